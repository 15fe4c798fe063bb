"""Docker volume plugin: Docker's VolumeDriver protocol over a unix socket, mounts via a Mounter.

A volume names a repository at a commit (resolved to a sha at Create and pinned there), an
optional subdir and an optional token. Nothing is mounted at Create: the first container
that uses the volume (``/VolumeDriver.Mount``) starts the mount, later ones share it, and
the last ``/VolumeDriver.Unmount`` stops it. Docker tells mounts apart by ``ID``, so the
set of IDs is the reference count, and it is persisted with the rest of the volume's record
(one atomically rewritten file per volume) so a restarted plugin keeps counting where it was.

The HTTP side is the standard library's ``http.server`` on a ``UnixStreamServer``: the
protocol is a handful of small JSON POSTs, the plugin layer may not depend on the server
extra (starlette/uvicorn live in ``gitxet.server`` only), and a threaded stdlib server
keeps a slow mount of one volume from blocking ``docker volume ls``.

Tokens: a ``token`` option is kept in ``secrets/<volume>`` (mode 0600) next to the volume
table, never in the table, a response or a log line. ``token_file`` names a file instead,
which the mount daemon re-reads whenever it changes (a rotated token is used by the running
mount at once); it must lie inside the directory the operator gave the plugin
(``--token-dir``), with no symlink on the way, so a volume option can never make the plugin
read (and send to a server) an arbitrary file of the host.
"""

from __future__ import annotations

import builtins
import contextlib
import datetime
import http.server
import json
import logging
import os
import re
import socketserver
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from gitxet.errors import ConfigError, FormatError, GitxetError, MountError, MountSpecError
from gitxet.formats.record import check_record, load_json_object
from gitxet.mount.runner import mounted_elsewhere, normalize_mountpoint
from gitxet.plugins.mounter import Mounter, MountSpec, resolve_local, validate_spec
from gitxet.settings import read_token_file, split_credentials
from gitxet.util.atomic import atomic_write
from gitxet.util.records import RecordDir
from gitxet.util.statelock import clear_stale_socket

log = logging.getLogger("gitxet.plugins.docker")

CONTENT_TYPE = "application/vnd.docker.plugins.v1.2+json"
OPTIONS = ("repo", "commit", "subdir", "token", "token_file", "cache_size", "prefetch", "cas")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,254}")
_RECORD_VERSION = 1
_RECORD_MAX_BYTES = 1 << 20  # a volume with thousands of mount IDs; refuse anything absurd
_LEGACY_MAX_BYTES = 64 << 20  # the whole-table file of earlier versions
_BODY_MAX_BYTES = 1 << 20  # Docker's requests are a few hundred bytes
_TOKEN_MAX_BYTES = 64 * 1024


class VolumeError(GitxetError):
    """A request Docker made that cannot be honoured; the message goes back in ``Err``."""


