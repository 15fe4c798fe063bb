"""The CSI Node service: publish a dataset commit at a pod's target path, and take it away.

Every publish is one read-only mount made by the :class:`~gitxet.plugins.mounter.Mounter`
directly at the target path. There is no NodeStageVolume step: kubelet never stages inline
ephemeral volumes, so staging would only serve static PVs and add a bind mount per pod;
sharing happens below the mounts instead, because every mount daemon on the node reads
through the same content-addressed chunk cache, so pods (and commits) that share chunks
download them once.

Records under ``<state dir>`` remember which volume is published at which target (never the
token), so that a restarted plugin can tell a repeated publish (idempotent) from a
conflicting one, and unpublish what kubelet asks for after a restart.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

from gitxet.errors import FormatError, MountError, MountSpecError, RepoUnavailableError
from gitxet.mount.runner import HEALTH_ABSENT, HEALTH_DEAD, HEALTH_HUNG, HEALTH_OK
from gitxet.plugins.csi import csi_pb2, csi_pb2_grpc, rpc
from gitxet.plugins.csi.volumes import (
    CsiRequestError,
    PublishRequest,
    VolumeRecord,
    VolumeRecords,
    check_capability,
    check_target_path,
    check_volume_id,
    invalid,
    parse_publish,
)
from gitxet.plugins.mounter import Mounter, MountSpec, validate_spec
from gitxet.settings import strip_credentials

log = logging.getLogger("gitxet.plugins.csi")

# Exit statuses of ``git-xet`` (gitxet.cli._errors), seen here as a mount daemon's status.
_EXIT_NOT_FOUND = 4
_EXIT_AUTH = 5


@dataclass(frozen=True)
class NodeConfig:
    """Per-node settings: the CSI node id, the volume cap kubelet is told, mount timeout."""

    node_id: str
    max_volumes_per_node: int = 0  # 0: no limit announced
    mount_timeout: float = 60.0
    # publish only below this directory (kubelet's root dir); None: anywhere
    target_root: str | None = None


class NodeService:
    """Publish/unpublish logic over a Mounter, in plain Python (the gRPC adapter is below)."""

    def __init__(self, mounter: Mounter, state_dir: str, config: NodeConfig) -> None:
        if not config.node_id:
            raise ValueError("a node id is required")
        self.mounter = mounter
        self.config = config
        self.records = VolumeRecords(os.path.join(state_dir, "volumes"))
        self._busy: set[str] = set()
        self._busy_lock = threading.Lock()
        # the last publish's token per target, in memory only (never stored): what a remount
        # of a dead mount needs between two publishes
        self._tokens: dict[str, str | None] = {}
        # targets whose mount was remounted after its daemon died, with when: containers
        # that had it bind-mounted keep the dead one, so the volume stays "abnormal"
        self._repaired: dict[str, float] = {}
        self._ready = threading.Event()

    # -- readiness

    @property
    def ready(self) -> bool:
        """Whether start-up recovery has finished (Probe answers ``ready=false`` before)."""
        return self._ready.is_set()

    def recover(self) -> None:
        """Re-adopt live mounts and remount dead ones (when the Mounter can), then be ready.

        Mounts of repositories that need a token cannot be remounted here (tokens are never
        stored); they come back when kubelet publishes the volume again.
        """
        try:
            recover = getattr(self.mounter, "recover", None)
            if callable(recover):
                report = recover()
                for target, why in sorted(getattr(report, "failed", {}).items()):
                    log.warning("cannot remount %s yet: %s", target, why)
                log.info(
                    "recovered mounts: %d adopted, %d remounted, %d waiting",
                    len(getattr(report, "adopted", [])),
                    len(getattr(report, "remounted", [])),
                    len(getattr(report, "failed", {})),
                )
        finally:
            self._ready.set()

    # -- per-target exclusion

    @contextlib.contextmanager
    def _exclusive(self, target: str) -> Iterator[None]:
        # CSI lets a plugin refuse a second concurrent call on the same volume with ABORTED;
        # the CO retries later. Blocking instead would pile up threads behind a slow mount.
        with self._busy_lock:
            if target in self._busy:
                raise CsiRequestError("ABORTED", f"an operation on {target} is in progress")
            self._busy.add(target)
        try:
            yield
        finally:
            with self._busy_lock:
                self._busy.discard(target)

    def _record(self, target: str) -> VolumeRecord | None:
        try:
            return self.records.get(target)
        except FormatError as exc:
            # A torn or foreign record must not wedge the target forever: the mounter's own
            # records still say what is mounted there.
            log.warning("ignoring unreadable record of %s: %s", target, exc)
            self.records.remove(target)
            return None

    # -- publish

    def _check_root(self, target: str) -> None:
        """INVALID_ARGUMENT unless ``target`` is below the configured target root, also
        once symlinks on its way are followed (kubelet only ever asks for paths there)."""
        root = self.config.target_root
        if root is None:
            return
        root = os.path.realpath(root)
        # the deepest part of the path that exists, with symlinks followed, plus the rest
        head, tail = target, ""
        while not os.path.lexists(head) and head != os.path.dirname(head):
            head, name = os.path.split(head)
            tail = os.path.join(name, tail) if tail else name
        real = os.path.join(os.path.realpath(head), tail) if tail else os.path.realpath(head)
        for path in (target, real):
            if os.path.commonpath([root, path]) != root or path == root:
                raise invalid(
                    f"target_path {target!r} is outside the plugin's target root {root} "
                    "(git xet csi --target-root)"
                )

    def publish(self, req: PublishRequest) -> None:
        """Make ``req``'s volume readable at its target path (idempotent)."""
        target = req.target_path
        self._check_root(target)
        with self._exclusive(target):
            rec = self._record(target)
            if rec is not None:
                if rec.volume_id != req.volume_id:
                    raise CsiRequestError(
                        "ALREADY_EXISTS", f"{target} already holds volume {rec.volume_id!r}"
                    )
                if rec.fingerprint != req.fingerprint:
                    raise CsiRequestError(
                        "ALREADY_EXISTS",
                        f"volume {req.volume_id!r} is published at {target} with other arguments",
                    )
                if self.mounter.is_mounted(target):
                    log.debug("volume %s already published at %s", req.volume_id, target)
                    if req.token is not None:
                        self._refresh_token(req, target, rec.commit_sha)
                    self._tokens[target] = req.token
                    return
                if self.mounter.health(target) == HEALTH_DEAD:
                    self._repaired[target] = time.time()
                log.info(
                    "volume %s: the mount at %s is gone; mounting again", req.volume_id, target
                )
            spec = _spec(req)
            if rec is not None:  # mounted again: at the commit published, wherever the
                spec = replace(spec, commit=rec.commit_sha)  # branch has moved since
            try:
                validate_spec(spec, target)
            except MountSpecError as exc:
                raise invalid(f"volume attribute {exc.field}: {exc.detail}") from None
            created = rec.created_target if rec is not None else not os.path.lexists(target)
            commit_sha = self._mount(req, spec, created)
            self._tokens[target] = req.token
            try:
                self.records.put(
                    VolumeRecord(
                        target_path=target,
                        volume_id=req.volume_id,
                        fingerprint=req.fingerprint,
                        repo=strip_credentials(req.repo),
                        commit=req.commit,
                        commit_sha=commit_sha,
                        ephemeral=req.ephemeral,
                        created_target=created,
                    )
                )
            except OSError as exc:
                # Without a record the publish could not be undone after a restart.
                self._undo(target, created)
                raise CsiRequestError("INTERNAL", f"cannot record the volume: {exc}") from None
            log.info(
                "published volume %s (%s at %s = %s%s) at %s",
                req.volume_id,
                strip_credentials(req.repo),
                req.commit,
                commit_sha[:12],
                f", subdir {req.subdir}" if req.subdir else "",
                target,
            )

    def _refresh_token(self, req: PublishRequest, target: str, commit_sha: str) -> None:
        """A republish (kubelet, ``requiresRepublish``) of a live volume: hand the mount
        the secret's current token, which its daemon picks up without unmounting. The
        commit is the one published (a mount done again after its daemon died is pinned
        to it: the branch the request names may have moved since)."""
        spec = replace(_spec(req), commit=commit_sha)
        try:
            validate_spec(spec, target)
            self.mounter.mount(spec, target, timeout=self.config.mount_timeout)
        except MountSpecError as exc:
            raise invalid(f"volume attribute {exc.field}: {exc.detail}") from None
        except MountError as exc:
            raise CsiRequestError(
                "INTERNAL", f"cannot refresh the token of {target}: {exc.reason}"
            ) from None

    def _mount(self, req: PublishRequest, spec: MountSpec, created: bool) -> str:
        target = req.target_path
        was_mounted = self.mounter.is_mounted(target)
        try:
            info = self.mounter.mount(spec, target, timeout=self.config.mount_timeout)
        except MountSpecError as exc:
            # The fields were checked above, so this is the repository or revision not being
            # there: CSI's "volume does not exist".
            self._undo(target, created, unmount=False)
            raise CsiRequestError(
                "NOT_FOUND", f"volume {req.volume_id!r}: {exc.field}: {exc.detail}"
            ) from None
        except RepoUnavailableError as exc:
            self._undo(target, created, unmount=False)
            raise CsiRequestError("UNAVAILABLE", _message_for(req, exc)) from None
        except MountError as exc:
            if was_mounted or self.mounter.is_mounted(target):
                # Someone else's mount (or another spec) is there; leave it alone.
                raise CsiRequestError(
                    "ALREADY_EXISTS", f"{target} is already mounted: {exc.reason}"
                ) from None
            self._undo(target, created, unmount=False)
            raise CsiRequestError(_code_for(exc), _message_for(req, exc)) from None
        return info.commit_sha

    def _undo(self, target: str, created: bool, *, unmount: bool = True) -> None:
        """Leave nothing behind after a failed publish."""
        if unmount:
            try:
                self.mounter.unmount(target)
            except MountError as exc:
                log.error("cannot undo the mount at %s: %s", target, exc)
                return
        if created:
            _remove_dir(target)

    # -- unpublish

    def unpublish(self, volume_id: str, target_path: str) -> None:
        """Unmount ``volume_id`` from ``target_path`` and remove the directory (idempotent)."""
        check_volume_id(volume_id)
        target = check_target_path(target_path)
        self._check_root(target)
        with self._exclusive(target):
            rec = self._record(target)
            if rec is not None and rec.volume_id != volume_id:
                raise CsiRequestError(
                    "NOT_FOUND",
                    f"volume {volume_id!r} is not published at {target} "
                    f"(volume {rec.volume_id!r} is)",
                )
            try:
                self.mounter.unmount(target)
            except MountError as exc:
                raise CsiRequestError(
                    "INTERNAL", f"cannot unmount {target}: {exc.reason}"
                ) from None
            self.records.remove(target)
            self._tokens.pop(target, None)
            self._repaired.pop(target, None)
            _remove_dir(target)
            log.info("unpublished volume %s from %s", volume_id, target)

    # -- stats

    def volume_stats(self, volume_id: str, volume_path: str) -> VolumeStats:
        """Usage and condition of the volume published at ``volume_path``.

        A mount whose daemon died is mounted again here (with the token of the last publish,
        kept in memory), and the volume is reported abnormal from then on: containers that
        had the target bind-mounted keep the dead mount until they restart.
        """
        check_volume_id(volume_id)
        target = check_target_path(volume_path)
        with self._exclusive(target):
            rec = self._record(target)
            if rec is None or rec.volume_id != volume_id:
                raise CsiRequestError(
                    "NOT_FOUND", f"volume {volume_id!r} is not published at {target}"
                )
            health = self.mounter.health(target)
            if health in (HEALTH_DEAD, HEALTH_ABSENT):
                self._remount(rec, target)
                health = self.mounter.health(target)
            problem = ""
            if health == HEALTH_HUNG:
                problem = "the mount does not answer"
            elif health != HEALTH_OK:
                problem = "the mount's daemon is gone and it could not be mounted again"
            elif target in self._repaired:
                when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self._repaired[target]))
                problem = (
                    f"the mount's daemon died and the volume was mounted again at {when}; "
                    "containers started before then still see the dead mount: restart the pod"
                )
            usage: list[tuple[str, int, int]] = []
            if health == HEALTH_OK:
                with contextlib.suppress(OSError):
                    st = os.statvfs(target)
                    usage = [
                        ("BYTES", st.f_blocks * st.f_frsize, 0),
                        ("INODES", st.f_files, 0),
                    ]
            return VolumeStats(usage, bool(problem), problem)

    def _remount(self, rec: VolumeRecord, target: str) -> None:
        """Mount a dead volume again at its pinned commit (best effort, logged)."""
        if target not in self._tokens:
            # after a plugin restart no token is known; a volume that needs none remounts
            log.info("volume %s: remounting %s without a token", rec.volume_id, target)
        # the mounter keeps what the publish asked for (subdir, cache size, ...); here only
        # the commit is pinned to what was published
        info = next((m for m in self.mounter.list() if m.target == target), None)
        get = getattr(self.mounter, "get", None)
        if info is None and callable(get):
            info = get(target)
        if info is None:
            log.warning("volume %s: no mount record for %s; cannot remount", rec.volume_id, target)
            return
        spec = replace(info.spec, commit=rec.commit_sha, token=self._tokens.get(target))
        try:
            self.mounter.mount(spec, target, timeout=self.config.mount_timeout)
        except (MountError, OSError) as exc:
            log.warning("volume %s: remounting %s failed: %s", rec.volume_id, target, exc)
            return
        self._repaired[target] = time.time()
        log.warning(
            "volume %s: the mount daemon at %s had died; mounted again", rec.volume_id, target
        )


