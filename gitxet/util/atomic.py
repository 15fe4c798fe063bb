"""The one atomic file writer: temp file beside the target, optional fsync, rename.

A reader sees the old file, no file, or the complete new file, never a torn one, even if
the writer is killed. With ``durable=True`` (the default) the data is fsynced before the
rename and the directory after it, so that also holds across a power loss; caches that can
be rebuilt pass ``durable=False``.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import os
import secrets
import stat
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import BinaryIO, cast

__all__ = [
    "STALE_TEMP_SECONDS",
    "TEMP_PREFIX",
    "atomic_create",
    "atomic_creator_at",
    "atomic_write",
    "atomic_writer",
    "atomic_writer_at",
    "claim_temp",
    "fsync_dir",
    "hold_temp",
    "remove_stale_temps",
    "temp_writer_alive",
]

#: Every temp file this module makes is named ``.tmp-<random>.incomplete``.
TEMP_PREFIX = ".tmp-"
TEMP_SUFFIX = ".incomplete"
#: A temp file untouched for this long has no live writer: writers append as data arrives
#: and rename within moments of the last write. Such files are swept even where locks
#: cannot be trusted (a network filesystem).
STALE_TEMP_SECONDS = 3600.0
#: A writer takes an exclusive ``flock`` on its temp file right after creating it and holds
#: it until the rename; the kernel drops it when the writer dies (``kill -9`` included). An
#: unlocked temp file older than this grace period (which covers the moment between create
#: and lock) therefore belongs to a dead writer and is swept at once.
UNLOCKED_GRACE_SECONDS = 5.0

StrPath = str | os.PathLike[str]


def hold_temp(fd: int) -> None:
    """Mark a temp file as having a live writer, until it is closed or the writer dies
    (see :data:`UNLOCKED_GRACE_SECONDS`; the node cache's range files use it too)."""
    with contextlib.suppress(OSError):
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)


def claim_temp(path: str, mode: int = 0o600) -> int | None:
    """Open ``path`` (created if missing, emptied) holding its writer lock, for a temp file
    whose name several processes may want (a node-cache range): the descriptor, or None
    while another writer (alive) holds it. A file a dead writer left is taken over in
    place: the lock is taken on the open file, then checked to still be the one at
    ``path``, so no second writer can slip in between a create and a lock."""
    for _ in range(3):
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, mode)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return None  # a live writer (or a moment's probe of one): not ours
        try:
            same = os.fstat(fd).st_ino == os.stat(path, follow_symlinks=False).st_ino
        except FileNotFoundError:
            same = False  # its writer removed it between our open and our lock
        if same:
            os.ftruncate(fd, 0)
            return fd
        os.close(fd)
    return None


def temp_writer_alive(path: str) -> bool:
    """Whether a writer still holds ``path``'s lock (unknown counts as alive)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)  # closing drops our probe lock
    return False


def fsync_dir(path: StrPath) -> None:
    """Persist a directory entry change (rename, create) where the platform allows it."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_writer(
    path: StrPath,
    *,
    mode: int = 0o644,
    keep_mode: bool = False,
    durable: bool = True,
    tmp_dir: StrPath | None = None,
) -> Iterator[BinaryIO]:
    """Yield a file to write; on success it replaces ``path`` atomically, else it is removed.

    ``mode`` is the new file's permission bits; with ``keep_mode`` an existing file's bits
    win. The temp file goes in ``tmp_dir`` when given (same filesystem as ``path``; a killed
    writer then leaves its debris there, not beside ``path``), else in ``path``'s directory,
    which is created if missing. Raises ``OSError``; callers translate it.
    """
    path = os.fspath(path)
    directory = os.path.dirname(path) or "."
    if keep_mode:
        with contextlib.suppress(FileNotFoundError):
            mode = os.stat(path).st_mode & 0o7777
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=TEMP_PREFIX, suffix=TEMP_SUFFIX, dir=tmp_dir or directory)
    hold_temp(fd)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
        if durable:
            fsync_dir(directory)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def atomic_writer_at(
    dir_fd: int,
    name: str,
    *,
    mode: int = 0o644,
    durable: bool = True,
    tmp_dir: StrPath | None = None,
    exclusive: bool = False,
) -> Iterator[BinaryIO]:
    """:func:`atomic_writer` for the entry ``name`` of the open directory ``dir_fd``.

    Nothing is resolved by path in that directory, so a symlink there (or swapped in
    meanwhile) is never followed: the temp file is created with ``O_EXCL | O_NOFOLLOW``
    (in ``tmp_dir`` when given, same filesystem) and renamed over ``name``, which replaces
    a symlink rather than writing through it. With ``exclusive`` it is linked instead, and
    ``FileExistsError`` says ``name`` exists. Raises ``OSError``; callers translate it.
    """
    if not name or "/" in name or name in (".", ".."):
        raise ValueError(f"not a directory entry name: {name!r}")
    src_fd = dir_fd
    if tmp_dir is not None:
        src_fd = os.open(tmp_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        while True:
            tmp = f"{TEMP_PREFIX}{secrets.token_hex(8)}{TEMP_SUFFIX}"
            try:
                fd = os.open(tmp, flags, 0o600, dir_fd=src_fd)
                hold_temp(fd)
                break
            except FileExistsError:
                continue
        try:
            with os.fdopen(fd, "wb") as f:
                yield f
                f.flush()
                os.fchmod(f.fileno(), mode)
                if durable:
                    os.fsync(f.fileno())
                big = not durable and os.fstat(f.fileno()).st_size >= EXCHANGE_MIN_BYTES
            if exclusive:
                os.link(tmp, name, src_dir_fd=src_fd, dst_dir_fd=dir_fd, follow_symlinks=False)
                os.unlink(tmp, dir_fd=src_fd)
            elif not (big and _exchange(src_fd, tmp, dir_fd, name)):
                os.replace(tmp, name, src_dir_fd=src_fd, dst_dir_fd=dir_fd)
            if durable:
                with contextlib.suppress(OSError):
                    os.fsync(dir_fd)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp, dir_fd=src_fd)
            raise
    finally:
        if src_fd != dir_fd:
            os.close(src_fd)


