"""What a background FUSE mount's processes import and pass on (gitxet/cli/_mountd.py).

The time to a ready mount is mostly Python start-up: the ``git xet mount`` process must not
import the FUSE adapter (trio, pyfuse3) or prometheus_client, which only the serving process
uses, and the serving process (``python -m gitxet mount-serve SPEC``, started by the
supervisor) must not import typer or the CLI app.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gitxet.cli._errors import EXTRAS, require
from gitxet.cli._mountd import SERVE_COMMAND, Daemon
from gitxet.errors import FormatError, MissingDependencyError
from gitxet.mount.supervisor import with_takeover


def _daemon(**kw: object) -> Daemon:
    base: dict[str, object] = dict(
        repo="/srv/data.git",
        sha="a" * 40,
        mnt="/mnt/x",
        subdir="sub dir",
        allow_other=False,
        cache=("/c", "20g", False, "64M", "http://127.0.0.1:1/", "/run/token"),
        read_around=False,
        metrics="127.0.0.1:9100",
        watch=None,
    )
    base.update(kw)
    return Daemon(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize("watch", [None, ("main", 2.5)])
def test_the_serving_command_carries_the_daemon(watch: tuple[str, float] | None) -> None:
    daemon = _daemon(watch=watch)
    argv = daemon.serving_argv("/logs/x.prom")
    assert argv[:4] == [sys.executable, "-m", "gitxet", SERVE_COMMAND] and len(argv) == 5
    # the supervisor appends its takeover option; the spec comes back whole
    argv = with_takeover(argv, 7, b"init", resend=False)
    assert argv[5].startswith("--fuse-takeover=7:0:")
    assert Daemon.from_spec(argv[4]) == (daemon, "/logs/x.prom")


def test_the_serving_command_resolves_the_cache_dir(tmp_path: Path) -> None:
    daemon = _daemon(cache=(None, None, False, None, None, None))
    spec = json.loads(daemon.serving_argv(str(tmp_path / "x.prom"))[4])
    assert spec["cache"][0]  # the daemon runs in / with no say in the matter: a real path


@pytest.mark.parametrize("spec", ["", "[]", "{}", '{"metrics_file": null}', "not json"])
def test_a_bad_spec_is_a_format_error(spec: str) -> None:
    with pytest.raises(FormatError, match="spec"):
        Daemon.from_spec(spec)


def test_require_without_loading_finds_a_missing_module(monkeypatch: pytest.MonkeyPatch) -> None:
    feature, _, system = EXTRAS["mount"]
    monkeypatch.setitem(EXTRAS, "mount", (feature, ("os", "gitxet_no_such_module"), system))
    with pytest.raises(MissingDependencyError, match="gitxet_no_such_module"):
        require("mount", load=False)


def _modules_after(code: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", f"{code}\nimport sys; print(' '.join(sys.modules))"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    return set(out.split())


def test_starting_a_background_mount_imports_no_fuse_adapter() -> None:
    loaded = _modules_after(
        "from gitxet.cli import _mountd\n"
        "from gitxet.cli._errors import require\n"
        "from gitxet.mount.runner import metrics_file_for, mount_options, start_background\n"
        "require('mount', load=False)\n"
        "_mountd.Daemon('/r', 'a' * 40, '/m', None, False, (None,) * 6, True, None)"
        ".serving_argv('/l.prom')\n"
    )
    assert not {"trio", "pyfuse3", "prometheus_client"} & loaded


@pytest.mark.fuse
def test_the_serving_process_imports_no_typer() -> None:
    pytest.importorskip("pyfuse3")
    loaded = _modules_after(
        "import gitxet.cli.entry, gitxet.cli.hot, gitxet.cli._mountd\n"
        "import gitxet.mount.fuse, gitxet.mount.metrics, gitxet.mount.follow, gitxet.dataset\n"
    )
    assert "pyfuse3" in loaded
    assert not {"typer", "click", "rich", "pydantic", "gitxet.cli.app"} & loaded
