"""The CI switch (tests/helpers/ci.py): under CI=true a FUSE/NFS/Docker skip is a failure."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.ci import ci_enabled

REPO_ROOT = Path(__file__).resolve().parents[2]

CONFTEST = """\
from tests.helpers.ci import REQUIRED_IN_CI, pytest_make_collect_report, pytest_runtest_makereport

def pytest_configure(config):
    for marker in REQUIRED_IN_CI:
        config.addinivalue_line("markers", marker)
"""

TESTS = """\
import pytest

pytestmark = pytest.mark.filterwarnings("ignore")

@pytest.mark.fuse
def test_fuse_skip():
    pytest.skip("no /dev/fuse")

@pytest.mark.nfs
@pytest.mark.skipif(True, reason="no nfs-cat")
def test_nfs_skipif():
    pass

@pytest.fixture
def engine():
    pytest.skip("no dockerd")

@pytest.mark.docker
def test_docker_fixture_skip(engine):
    pass

def test_plain_skip():
    pytest.skip("not a FUSE/NFS/Docker test")

@pytest.mark.fuse
def test_fuse_runs():
    pass
"""

IMPORT_SKIP = """\
import pytest
pytest.importorskip("no_such_module_for_the_ci_switch")

def test_never():
    pass
"""


def run_pytest(tmp_path: Path, ci: str | None) -> str:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_kinds.py").write_text(TESTS)
    (tmp_path / "test_importskip.py").write_text(IMPORT_SKIP)
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["PYTHONPATH"] = str(REPO_ROOT)
    if ci is not None:
        env["CI"] = ci
    r = subprocess.run(
        [
            *(sys.executable, "-m", "pytest", "-v", "-rA", "-p", "no:cacheprovider"),
            *("--strict-markers", "--continue-on-collection-errors", str(tmp_path)),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return r.stdout + r.stderr


def outcomes(out: str) -> dict[str, str]:
    """``test name -> PASSED/FAILED/SKIPPED/ERROR`` from pytest's ``-v`` lines."""
    got: dict[str, str] = {}
    for line in out.splitlines():
        if line.startswith("test_kinds.py::"):
            name, word = line.removeprefix("test_kinds.py::").split()[:2]
            got[name] = word
        elif line.startswith(("ERROR test_importskip.py", "SKIPPED [1] test_importskip.py")):
            got["test_importskip"] = line.split()[0]
    return got


def test_in_ci_a_skipped_fuse_nfs_or_docker_test_fails(tmp_path: Path) -> None:
    out = run_pytest(tmp_path, "true")
    assert outcomes(out) == {
        "test_fuse_skip": "FAILED",
        # skips before the test body (skipif, a fixture) become setup errors
        "test_nfs_skipif": "ERROR",
        "test_docker_fixture_skip": "ERROR",
        "test_plain_skip": "SKIPPED",
        "test_fuse_runs": "PASSED",
        "test_importskip": "ERROR",
    }, out
    assert "CI=true: a fuse test must run, not skip: no /dev/fuse" in out
    assert "CI=true: test module skipped at import" in out


@pytest.mark.parametrize("ci", [None, "", "false", "0"])
def test_outside_ci_they_stay_skips(tmp_path: Path, ci: str | None) -> None:
    got = outcomes(run_pytest(tmp_path, ci))
    assert got == {
        "test_fuse_skip": "SKIPPED",
        "test_nfs_skipif": "SKIPPED",
        "test_docker_fixture_skip": "SKIPPED",
        "test_plain_skip": "SKIPPED",
        "test_fuse_runs": "PASSED",
        "test_importskip": "SKIPPED",
    }


def test_ci_values() -> None:
    assert all(ci_enabled({"CI": v}) for v in ("true", "TRUE", "1", "yes", "on"))
    assert not any(ci_enabled({"CI": v}) for v in ("", "0", "false", "no"))
    assert not ci_enabled({})
