"""Mount commands: mount, unmount, mounts, nfs-serve, warmup."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from dataclasses import asdict
from typing import TYPE_CHECKING, Annotated

import typer

from gitxet.cli import _json
from gitxet.cli._mountd import open_fs as _open_fs
from gitxet.settings import strip_credentials, url_token

if TYPE_CHECKING:
    from gitxet.dataset import HttpAccess

DEFAULT_WATCH = "10s"  # how often a watched mount polls its branch (--watch without a value)


def register(app: typer.Typer) -> None:
    app.command("mount")(mount_cmd)
    app.command("unmount")(unmount_cmd)
    app.command("mounts")(mounts_cmd)
    app.command("nfs-serve")(nfs_serve_cmd)
    app.command("warmup")(warmup_cmd)


def _state_dir() -> str:
    from gitxet.settings import state_root

    return state_root()


def _registry():  # type: ignore[no-untyped-def]
    from gitxet.mount.runner import MountRegistry

    return MountRegistry(os.path.join(_state_dir(), "mounts"))


CacheDirOpt = Annotated[
    str | None,
    typer.Option("--cache-dir", help="Shared chunk cache for http(s) repos (GITXET_CACHE_DIR)."),
]
CacheSizeOpt = Annotated[
    str | None, typer.Option("--cache-size", help="Cap of the chunk cache, e.g. 20g (LRU).")
]
PrefetchOpt = Annotated[
    str | None,
    typer.Option(
        "--prefetch",
        help="Largest read-ahead of sequential readers of http repos (default 128M; 0: off).",
    ),
]
ReadAroundOpt = Annotated[
    bool,
    typer.Option(
        "--read-around/--no-read-around",
        help="Page cache fills: a small read's whole chunk, a small file at open (FUSE).",
    ),
]
CasUrlOpt = Annotated[
    str | None,
    typer.Option(
        "--cas-url",
        help="Read file data through this cache tier (git xet serve --upstream); "
        "git metadata still comes from REPO (GITXET_CAS_URL).",
    ),
]
OfflineOpt = Annotated[
    bool, typer.Option("--offline", help="Serve only from the cache; a miss is an I/O error.")
]
TokenFileOpt = Annotated[
    str | None,
    typer.Option(
        "--token-file",
        metavar="PATH",
        help="Read the server token from this file, again whenever it changes (rotation) "
        "(GITXET_TOKEN_FILE).",
    ),
]


def mount_cmd(
    repo: Annotated[
        str | None,
        typer.Argument(
            help="Repository: working/bare repo, file:// or http(s) URL.", show_default=False
        ),
    ] = None,
    commit: Annotated[
        str | None, typer.Argument(help="Branch, tag or commit sha.", show_default=False)
    ] = None,
    # str, not Path: click stats a Path argument, which blocks on a mount that does not
    # answer (and deadlocks a serving process taking over its own mountpoint)
    mountpoint: Annotated[
        str | None, typer.Argument(help="Empty directory to mount on.", show_default=False)
    ] = None,
    subdir: Annotated[str | None, typer.Option("--subdir", help="Mount only this subtree.")] = None,
    foreground: Annotated[
        bool, typer.Option("--foreground", "-f", help="Serve in this process.")
    ] = False,
    nfs: Annotated[
        bool, typer.Option("--nfs", help="Serve over NFSv3 and mount with the OS client.")
    ] = False,
    allow_other: Annotated[
        bool, typer.Option("--allow-other", help="Let other users read it.")
    ] = False,
    timeout: Annotated[
        float, typer.Option(help="Seconds to wait for the mount to be ready.")
    ] = 30.0,
    cache_dir: CacheDirOpt = None,
    cache_size: CacheSizeOpt = None,
    offline: OfflineOpt = False,
    prefetch: PrefetchOpt = None,
    cas_url: CasUrlOpt = None,
    token_file: TokenFileOpt = None,
    read_around: ReadAroundOpt = True,
    nonempty: Annotated[
        bool,
        typer.Option("--nonempty", help="Mount over a directory that has files (hiding them)."),
    ] = False,
    metrics: Annotated[
        str | None,
        typer.Option(
            "--metrics",
            metavar="ADDR",
            help="Serve Prometheus metrics on HOST:PORT (/metrics); 127.0.0.1 if no host.",
        ),
    ] = None,
    upgrade: Annotated[
        str | None,
        typer.Option(
            "--upgrade",
            metavar="MOUNTPOINT",
            help="Replace the process serving this mount (e.g. after an upgrade); no unmount.",
        ),
    ] = None,
    supervise: Annotated[
        bool,
        typer.Option(
            "--supervise/--no-supervise",
            help="Keep the FUSE connection in a supervisor that replaces a serving process "
            "that dies, with no error for readers (background FUSE mounts).",
        ),
    ] = True,
    watch: Annotated[
        str | None,
        typer.Option(
            "--watch",
            metavar="[=INTERVAL]",
            help="Follow the branch COMMIT: poll it every INTERVAL (default "
            f"{DEFAULT_WATCH}; e.g. 1s, 2m) and show its newest commit to new opens; "
            "files already open keep reading theirs (FUSE only).",
        ),
    ] = None,
    metrics_file: Annotated[str | None, typer.Option("--metrics-file", hidden=True)] = None,
    fuse_takeover: Annotated[str | None, typer.Option("--fuse-takeover", hidden=True)] = None,
) -> None:
    """Mount a commit read-only, reading file data lazily (FUSE by default).

    REPO may be a local working or bare repository, a file:// URL or an http(s) URL of a
    gitxet server (git metadata is mirrored into the cache; data is fetched on demand into
    the shared chunk cache). A background FUSE mount is held by a small supervisor: when
    the process serving it dies, a new one takes the same connection over and the kernel
    re-sends what was in flight, so readers see a pause, not an error.
    """
    from gitxet.cli import _mountd

    if upgrade is not None:
        if repo is not None:
            raise typer.BadParameter("--upgrade takes only the mountpoint")
        _mountd.upgrade(_registry(), upgrade, timeout)
        return
    if repo is None or commit is None or mountpoint is None:
        raise typer.BadParameter("REPO, COMMIT and MOUNTPOINT are required")
    interval = _watch_interval(watch, nfs)
    from gitxet.mount.runner import normalize_mountpoint

    mnt = normalize_mountpoint(os.path.abspath(mountpoint))
    if token_file is not None:
        token_file = os.path.abspath(token_file)  # the daemon runs in /
    cache = (cache_dir, cache_size, offline, prefetch, cas_url, token_file)

    def serve_fuse(takeover: str | None) -> None:
        _mountd.serve_fuse(
            repo,
            commit,
            mnt,
            subdir,
            cache,
            allow_other,
            read_around,
            metrics,
            metrics_file,
            takeover,
            watch=interval,
        )

    def access() -> HttpAccess:
        return _mountd.cache_access(cache)

    if fuse_takeover is not None:
        # a serving process started by the supervisor: the mount exists already (and a stat
        # of it would wait for this very process)
        require_mount()
        serve_fuse(fuse_takeover)
        return
    dead = _dead_mount(mnt)
    if dead is None:
        _check_mountpoint(mnt, nonempty)
    if not nfs:
        require_mount(load=foreground)  # a background mount's daemon imports it (and says)
    if dead is not None:
        # a dead mount of the same repo and commit is repaired: detached, then mounted anew
        from gitxet.dataset import open_dataset

        sha = open_dataset(repo, access()).resolve(commit)
        _repair_dead(mnt, dead, repo, commit if interval is not None else sha, nonempty)
    if not foreground and not nfs:
        # the daemon opens the commit itself: here only check that repo and commit resolve
        from gitxet.dataset import open_dataset

        daemon_access = access()
        ds = open_dataset(repo, daemon_access)
        sha = ds.resolve(commit)
        if interval is not None:
            _check_branch(commit, sha)
        ds.check_subdir(sha, subdir or "")  # a bad --subdir fails here, not in the daemon
        typer.echo(f"git-xet: {strip_credentials(repo)} at {commit} = commit {sha}", err=True)
        # The token the user put in the URL stays out of the daemon's argv: the daemon gets
        # the clean URL and the token through its environment.
        token = daemon_access.token_for(repo) if url_token(repo) else None
        daemon = _mountd.Daemon(
            _location(repo),
            sha,
            mnt,
            subdir,
            allow_other,
            cache,
            read_around,
            metrics,
            (commit, interval) if interval is not None else None,
        )
        log_path = _log_path(mnt)
        if interval is not None:
            from gitxet.mount.follow import state_file_for

            # the first serving process writes it anew: never show an earlier mount's
            with contextlib.suppress(FileNotFoundError):
                os.unlink(state_file_for(log_path))
        proc = daemon.start(timeout, log_path, token, supervise=supervise)
        _record_daemon(
            proc, repo, sha, cache_dir, subdir, metrics, commit if interval is not None else ""
        )
        return
    if nfs:
        ds, sha, fs = _open_fs(repo, commit, subdir, cache)
        typer.echo(f"git-xet: {strip_credentials(repo)} at {commit} = commit {sha}", err=True)
        try:
            _mount_nfs(fs, sha, mnt)
        finally:
            fs.close()
        return
    serve_fuse(None)


def _watch_interval(watch: str | None, nfs: bool) -> float | None:
    """Seconds between polls of a watched mount, or ``None`` when not watching."""
    if watch is None:
        return None
    if nfs:
        raise typer.BadParameter(
            "--watch needs a FUSE mount: an NFS mount serves one commit "
            "(remount it to change commits)",
            param_hint="--watch",
        )
    from gitxet.errors import ConfigError
    from gitxet.settings import parse_duration

    try:
        return parse_duration(watch)
    except ConfigError as exc:
        raise typer.BadParameter(str(exc), param_hint="--watch") from None


def _check_branch(rev: str, sha: str) -> None:
    """Refuse ``--watch`` of a commit id: it never moves."""
    low = rev.lower()
    if len(low) >= 4 and not low.strip("0123456789abcdef") and sha.startswith(low):
        raise typer.BadParameter(
            f"--watch follows a branch, and {rev} is a commit id (it never moves)",
            param_hint="COMMIT",
        )


def require_mount(*, load: bool = True) -> None:
    """Fail with one line naming the extra when FUSE mounts cannot run here (``load=False``:
    only that it is installed, for a process that leaves the serving to another)."""
    from gitxet.cli._errors import require

    require("mount", load=load)


def _check_mountpoint(mnt: str, nonempty: bool) -> None:
    if not os.path.isdir(mnt):
        raise typer.BadParameter(f"{mnt} is not a directory", param_hint="MOUNTPOINT")
    if not nonempty and any(True for _ in os.scandir(mnt)):
        raise typer.BadParameter(
            f"{mnt} is not empty: its files would be hidden (pass --nonempty to mount anyway)",
            param_hint="MOUNTPOINT",
        )


def _dead_mount(mnt: str) -> tuple[str, str] | None:
    """(repo, commit) of the dead gitxet mount at ``mnt`` ("" where unknown), else ``None``.

    A live mount there is refused later (by the daemon start); a dead one (its daemon gone,
    "Transport endpoint is not connected") can be repaired.
    """
    from gitxet.mount.runner import HEALTH_DEAD, HEALTH_OK, find_mount, mount_health

    entry = find_mount(mnt)
    if entry is None or not entry.source.startswith("gitxet:"):
        return None
    rec = _registry().get(mnt)
    health = mount_health(mnt)
    if rec is not None and health == HEALTH_OK:
        from gitxet.mount.runner import process_alive

        if not process_alive(rec.pid, rec.start_time):
            health = HEALTH_DEAD  # served by an orphan nobody manages: replace it
    if health != HEALTH_DEAD:
        return None
    if rec is not None:
        return rec.repo, rec.watch or rec.commit  # a watched mount: its branch
    return "", entry.source.removeprefix("gitxet:")


def _location(repo: str) -> str:
    """``repo`` as records and listings show it: a local path made absolute (it must mean
    the same from any directory), a URL without credentials."""
    return strip_credentials(repo) if "://" in repo else os.path.abspath(repo)


def _repair_dead(mnt: str, dead: tuple[str, str], repo: str, sha: str, nonempty: bool) -> None:
    from gitxet.errors import MountError
    from gitxet.mount.runner import unmount

    old_repo, old_commit = dead
    same_repo = not old_repo or old_repo == _location(repo)
    if not (same_repo and old_commit and sha.startswith(old_commit)):
        shown = f"{old_repo or 'a repository'} at {old_commit[:12] or '?'}"
        raise MountError(
            mnt,
            f"a dead gitxet mount of {shown} is there; "
            f"'git xet unmount {mnt}' first to mount something else",
        )
    unmount(mnt, lazy=True, registry=_registry())
    _check_mountpoint(mnt, nonempty)
    typer.echo(f"git-xet: detached the dead mount at {mnt}; mounting again", err=True)


def _log_path(mnt: str) -> str:
    from gitxet.mount.runner import log_path_for

    logs = os.path.join(_state_dir(), "logs")
    os.makedirs(logs, exist_ok=True)
    return log_path_for(logs, mnt)


def _record_daemon(  # type: ignore[no-untyped-def]
    proc,
    repo: str,
    sha: str,
    cache_dir: str | None,
    subdir: str | None,
    metrics: str | None,
    watch: str = "",
) -> None:
    from gitxet.mount.runner import MountRecord
    from gitxet.settings import cache_root

    _registry().record(
        MountRecord.for_process(
            proc,
            kind="fuse",
            repo=_location(repo),  # records never carry credentials
            commit=sha,
            cache_dir=cache_root(cache_dir),
            subdir=(subdir or "").strip("/"),
            metrics=metrics or "",
            watch=watch,
        )
    )
    typer.echo(
        f"git-xet: mounted at {proc.mountpoint} (pid {proc.pid}); "
        f"'git xet unmount {proc.mountpoint}' to stop",
        err=True,
    )


def _mount_nfs(fs, sha: str, mnt: str) -> None:  # type: ignore[no-untyped-def]
    import subprocess

    from gitxet.mount.nfs.handle import fsid_for
    from gitxet.mount.nfs.server import NFSServer

    server = NFSServer(fs, "127.0.0.1", 0, None, fsid=fsid_for(sha))
    server.start()
    port = server.nfs_port
    opts = f"vers=3,tcp,nolock,port={port},mountport={port},ro"
    r = subprocess.run(
        ["mount", "-t", "nfs", "-o", opts, "127.0.0.1:/", mnt],
        capture_output=True,
        text=True,
        check=False,
    )
    if r.returncode != 0:
        server.stop()
        msg = (r.stderr or r.stdout).strip().splitlines()
        raise typer.BadParameter(
            f"the OS NFS mount failed: {msg[-1] if msg else r.returncode} "
            "(no kernel NFS client? use 'git xet nfs-serve' and mount from elsewhere)"
        )
    typer.echo(f"git-xet: NFS mount at {mnt} (port {port}); serving until interrupted", err=True)
    _wait_for_signal()
    subprocess.run(["umount", mnt], check=False)
    server.stop()


def _wait_for_signal() -> None:
    done = threading.Event()
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, lambda *_: done.set())
    while not done.wait(3600):
        pass


def nfs_serve_cmd(
    repo: Annotated[
        str, typer.Argument(help="Repository: working/bare repo, file:// or http(s) URL.")
    ],
    commit: Annotated[str, typer.Argument(help="Branch, tag or commit sha.")],
    port: Annotated[
        int, typer.Option(min=0, max=65535, help="TCP port for NFS and MOUNT (0: any free port).")
    ] = 0,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    subdir: Annotated[str | None, typer.Option("--subdir", help="Serve only this subtree.")] = None,
    cache_dir: CacheDirOpt = None,
    cache_size: CacheSizeOpt = None,
    offline: OfflineOpt = False,
    cas_url: CasUrlOpt = None,
) -> None:
    """Serve a commit over NFSv3 only (no OS mount); prints an nfs:// URL."""
    from gitxet.mount.nfs.handle import fsid_for
    from gitxet.mount.nfs.server import NFSServer

    _, sha, fs = _open_fs(
        repo, commit, subdir, (cache_dir, cache_size, offline, None, cas_url, None)
    )
    server = NFSServer(fs, host, port, None, fsid=fsid_for(sha))
    server.start()
    typer.echo(f"git-xet: {strip_credentials(repo)} at {commit} = commit {sha}", err=True)
    typer.echo(server.url, err=False)
    sys.stdout.flush()
    try:
        _wait_for_signal()
    finally:
        server.stop()
        fs.close()


