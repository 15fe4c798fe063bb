"""The Mounter boundary: what the Docker and CSI plugins use to mount a commit somewhere.

A plugin asks for "this repo at this commit (and subdir) on that target" and gets a live,
read-only mount back, or a :class:`~gitxet.errors.MountError` saying why not. How the
mount is made is the Mounter's business; :class:`SubprocessMounter` runs one
``git-xet mount --foreground`` daemon per target.

Each daemon runs in its own session (``gitxet.mount.runner.start_background``), so it is
not a child that dies with the plugin: restarting the plugin leaves mounts serving. The
mounter writes one JSON record per target under its state dir; after a restart
:meth:`SubprocessMounter.recover` adopts the mounts whose daemon still serves and remounts
the ones whose daemon died (pinned to the recorded commit sha, so a moved branch never
changes what a volume shows).

Tokens (for http(s) repositories) reach the daemon through a token file only: never argv
(visible in ``ps``), never a record or a log, never the node's disk. The mounter writes the
spec's token to a file in memory (``/dev/shm/gitxet-tokens-<state>/<target>``, 0600 in a
0700 directory, removed at unmount) and the daemon gets its path (``GITXET_TOKEN_FILE``); a
spec naming its own ``token_file`` (a Docker volume's operator-provided file) is handed over
as it is. The daemon re-reads the
file whenever it changes, so mounting the same spec again with a new token
(:meth:`SubprocessMounter.mount`, what a CSI republish does) rotates the token of the
running mount without unmounting. A remount after a restart needs the token handed back
to ``recover``.
"""

from __future__ import annotations

import builtins
import contextlib
import json
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from gitxet.dataset import HttpAccess
from gitxet.errors import (
    AuthError,
    ConfigError,
    FormatError,
    GitError,
    GitxetError,
    MountError,
    MountSpecError,
    NotFoundError,
    RemoteError,
    RepoUnavailableError,
)
from gitxet.formats.record import check_record, load_json_object
from gitxet.mount import runner
from gitxet.settings import (
    CACHE_DIR_ENV,
    CACHE_SIZE_ENV,
    CAS_URL_ENV,
    PREFETCH_ENV,
    TOKEN_ENV,
    TOKEN_FILE_ENV,
    check_cas_url,
    is_size,
    split_credentials,
)
from gitxet.util.atomic import atomic_write
from gitxet.util.records import RecordDir, record_name

# The environment of mount daemons when the caller gives none: enough to find git and
# fusermount3, and nothing inherited by accident (library code does not read os.environ).
DEFAULT_ENV: Mapping[str, str] = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "LANG": "C.UTF-8",
}

_RECORD_VERSION = 1
_RECORD_MAX_BYTES = 64 * 1024
_FULL_SHA = re.compile(r"[0-9a-f]{40}")
_MAX_FIELD = 4096  # no spec field is longer than a path


# ---- the boundary ----------------------------------------------------------------------------


@dataclass(frozen=True)
class MountSpec:
    """What to mount: a repository at a commit (branch, tag or sha), optionally one subdir.

    ``token`` authenticates against http(s) repositories; ``cache_size`` (e.g. ``"10GiB"``)
    and ``prefetch`` (a mount daemon hint) tune the node cache; ``cas`` is a cache tier the
    daemon reads file data through (``GITXET_CAS_URL``). ``token_file`` (an absolute path)
    is read by the daemon instead of ``token``, again whenever it changes.
    """

    repo: str
    commit: str
    subdir: str = ""
    token: str | None = field(default=None, repr=False)  # repr=False: never in a log line
    cache_size: str | None = None
    prefetch: str | None = None
    cas: str | None = None
    token_file: str | None = None

    def secured(self) -> MountSpec:
        """The same spec with credentials moved out of the repo URL into ``token`` (an
        explicit token wins): what argv, records and logs may carry."""
        repo, url_token = split_credentials(self.repo)
        if url_token is None:
            return self
        return replace(self, repo=repo, token=self.token or url_token)

    def without_token(self) -> MountSpec:
        """The same spec with the token dropped (what records and listings carry)."""
        return self if self.token is None else replace(self, token=None)


@dataclass(frozen=True)
class MountInfo:
    """A live mount: where, of what (token always dropped), which commit, served by which pid."""

    target: str
    spec: MountSpec
    commit_sha: str
    pid: int


