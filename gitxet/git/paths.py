"""Which tree entry names and work-tree paths are safe to show or write: git's own rules.

A repository can hold any bytes as a tree entry name (``git hash-object -t tree --literally``
writes what it is given). Git refuses to check out names that would escape the work tree or
land in a ``.git`` directory (``verify_path`` in git's ``read-cache.c``, ``fsck_tree`` in
``fsck.c``); gitxet applies the same rule wherever it reads a tree, with both of git's
platform variants always on (git enables the HFS+ one only on macOS):

* no empty name, no ``.`` or ``..``, no ``/`` inside a name (so no absolute path);
* no ``.git`` in any case, nor a name NTFS reads as ``.git`` (trailing dots and spaces,
  ``git~1``, ``.git::$INDEX_ALLOCATION``: ``is_ntfs_dotgit``), nor one HFS+ reads as
  ``.git`` (code points HFS+ ignores, such as U+200C, anywhere in it: ``is_hfs_dotgit``);
* no symlink named ``.gitmodules`` (or an NTFS/HFS+ look-alike of it).

Duplicate names within one tree are the tree parser's business (:func:`parse_tree`).
The functions here return a reason (for messages and logs) or ``None`` when the name is safe.
"""

from __future__ import annotations

__all__ = ["PATH_MAX", "unsafe_name", "unsafe_path"]

#: Longest symlink target or path the model hands to the kernel (Linux ``PATH_MAX``).
PATH_MAX = 4096

_MODE_LINK = 0o120000

# code points HFS+ drops when it compares names (git's utf8.c, next_hfs_char)
_HFS_IGNORED = frozenset(
    {*range(0x200C, 0x2010), *range(0x202A, 0x202F), *range(0x206A, 0x2070), 0xFEFF}
)
_NTFS_ENDS_DOTGIT = b"/\\:"  # a ':' starts an alternate data stream name
_NTFS_ENDS_GENERIC = b":"  # git's is_ntfs_dot_generic stops only there (and at the end)


def _hfs_chars(name: bytes) -> list[int]:
    """The code points of ``name`` that HFS+ compares. Like git, a malformed UTF-8 sequence
    ends the name (so ``.git`` followed by a bad byte counts as ``.git``)."""
    try:
        text = name.decode("utf-8")
    except UnicodeDecodeError as exc:
        text = name[: exc.start].decode("utf-8")
    return [ord(c) for c in text if ord(c) not in _HFS_IGNORED]


def _is_hfs_dot(name: bytes, needle: bytes) -> bool:
    """``is_hfs_dot_generic``: ``name`` reads as ``.`` + ``needle`` on a case-folding HFS+."""
    chars = _hfs_chars(name)
    if len(chars) < len(needle) + 1 or chars[0] != ord("."):
        return False
    for c, want in zip(chars[1:], needle, strict=False):
        if c > 127 or chr(c).lower() != chr(want):
            return False
    rest = chars[len(needle) + 1 :]
    return not rest or rest[0] == ord("/")


def _only_dots_and_spaces(rest: bytes, ends: bytes) -> bool:
    """NTFS drops trailing dots and spaces, and ``:`` starts a stream name."""
    for c in rest:
        if c in ends:
            return True
        if c not in b" .":
            return False
    return True


def _is_ntfs_dotgit(name: bytes) -> bool:
    """``is_ntfs_dotgit``: ``.git`` or its 8.3 short name ``git~1``, as NTFS reads them."""
    low = name.lower()
    if low.startswith(b".git"):
        return _only_dots_and_spaces(name[4:], _NTFS_ENDS_DOTGIT)
    if low.startswith(b"git~1"):
        return _only_dots_and_spaces(name[5:], _NTFS_ENDS_DOTGIT)
    return False


def _is_ntfs_dotgitmodules(name: bytes) -> bool:
    """``is_ntfs_dot_generic(name, "gitmodules", 10, "gi7eba")``: the name and its 8.3 forms."""
    low = name.lower()
    if low.startswith(b".gitmodules"):
        return _only_dots_and_spaces(name[11:], _NTFS_ENDS_GENERIC)
    if low[:6] == b"gitmod" and name[6:7] == b"~" and b"1" <= name[7:8] <= b"4":
        return _only_dots_and_spaces(name[8:], _NTFS_ENDS_GENERIC)
    # the fall-back short name: up to 6 characters of "gi7eba", '~', a digit 1-9, digits
    i, saw_tilde = 0, False
    while i < 8:
        if i >= len(name):
            return False
        c = name[i]
        if saw_tilde:
            if not 0x30 <= c <= 0x39:
                return False
        elif c == 0x7E:  # '~'
            i += 1
            if i >= len(name) or not 0x31 <= name[i] <= 0x39:
                return False
            saw_tilde = True
        elif i >= 6 or c & 0x80 or bytes([c]).lower() != b"gi7eba"[i : i + 1]:
            return False
        i += 1
    return _only_dots_and_spaces(name[8:], _NTFS_ENDS_GENERIC)


def unsafe_name(name: bytes, mode: int | None = None) -> str | None:
    """Why the tree entry ``name`` (with git ``mode``, if known) must be neither shown nor
    written, or ``None`` when it is safe."""
    if not name:
        return "empty name"
    if name in (b".", b".."):
        return f"{name.decode()!r} as a name"
    if b"/" in name:
        return "'/' inside a name"
    if b"\0" in name:
        return "NUL byte inside a name"
    # the common case, fast (a listing checks every name): an ASCII name has no code point
    # HFS+ ignores, so only a '.git' or 'git~1' prefix can make it unsafe
    if (
        mode != _MODE_LINK
        and name.isascii()
        and b"\\" not in name
        and not name.lower().startswith((b".git", b"git~1"))
    ):
        return None
    # Windows also splits names at '\\' (fsck_tree checks the rest after each one)
    pieces = [name] + [name[i + 1 :] for i, c in enumerate(name) if c == 0x5C]
    if _is_hfs_dot(name, b"git") or any(_is_ntfs_dotgit(p) for p in pieces):
        return "'.git', or a name NTFS or HFS+ reads as '.git'"
    if mode == _MODE_LINK and (
        _is_hfs_dot(name, b"gitmodules") or any(_is_ntfs_dotgitmodules(p) for p in pieces)
    ):
        return "a symlink named '.gitmodules'"
    return None


def unsafe_path(path: bytes, mode: int | None = None) -> str | None:
    """Why the ``/``-separated work-tree ``path`` must not be written, or ``None``.

    Every component must be a safe name (``mode`` applies to the last one), so absolute
    paths, ``..`` and anything inside a ``.git`` directory are refused.
    """
    if path.startswith(b"/"):
        return "absolute path"
    parts = path.split(b"/")
    for i, part in enumerate(parts):
        reason = unsafe_name(part, mode if i == len(parts) - 1 else None)
        if reason is not None:
            return reason
    return None