def unmount_cmd(
    mountpoint: Annotated[str, typer.Argument(help="A gitxet mountpoint.")],
    lazy: Annotated[bool, typer.Option("--lazy", "-z", help="Detach even if busy.")] = False,
) -> None:
    """Unmount a gitxet mount and stop the process serving it."""
    from gitxet.errors import MountError, NotFoundError
    from gitxet.mount.runner import BUSY, find_mount, normalize_mountpoint, unmount

    mnt = normalize_mountpoint(os.path.abspath(mountpoint))
    registry = _registry()
    rec = registry.get(mnt)
    entry = find_mount(mnt)
    if rec is None and (entry is None or not entry.source.startswith("gitxet:")):
        what = f" ({entry.fstype} is mounted there)" if entry is not None else ""
        raise NotFoundError(f"no gitxet mount at {mnt}{what}; 'git xet mounts' lists them")
    try:
        unmount(mnt, lazy=lazy, registry=registry)
    except MountError as exc:
        if exc.reason != BUSY:
            raise
        raise MountError(mnt, f"{BUSY} ('git xet unmount --lazy {mnt}' detaches it now)") from None
    done = "unmounted" if entry is not None else "removed the record of the ended mount at"
    typer.echo(f"git-xet: {done} {mnt}", err=True)


