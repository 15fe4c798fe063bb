"""The gitxet exception tree.

Errors carry data fields; user-facing wording lives in ``gitxet.cli``.

    GitxetError
    ├── FormatError                 malformed or truncated bytes (xorb, shard, pointer)
    │   ├── XorbFormatError
    │   ├── ShardFormatError
    │   └── PointerFormatError
    ├── IntegrityError              bytes whose hash does not match what names them
    ├── NotFoundError               a xorb, shard, file or object that is not there
    │   ├── XorbNotFoundError
    │   └── FileNotFoundInCASError
    │       └── DataUnavailableError   no store nor remote had it (says which were tried)
    ├── StoreError                  the local store cannot be used (locked, unwritable)
    ├── BackendError                a CAS server's storage backend (directory, S3) failed
    ├── RemoteError                 a CAS remote failed (HTTP status, connection)
    │   ├── AuthError               401/403
    │   └── UnreachableError        no connection at all (refused, DNS, timeout)
    ├── GitError                    the git binary failed or the repo is unusable
    │   └── NotARepositoryError     a command that needs a repository ran outside one
    ├── UnsafePathError             a path from a tree that must not be written
    ├── LocalChangesError           a work-tree file a checkout would overwrite holds changes
    ├── ConfigError                 bad user configuration
    │   └── StateBusyError          a state dir or socket another live process owns
    └── MissingDependencyError      an optional package or system library is not installed
"""

from __future__ import annotations


class GitxetError(Exception):
    """Base of every error gitxet raises on purpose."""


class FormatError(GitxetError):
    """Bytes that do not follow a format; ``what`` names the object, ``reason`` the defect."""

    def __init__(self, what: str, reason: str) -> None:
        super().__init__(f"{what}: {reason}")
        self.what = what
        self.reason = reason


class XorbFormatError(FormatError):
    """A malformed or truncated xorb."""


class ShardFormatError(FormatError):
    """A malformed or truncated shard."""


class PointerFormatError(FormatError):
    """A malformed pointer file."""


class IntegrityError(GitxetError):
    """Data whose hash does not match its name: corruption or tampering."""

    def __init__(self, kind: str, name: str, detail: str) -> None:
        super().__init__(f"{kind} {name}: {detail}")
        self.kind = kind
        self.name = name
        self.detail = detail


class WouldBlockError(GitxetError):
    """A read asked not to wait (``gitxet.util.nowait``) would have waited on a disk."""


class NotFoundError(GitxetError):
    """Something addressed by hash or name is not present."""


class XorbNotFoundError(NotFoundError):
    """A xorb is missing from every store that was asked."""

    def __init__(self, xorb_hex: str, where: str = "") -> None:
        super().__init__(f"xorb {xorb_hex} not found" + (f" {where}" if where else ""))
        self.xorb_hex = xorb_hex


class FileNotFoundInCASError(NotFoundError):
    """No reconstruction is known for a file hash."""

    def __init__(self, file_hex: str) -> None:
        super().__init__(f"no reconstruction for file {file_hex}")
        self.file_hex = file_hex


class DataUnavailableError(FileNotFoundInCASError):
    """No store and no remote could give a file's data; ``tried`` says where gitxet looked.

    Each entry of ``tried`` is ``(where, reason)``: a remote (``"upstream /srv/x.git"``) or a
    store, and why it did not serve (``"does not have it"``, or the error it raised, also kept
    in ``causes``). ``path`` names the file when known.
    """

    def __init__(
        self,
        file_hex: str,
        tried: list[tuple[str, str]],
        causes: list[BaseException] | None = None,
        path: str | None = None,
        others: int = 0,
    ) -> None:
        super().__init__(file_hex)
        what = f"{path} (xet hash {file_hex[:16]}...)" if path else f"file {file_hex}"
        more = f" and {others} more file(s)" if others else ""
        where = "; ".join(f"{w}: {r}" for w, r in tried) if tried else "no remote is configured"
        self.args = (f"no store or remote has the data of {what}{more} (tried {where})",)
        self.tried = tried
        self.causes = causes or []
        self.path = path
        self.others = others


class StoreError(GitxetError):
    """The local store cannot be used."""


class RemoteError(GitxetError):
    """A CAS remote failed."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class AuthError(RemoteError):
    """The remote refused our credentials (401) or their scope (403)."""


class UnreachableError(RemoteError):
    """A server could not be talked to at all: ``url`` (no credentials), ``reason`` in words
    (``"connection refused"``, ``"timed out"``, ``"unknown host"``)."""

    def __init__(self, what: str, url: str, reason: str) -> None:
        super().__init__(f"{what}: cannot reach {url}: {reason}")
        self.what = what
        self.url = url
        self.reason = reason


class GitError(GitxetError):
    """The git binary failed or the repository is unusable."""


class NotARepositoryError(GitError):
    """A command that needs a git repository ran in ``path``, which is not in one."""

    def __init__(self, path: str) -> None:
        super().__init__(f"not a git repository: {path}")
        self.path = path


class UnsafePathError(GitxetError):
    """A work-tree path gitxet refuses to write: it breaks the path rule of
    ``gitxet.git.paths`` (``..``, absolute, ``.git``, ...) or leads through a symlink."""

    def __init__(self, path: str, reason: str) -> None:
        shown = path if path.isprintable() else repr(path)  # invisible code points show
        super().__init__(f"{shown}: refusing to write this path: {reason}")
        self.path = path
        self.reason = reason


class LocalChangesError(GitxetError):
    """A work-tree file holds neither its pointer nor its data: the user's changes, which
    writing the data would destroy."""

    def __init__(self, path: str) -> None:
        super().__init__(
            "has changes of its own: not overwritten ('git checkout -- PATH' discards them; "
            "then check it out again)"
        )
        self.path = path


class ConfigError(GitxetError):
    """Bad user configuration."""


class XdrError(FormatError):
    """Malformed or truncated XDR bytes (NFS / ONC RPC wire data)."""


class RpcRecordError(FormatError):
    """A broken ONC RPC record stream: bad fragment header or a record over the size cap."""


class PktLineError(GitError):
    """Broken pkt-line framing on a git pipe: bad length header, or EOF inside a packet/list."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"pkt-line: {reason}")
        self.reason = reason