class Mounter(Protocol):
    """Makes and removes read-only dataset mounts (the plugins' only way to mount)."""

    def mount(self, spec: MountSpec, target: str, *, timeout: float = 60) -> MountInfo:
        """Mount ``spec`` on ``target`` and wait until it really serves.

        Mounting the same spec again on the same target returns the existing mount; a
        different spec there raises. Raises :class:`MountSpecError` for bad input (nothing is
        left behind) and :class:`MountError` with the reason for every other failure.
        """
        ...

    def unmount(self, target: str) -> None:
        """Unmount ``target`` and stop its daemon; nothing mounted there is fine."""
        ...

    def list(self) -> builtins.list[MountInfo]:
        """The live mounts this mounter made, by target."""
        ...

    def is_mounted(self, target: str) -> bool:
        """Whether a live mount of this mounter serves ``target`` (a dead one does not)."""
        ...

    def health(self, target: str) -> str:
        """``ok``, ``dead`` (recorded and still in the mount table, but its daemon or FUSE
        connection is gone), ``hung`` or ``absent`` (``gitxet.mount.runner.HEALTH_*``)."""
        ...


@dataclass(frozen=True)
class RecoveryReport:
    """What :meth:`SubprocessMounter.recover` did with each recorded mount."""

    adopted: builtins.list[MountInfo]  # daemon still serving: kept as is
    remounted: builtins.list[MountInfo]  # daemon was dead: mounted again
    failed: dict[str, str]  # target -> why it could not be remounted (record kept)


# ---- spec checks -----------------------------------------------------------------------------


def validate_spec(spec: MountSpec, target: str = "") -> None:
    """Raise :class:`MountSpecError` naming the first field of ``spec`` that is malformed."""
    where = target or "mount"
    fields = ("repo", "commit", "subdir", "cache_size", "prefetch", "cas", "token", "token_file")
    for name in fields:
        value = getattr(spec, name)
        if value is None:
            continue
        if not isinstance(value, str):
            raise MountSpecError(where, name, "must be a string")
        if len(value) > _MAX_FIELD:
            raise MountSpecError(where, name, f"longer than {_MAX_FIELD} characters")
        if "\0" in value or (name != "token" and ("\n" in value or "\r" in value)):
            raise MountSpecError(where, name, "contains a NUL or newline character")
    if not spec.repo.strip():
        raise MountSpecError(where, "repo", "is required")
    if not spec.commit.strip():
        raise MountSpecError(where, "commit", "is required")
    if spec.commit.startswith("-"):
        raise MountSpecError(where, "commit", f"{spec.commit!r} is not a revision")
    if spec.subdir:
        parts = spec.subdir.strip("/").split("/")
        if spec.subdir.startswith("/") or any(p in ("", ".", "..") for p in parts):
            raise MountSpecError(
                where, "subdir", f"{spec.subdir!r} must be a relative path without '.' or '..'"
            )
    # the one size grammar (gitxet.settings): what is accepted here, the daemon can parse
    for name in ("cache_size", "prefetch"):
        value = getattr(spec, name)
        if value is not None and not is_size(value):
            raise MountSpecError(where, name, f"{value!r} is not a size like 10GiB or 512M")
    if spec.cas is not None:
        try:
            check_cas_url(spec.cas)
        except ConfigError as exc:
            raise MountSpecError(where, "cas", str(exc)) from None
    if spec.token is not None and not spec.token.strip():
        raise MountSpecError(where, "token", "is empty")
    if spec.token_file is not None:
        if not os.path.isabs(spec.token_file):
            raise MountSpecError(where, "token_file", "must be an absolute path")
        if spec.token is not None:
            raise MountSpecError(where, "token_file", "give either a token or a token file")


def resolve_local(spec: MountSpec, access: HttpAccess | None = None) -> str:
    """Full commit sha of ``spec.commit`` in ``spec.repo`` (through the one resolver,
    :mod:`gitxet.dataset`), after checking that ``spec.subdir`` is a directory there.

    Local paths and file:// URLs need nothing else; http(s) repositories need ``access``
    (cache and credentials), which the plugin's command line builds.
    """
    from gitxet.dataset import open_dataset

    try:
        ds = open_dataset(spec.repo, access)
    except NotFoundError as exc:
        raise MountSpecError(spec.repo, "repo", str(exc)) from None
    except AuthError as exc:
        raise MountError(spec.repo, f"access denied: {exc}", returncode=5) from None
    except (GitError, RemoteError) as exc:
        # a server that is down or unreachable: a caller may retry (CSI: UNAVAILABLE)
        raise RepoUnavailableError(spec.repo, str(exc)) from None
    try:
        sha = ds.resolve(spec.commit)
    except NotFoundError as exc:
        raise MountSpecError(spec.repo, "commit", str(exc)) from None
    try:
        # checked here so a missing subdir is a clear "bad subdir" before any daemon runs
        ds.check_subdir(sha, spec.subdir)
    except NotFoundError as exc:
        raise MountSpecError(spec.repo, "subdir", str(exc)) from None
    return sha