@contextlib.contextmanager
def atomic_creator_at(
    dir_fd: int, name: str, *, mode: int = 0o644
) -> Iterator[tuple[BinaryIO, list[os.stat_result]]]:
    """Yield ``(file, out)``: what is written becomes the new entry ``name`` of the open
    directory ``dir_fd`` once complete (not durable; ``out`` then holds its stat).

    The data goes into an unnamed file in that directory (``O_TMPFILE``) that is linked in
    at the end, so no name ever holds part of it, a killed writer leaves nothing behind,
    and nothing is renamed (a rename over a file, or across directories, serializes
    writers on the filesystem's locks). Where ``O_TMPFILE`` is unavailable, a named temp
    file beside ``name`` is linked instead. Raises ``FileExistsError`` (nothing written
    there) when ``name`` exists by then, else ``OSError``; callers translate it.
    """
    if not name or "/" in name or name in (".", ".."):
        raise ValueError(f"not a directory entry name: {name!r}")
    out: list[os.stat_result] = []
    fd = _open_unnamed(dir_fd, mode)
    if fd is not None:
        with os.fdopen(fd, "wb") as f:
            yield f, out
            f.flush()
            os.fchmod(fd, mode)
            # linkat(AT_SYMLINK_FOLLOW) of the descriptor's /proc name: no privilege needed
            os.link(f"/proc/self/fd/{fd}", name, dst_dir_fd=dir_fd, follow_symlinks=True)
            out.append(os.fstat(fd))
        return
    with atomic_writer_at(dir_fd, name, mode=mode, durable=False, exclusive=True) as f:
        yield f, out
    out.append(os.stat(name, dir_fd=dir_fd, follow_symlinks=False))


def _open_unnamed(dir_fd: int, mode: int) -> int | None:
    """An unnamed file in ``dir_fd`` (``O_TMPFILE``), or None where that cannot be had
    (another system, a filesystem without it, no ``/proc`` to link it through)."""
    flag = getattr(os, "O_TMPFILE", 0)
    if not flag or not _proc_fds():
        return None
    try:
        return os.open(".", flag | os.O_WRONLY | os.O_CLOEXEC, mode & 0o777, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL, errno.ENOENT):
            return None
        raise


@functools.cache
def _proc_fds() -> bool:
    return os.path.isdir(f"/proc/{os.getpid()}/fd")


#: A non-durable file at least this big takes the old file's place by exchange, not rename
#: (:func:`_exchange`).
EXCHANGE_MIN_BYTES = 8 << 20
_RENAME_EXCHANGE = 2  # linux/fs.h


@functools.cache
def _renameat2() -> Callable[[int, bytes, int, bytes, int], int] | None:
    """libc's ``renameat2``, or None where it has none."""
    import ctypes

    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return cast("Callable[[int, bytes, int, bytes, int], int]", fn)


