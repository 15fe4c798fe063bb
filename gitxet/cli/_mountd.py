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
from typing import TYPE_CHECKING

import typer

from gitxet.errors import MountError, NotFoundError
from gitxet.settings import strip_credentials

if TYPE_CHECKING:
    from gitxet.dataset import Dataset
    from gitxet.mount.follow import Follower

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
    watch: tuple[str, float] | None = None  # (branch, seconds between polls)

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
        rev = self.sha
        if self.watch is not None:
            rev = self.watch[0]  # each serving process follows the branch itself
            argv.append(f"--watch={self.watch[1]:g}s")
        return [*argv, "--", self.repo, rev, self.mnt]

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
    *,
    watch: float | None = None,
) -> None:
    """Serve ``repo`` at ``commit`` on ``mnt`` in this process until it is unmounted (or,
    taken over from a supervisor, until this process is told to stop). With ``watch``,
    ``commit`` is a branch polled every ``watch`` seconds (``gitxet.mount.follow``)."""
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
    follower: Follower | None = None
    try:
        if watch is None:
            ds, sha, fs = _open_fs(repo, commit, subdir, *cache)
        else:
            ds, follower = _following(repo, commit, subdir, cache, watch, metrics_file, takeover)
            fs = follower.fs
            sha = fs.commit
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
            follower=follower,
        )
    finally:
        stop.set()
        if writer is not None:
            writer.join(5)
        if endpoint is not None:
            endpoint.shutdown()
            endpoint.server_close()
        fs.close()


def _following(  # type: ignore[no-untyped-def]
    repo: str,
    branch: str,
    subdir: str | None,
    cache: Cache,
    interval: float,
    metrics_file: str | None,
    takeover,
) -> tuple[Dataset, Follower]:
    """The dataset and the :class:`Follower` of a watched mount. A serving process that
    replaces a dead one starts from the commits its predecessor served (the kernel may
    hold their inodes); the first one from the branch as it is now."""
    from gitxet.cli._env import http_access
    from gitxet.dataset import mirror_git_metadata, open_dataset
    from gitxet.mount.follow import Follower, FollowingFS, read_state, state_file_for

    cache_dir, cache_size, offline, prefetch, cas_url, token_file = cache
    if offline:
        raise MountError(repo, "--watch needs the server: it cannot follow a branch --offline")
    access = http_access(
        cache_dir, cache_size, prefetch=prefetch, cas_url=cas_url, token_file=token_file
    )
    ds = open_dataset(repo, access)
    remote = repo.startswith(("http://", "https://"))

    def head() -> str:
        if remote:
            mirror_git_metadata(repo, access)  # the server's refs, fetched into the mirror
        return ds.resolve(branch)

    state_path = state_file_for(metrics_file) if metrics_file else None
    start: str | None = None
    history: list[str] = []
    if takeover is not None and takeover.resend and state_path is not None:
        saved = read_state(state_path)
        if saved is not None and saved[0] == branch:
            _, start, history = saved
    fs = FollowingFS(
        lambda c: ds.open_commit(c, subdir or ""), start or ds.resolve(branch), history
    )
    return ds, Follower(fs, branch, head, interval, state_path=state_path)


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