# ---- records ---------------------------------------------------------------------------------


_RECORD_TYPES: dict[str, tuple[type, ...]] = {
    "target": (str,),
    "repo": (str,),
    "commit": (str,),
    "subdir": (str,),
    "cache_size": (str, type(None)),
    "prefetch": (str, type(None)),
    "cas": (str, type(None)),
    "token_file": (str, type(None)),
    "commit_sha": (str,),
    "pid": (int,),
    "start_time": (int,),
    "log_path": (str,),
    "started_at": (float, int),
}


@dataclass(frozen=True)
class _Record:
    target: str
    spec: MountSpec  # without token
    commit_sha: str
    pid: int
    start_time: int
    log_path: str
    started_at: float

    def info(self) -> MountInfo:
        return MountInfo(self.target, self.spec, self.commit_sha, self.pid)

    def to_json(self) -> bytes:
        body: dict[str, Any] = {
            "version": _RECORD_VERSION,
            "target": self.target,
            "repo": self.spec.repo,
            "commit": self.spec.commit,
            "subdir": self.spec.subdir,
            "cache_size": self.spec.cache_size,
            "prefetch": self.spec.prefetch,
            "cas": self.spec.cas,
            "token_file": self.spec.token_file,
            "commit_sha": self.commit_sha,
            "pid": self.pid,
            "start_time": self.start_time,
            "log_path": self.log_path,
            "started_at": self.started_at,
        }
        return json.dumps(body, sort_keys=True, indent=1).encode("utf-8") + b"\n"

    @classmethod
    def from_json(cls, data: bytes, what: str) -> _Record:
        raw = load_json_object(data, what, max_bytes=_RECORD_MAX_BYTES)
        raw.setdefault("cas", None)  # records written before cache tiers
        raw.setdefault("token_file", None)  # ... and before token files
        body = check_record(raw, what, version=_RECORD_VERSION, types=_RECORD_TYPES)
        if not _FULL_SHA.fullmatch(body["commit_sha"]):
            raise FormatError(what, "commit_sha is not a full sha")
        if body["pid"] <= 0 or body["start_time"] < 0:
            raise FormatError(what, "bad pid or start time")
        if not os.path.isabs(body["target"]):
            raise FormatError(what, "target is not an absolute path")
        spec = MountSpec(
            repo=body["repo"],
            commit=body["commit"],
            subdir=body["subdir"],
            cache_size=body["cache_size"],
            prefetch=body["prefetch"],
            cas=body["cas"],
            token_file=body["token_file"],
        )
        return cls(
            target=body["target"],
            spec=spec,
            commit_sha=body["commit_sha"],
            pid=body["pid"],
            start_time=body["start_time"],
            log_path=body["log_path"],
            started_at=float(body["started_at"]),
        )


def _record_live(rec: _Record, mounted: set[str], *, probe: bool = False) -> bool:
    # The process check comes first: it also reaps a daemon of ours that exited (no zombies
    # in a long-running plugin). ``probe`` also asks the mount one stat(): a daemon that
    # runs but whose FUSE connection is gone (aborted) serves nothing either.
    if not (runner.process_alive(rec.pid, rec.start_time) and rec.target in mounted):
        return False
    return not probe or runner.mount_health(rec.target) != runner.HEALTH_DEAD


# ---- the subprocess mounter ------------------------------------------------------------------


def _memory_dir(state_dir: str) -> str:
    """The directory in memory (``/dev/shm``, else the state dir) for the token files of
    the mounter of ``state_dir``."""
    shm = "/dev/shm"
    if not os.path.isdir(shm):
        return os.path.join(state_dir, "tokens")
    return os.path.join(shm, f"gitxet-tokens-{record_name(state_dir)[:16]}")


