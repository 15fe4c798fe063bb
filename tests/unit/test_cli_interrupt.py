"""gitxet.cli._interrupt: one Ctrl-C ends a command, and the same Ctrl-C arriving twice (the
terminal signals the process group, and git passes its own signal on to git-xet) never cuts
the cleanup the first one started short."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest

from gitxet.cli import _interrupt


@pytest.fixture
def handlers(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """The handlers installed for the test (restored after it); ``exit_now`` recorded."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    exits: list[int] = []
    monkeypatch.setattr(_interrupt, "_received", None)
    monkeypatch.setattr(_interrupt, "exit_now", exits.append)
    for s in saved:
        signal.signal(s, signal.SIG_DFL)
    _interrupt.handle_signals()
    try:
        yield exits
    finally:
        for s, h in saved.items():
            signal.signal(s, h)


def test_the_same_ctrl_c_twice_raises_once_and_spares_the_cleanup(handlers: list[int]) -> None:
    cleaned = False
    with pytest.raises(_interrupt.Interrupted):
        try:
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C: raises as kill() returns
        finally:
            os.kill(os.getpid(), signal.SIGINT)  # git's forwarded copy, during cleanup
            cleaned = True
    assert cleaned
    assert _interrupt.received() == signal.SIGINT
    assert handlers == []  # not ended early either


def test_a_later_signal_ends_the_process_at_once(
    handlers: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_interrupt, "REPEAT_GRACE", -1.0)  # "later" is now
    with pytest.raises(_interrupt.Interrupted):
        os.kill(os.getpid(), signal.SIGTERM)
    os.kill(os.getpid(), signal.SIGINT)
    assert handlers == [signal.SIGTERM]  # exit_now with the first signal's status


def test_an_ignored_signal_stays_ignored(handlers: list[int]) -> None:
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # nohup (the fixture restores it)
    _interrupt.handle_signals()
    assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    assert signal.getsignal(signal.SIGINT) is _interrupt._raise