@dataclass(frozen=True)
class VolumeStats:
    """What NodeGetVolumeStats answers: (unit, total, available) rows and the condition."""

    usage: list[tuple[str, int, int]]
    abnormal: bool
    message: str


def _remove_dir(path: str) -> None:
    try:
        os.rmdir(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        if exc.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.EBUSY):
            # Not ours to delete (files in it, or still a mountpoint of something else).
            log.warning("leaving %s in place: %s", path, exc.strerror)
        elif exc.errno != errno.ENOTDIR:
            raise


def _code_for(exc: MountError) -> str:
    if exc.returncode == _EXIT_NOT_FOUND:
        return "NOT_FOUND"
    if exc.returncode == _EXIT_AUTH:
        return "PERMISSION_DENIED"
    return "INTERNAL"


def _message_for(req: PublishRequest, exc: MountError) -> str:
    msg = f"cannot mount volume {req.volume_id!r} ({strip_credentials(req.repo)} at {req.commit}): "
    msg += exc.reason
    tail = exc.log_tail.strip().splitlines()[-3:] if exc.log_tail else []
    if tail:
        msg += " | " + " | ".join(line.strip() for line in tail)
    return msg


# ---- gRPC adapter ----------------------------------------------------------------------------


def _access(capability: Any) -> tuple[str | None, int, list[str]]:
    kind = capability.WhichOneof("access_type")
    flags = list(capability.mount.mount_flags) if kind == "mount" else []
    return kind, int(capability.access_mode.mode), flags


