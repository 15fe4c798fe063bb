"""One Ctrl-C ends a command: SIGINT, SIGTERM and SIGHUP become :class:`Interrupted` in the
main thread, and the command exits at once, without waiting for worker threads.

Cleanup still happens: the exception unwinds the main thread through every ``finally`` and
context manager (temp files, locks; transfers stop starting work and give copies to local
disk a moment to finish), and a second signal never raises into it: the same Ctrl-C often
arrives twice (the terminal signals the whole process group, and ``git xet`` is a git
process that passes its signal on to git-xet); one more than :data:`REPEAT_GRACE` seconds
later ends the process at once. Only then does :func:`exit_now` end the process with
``os._exit``, because a worker blocked on a server that stopped answering would otherwise
hold the interpreter's exit (it joins every pool thread) for as long as the server keeps
silent. The exit status is 128 + the signal number, so git sees a failed hook (and updates
no ref) and shells see the usual code.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from types import FrameType
from typing import NoReturn

__all__ = ["Interrupted", "exit_now", "handle_signals", "received"]

_received: int | None = None


class Interrupted(KeyboardInterrupt):
    """A terminating signal arrived."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


#: Seconds after the first signal during which another one is taken for the same Ctrl-C
#: (git passes the signal it gets on to the command it runs, and a terminal sends it to both)
REPEAT_GRACE = 2.0
_first_at = 0.0


def _raise(signum: int, frame: FrameType | None) -> None:
    global _received, _first_at
    if _received is not None:
        # never raise into the cleanup the first one started (it restats what a checkout
        # wrote, removes temp files); a Ctrl-C pressed again later ends the process now
        if time.monotonic() - _first_at > REPEAT_GRACE:
            exit_now(_received)
        return
    _received, _first_at = signum, time.monotonic()
    raise Interrupted(signum)


def handle_signals() -> None:
    """Turn SIGINT, SIGTERM and SIGHUP into :class:`Interrupted`, unless they are ignored
    (``nohup``, a background job); commands with handlers of their own set them later."""
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(signum) is not signal.SIG_IGN:
            signal.signal(signum, _raise)


def received() -> int | None:
    """The signal that interrupted this process, if one did (whoever caught the exception:
    typer, for one, turns Ctrl-C into an exit status)."""
    return _received


def exit_now(signum: int) -> NoReturn:
    """Say so and end the process now, abandoning worker threads."""
    try:
        print("git-xet: interrupted", file=sys.stderr, flush=True)
        sys.stdout.flush()
    except (OSError, ValueError):
        pass  # a closed or broken pipe: nothing left to tell
    os._exit(128 + signum)
