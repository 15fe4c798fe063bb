"""Subprocesses the test process started and left running (conftest hooks).

A ``subprocess.Popen`` whose process still runs when Python exits makes "ResourceWarning:
subprocess N is still running" at the very end of a suite, after pytest's report, naming
no test. Here every ``Popen`` made in this process remembers the test that made it; when
the session ends, each one still running is named on the terminal (that test must
stop and wait for it) and stopped and reaped, and so is any started after that (at exit).
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest

__all__ = ["pytest_runtest_setup", "pytest_sessionfinish"]

_current = ["(no test: collection or a session fixture)"]
_ATTR = "_gitxet_started_by"
_real_init: Callable[..., None] = subprocess.Popen.__init__


def _init(self: subprocess.Popen[Any], *args: Any, **kwargs: Any) -> None:
    setattr(self, _ATTR, _current[0])
    _real_init(self, *args, **kwargs)


subprocess.Popen.__init__ = _init  # type: ignore[method-assign]


def pytest_runtest_setup(item: pytest.Item) -> None:
    _current[0] = item.nodeid


def _running() -> list[subprocess.Popen[Any]]:
    gc.collect()
    out = []
    for obj in gc.get_objects():
        with contextlib.suppress(Exception):
            if isinstance(obj, subprocess.Popen) and obj.poll() is None:
                out.append(obj)
    return out


def _stop(proc: subprocess.Popen[Any]) -> None:
    """SIGTERM (a mount daemon then unmounts), and SIGKILL if it is still there 10 s on."""
    from tests.helpers.server_env import stop_process

    with contextlib.suppress(OSError, subprocess.SubprocessError):
        stop_process(proc, 10)


def _describe(proc: subprocess.Popen[Any]) -> str:
    args = proc.args if isinstance(proc.args, (str, bytes)) else list(proc.args)[:4]
    return f"pid {proc.pid} {args!r}, started by {getattr(proc, _ATTR, '?')}"


def pytest_sessionfinish(session: pytest.Session) -> None:
    _current[0] = "(after the session)"
    left = _running()
    if not left:
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    for proc in left:
        line = f"subprocess still running at the end of the session, stopped: {_describe(proc)}"
        if reporter is not None:
            reporter.write_line(line, yellow=True)
        else:
            print(line, file=sys.stderr)
        _stop(proc)


@atexit.register
def _at_exit() -> None:
    for proc in _running():
        print(f"subprocess still running at exit, stopped: {_describe(proc)}", file=sys.stderr)
        _stop(proc)