def mounts_cmd(
    as_json: Annotated[
        bool, typer.Option("--json", help="One JSON object per mount (JSON Lines).")
    ] = False,
) -> None:
    """List gitxet mounts: mountpoint, state, kind, commit, subdir, repo, pid, data source.

    STATE is ``ok``, ``dead`` (its daemon is gone: reads fail with "Transport endpoint is not
    connected"; the line says how to repair it) or ``hung`` (it does not answer). A mount of
    an http(s) repository reads through the shared chunk cache, whose use is shown; a mount
    of a local repository reads that repository's own store.
    """
    from gitxet.cli._progress import human_size
    from gitxet.data.remote_source import node_cache_bytes
    from gitxet.mount.runner import (
        HEALTH_DEAD,
        mount_health,
        serving_pid,
        unrecorded_gitxet_mounts,
    )

    usage: dict[str, int] = {}
    statuses = _registry().statuses()
    for st in statuses:
        rec = st.record
        remote = rec.repo.startswith(("http://", "https://"))
        if remote and rec.cache_dir not in usage:
            usage[rec.cache_dir] = node_cache_bytes(rec.cache_dir)
        cached = usage.get(rec.cache_dir, 0) if remote else None
        fix = _fix_for(st.state, rec.mountpoint, rec.repo, rec.watch or rec.commit, rec.subdir)
        if rec.watch and fix:
            fix = fix.replace("git xet mount ", "git xet mount --watch ", 1)
        # a supervised mount: the record names the supervisor, which serves through a child
        child = serving_pid(rec.pid) if rec.kind == "fuse" else None
        pid, supervisor = (child, rec.pid) if child is not None else (rec.pid, None)
        summary = _summary(rec.log_path)
        commit = _served(rec)
        if as_json:
            _json.emit(
                "mounts",
                {
                    "mountpoint": rec.mountpoint,
                    "state": st.state,
                    "pid": pid,
                    "supervisor_pid": supervisor,
                    "kind": rec.kind,
                    "repo": rec.repo,
                    "commit": commit,
                    "subdir": rec.subdir,
                    "data": "chunk cache" if remote else "local store",
                    "cache_dir": rec.cache_dir if remote else None,
                    "cache_bytes": cached,
                    "log": rec.log_path,
                    "metrics": rec.metrics or None,
                    "watch": rec.watch or None,
                    "fix": fix,
                    "stats": asdict(summary) if summary is not None else None,
                },
            )
        else:
            data = (
                f"cache {human_size(cached)} in {rec.cache_dir}"
                if cached is not None
                else "data from the repository's store"
            )
            where = f"{commit[:12]}" + (f":/{rec.subdir}" if rec.subdir else "")
            if rec.watch:
                where += f" (following {rec.watch})"
            who = f"pid {pid}" + (f" (supervisor {supervisor})" if supervisor else "")
            typer.echo(
                f"{rec.mountpoint}\t{st.state}\t{rec.kind}\t{where}\t{rec.repo}\t{who}\t{data}"
            )
            if summary is not None:
                typer.echo(f"  {_summary_line(summary, rec.metrics)}")
            if fix:
                typer.echo(f"  {fix}")
    # gitxet mounts nobody recorded (another state dir, a crashed plugin): shown when dead,
    # since then they only get in the way
    for entry in unrecorded_gitxet_mounts([st.record.mountpoint for st in statuses]):
        if mount_health(entry.mountpoint) != HEALTH_DEAD:
            continue
        fix = _fix_for(HEALTH_DEAD, entry.mountpoint, "", "", "")
        if as_json:
            commit = entry.source.removeprefix("gitxet:")
            _json.emit(
                "mounts",
                {"mountpoint": entry.mountpoint, "state": HEALTH_DEAD, "commit": commit}
                | {"fix": fix},
            )
        else:
            typer.echo(f"{entry.mountpoint}\t{HEALTH_DEAD}\tfuse\t{entry.source}\t(no record)")
            typer.echo(f"  {fix}")