class FilterProtocolError(GitError):
    """git's long-running filter protocol was violated (handshake, capabilities, requests)."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"filter protocol: {reason}")
        self.reason = reason


class FilterAbortError(GitError):
    """Raised by a filter handler to answer ``status=abort``: git stops using that command."""


class GitCommandError(GitError):
    """A git command exited non-zero; ``stderr`` holds the first line of its error output."""

    def __init__(self, argv: list[str], returncode: int, stderr: str) -> None:
        super().__init__(f"git {' '.join(argv[:1])} failed ({returncode}): {stderr}")
        self.argv = argv
        self.returncode = returncode
        self.stderr = stderr


class GitObjectNotFoundError(GitError):
    """``git cat-file`` (or rev-parse) does not know the object name ``name``."""

    def __init__(self, name: str) -> None:
        super().__init__(f"git object {name} not found")
        self.name = name


class HookConflictError(GitError):
    """A git hook exists that gitxet did not write; gitxet refuses to overwrite it."""

    def __init__(self, hook: str, path: str) -> None:
        super().__init__(f"{hook} hook at {path} was not written by gitxet")
        self.hook = hook
        self.path = path


class MaterializeError(GitxetError):
    """Some files could not be written from their pointers; ``failures`` says why, by path."""

    def __init__(self, failures: list[tuple[str, BaseException]]) -> None:
        path, cause = failures[0]
        more = f" (and {len(failures) - 1} more file(s))" if len(failures) > 1 else ""
        super().__init__(f"{path}: {cause}{more}")
        self.failures = failures


class MountError(GitxetError):
    """A mount could not be started, checked or stopped.

    ``reason`` says what went wrong; ``log_tail`` holds the mount daemon's last output lines when
    there is a daemon to blame, and ``returncode`` its exit status when it exited.
    """

    def __init__(
        self, mountpoint: str, reason: str, log_tail: str = "", returncode: int | None = None
    ) -> None:
        super().__init__(f"{mountpoint}: {reason}")
        self.mountpoint = mountpoint
        self.reason = reason
        self.log_tail = log_tail
        self.returncode = returncode


class RangeNotSatisfiableError(GitxetError):
    """A byte range that starts at or past the end of an object of ``size`` bytes (HTTP 416)."""

    def __init__(self, what: str, size: int) -> None:
        super().__init__(f"{what}: range starts past the end ({size} bytes)")
        self.what = what
        self.size = size


class BackendError(GitxetError):
    """A CAS server's storage backend (local directory or S3) failed; ``key`` names the object.

    Not a :class:`StoreError`: that is the local store of a repository.
    """

    def __init__(self, key: str, reason: str) -> None:
        super().__init__(f"storage {key}: {reason}")
        self.key = key
        self.reason = reason


class RequestRejectedError(GitxetError):
    """An uploaded body the CAS server refuses (HTTP 400); ``reason`` says why."""

    def __init__(self, what: str, reason: str) -> None:
        super().__init__(f"{what}: {reason}")
        self.what = what
        self.reason = reason


class MountSpecError(MountError):
    """A mount request that cannot be mounted as asked (bad field, unknown repo or revision).

    ``field`` names the culprit (``"repo"``, ``"commit"``, ``"subdir"``, ...) so callers can
    answer "invalid argument" rather than "internal error".
    """

    def __init__(self, mountpoint: str, field: str, reason: str) -> None:
        super().__init__(mountpoint, f"{field}: {reason}")
        self.field = field
        self.detail = reason


class URLFormatError(FormatError, ValueError):
    """A malformed ``xet://`` URL; a ``ValueError`` too, as fsspec callers expect."""


class DirtyWorkTreeError(GitError):
    """The work tree has uncommitted changes to tracked files (``paths``: the first few)."""

    def __init__(self, paths: list[str], count: int) -> None:
        shown = ", ".join(paths) + (", ..." if count > len(paths) else "")
        super().__init__(f"the work tree has {count} uncommitted change(s): {shown}")
        self.paths = paths
        self.count = count


class LfsObjectMissingError(NotFoundError):
    """A git-lfs pointer whose object (``oid``, SHA-256 hex) is not in the local LFS store."""

    def __init__(self, oid: str, path: str) -> None:
        super().__init__(f"git-lfs object {oid} for {path} is not in the local LFS store")
        self.oid = oid
        self.path = path


class RepoUnavailableError(MountError):
    """The repository's server could not be reached (or refused): worth retrying later."""

    def __init__(self, mountpoint: str, reason: str) -> None:
        super().__init__(mountpoint, reason)


class StateBusyError(ConfigError):
    """Another live process holds a state-dir lock or serves a socket at ``path``."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


class MissingDependencyError(GitxetError):
    """A feature (``feature``: "FUSE mounts need") lacks what is not installed: ``extra``
    (``pip install 'gitxet[extra]'``) or a system package (``system``, e.g. libfuse3);
    ``module`` is what failed to import."""

    def __init__(self, feature: str, module: str, extra: str | None, system: str | None) -> None:
        super().__init__(f"{feature} {module}, which is not installed")
        self.feature = feature
        self.module = module
        self.extra = extra
        self.system = system
