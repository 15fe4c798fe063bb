"""``git-xet``'s entry point: hot paths first, then the full typer app."""

from __future__ import annotations

import os
import sys


def raise_open_file_limit() -> int:
    """Raise the soft ``RLIMIT_NOFILE`` to the hard limit; returns the soft limit now.

    gitxet keeps a fixed number of descriptors per process (every cache of open files is
    bounded), but git, sqlite and FUSE add their own: a soft limit of 1024 with a far higher
    hard limit only makes failures more likely. Never lowers it; failures are ignored.
    """
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 16)
    if soft == resource.RLIM_INFINITY or soft >= want:
        return soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    except (ValueError, OSError):
        return soft
    return want


def main() -> None:
    raise_open_file_limit()
    argv = sys.argv[1:]
    if argv[:1] == ["help"]:  # 'git xet help [COMMAND...]', as most tools take it
        argv = sys.argv[1:] = [*argv[1:], "--help"]
    if argv[:1] == ["mount-serve"]:  # a mount's serving process: see gitxet.cli._mountd
        from gitxet.cli.hot import run

        raise SystemExit(run(argv))
    if argv and os.environ.get("GITXET_TRACEBACK") != "1" and not {"-h", "--help"} & set(argv):
        from gitxet.cli.hot import HOT

        if argv[0] in HOT:
            from gitxet.cli.hot import run

            raise SystemExit(run(argv))
        if argv[0] == "clone":
            from gitxet.cli.clone import parse_argv

            if parse_argv(argv[1:]) is not None:  # else the full CLI says what is wrong
                from gitxet.cli.hot import run

                raise SystemExit(run(argv))
    if argv[:1] == ["mount"] and "--watch" in argv[: argv.index("--") if "--" in argv else None]:
        # --watch[=INTERVAL]: click options cannot take an optional value
        from gitxet.cli.mountcmds import DEFAULT_WATCH

        sys.argv[1 + argv.index("--watch")] = f"--watch={DEFAULT_WATCH}"
    from gitxet.cli.app import main as full

    full()