def _served(rec) -> str:  # type: ignore[no-untyped-def]
    """The commit a mount serves now: a watched mount's daemon records it as it switches."""
    if not rec.watch or not rec.log_path:
        return str(rec.commit)
    from gitxet.mount.follow import read_state, state_file_for

    state = read_state(state_file_for(rec.log_path))
    return state[1] if state is not None else str(rec.commit)


def _summary(log_path: str):  # type: ignore[no-untyped-def]
    """The counters a mount daemon last wrote beside its log, or ``None``."""
    if not log_path:
        return None
    try:
        from gitxet.mount.metrics import read_summary
        from gitxet.mount.runner import metrics_file_for

        with open(metrics_file_for(log_path), encoding="utf-8") as f:
            return read_summary(f.read(1 << 20))
    except (ImportError, OSError, ValueError):
        return None


def _summary_line(s, endpoint: str) -> str:  # type: ignore[no-untyped-def]
    from gitxet.cli._progress import human_size

    line = f"read {human_size(int(s.read_bytes))} in {int(s.reads):,} reads"
    if s.read_errors:
        line += f" ({int(s.read_errors):,} failed)"
    lookups = s.cache_hits + s.cache_misses
    if lookups:
        line += f"; cache {100 * s.cache_hits / lookups:.0f}% hits"
        line += f", fetched {human_size(int(s.fetched_bytes))}"
    if endpoint:
        line += f"; metrics at http://{endpoint}/metrics"
    return line