class SubprocessMounter:
    """Mounts through detached ``git-xet mount --foreground`` daemons; state under ``state_dir``.

    ``state_dir`` holds ``mounts/`` (one record per target), ``logs/`` (one daemon log per
    target) and ``cache/`` (the node cache directory handed to every daemon). ``program`` is
    the command that runs ``git-xet``; ``env`` the daemons' base environment (default: a
    minimal PATH). ``resolve`` maps a spec to a full commit sha (default: the local/file://
    resolver); ``allow_other`` lets other users (container processes) read the mounts
    (default: only when running as root, where FUSE allows it without configuration);
    ``tokens_dir`` where the daemons' token files are kept (default: in memory, see the
    module docstring).
    """

    def __init__(
        self,
        state_dir: str,
        *,
        program: Sequence[str] = (sys.executable, "-m", "gitxet"),
        env: Mapping[str, str] | None = None,
        resolve: Callable[[MountSpec], str] | None = None,
        allow_other: bool | None = None,
        tokens_dir: str | None = None,
    ) -> None:
        self.state_dir = os.path.abspath(state_dir)
        self.program = tuple(program)
        self.env = dict(DEFAULT_ENV if env is None else env)
        self._resolve = resolve or resolve_local
        self.allow_other = (os.geteuid() == 0) if allow_other is None else allow_other
        self._records: RecordDir[_Record] = RecordDir(
            os.path.join(self.state_dir, "mounts"),
            key=lambda r: r.target,
            load=_Record.from_json,
            dump=_Record.to_json,
            max_bytes=_RECORD_MAX_BYTES,
        )
        self._logs = os.path.join(self.state_dir, "logs")
        # a marker per target whose daemon is being started (no record yet): what a mounter
        # killed in between left mounted there is its own orphan, not someone else's mount
        self._starting = os.path.join(self.state_dir, "starting")
        self._tokens = tokens_dir if tokens_dir is not None else _memory_dir(self.state_dir)
        self.cache_dir = os.path.join(self.state_dir, "cache")
        self._locks: dict[str, threading.Lock] = {}
        self._locks_guard = threading.Lock()

    def set_resolver(self, resolve: Callable[[MountSpec], str]) -> None:
        """Replace the spec resolver (e.g. one that reaches http(s) repos via the node cache)."""
        self._resolve = resolve

    def _lock(self, target: str) -> threading.Lock:
        # One lock per target: a slow mount of one volume never holds up another.
        with self._locks_guard:
            return self._locks.setdefault(target, threading.Lock())

    # -- the Mounter protocol

    def mount(self, spec: MountSpec, target: str, *, timeout: float = 60) -> MountInfo:
        """See :meth:`Mounter.mount`."""
        mnt = runner.normalize_mountpoint(target)
        validate_spec(spec, mnt)
        spec = spec.secured()
        with self._lock(mnt):
            existing = self._records.get(mnt)
            if existing is not None:
                if _record_live(existing, self._mounted(), probe=True):
                    return self._same_or_raise(existing, spec, mnt)
                self._clear_stale(existing)  # a dead mount: detached, then mounted anew
            elif runner.is_mounted(mnt) and not self._drop_orphan(mnt):
                raise MountError(mnt, "something else is already mounted there")
            # Resolved even when given a full sha: an unknown repo or commit is then a clear
            # MountSpecError before any daemon starts, not a daemon log tail.
            try:
                sha = self._resolve(spec)
            except MountSpecError as exc:
                raise MountSpecError(mnt, exc.field, exc.detail) from None
            except RepoUnavailableError as exc:
                raise RepoUnavailableError(mnt, exc.reason) from None
            except MountError as exc:
                raise MountError(mnt, exc.reason, returncode=exc.returncode) from None
            except GitxetError as exc:
                raise MountError(mnt, f"cannot resolve {spec.commit!r}: {exc}") from None
            return self._start(spec, sha, mnt, timeout).info()

    def _same_or_raise(self, rec: _Record, spec: MountSpec, mnt: str) -> MountInfo:
        want = spec.without_token()
        have = rec.spec
        same_commit = spec.commit in (have.commit, rec.commit_sha)
        if (
            want.repo == have.repo
            and same_commit
            and want.subdir.strip("/") == have.subdir.strip("/")
            and want.cache_size == have.cache_size
            and want.prefetch == have.prefetch
            and want.cas == have.cas
            and want.token_file == have.token_file
        ):
            if spec.token is not None:
                self._write_token(mnt, spec.token)  # a new token reaches the running daemon
            return rec.info()
        raise MountError(
            mnt, f"already mounted with another spec ({have.repo} at {rec.commit_sha[:12]})"
        )

    def _token_path(self, mnt: str) -> str:
        return os.path.join(self._tokens, record_name(mnt))

    def _write_token(self, mnt: str, token: str) -> None:
        """Store the token of the mount at ``mnt`` where its daemon reads it (0600); an
        unchanged token is not rewritten (the daemon re-reads only changed files)."""
        path = self._token_path(mnt)
        try:
            with open(path, "rb") as f:
                if f.read(len(token) + 2).strip() == token.encode("utf-8"):
                    return
        except OSError:
            pass
        os.makedirs(self._tokens, mode=0o700, exist_ok=True)
        atomic_write(path, token.encode("utf-8") + b"\n", mode=0o600)

    def _drop_token(self, mnt: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._token_path(mnt))

    def _daemon_env(self, spec: MountSpec, mnt: str) -> dict[str, str]:
        env = dict(self.env)
        env.pop(TOKEN_ENV, None)
        env.pop(TOKEN_FILE_ENV, None)
        if spec.token_file is not None:
            env[TOKEN_FILE_ENV] = spec.token_file
        elif spec.token is not None:
            self._write_token(mnt, spec.token)
            env[TOKEN_FILE_ENV] = self._token_path(mnt)
        env[CACHE_DIR_ENV] = self.cache_dir
        for name, value in (
            (CACHE_SIZE_ENV, spec.cache_size),
            (PREFETCH_ENV, spec.prefetch),
            (CAS_URL_ENV, spec.cas),
        ):
            if value is None:
                env.pop(name, None)
            else:
                env[name] = value
        return env

    def _starting_marker(self, mnt: str) -> str:
        return os.path.join(self._starting, record_name(mnt))

    def _drop_orphan(self, mnt: str) -> bool:
        """Detach the gitxet mount at ``mnt`` if this mounter was starting it when it was
        killed (its marker is there, its record never written); True when it is gone. Its
        daemon, a foreground mount, exits once its connection is detached."""
        marker = self._starting_marker(mnt)
        if not os.path.exists(marker):
            return False
        entry = runner.find_mount(mnt)
        if entry is not None:
            if not entry.source.startswith("gitxet:"):
                return False
            try:
                runner.unmount(mnt, lazy=True)
            except MountError:
                return False
        with contextlib.suppress(FileNotFoundError):
            os.unlink(marker)
        return not runner.is_mounted(mnt)

    def _start(self, spec: MountSpec, sha: str, mnt: str, timeout: float) -> _Record:
        try:
            os.makedirs(mnt, exist_ok=True)
            os.makedirs(self._starting, mode=0o700, exist_ok=True)
            atomic_write(self._starting_marker(mnt), mnt.encode("utf-8") + b"\n", mode=0o600)
        except OSError as exc:
            raise MountError(mnt, f"cannot create the mountpoint: {exc}") from None
        os.makedirs(self._logs, mode=0o700, exist_ok=True)
        os.makedirs(self.cache_dir, mode=0o700, exist_ok=True)
        argv = [*self.program, "mount", "--foreground", spec.repo, sha, mnt]
        if spec.subdir.strip("/"):
            argv += ["--subdir", spec.subdir.strip("/")]
        if self.allow_other:
            argv.append("--allow-other")
        try:
            proc = runner.start_background(
                argv,
                mnt,
                timeout=timeout,
                log_path=runner.log_path_for(self._logs, mnt),
                cwd="/",
                env=self._daemon_env(spec, mnt),
            )
        except BaseException:
            self._drop_token(mnt)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._starting_marker(mnt))
            raise
        rec = _Record(
            target=mnt,
            spec=spec.without_token(),
            commit_sha=sha,
            pid=proc.pid,
            start_time=proc.start_time,
            log_path=proc.log_path,
            started_at=proc.started_at,
        )
        try:
            self._records.put(rec)
        except BaseException:
            # A mount nobody has a record of could never be recovered or cleaned: undo it.
            with contextlib.suppress(MountError):
                self._stop(rec)
            raise
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._starting_marker(mnt))
        return rec

    def _mounted(self) -> set[str]:
        return {row.mountpoint for row in runner.mount_table()}

    def _stop(self, rec: _Record, timeout: float = 10.0) -> None:
        """Unmount ``rec.target`` (lazily if busy) and make sure its daemon is gone."""
        if runner.is_mounted(rec.target):
            try:
                runner.unmount(rec.target, timeout=timeout)
            except MountError:
                runner.unmount(rec.target, timeout=timeout, lazy=True)
        deadline = time.monotonic() + timeout
        while runner.process_alive(rec.pid, rec.start_time) and time.monotonic() < deadline:
            time.sleep(0.05)
        if not runner.stop_process(rec.pid, rec.start_time):
            raise MountError(rec.target, f"the mount daemon (pid {rec.pid}) does not exit")
        self._drop_token(rec.target)

    def _clear_stale(self, rec: _Record) -> None:
        """Detach what a dead (or wedged) daemon left at its target and stop the daemon."""
        self._stop(rec)
        self._records.remove(rec.target)

    def unmount(self, target: str) -> None:
        """See :meth:`Mounter.unmount`; only touches targets this mounter mounted."""
        mnt = runner.normalize_mountpoint(target)
        with self._lock(mnt):
            rec = self._records.get(mnt)
            if rec is None:
                return
            self._stop(rec)
            self._records.remove(mnt)

    def list(self) -> builtins.list[MountInfo]:
        """See :meth:`Mounter.list` (records of dead mounts are kept for :meth:`recover`)."""
        mounted = self._mounted()
        return [r.info() for r in self._records.list() if _record_live(r, mounted)]

    def is_mounted(self, target: str) -> bool:
        """See :meth:`Mounter.is_mounted`; a dead mount (its daemon gone) is not mounted."""
        rec = self._records.get(runner.normalize_mountpoint(target))
        return rec is not None and _record_live(rec, self._mounted(), probe=True)

    def health(self, target: str) -> str:
        """A ``runner.HEALTH_*`` value for ``target``: ``absent`` when this mounter has no
        mount there, ``dead`` when its daemon is gone or its connection is."""
        rec = self._records.get(runner.normalize_mountpoint(target))
        if rec is None or rec.target not in self._mounted():
            return runner.HEALTH_ABSENT
        if not runner.process_alive(rec.pid, rec.start_time):
            return runner.HEALTH_DEAD
        return runner.mount_health(rec.target)

    def get(self, target: str) -> MountInfo | None:
        """The recorded mount at ``target`` (live or not), or ``None``."""
        rec = self._records.get(runner.normalize_mountpoint(target))
        return None if rec is None else rec.info()

    def recover(
        self, tokens: Mapping[str, str] | None = None, *, timeout: float = 60
    ) -> RecoveryReport:
        """Adopt recorded mounts that still serve; remount the ones whose daemon died.

        ``tokens`` maps a target to the token its remount needs (records never hold one).
        A remount that fails keeps its record, so a later call can retry.
        """
        adopted: builtins.list[MountInfo] = []
        remounted: builtins.list[MountInfo] = []
        failed: dict[str, str] = {}
        mounted = self._mounted()
        for rec in self._records.list():
            with self._lock(rec.target):
                if _record_live(rec, mounted):
                    adopted.append(rec.info())
                    continue
                token = (tokens or {}).get(rec.target)
                spec = replace(rec.spec, token=token)
                try:
                    self._stop(rec)
                    # The pinned sha is re-checked (the repo may be gone) for a clear reason.
                    self._resolve(replace(spec, commit=rec.commit_sha))
                    remounted.append(self._start(spec, rec.commit_sha, rec.target, timeout).info())
                except (MountError, OSError) as exc:
                    failed[rec.target] = str(exc)
        self.drop_orphans()
        return RecoveryReport(adopted, remounted, failed)

    def drop_orphans(self) -> None:
        """Detach the mounts a killed mounter was starting (never recorded), so that none
        is left behind in the way of the volume's next mount."""
        with contextlib.suppress(FileNotFoundError):
            for name in os.listdir(self._starting):
                try:
                    with open(os.path.join(self._starting, name), "rb") as f:
                        target = f.read(4097).decode("utf-8").strip()
                except (OSError, UnicodeDecodeError):
                    continue
                if record_name(target) == name and self._records.get(target) is None:
                    with self._lock(target):
                        self._drop_orphan(target)
