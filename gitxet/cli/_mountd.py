"""The FUSE mount daemon's side of ``git xet mount``: its command line, serving, upgrading.

A background FUSE mount is ``python -m gitxet.mount.supervisor ... -- git-xet mount
--foreground ...``: the supervisor mounts and holds the FUSE connection, the serving
process (this module's :func:`serve_fuse`, run with ``--fuse-takeover``) serves it and can
be replaced (see ``gitxet.mount.supervisor``). Every serving process keeps metrics
(``gitxet.mount.metrics``): an endpoint with ``--metrics``, and a file beside its log that
``git xet mounts`` summarizes.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass

import typer

from gitxet.errors import MountError, NotFoundError
from gitxet.settings import strip_credentials

#: dir, size, offline, prefetch, cache tier, token file
Cache = tuple[str | None, str | None, bool, str | None, str | None, str | None]


@dataclass(frozen=True)
class Daemon:
    """What a background FUSE mount serves, and how."""

    repo: str  # absolute path or URL without credentials
    sha: str
    mnt: str
    subdir: str | None
    allow_other: bool
    cache: Cache
    read_around: bool
    metrics: str | None

    def serving_argv(self, metrics_file: str) -> list[str]:
        """``git-xet mount --foreground ...`` for one serving process."""
        from gitxet.settings import cache_root

        cache_dir, cache_size, offline, prefetch, cas_url, token_file = self.cache
        argv = [sys.executable, "-m", "gitxet", "mount", "--foreground"]
        argv += ["--cache-dir", cache_root(cache_dir), "--metrics-file", metrics_file]
        if self.subdir:
            argv += ["--subdir", self.subdir]
        if self.allow_other:
            argv.append("--allow-other")
        if cache_size:
            argv += ["--cache-size", cache_size]
        if offline:
            argv.append("--offline")
        if prefetch:
            argv += ["--prefetch", prefetch]
        if cas_url:
            argv += ["--cas-url", cas_url]
        if token_file:
            argv += ["--token-file", token_file]  # a path, never the token itself
        if not self.read_around:
            argv.append("--no-read-around")
        if self.metrics:
            argv += ["--metrics", self.metrics]
        return [*argv, "--", self.repo, self.sha, self.mnt]

    def start(self, timeout: float, log_path: str, token: str | None, *, supervise: bool):  # type: ignore[no-untyped-def]
        """Start the daemon (supervised unless told otherwise) and wait until it serves."""
        from gitxet.mount.fuse import mount_options
        from gitxet.mount.metrics import metrics_file_for
        from gitxet.mount.runner import start_background
        from gitxet.settings import TOKEN_ENV, child_env

        if self.metrics:
            from gitxet.settings import parse_address

            parse_address(self.metrics)  # a bad address fails here, not in the daemon
        argv = self.serving_argv(metrics_file_for(log_path))
        if supervise:
            opts = mount_options(f"gitxet:{self.sha[:12]}", allow_other=self.allow_other)
            argv = [
                *(sys.executable, "-m", "gitxet.mount.supervisor"),
                *("--mountpoint", self.mnt, "--options", ",".join(sorted(opts))),
                "--",
                *argv,
            ]
        # argv never holds a token: one from the URL travels in the environment
        env = child_env({TOKEN_ENV: token}) if token else None
        return start_background(
            argv, self.mnt, timeout=timeout, log_path=log_path, cwd="/", env=env
        )


def serve_fuse(
    repo: str,
    commit: str,
    mnt: str,
    subdir: str | None,
    cache: Cache,
    allow_other: bool,
    read_around: bool,
    metrics: str | None,
    metrics_file: str | None,
    takeover_arg: str | None,
) -> None:
    """Serve ``repo`` at ``commit`` on ``mnt`` in this process until it is unmounted (or,
    taken over from a supervisor, until this process is told to stop)."""
    from gitxet.cli.mountcmds import _open_fs
    from gitxet.mount.fuse import serve
    from gitxet.mount.metrics import MountMetrics
    from gitxet.mount.supervisor import parse_takeover

    if takeover_arg is not None:
        # a daemon's log: what happens to the mount (takeovers, failures) with timestamps
        logging.basicConfig(
            level=logging.WARNING, format="%(asctime)s %(name)s[%(process)d] %(message)s"
        )
        logging.getLogger("gitxet.mount").setLevel(logging.INFO)
    takeover = parse_takeover(takeover_arg) if takeover_arg is not None else None
    try:
        ds, sha, fs = _open_fs(repo, commit, subdir, *cache)
    except BaseException:
        if takeover is not None:
            takeover.close()
        raise
    typer.echo(f"git-xet: {strip_credentials(repo)} at {commit} = commit {sha}", err=True)
    counters = MountMetrics(mnt, sha)
    if ds.server is not None:
        counters.watch_source(ds.server)
    endpoint = None
    stop = threading.Event()
    writer = None
    try:
        if metrics:
            endpoint = counters.serve(metrics)
            typer.echo(f"git-xet: metrics on http://{metrics}/metrics", err=True)
        if metrics_file:
            writer = counters.write_periodically(metrics_file, stop)
        serve(
            fs,
            mnt,
            fsname=f"gitxet:{sha[:12]}",
            allow_other=allow_other,
            read_around=read_around,
            metrics=counters,
            takeover=takeover,
        )
    finally:
        stop.set()
        if writer is not None:
            writer.join(5)
        if endpoint is not None:
            endpoint.shutdown()
            endpoint.server_close()
        fs.close()


def upgrade(registry, mountpoint: str, timeout: float) -> None:  # type: ignore[no-untyped-def]
    """Replace the process serving a supervised mount; the mount stays."""
    from gitxet.mount.runner import (
        HEALTH_OK,
        mount_health,
        normalize_mountpoint,
        process_alive,
        serving_pid,
    )

    mnt = normalize_mountpoint(os.path.abspath(mountpoint))
    rec = registry.get(mnt)
    if rec is None:
        raise NotFoundError(f"no gitxet mount at {mnt}; 'git xet mounts' lists them")
    if not process_alive(rec.pid, rec.start_time):
        raise MountError(mnt, "the mount is dead: 'git xet mount' onto it repairs it")
    old = serving_pid(rec.pid)
    if old is None:
        raise MountError(mnt, "not a supervised mount (mounted with --no-supervise?)")
    os.kill(rec.pid, signal.SIGUSR1)
    deadline = time.monotonic() + timeout
    while True:
        new = serving_pid(rec.pid)
        if (
            new not in (None, old)
            and mount_health(mnt, max(0.1, deadline - time.monotonic())) == HEALTH_OK
        ):
            break
        if time.monotonic() > deadline:
            raise MountError(mnt, f"no new serving process answered within {timeout:g} s")
        time.sleep(0.05)
    typer.echo(f"git-xet: {mnt} is now served by pid {new} (was {old})", err=True)