class NodeServicer(csi_pb2_grpc.NodeServicer):
    """Translates the Node service's messages to :class:`NodeService` calls and back."""

    def __init__(self, node: NodeService) -> None:
        self.node = node

    def NodePublishVolume(self, request: Any, context: Any) -> Any:
        def run() -> Any:
            kind, mode, flags = _access(request.volume_capability)
            check_volume_id(request.volume_id)
            check_target_path(request.target_path)
            check_capability(
                has_capability=request.HasField("volume_capability"),
                access_type=kind,
                mode=mode,
                mount_flags=flags,
            )
            req = parse_publish(
                volume_id=request.volume_id,
                target_path=request.target_path,
                readonly=request.readonly,
                volume_context=dict(request.volume_context),
                secrets=dict(request.secrets),
                access_mode=mode,
                mount_flags=flags,
                publish_context=dict(request.publish_context),
            )
            self.node.publish(req)
            return csi_pb2.NodePublishVolumeResponse()

        return rpc.handle("NodePublishVolume", request, context, run)

    def NodeUnpublishVolume(self, request: Any, context: Any) -> Any:
        def run() -> Any:
            self.node.unpublish(request.volume_id, request.target_path)
            return csi_pb2.NodeUnpublishVolumeResponse()

        return rpc.handle("NodeUnpublishVolume", request, context, run)

    def NodeGetVolumeStats(self, request: Any, context: Any) -> Any:
        def run() -> Any:
            stats = self.node.volume_stats(request.volume_id, request.volume_path)
            unit = csi_pb2.VolumeUsage.Unit
            usage = [
                csi_pb2.VolumeUsage(total=total, used=total, available=avail, unit=unit.Value(name))
                for name, total, avail in stats.usage
            ]
            return csi_pb2.NodeGetVolumeStatsResponse(
                usage=usage,
                volume_condition=csi_pb2.VolumeCondition(
                    abnormal=stats.abnormal, message=stats.message
                ),
            )

        return rpc.handle("NodeGetVolumeStats", request, context, run)

    def NodeGetCapabilities(self, request: Any, context: Any) -> Any:
        # No staging (see the module docstring), no expansion; volume stats carry the
        # volume's condition (a dead mount daemon) and its size (a commit is always full).
        rpc_type = csi_pb2.NodeServiceCapability.RPC.Type
        caps = [
            csi_pb2.NodeServiceCapability(rpc=csi_pb2.NodeServiceCapability.RPC(type=t))
            for t in (rpc_type.GET_VOLUME_STATS, rpc_type.VOLUME_CONDITION)
        ]
        return rpc.handle(
            "NodeGetCapabilities",
            request,
            context,
            lambda: csi_pb2.NodeGetCapabilitiesResponse(capabilities=caps),
        )

    def NodeGetInfo(self, request: Any, context: Any) -> Any:
        cfg = self.node.config
        return rpc.handle(
            "NodeGetInfo",
            request,
            context,
            lambda: csi_pb2.NodeGetInfoResponse(
                node_id=cfg.node_id, max_volumes_per_node=cfg.max_volumes_per_node
            ),
        )


def _spec(req: PublishRequest) -> MountSpec:
    """What the mounter mounts for a publish request."""
    return MountSpec(
        repo=req.repo,
        commit=req.commit,
        subdir=req.subdir,
        token=req.token,
        cache_size=req.cache_size,
        prefetch=req.prefetch,
        cas=req.cas,
    )
