"""What a CSI volume of this driver is: parsing publish requests, and the per-target records.

Everything here is plain Python (no gRPC, no protobuf): :mod:`gitxet.plugins.csi.node`
turns requests into :class:`PublishRequest` and :class:`CsiRequestError` into gRPC statuses.

A volume is described by its *volume context* (``volumeAttributes`` of a static PV or of an
inline ephemeral volume): ``repo`` and ``commit`` (required), ``subdir``, ``cacheSize``,
``prefetch`` and ``cas`` (a cache tier to read file data through; optional). Kubernetes
adds ``csi.storage.k8s.io/*`` keys (pod info, the ephemeral flag), which are accepted and
ignored; any other key is refused, so a misspelt attribute fails loudly instead of being
silently dropped. The token comes from the ``secrets`` map (``nodePublishSecretRef``, key
``token``) and is never stored or logged.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from gitxet.errors import FormatError, GitxetError
from gitxet.formats.record import parse_record
from gitxet.settings import strip_credentials
from gitxet.util.records import RecordDir

# Volume context keys (the CSI ``volume_context`` map) and what they become in a MountSpec.
ATTR_REPO = "repo"
ATTR_COMMIT = "commit"
ATTR_SUBDIR = "subdir"
ATTR_CACHE_SIZE = "cacheSize"
ATTR_PREFETCH = "prefetch"
ATTR_CAS = "cas"
ATTRIBUTES = (ATTR_REPO, ATTR_COMMIT, ATTR_SUBDIR, ATTR_CACHE_SIZE, ATTR_PREFETCH, ATTR_CAS)
SECRET_TOKEN = "token"
K8S_PREFIX = "csi.storage.k8s.io/"
K8S_EPHEMERAL = K8S_PREFIX + "ephemeral"

# Access modes by their CSI enum numbers (VolumeCapability.AccessMode.Mode).
ACCESS_MODES = {
    1: "SINGLE_NODE_WRITER",
    2: "SINGLE_NODE_READER_ONLY",
    3: "MULTI_NODE_READER_ONLY",
    4: "MULTI_NODE_SINGLE_WRITER",
    5: "MULTI_NODE_MULTI_WRITER",
    6: "SINGLE_NODE_SINGLE_WRITER",
    7: "SINGLE_NODE_MULTI_WRITER",
}
# Mount flags a CO may pass that fit a read-only FUSE mount; anything else is refused.
ACCEPTED_MOUNT_FLAGS = frozenset({"ro", "nodev", "nosuid", "noexec", "noatime", "relatime"})
WRITABLE_MOUNT_FLAGS = frozenset({"rw"})

MAX_ID = 1024  # volume ids and attribute values: far above anything real, bounds the records
MAX_PATH = 4096
_RECORD_VERSION = 1
_RECORD_MAX_BYTES = 64 * 1024


class CsiRequestError(GitxetError):
    """A CSI call that must fail with gRPC status ``code`` (a ``grpc.StatusCode`` name)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def invalid(message: str) -> CsiRequestError:
    """INVALID_ARGUMENT: a required field is missing or a value is malformed."""
    return CsiRequestError("INVALID_ARGUMENT", message)


@dataclass(frozen=True)
class PublishRequest:
    """A checked NodePublishVolume request (the token kept out of ``repr``)."""

    volume_id: str
    target_path: str
    repo: str
    commit: str
    subdir: str
    cache_size: str | None
    prefetch: str | None
    cas: str | None
    ephemeral: bool
    token: str | None
    fingerprint: str  # identifies every argument but the secrets (CSI's "P1 = P2" test)

    def __repr__(self) -> str:
        return (
            f"PublishRequest(volume_id={self.volume_id!r}, target={self.target_path!r}, "
            f"repo={strip_credentials(self.repo)!r}, commit={self.commit!r}, "
            f"subdir={self.subdir!r})"
        )


def _check_text(name: str, value: str, limit: int = MAX_ID) -> None:
    if len(value) > limit:
        raise invalid(f"{name} is longer than {limit} characters")
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
        raise invalid(f"{name} contains control characters")


def check_target_path(target_path: str) -> str:
    """The normalized absolute target path, or INVALID_ARGUMENT."""
    if not target_path:
        raise invalid("target_path is required")
    _check_text("target_path", target_path, MAX_PATH)
    if not os.path.isabs(target_path):
        raise invalid(f"target_path {target_path!r} is not an absolute path")
    return os.path.normpath(target_path)


def check_volume_id(volume_id: str) -> str:
    """``volume_id`` if it is present and sane, else INVALID_ARGUMENT."""
    if not volume_id:
        raise invalid("volume_id is required")
    _check_text("volume_id", volume_id)
    return volume_id


def check_capability(
    *, has_capability: bool, access_type: str | None, mode: int, mount_flags: Sequence[str]
) -> None:
    """Refuse what a read-only dataset mount cannot be.

    Missing fields are INVALID_ARGUMENT. A block volume or a writable mount flag asks for
    more than the volume can do: FAILED_PRECONDITION, the spec's "exceeds capabilities".
    Every access mode is accepted as long as the publish itself is read-only: kubelet asks
    for SINGLE_NODE_WRITER on every inline ephemeral volume, whatever the pod says.
    """
    if not has_capability:
        raise invalid("volume_capability is required")
    if access_type is None:
        raise invalid("volume_capability needs an access type (mount)")
    if mode not in ACCESS_MODES:
        raise invalid("volume_capability.access_mode is required")
    if access_type == "block":
        raise CsiRequestError(
            "FAILED_PRECONDITION", "gitxet volumes are filesystems: block access is not supported"
        )
    for flag in mount_flags:
        if flag in WRITABLE_MOUNT_FLAGS:
            raise CsiRequestError(
                "FAILED_PRECONDITION", f"gitxet volumes are read-only: mount flag {flag!r}"
            )
        if flag not in ACCEPTED_MOUNT_FLAGS:
            raise invalid(f"unsupported mount flag {flag!r} (accepted: ro, nodev, nosuid, ...)")