def _fix_for(state: str, mnt: str, repo: str, commit: str, subdir: str) -> str:
    """What to run about a mount in ``state`` ("" when nothing is wrong)."""
    from gitxet.mount.runner import HEALTH_DEAD, HEALTH_HUNG, HEALTH_ORPHAN

    if state == HEALTH_DEAD:
        again = ""
        if repo:
            sub = f" --subdir {subdir}" if subdir else ""
            again = f"'git xet mount{sub} {repo} {commit} {mnt}' to repair, or "
        return f"the mount's daemon is gone: {again}'git xet unmount {mnt}' to remove it"
    if state == HEALTH_ORPHAN:
        return (
            "its supervisor is gone: reads work, but a crash would not be repaired; "
            f"'git xet unmount {mnt}' and mount again to get failover back"
        )
    if state == HEALTH_HUNG:
        return f"the mount does not answer: 'git xet unmount --lazy {mnt}' to detach it"
    return ""


def warmup_cmd(
    repo: Annotated[
        str, typer.Argument(help="Repository: working/bare repo, file:// or http(s) URL.")
    ],
    commit: Annotated[str, typer.Argument(help="Branch, tag or commit sha.")],
    paths: Annotated[
        list[str] | None, typer.Argument(help="Files or directories (default: all).")
    ] = None,
    cache_dir: CacheDirOpt = None,
    cache_size: CacheSizeOpt = None,
    cas_url: Annotated[
        str | None,
        typer.Option(
            "--cas-url",
            help="Fill this cache tier (git xet serve --upstream) instead of the local cache: "
            "every range is fetched through it (verified here, not kept); REPO must be http(s).",
        ),
    ] = None,
) -> None:
    """Fetch and verify the given paths of a commit into the shared cache, so later
    mounts (also --offline ones) are served from it; with --cas-url, into a cache tier,
    so the nodes reading through it later make the origin serve nothing."""
    from gitxet.cli._progress import byte_progress
    from gitxet.vfs.nodes import NodeKind

    if cas_url is not None and not repo.startswith(("http://", "https://")):
        raise typer.BadParameter(
            "a cache tier caches an http(s) repository: give its URL", param_hint="REPO"
        )
    _, sha, fs = _open_fs(repo, commit, None, (cache_dir, cache_size, False, None, cas_url, None))
    todo: list[int] = []

    def walk(ino: int) -> None:
        for _, a in fs.readdir(ino):
            if a.kind is NodeKind.DIR:
                walk(a.ino)
            elif a.kind is NodeKind.FILE:
                todo.append(a.ino)

    for p in paths or [""]:
        a = fs.resolve_path(os.fsencode(p.strip("/"))) if p.strip("/") else fs.getattr(fs.root_ino)
        if a.kind is NodeKind.DIR:
            walk(a.ino)
        else:
            todo.append(a.ino)
    if cas_url is not None:
        _warm_tier(repo, cas_url, cache_dir, cache_size, fs, todo, sha)
        return
    total = sum(fs.getattr(i).size for i in todo)
    with byte_progress("warming", total) as advance:
        for ino in todo:
            off = 0
            size = fs.getattr(ino).size
            while off < size:
                n = len(fs.read(ino, off, 8 << 20))
                if n == 0:
                    break
                off += n
                advance(n)
    typer.echo(f"git-xet: {len(todo)} files, {total:,} bytes verified at {sha[:12]}", err=True)