def _exchange(src_fd: int, tmp: str, dir_fd: int, name: str) -> bool:
    """Put ``tmp`` in place of the regular file ``name`` by ``renameat2(RENAME_EXCHANGE)``
    and unlink the old file (now at ``tmp``); False (nothing changed) where that cannot be
    done: ``name`` missing or not a regular file, no ``renameat2``, a filesystem without it.

    A rename over an existing file makes ext4 (``auto_da_alloc``) allocate and start
    writing back all of the new file's data inside the rename: ~0.3 s for 1 GiB on the
    development VM, on the critical path of a checkout. An exchange does not; the name is
    never missing either way, and the file is no less durable than after a rename of a
    ``durable=False`` write (the kernel writes it back on its own schedule).
    """
    try:
        if not stat.S_ISREG(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode):
            return False
    except OSError:
        return False
    fn = _renameat2()
    if fn is None:
        return False
    if fn(src_fd, os.fsencode(tmp), dir_fd, os.fsencode(name), _RENAME_EXCHANGE) != 0:
        return False  # EINVAL/ENOSYS (filesystem), ENOENT (gone meanwhile): rename instead
    try:
        swapped_in = os.stat(tmp, dir_fd=src_fd, follow_symlinks=False).st_mode
    except OSError:
        return True  # gone meanwhile: the new file is in place all the same
    if not stat.S_ISREG(swapped_in):
        # swapped for a directory meanwhile: put it back; the rename then fails as it would
        fn(src_fd, os.fsencode(tmp), dir_fd, os.fsencode(name), _RENAME_EXCHANGE)
        return False
    with contextlib.suppress(OSError):
        os.unlink(tmp, dir_fd=src_fd)  # else swept later, as a dead writer's temp file
    return True


def atomic_write(
    path: StrPath,
    data: bytes,
    *,
    mode: int = 0o644,
    keep_mode: bool = False,
    durable: bool = True,
    tmp_dir: StrPath | None = None,
) -> None:
    """Write ``data`` to ``path`` atomically (see :func:`atomic_writer`)."""
    with atomic_writer(path, mode=mode, keep_mode=keep_mode, durable=durable, tmp_dir=tmp_dir) as f:
        f.write(data)


def remove_stale_temps(
    directory: StrPath,
    *,
    older_than: float = STALE_TEMP_SECONDS,
    any_suffix: bool = False,
    now: float | None = None,
) -> int:
    """Delete this module's temp files in ``directory`` (not below it) whose writer is gone:
    no writer holds the file's lock (after a short grace period), or nobody touched it for
    ``older_than`` seconds. Returns how many.

    ``any_suffix`` also takes ``.tmp-*`` names without the ``.incomplete`` suffix (what
    older gitxet versions left in store directories, where nothing else starts so). A
    missing directory holds none; files that vanish or resist meanwhile are skipped.
    """
    now = time.time() if now is None else now
    removed = 0
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return 0
    for e in entries:
        if not e.name.startswith(TEMP_PREFIX):
            continue
        if not (any_suffix or e.name.endswith(TEMP_SUFFIX)):
            continue
        try:
            if not e.is_file(follow_symlinks=False):
                continue
            age = now - e.stat(follow_symlinks=False).st_mtime
            if age < older_than and (
                age < min(UNLOCKED_GRACE_SECONDS, older_than) or temp_writer_alive(e.path)
            ):
                continue
            os.unlink(e.path)
            removed += 1
        except OSError:
            continue
    return removed


def atomic_create(
    path: StrPath,
    data: bytes,
    *,
    mode: int = 0o644,
    durable: bool = True,
    tmp_dir: StrPath | None = None,
) -> bool:
    """Create ``path`` holding ``data`` unless it exists; returns whether this call created it.

    The data goes to a temp file (in ``tmp_dir`` when given, same filesystem) that is then
    hard-linked into place: ``link`` fails when the name exists, so of concurrent writers
    exactly one wins and nobody sees a partial file.
    """
    path = os.fspath(path)
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=TEMP_PREFIX, suffix=TEMP_SUFFIX, dir=tmp_dir or directory)
    hold_temp(fd)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.chmod(tmp, mode)
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        if durable:
            fsync_dir(directory)
        return True
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def sync_written(paths: list[str]) -> None:
    """Make files written with ``durable=False`` durable as a group: with many files, one
    ``syncfs(2)`` of their filesystem (one journal commit instead of two per file), else
    an fsync of each file and then of each directory."""
    if not paths:
        return
    if len(paths) >= 8 and _syncfs(os.path.dirname(paths[0]) or "."):
        return
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    for d in sorted({os.path.dirname(p) or "." for p in paths}):
        fsync_dir(d)


def _syncfs(path: str) -> bool:
    """``syncfs(2)`` of the filesystem holding ``path``; False where unavailable."""
    import ctypes

    try:
        fn = ctypes.CDLL(None, use_errno=True).syncfs
    except (OSError, AttributeError):
        return False
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        return bool(fn(fd) == 0)
    finally:
        os.close(fd)