@dataclass
class Volume:
    """One volume: what to mount and who uses it (``mount_ids`` is the reference count)."""

    name: str
    repo: str
    commit: str  # as the user gave it
    commit_sha: str  # pinned at Create
    subdir: str = ""
    token_file: str | None = None
    has_token: bool = False  # a token lives in secrets/<name>
    cache_size: str | None = None
    prefetch: str | None = None
    cas: str | None = None  # a cache tier the mount reads file data through
    created_at: float = 0.0
    mount_ids: builtins.list[str] = field(default_factory=builtins.list)

    def status(self) -> dict[str, Any]:
        """What ``docker volume inspect`` shows (no token, only whether there is one)."""
        out: dict[str, Any] = {
            "repo": self.repo,
            "commit": self.commit,
            "commit_sha": self.commit_sha,
            "subdir": self.subdir,
            "mounts": len(self.mount_ids),
            "auth": "token" if self.has_token else "token_file" if self.token_file else "none",
        }
        for key in ("cache_size", "prefetch", "cas"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        return out


_VOLUME_TYPES: dict[str, tuple[type, ...]] = {
    "name": (str,),
    "repo": (str,),
    "commit": (str,),
    "commit_sha": (str,),
    "subdir": (str,),
    "token_file": (str, type(None)),
    "has_token": (bool,),
    "cache_size": (str, type(None)),
    "prefetch": (str, type(None)),
    "cas": (str, type(None)),
    "created_at": (float, int),
    "mount_ids": (list,),
}


def _volume_from_body(body: Any, what: str) -> Volume:
    if isinstance(body, dict):
        body.setdefault("cas", None)  # volumes created before cache tiers
    fields = check_record(body, what, version=_RECORD_VERSION, types=_VOLUME_TYPES)
    if not all(isinstance(i, str) for i in fields["mount_ids"]):
        raise FormatError(what, "mount_ids must be strings")
    if not _NAME.fullmatch(fields["name"]):
        raise FormatError(what, f"bad volume name {fields['name']!r}")
    return Volume(**{**fields, "created_at": float(fields["created_at"])})


def _volume_from_json(data: bytes, what: str) -> Volume:
    return _volume_from_body(load_json_object(data, what, max_bytes=_RECORD_MAX_BYTES), what)


def _volume_to_json(vol: Volume) -> bytes:
    body = {"version": _RECORD_VERSION, **asdict(vol)}
    return json.dumps(body, sort_keys=True, indent=1).encode("utf-8") + b"\n"


class VolumeTable:
    """The persisted volumes: one record per volume plus ``secrets/<name>`` token files.

    ``records/<hash of name>.json`` holds a volume (its mount IDs included), rewritten
    atomically on every change of that volume only. A ``volumes.json`` table written by an
    earlier version is read once (as strictly), turned into records and removed.
    """

    def __init__(self, state_dir: str) -> None:
        self.state_dir = state_dir
        self.records: RecordDir[Volume] = RecordDir(
            os.path.join(state_dir, "records"),
            key=lambda v: v.name,
            load=_volume_from_json,
            dump=_volume_to_json,
            max_bytes=_RECORD_MAX_BYTES,
        )
        self.legacy = os.path.join(state_dir, "volumes.json")
        self.secrets = os.path.join(state_dir, "secrets")

    def load(self) -> dict[str, Volume]:
        """Every volume by name (:class:`FormatError` names a defect); empty if none."""
        self._import_legacy()
        return {vol.name: vol for vol in self.records.list()}

    def _import_legacy(self) -> None:
        try:
            with open(self.legacy, "rb") as f:
                data = f.read(_LEGACY_MAX_BYTES + 1)
        except FileNotFoundError:
            return
        body = load_json_object(data, self.legacy, max_bytes=_LEGACY_MAX_BYTES)
        vols = body.get("volumes")
        if body.get("version") != 1 or set(body) != {"version", "volumes"}:
            raise FormatError(self.legacy, "not a version 1 volume table")
        if not isinstance(vols, list):
            raise FormatError(self.legacy, "bad top-level fields")
        found: dict[str, Volume] = {}
        for item in vols:
            vol = _volume_from_body(
                {"version": _RECORD_VERSION, **item} if isinstance(item, dict) else item,
                self.legacy,
            )
            if vol.name in found:
                raise FormatError(self.legacy, f"volume {vol.name!r} listed twice")
            found[vol.name] = vol
        for vol in found.values():  # a crash midway imports again next time: same records
            self.records.put(vol)
        os.unlink(self.legacy)
        log.info("imported %d volume(s) from %s", len(found), self.legacy)

    def put(self, vol: Volume) -> None:
        """Store (or replace) ``vol``."""
        self.records.put(vol)

    def remove(self, name: str) -> None:
        """Forget volume ``name`` (nothing stored is fine)."""
        self.records.remove(name)

    def put_token(self, name: str, token: str) -> None:
        """Store a volume's token (0600, in a 0700 directory)."""
        os.makedirs(self.secrets, mode=0o700, exist_ok=True)
        os.chmod(self.secrets, 0o700)
        atomic_write(os.path.join(self.secrets, name), token.encode("utf-8"), mode=0o600)

    def get_token(self, name: str) -> str | None:
        """A stored token, or ``None`` when there is none."""
        try:
            return _read_token(os.path.join(self.secrets, name))
        except FileNotFoundError:
            return None

    def drop_token(self, name: str) -> None:
        """Delete a stored token (nothing stored is fine)."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(self.secrets, name))


def _read_token(path: str) -> str:
    try:
        return read_token_file(path)
    except ConfigError as exc:
        raise VolumeError(str(exc)) from None


def check_token_file(path: str, token_dir: str | None) -> str:
    """``path`` if it names a regular file inside ``token_dir`` reached without symlinks,
    else :class:`VolumeError` (also when the operator configured no token directory)."""
    if token_dir is None:
        raise VolumeError(
            "token_file is disabled: start the plugin with --token-dir DIR to allow "
            "token files inside DIR"
        )
    if not os.path.isabs(path):
        raise VolumeError(f"token_file {path!r} must be an absolute path")
    base = os.path.realpath(token_dir)
    clean = os.path.normpath(path)
    if os.path.commonpath([base, clean]) != base or clean == base:
        raise VolumeError(f"token_file {path!r} is outside the token directory {base}")
    # every component below the directory must be a real directory or file, no symlink:
    # a link could point anywhere on the host
    at = base
    for part in os.path.relpath(clean, base).split(os.sep):
        at = os.path.join(at, part)
        try:
            st = os.lstat(at)
        except OSError as exc:
            raise VolumeError(f"cannot read token_file {path}: {exc.strerror}") from None
        if stat.S_ISLNK(st.st_mode):
            raise VolumeError(f"token_file {path!r} goes through a symlink ({at})")
    if not stat.S_ISREG(st.st_mode):
        raise VolumeError(f"token_file {path!r} is not a regular file")
    return clean


def _iso(ts: float) -> str:
    return datetime.datetime.fromtimestamp(ts, datetime.UTC).isoformat().replace("+00:00", "Z")


class VolumeDriver:
    """Docker's VolumeDriver semantics over a :class:`Mounter`; thread-safe.

    ``state_dir`` holds the volume table; each volume mounts at ``<mount_root>/<name>``
    (for a managed plugin, ``mount_root`` is the config's ``propagatedMount``).
    ``resolve`` turns a spec into a full commit sha at Create (default: local repositories
    and file:// URLs). ``token_dir`` is the one directory ``token_file`` options may name
    files in (``None``: token files are refused). ``in_use`` tells whether a container uses
    the mount at a path (``None``: cannot tell); see :meth:`recover`.
    """

    def __init__(
        self,
        mounter: Mounter,
        state_dir: str,
        mount_root: str,
        *,
        resolve: Callable[[MountSpec], str] | None = None,
        mount_timeout: float = 60.0,
        clock: Callable[[], float] = time.time,
        token_dir: str | None = None,
        in_use: Callable[[str], bool | None] = mounted_elsewhere,
    ) -> None:
        self.mounter = mounter
        self.in_use = in_use
        self.token_dir = os.path.abspath(token_dir) if token_dir is not None else None
        self.table = VolumeTable(os.path.abspath(state_dir))
        self.mount_root = normalize_mountpoint(mount_root)
        self.resolve = resolve or resolve_local
        self.mount_timeout = mount_timeout
        self.clock = clock
        self._lock = threading.Lock()  # guards self.volumes and the table file
        self._vol_locks: dict[str, threading.Lock] = {}
        self.volumes = self.table.load()
        # mount IDs recorded by an earlier plugin process: Docker makes no Unmount call it
        # missed again (a container removed while the plugin was down)
        self._restart_ids = {n: set(v.mount_ids) for n, v in self.volumes.items()}

    # -- helpers

    def target(self, name: str) -> str:
        """Where volume ``name`` is mounted."""
        return os.path.join(self.mount_root, name)

    def _vol_lock(self, name: str) -> threading.Lock:
        # Per volume: mounting one volume (seconds) never blocks requests about another.
        with self._lock:
            return self._vol_locks.setdefault(name, threading.Lock())

    def _get(self, name: Any) -> Volume:
        if not isinstance(name, str) or not name:
            raise VolumeError("the request has no volume Name")
        with self._lock:
            vol = self.volumes.get(name)
        if vol is None:
            raise VolumeError(f"no such volume {name!r}")
        return vol

    def _commit(self, vol: Volume | None, name: str) -> None:
        """Store ``vol`` as ``name`` (``None`` deletes): persisted first, then in memory."""
        with self._lock:
            if vol is None:
                self.table.remove(name)
                self.volumes.pop(name, None)
            else:
                self.table.put(vol)
                self.volumes[name] = vol

    def _token(self, vol: Volume) -> str | None:
        if vol.token_file:
            # checked again at every mount: the directory may have changed since Create
            _read_token(check_token_file(vol.token_file, self.token_dir))
            return None  # the daemon reads the file itself, again whenever it changes
        return self.table.get_token(vol.name) if vol.has_token else None

    def _spec(self, vol: Volume, token: str | None) -> MountSpec:
        return MountSpec(
            repo=vol.repo,
            commit=vol.commit_sha,
            subdir=vol.subdir,
            token=token,
            cache_size=vol.cache_size,
            prefetch=vol.prefetch,
            cas=vol.cas,
            token_file=vol.token_file or None,
        )

    def _live(self, vol: Volume) -> bool:
        return self.mounter.is_mounted(self.target(vol.name))

    # -- endpoints

    def activate(self) -> dict[str, Any]:
        """``/Plugin.Activate``."""
        return {"Implements": ["VolumeDriver"]}

    def capabilities(self) -> dict[str, Any]:
        """``/VolumeDriver.Capabilities``: volumes live on this node only."""
        return {"Capabilities": {"Scope": "local"}}

    def create(self, name: Any, opts: Any) -> None:
        """``/VolumeDriver.Create``: validate, resolve the commit, persist; mounts nothing."""
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise VolumeError(
                f"bad volume name {name!r}: use letters, digits, '_', '.', '-' "
                "(starting with a letter or digit)"
            )
        if opts is None:
            opts = {}
        if not isinstance(opts, dict) or not all(isinstance(v, str) for v in opts.values()):
            raise VolumeError("Opts must be a map of strings")
        unknown = sorted(set(opts) - set(OPTIONS))
        if unknown:
            raise VolumeError(f"unknown option(s) {unknown}; known: {', '.join(OPTIONS)}")
        for required in ("repo", "commit"):
            if not opts.get(required, "").strip():
                raise VolumeError(f"option {required!r} is required (-o {required}=...)")
        if "token" in opts and "token_file" in opts:
            raise VolumeError("give either 'token' or 'token_file', not both")
        token = opts.get("token")
        token_file = opts.get("token_file")
        if token_file is not None:
            token_file = check_token_file(token_file, self.token_dir)
            token = _read_token(token_file)
        # credentials in the repo URL move to the token (kept in secrets/, never in the
        # table, argv or a log); an explicit token or token_file wins over them
        repo, url_token = split_credentials(opts["repo"].strip())
        from_url = url_token is not None and token is None
        if from_url:
            token = url_token
        spec = MountSpec(
            repo=repo,
            commit=opts["commit"].strip(),
            subdir=opts.get("subdir", "").strip("/"),
            token=token,
            cache_size=opts.get("cache_size"),
            prefetch=opts.get("prefetch"),
            cas=opts.get("cas"),
        )
        try:
            validate_spec(spec, name)
            sha = self.resolve(spec)
        except MountSpecError as exc:
            raise VolumeError(f"volume {name}: option {exc.field!r}: {exc.detail}") from None
        except GitxetError as exc:
            raise VolumeError(f"volume {name}: {exc}") from None
        vol = Volume(
            name=name,
            repo=spec.repo,
            commit=spec.commit,
            commit_sha=sha,
            subdir=spec.subdir,
            token_file=token_file,
            has_token="token" in opts or from_url,
            cache_size=spec.cache_size,
            prefetch=spec.prefetch,
            cas=spec.cas,
            created_at=self.clock(),
        )
        with self._vol_lock(name):
            with self._lock:
                old = self.volumes.get(name)
            if old is not None:
                # The pinned sha is left out: a branch that moved since does not make a
                # repeated Create different (the volume stays pinned where it was).
                def blank(v: Volume) -> Volume:
                    return replace(v, created_at=0.0, mount_ids=[], commit_sha="")

                same = blank(old) == blank(vol) and (
                    not old.has_token or self.table.get_token(name) == token
                )
                if same:
                    return  # Docker may repeat a Create: same options is a no-op
                raise VolumeError(f"volume {name} already exists with other options")
            if vol.has_token and token is not None:
                self.table.put_token(name, token)
            try:
                self._commit(vol, name)
            except BaseException:
                self.table.drop_token(name)
                raise
        log.info("created volume %s: %s at %s (%s)", name, vol.repo, vol.commit, sha[:12])

    def remove(self, name: Any) -> None:
        """``/VolumeDriver.Remove``: unmount (if mounted) and forget the volume.

        Docker refuses to remove a volume a container still references before it asks the
        driver, so mount IDs still recorded here are Unmount calls Docker made while the
        plugin was down: they are dropped, not obeyed.
        """
        vol = self._get(name)
        with self._vol_lock(vol.name):
            vol = self._get(name)
            if vol.mount_ids:
                log.warning(
                    "volume %s: removing with %d stale mount ID(s) (Unmount calls missed "
                    "while the plugin was down)",
                    vol.name,
                    len(vol.mount_ids),
                )
            target = self.target(vol.name)
            try:
                self.mounter.unmount(target)
            except MountError as exc:
                raise VolumeError(f"volume {vol.name}: {exc}") from None
            self._commit(None, vol.name)
            self.table.drop_token(vol.name)
            with contextlib.suppress(OSError):
                os.rmdir(target)  # only if empty and not mounted: never touches data
        log.info("removed volume %s", vol.name)

    def mount(self, name: Any, mount_id: Any) -> str:
        """``/VolumeDriver.Mount``: mount on first use, count the user, return the path."""
        if not isinstance(mount_id, str) or not mount_id:
            raise VolumeError("the request has no mount ID")
        vol = self._get(name)
        with self._vol_lock(vol.name):
            vol = self._get(name)
            target = self.target(vol.name)
            if not self._live(vol):
                try:
                    spec = self._spec(vol, self._token(vol))
                    info = self.mounter.mount(spec, target, timeout=self.mount_timeout)
                except MountError as exc:
                    detail = f"\n{exc.log_tail}" if exc.log_tail else ""
                    raise VolumeError(f"volume {vol.name}: mount failed: {exc}{detail}") from None
                log.info("mounted volume %s at %s (pid %d)", vol.name, target, info.pid)
            if mount_id not in vol.mount_ids:
                new = replace(vol, mount_ids=[*vol.mount_ids, mount_id])
                try:
                    self._commit(new, vol.name)
                except BaseException:
                    if not vol.mount_ids:  # nobody else uses it: do not leave it behind
                        with contextlib.suppress(MountError):
                            self.mounter.unmount(target)
                    raise
            return target

    def unmount(self, name: Any, mount_id: Any) -> None:
        """``/VolumeDriver.Unmount``: drop one user; the last one out unmounts."""
        if not isinstance(mount_id, str) or not mount_id:
            raise VolumeError("the request has no mount ID")
        vol = self._get(name)
        with self._vol_lock(vol.name):
            vol = self._get(name)
            ids = [i for i in vol.mount_ids if i != mount_id]
            if ids != vol.mount_ids:
                self._commit(replace(vol, mount_ids=ids), vol.name)
            if not ids:
                try:
                    self.mounter.unmount(self.target(vol.name))
                except MountError as exc:
                    raise VolumeError(f"volume {vol.name}: unmount failed: {exc}") from None
                log.info("unmounted volume %s", vol.name)

    def path(self, name: Any) -> str:
        """``/VolumeDriver.Path``: the mountpoint, or ``""`` while not mounted."""
        vol = self._get(name)
        return self.target(vol.name) if self._live(vol) else ""

    def get(self, name: Any) -> dict[str, Any]:
        """``/VolumeDriver.Get``."""
        vol = self._get(name)
        return {
            "Name": vol.name,
            "Mountpoint": self.path(vol.name),
            "CreatedAt": _iso(vol.created_at),
            "Status": vol.status(),
        }

    def list(self) -> builtins.list[dict[str, Any]]:
        """``/VolumeDriver.List``."""
        with self._lock:
            vols = [self.volumes[n] for n in sorted(self.volumes)]
        live = {info.target for info in self.mounter.list()}  # one look at the mount table
        return [
            {"Name": v.name, "Mountpoint": t if (t := self.target(v.name)) in live else ""}
            for v in vols
        ]

    # -- restart

    def recover(self) -> dict[str, str]:
        """Bring mounts in line with the table after a (re)start; returns failures by volume.

        Mount IDs recorded before the restart are dropped first when no container has the
        volume's mount any more (its Unmount came while the plugin was down; a mount no
        other mount namespace holds, see ``in_use``). Volumes in use get their mount back (a
        live daemon is adopted as is, a dead one is remounted at the pinned sha); mounts of
        volumes nobody uses any more are stopped.
        """
        failed: dict[str, str] = {}
        with self._lock:
            names = sorted(self.volumes)
        for name in names:
            self._drop_missed_unmounts(name)
        with self._lock:
            vols = list(self.volumes.values())
        wanted = {self.target(v.name): v for v in vols if v.mount_ids}
        drop_orphans = getattr(self.mounter, "drop_orphans", None)
        if callable(drop_orphans):  # mounts a killed plugin was starting, never recorded
            drop_orphans()
        for info in self.mounter.list():
            if info.target.startswith(self.mount_root + os.sep) and info.target not in wanted:
                with contextlib.suppress(MountError):
                    self.mounter.unmount(info.target)
        for target, vol in sorted(wanted.items()):
            try:
                with self._vol_lock(vol.name):
                    if not self._live(vol):
                        spec = self._spec(vol, self._token(vol))
                        self.mounter.mount(spec, target, timeout=self.mount_timeout)
                        log.info("remounted volume %s at %s", vol.name, target)
            except (GitxetError, OSError) as exc:
                failed[vol.name] = str(exc)
                log.warning("volume %s: could not remount: %s", vol.name, exc)
        return failed

    def _drop_missed_unmounts(self, name: str) -> None:
        """Forget the mount IDs recorded before a restart when no container uses the mount
        (their Unmount calls came while the plugin was down), and unmount it if nobody
        has mounted the volume since: it would otherwise serve no one until Remove."""
        with self._vol_lock(name):
            with self._lock:
                vol = self.volumes.get(name)
                old = self._restart_ids.pop(name, set())
            if vol is None or not old & set(vol.mount_ids):
                return
            target = self.target(name)
            if self.in_use(target) is not False:
                return  # a container may use it (or we cannot tell): keep counting
            ids = [i for i in vol.mount_ids if i not in old]
            log.warning(
                "volume %s: no container uses it: dropping %d mount ID(s) whose Unmount came "
                "while the plugin was down",
                name,
                len(vol.mount_ids) - len(ids),
            )
            self._commit(replace(vol, mount_ids=ids), name)
            if not ids:
                try:
                    self.mounter.unmount(target)
                except MountError as exc:
                    log.warning("volume %s: unmount failed: %s", name, exc)

    # -- dispatch

    def handle(self, route: str, body: Any) -> dict[str, Any]:
        """Answer one protocol request; errors come back as ``{"Err": message}``."""
        req = body if isinstance(body, dict) else {}
        try:
            if route == "/Plugin.Activate":
                return self.activate()
            if route == "/VolumeDriver.Capabilities":
                return self.capabilities()
            if route == "/VolumeDriver.Create":
                self.create(req.get("Name"), req.get("Opts"))
                return {"Err": ""}
            if route == "/VolumeDriver.Remove":
                self.remove(req.get("Name"))
                return {"Err": ""}
            if route == "/VolumeDriver.Mount":
                return {"Mountpoint": self.mount(req.get("Name"), req.get("ID")), "Err": ""}
            if route == "/VolumeDriver.Unmount":
                self.unmount(req.get("Name"), req.get("ID"))
                return {"Err": ""}
            if route == "/VolumeDriver.Path":
                return {"Mountpoint": self.path(req.get("Name")), "Err": ""}
            if route == "/VolumeDriver.Get":
                return {"Volume": self.get(req.get("Name")), "Err": ""}
            if route == "/VolumeDriver.List":
                return {"Volumes": self.list(), "Err": ""}
        except VolumeError as exc:
            # Docker asks Get/Path about names it does not know as a matter of course.
            quiet = route in ("/VolumeDriver.Get", "/VolumeDriver.Path")
            log.log(logging.DEBUG if quiet else logging.WARNING, "%s: %s", route, exc)
            return {"Err": str(exc)}
        except (GitxetError, OSError) as exc:
            log.exception("%s failed", route)
            return {"Err": f"{route}: {exc}"}
        raise LookupError(route)


# ---- HTTP over a unix socket -----------------------------------------------------------------


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: Docker's client reuses connections
    server: PluginServer

    def address_string(self) -> str:
        return "unix"  # AF_UNIX peers have no (host, port)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s", format % args)

    def _reply(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", CONTENT_TYPE)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if length < 0 or length > _BODY_MAX_BYTES:
            self.close_connection = True
            self._reply(400, {"Err": f"request body must be 0..{_BODY_MAX_BYTES} bytes"})
            return
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw.strip() else None
        except (UnicodeDecodeError, ValueError):
            self._reply(400, {"Err": "the request body is not JSON"})
            return
        try:
            answer = self.server.driver.handle(self.path, body)
        except LookupError:
            self._reply(404, {"Err": f"unknown endpoint {self.path}"})
            return
        except Exception as exc:  # a bug must not kill the plugin; Docker gets the message
            log.exception("%s: unexpected failure", self.path)
            answer = {"Err": f"internal error: {type(exc).__name__}: {exc}"}
        self._reply(200, answer)


class PluginServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    """A threaded HTTP server on a unix socket, answering with a :class:`VolumeDriver`."""

    daemon_threads = True
    allow_reuse_address = False

    def __init__(self, socket_path: str, driver: VolumeDriver) -> None:
        self.driver = driver
        self.socket_path = socket_path
        clear_stale_socket(socket_path)
        os.makedirs(os.path.dirname(socket_path) or ".", exist_ok=True)
        super().__init__(socket_path, _Handler)
        os.chmod(socket_path, 0o660)

    def server_close(self) -> None:
        super().server_close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)