def _warm_tier(  # type: ignore[no-untyped-def]
    repo: str,
    cas_url: str,
    cache_dir: str | None,
    cache_size: str | None,
    fs,
    todo: list[int],
    sha: str,
) -> None:
    """Fetch every range of the pointer files ``todo`` through the tier (which keeps them),
    verifying them here without keeping them; never from the origin."""
    from gitxet.cli._env import http_access
    from gitxet.cli._progress import byte_progress
    from gitxet.data.remote_source import HttpCASRemote
    from gitxet.hashing import from_hex

    pointers = [ptr for ptr in (fs.pointer(i) for i in todo) if ptr is not None]
    hashes = list(dict.fromkeys(from_hex(ptr.xet_hash) for ptr in pointers if ptr.size))
    access = http_access(cache_dir, cache_size, cas_url=cas_url)
    assert access.remote_factory is not None
    remote = access.remote_factory(repo)
    source = remote.tier_source() if isinstance(remote, HttpCASRemote) else None
    if source is None:
        raise typer.BadParameter(f"{strip_credentials(repo)} has no CAS a tier can cache")
    total = sum(ptr.size for ptr in {ptr.xet_hash: ptr for ptr in pointers}.values())
    try:
        with byte_progress("warming the tier", total) as advance:
            moved = source.warm(hashes, advance, store=False)
    finally:
        source.close()
    typer.echo(
        f"git-xet: {len(hashes)} files, {moved:,} bytes through the tier {cas_url} "
        f"at {sha[:12]} (verified)",
        err=True,
    )
