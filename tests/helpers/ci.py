"""The CI switch: under ``CI=true`` a FUSE, NFS or Docker test must run, never skip.

A test that needs one of those marks itself (``@pytest.mark.fuse``, ``nfs``, ``docker``) and
skips with a reason naming what is missing. On a developer machine that skip stays a skip; in
CI (``.ci/run`` exports ``CI=true``) the hooks below turn it into a failure, so a CI run can
never go green without running them. A whole module skipped at import (``importorskip`` of
a test dependency) fails in CI too: CI installs every test dependency.

``tests/conftest.py`` re-exports the two hooks; tests/unit/test_ci_switch.py checks them.
"""

from __future__ import annotations

import os
from collections.abc import Generator, Mapping

import pytest

# Markers of the tests a CI run must not skip.
REQUIRED_IN_CI = ("fuse", "nfs", "docker")


def ci_enabled(env: Mapping[str, str] = os.environ) -> bool:
    """Whether ``CI`` is set to a true value (``true``, ``1``, ``yes``, ``on``)."""
    return env.get("CI", "").strip().lower() in ("1", "true", "yes", "on")


# Read at import: tests/conftest.py reseals the environment of each test.
IN_CI = ci_enabled()


def _reason(longrepr: object) -> str:
    # a skip's longrepr is (file, line, "Skipped: reason")
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """In CI, a skipped FUSE/NFS/Docker test is reported as failed."""
    report = yield
    if IN_CI and report.skipped and not hasattr(report, "wasxfail"):
        kinds = [m for m in REQUIRED_IN_CI if item.get_closest_marker(m) is not None]
        if kinds:
            report.outcome = "failed"
            report.longrepr = (
                f"CI=true: a {'/'.join(kinds)} test must run, not skip: {_reason(report.longrepr)}"
            )
    return report


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(
    collector: pytest.Collector,
) -> Generator[None, pytest.CollectReport, pytest.CollectReport]:
    """In CI, a test module skipped at import (a missing test dependency) is an error."""
    report = yield
    if IN_CI and report.skipped and isinstance(collector, pytest.Module):
        report.outcome = "failed"
        report.longrepr = f"CI=true: test module skipped at import: {_reason(report.longrepr)}"
    return report


def require_native(built: bool, what: str) -> None:
    """Skip a test of a C extension (``what``) that is not built, but fail where it must
    be: in CI and under ``GITXET_REQUIRE_NATIVE=1`` a silent fallback is a failure."""
    if built:
        return
    if os.environ.get("CI") or os.environ.get("GITXET_REQUIRE_NATIVE") == "1":
        pytest.fail(f"{what} is not built: a silent fallback is a failure")
    pytest.skip(f"{what} is not built on this machine")
