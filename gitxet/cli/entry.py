"""``git-xet``'s entry point: hot paths first, then the full typer app."""

from __future__ import annotations

import os
import sys


def main() -> None:
    argv = sys.argv[1:]
    if argv and os.environ.get("GITXET_TRACEBACK") != "1" and not {"-h", "--help"} & set(argv):
        from gitxet.cli.hot import HOT

        if argv[0] in HOT:
            from gitxet.cli.hot import run

            raise SystemExit(run(argv))
    from gitxet.cli.app import main as full

    full()
