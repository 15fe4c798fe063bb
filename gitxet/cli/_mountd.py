"""The FUSE mount daemon's side of ``git xet mount``: its command line, serving, upgrading.

A background FUSE mount is ``python -m gitxet.mount.supervisor ... -- python -m gitxet
mount-serve SPEC``: the supervisor mounts and holds the FUSE connection, the serving
process (:func:`serve_main`, run with ``--fuse-takeover``) serves it and can be replaced
(see ``gitxet.mount.supervisor``). SPEC is the :class:`Daemon` as JSON, and ``mount-serve``
is dispatched by ``gitxet.cli.entry`` before typer: a serving process imports only what it
serves with (typer and the CLI app cost more than a fifth of its start-up, which a reader
waits for at every mount and failover). Every serving process keeps metrics
(``gitxet.mount.metrics``): an endpoint with ``--metrics``, and a file beside its log that
``git xet mounts`` summarizes. This module does not import typer.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import signal
import sys
import threading
import time
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from gitxet.errors import FormatError, MountError, NotFoundError
from gitxet.settings import strip_credentials

if TYPE_CHECKING:
    from gitxet.dataset import Dataset, HttpAccess
    from gitxet.mount.follow import Follower

#: dir, size, offline, prefetch, cache tier, token file
Cache = tuple[str | None, str | None, bool, str | None, str | None, str | None]

SERVE_COMMAND = "mount-serve"  # the serving process's command (hidden; see the docstring)
#: young-generation size of the serving process's garbage collector (see serve_fuse)
_GC_YOUNG = 50_000


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def cache_access(cache: Cache) -> HttpAccess:
    """Access to http(s) repositories with a mount's cache settings."""
    from gitxet.cli._env import http_access

    cache_dir, cache_size, offline, prefetch, cas_url, token_file = cache
    return http_access(
        cache_dir,
        cache_size,
        offline=offline,
        prefetch=prefetch,
        cas_url=cas_url,
        token_file=token_file,
    )


def open_fs(repo: str, commit: str, subdir: str | None, cache: Cache):  # type: ignore[no-untyped-def]
    """(dataset, full sha, CommitFS) of ``commit`` in ``repo``, through the one resolver."""
    from gitxet.dataset import open_commit

    opened = open_commit(repo, commit, subdir or "", cache_access(cache))
    return opened.dataset, opened.commit, opened.fs


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
        """``python -m gitxet mount-serve SPEC`` for one serving process (:func:`serve_main`)."""
        from gitxet.settings import cache_root

        spec = asdict(self)
        spec["cache"] = [cache_root(self.cache[0]), *self.cache[1:]]  # the daemon runs in /
        spec["metrics_file"] = metrics_file  # token_file is a path: never the token itself
        return [sys.executable, "-m", "gitxet", SERVE_COMMAND, json.dumps(spec, sort_keys=True)]

    @classmethod
    def from_spec(cls, text: str) -> tuple[Daemon, str | None]:
        """The daemon and metrics file :meth:`serving_argv` wrote into SPEC."""
        try:
            spec: dict[str, Any] = json.loads(text)
            metrics_file = spec.pop("metrics_file")
            spec["cache"] = tuple(spec["cache"])
            if spec["watch"] is not None:
                spec["watch"] = tuple(spec["watch"])
            return cls(**spec), metrics_file
        except (ValueError, TypeError, KeyError) as exc:
            raise FormatError("mount-serve SPEC", f"not a serving process's spec: {exc}") from None

    def start(self, timeout: float, log_path: str, token: str | None, *, supervise: bool):  # type: ignore[no-untyped-def]
        """Start the daemon (supervised unless told otherwise) and wait until it serves."""
        # the runner, not the FUSE adapter or the metrics module: this process never serves,
        # and trio, pyfuse3 and prometheus_client cost a tenth of a second to import
        from gitxet.mount.runner import metrics_file_for, mount_options, start_background
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
            ds, sha, fs = open_fs(repo, commit, subdir, cache)
        else:
            ds, follower = _following(repo, commit, subdir, cache, watch, metrics_file, takeover)
            fs = follower.fs
            sha = fs.commit
    except BaseException:
        if takeover is not None:
            takeover.close()
        raise
    _say(f"git-xet: {strip_credentials(repo)} at {commit} = commit {sha}")
    # A listing makes several objects per entry (nodes, attributes), nearly all long-lived
    # and free of cycles: with the default 700-allocation young generation, a cold `find`
    # of 200,000 files spent ~11% of its time in the collector re-scanning them.
    gc.set_threshold(_GC_YOUNG, *gc.get_threshold()[1:])
    counters = MountMetrics(mnt, sha)
    if ds.server is not None:
        counters.watch_source(ds.server)
    endpoint = None
    stop = threading.Event()
    writer = None
    try:
        if metrics:
            endpoint = counters.serve(metrics)
            host, port = endpoint.server_address[:2]  # the port bound (ADDR may say 0)
            where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
            _say(f"git-xet: metrics on http://{where}/metrics")
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


def serve_main(args: list[str]) -> int:
    """``git-xet mount-serve SPEC [--fuse-takeover=...]``: one serving process of a background
    FUSE mount, started by its supervisor (no typer: see the module docstring)."""
    import argparse

    from gitxet.cli._errors import require
    from gitxet.mount.supervisor import TAKEOVER_OPTION

    parser = argparse.ArgumentParser(prog=f"git-xet {SERVE_COMMAND}", add_help=False)
    parser.add_argument("spec")
    parser.add_argument(TAKEOVER_OPTION, dest="takeover")
    parsed = parser.parse_args(args)
    daemon, metrics_file = Daemon.from_spec(parsed.spec)
    require("mount")
    serve_fuse(
        daemon.repo,
        daemon.sha if daemon.watch is None else daemon.watch[0],
        daemon.mnt,
        daemon.subdir,
        daemon.cache,
        daemon.allow_other,
        daemon.read_around,
        daemon.metrics,
        metrics_file,
        parsed.takeover,
        watch=None if daemon.watch is None else daemon.watch[1],
    )
    return 0


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
    from gitxet.dataset import mirror_git_metadata, open_dataset
    from gitxet.mount.follow import Follower, FollowingFS, read_state, state_file_for

    if cache[2]:  # offline
        raise MountError(repo, "--watch needs the server: it cannot follow a branch --offline")
    access = cache_access(cache)
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
    _say(f"git-xet: {mnt} is now served by pid {new} (was {old})")