def parse_publish(
    *,
    volume_id: str,
    target_path: str,
    readonly: bool,
    volume_context: Mapping[str, str],
    secrets: Mapping[str, str],
    access_mode: int,
    mount_flags: Sequence[str],
    publish_context: Mapping[str, str] | None = None,
) -> PublishRequest:
    """Check a NodePublishVolume request's arguments (capability already checked)."""
    check_volume_id(volume_id)
    target = check_target_path(target_path)
    if not readonly:
        # CSI: "exceeds capabilities" is FAILED_PRECONDITION. Kubernetes sends readonly only
        # when the pod volume (or the PV's csi source) says readOnly: true.
        raise CsiRequestError(
            "FAILED_PRECONDITION",
            "gitxet volumes are read-only: publish them with readonly "
            "(readOnly: true on the pod's csi volume or the PV's csi source)",
        )
    unknown = sorted(k for k in volume_context if k not in ATTRIBUTES and not _k8s_key(k))
    if unknown:
        raise invalid(f"unknown volume attributes {unknown} (known: {', '.join(ATTRIBUTES)})")
    for key in ATTRIBUTES:
        if key in volume_context:
            _check_text(f"volume attribute {key!r}", volume_context[key])
    repo = volume_context.get(ATTR_REPO, "").strip()
    commit = volume_context.get(ATTR_COMMIT, "").strip()
    if not repo:
        raise invalid(f"volume attribute {ATTR_REPO!r} is required")
    if not commit:
        raise invalid(f"volume attribute {ATTR_COMMIT!r} is required (a branch, tag or sha)")
    token = secrets.get(SECRET_TOKEN)
    if token is not None and not token.strip():
        raise invalid(f"secret {SECRET_TOKEN!r} is empty")
    cache_size = volume_context.get(ATTR_CACHE_SIZE) or None
    prefetch = volume_context.get(ATTR_PREFETCH) or None
    cas = volume_context.get(ATTR_CAS) or None
    subdir = volume_context.get(ATTR_SUBDIR, "").strip("/")
    fingerprint = _fingerprint(
        {
            "volume_id": volume_id,
            "readonly": readonly,
            "access_mode": access_mode,
            "mount_flags": sorted(mount_flags),
            "volume_context": dict(sorted(volume_context.items())),
            "publish_context": dict(sorted((publish_context or {}).items())),
        }
    )
    return PublishRequest(
        volume_id=volume_id,
        target_path=target,
        repo=repo,
        commit=commit,
        subdir=subdir,
        cache_size=cache_size,
        prefetch=prefetch,
        cas=cas,
        ephemeral=volume_context.get(K8S_EPHEMERAL) == "true",
        token=token,
        fingerprint=fingerprint,
    )


def _k8s_key(key: str) -> bool:
    return key.startswith(K8S_PREFIX)


def _fingerprint(body: dict[str, Any]) -> str:
    data = json.dumps(body, sort_keys=True, separators=(",", ":")).encode("utf-8")
    return hashlib.sha256(data).hexdigest()


# ---- records ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class VolumeRecord:
    """Which volume is published at a target, and with which arguments (never the token)."""

    target_path: str
    volume_id: str
    fingerprint: str
    repo: str
    commit: str
    commit_sha: str
    ephemeral: bool
    created_target: bool  # we made the target directory, so unpublish removes it

    _TYPES: ClassVar[dict[str, type]] = {
        "target_path": str,
        "volume_id": str,
        "fingerprint": str,
        "repo": str,
        "commit": str,
        "commit_sha": str,
        "ephemeral": bool,
        "created_target": bool,
    }

    def to_json(self) -> bytes:
        body: dict[str, Any] = {"version": _RECORD_VERSION}
        body.update({k: getattr(self, k) for k in self._TYPES})
        return json.dumps(body, sort_keys=True, indent=1).encode("utf-8") + b"\n"

    @classmethod
    def from_json(cls, data: bytes, what: str) -> VolumeRecord:
        """Parse a record strictly; :class:`FormatError` names the defect."""
        body = parse_record(
            data, what, version=_RECORD_VERSION, types=cls._TYPES, max_bytes=_RECORD_MAX_BYTES
        )
        if not os.path.isabs(body["target_path"]):
            raise FormatError(what, "target_path is not absolute")
        return cls(**{k: body[k] for k in cls._TYPES})


class VolumeRecords(RecordDir[VolumeRecord]):
    """One JSON record per published target under ``directory``, keyed by the target path."""

    def __init__(self, directory: str) -> None:
        super().__init__(
            directory,
            key=lambda r: r.target_path,
            load=VolumeRecord.from_json,
            dump=VolumeRecord.to_json,
            max_bytes=_RECORD_MAX_BYTES,
        )
