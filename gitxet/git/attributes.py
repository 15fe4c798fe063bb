"""Editing ``.gitattributes``: which paths go through the ``xet`` filter; gitattributes-style
path patterns (:class:`PathSelector`).

A tracked pattern is one line ``<pattern> filter=xet diff=xet merge=xet -text`` (the same
shape as git-lfs uses). ``-text`` keeps git's end-of-line conversion away from the content;
``diff=xet`` and ``merge=xet`` name drivers that need no configuration: git falls back to its
defaults for them, which work on the pointer text.

Edits are surgical: other lines, comments, blank lines and the file's line endings are kept
byte for byte, ``track`` and ``untrack`` are idempotent, and the file is replaced atomically.
Patterns with blanks or other special characters are written in git's C-style quoted form
(``"my file.bin" ...``), which git has understood since 2.14; negative patterns (``!x``) are
refused because git ignores them in attributes files.

**Always a pointer.** ``git xet track PATTERN`` writes the line with one more attribute,
``xet=always``: matching files become pointers whatever their size. The clean filter asks git
for it (``git check-attr``, :mod:`gitxet.git.checkattr`), so git's own pattern matching
decides. ``untrack`` removes exactly such a line (or gitxet's attributes from it).

**Size-based auto tracking.** :func:`default_auto_track_line` returns
``* filter=xet diff=xet merge=xet -text``: every file goes to the filter, and the clean filter
passes files below its size threshold through unchanged (so small files stay ordinary git
blobs; the files git reads itself, ``.gitattributes`` included, always do, see
:mod:`gitxet.git.xetconfig`). Note that ``-text`` then applies to
every path, which turns off line-ending normalisation repository-wide; add later, more
specific lines (``*.txt text``) where that matters.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from gitxet.errors import ConfigError, GitError
from gitxet.util.atomic import atomic_write

__all__ = [
    "ALWAYS",
    "ATTRIBUTES",
    "AUTO_TRACK_LINE",
    "PathSelector",
    "Rule",
    "default_auto_track_line",
    "rules",
    "track",
    "tracked_patterns",
    "untrack",
]

#: The attributes a tracked pattern gets, in this order.
ATTRIBUTES = "filter=xet diff=xet merge=xet -text"
#: Suggested line for size-based auto tracking (see the module docstring).
AUTO_TRACK_LINE = f"* {ATTRIBUTES}"

#: Marks a tracked pattern whose files are pointers whatever their size.
ALWAYS = "xet=always"

_OURS = frozenset(ATTRIBUTES.encode().split()) | {ALWAYS.encode()}
_BLANKS = b" \t"
_ESCAPES = {
    b"\a"[0]: b"\\a",
    b"\b"[0]: b"\\b",
    b"\t"[0]: b"\\t",
    b"\n"[0]: b"\\n",
    b"\v"[0]: b"\\v",
    b"\f"[0]: b"\\f",
    b"\r"[0]: b"\\r",
    b'"'[0]: b'\\"',
    b"\\"[0]: b"\\\\",
}
_UNESCAPES = {v[1]: k for k, v in _ESCAPES.items()}


def default_auto_track_line() -> str:
    """The ``.gitattributes`` line that sends every file through the xet filter."""
    return AUTO_TRACK_LINE


def _attributes_path(root: str | os.PathLike[str]) -> Path:
    return Path(root) / ".gitattributes"


def _encode_pattern(pattern: str) -> bytes:
    if not pattern or "\0" in pattern:
        raise ConfigError(f"invalid attribute pattern {pattern!r}")
    if pattern.startswith("!"):
        raise ConfigError(f"negative patterns are not allowed in .gitattributes: {pattern!r}")
    return os.fsencode(pattern)


def _needs_quotes(pattern: bytes) -> bool:
    return pattern.startswith((b"#", b'"')) or any(c < 0x20 or c in b' "\\\x7f' for c in pattern)


def _quote(pattern: bytes) -> bytes:
    if not _needs_quotes(pattern):
        return pattern
    out = bytearray(b'"')
    for c in pattern:
        if c in _ESCAPES:
            out += _ESCAPES[c]
        elif c < 0x20 or c == 0x7F:
            out += b"\\%03o" % c
        else:
            out.append(c)
    out += b'"'
    return bytes(out)


def _unquote(text: bytes) -> tuple[bytes, bytes] | None:
    """Parse a C-quoted token at the start of ``text``: (value, rest) or None if malformed."""
    out = bytearray()
    i = 1
    while i < len(text):
        c = text[i]
        if c == 0x22:  # closing quote
            return bytes(out), text[i + 1 :]
        if c != 0x5C:  # backslash
            out.append(c)
            i += 1
            continue
        if i + 1 >= len(text):
            return None
        nxt = text[i + 1]
        if nxt in _UNESCAPES:
            out.append(_UNESCAPES[nxt])
            i += 2
        elif text[i + 1 : i + 4].isdigit() and len(text[i + 1 : i + 4]) == 3:
            value = int(text[i + 1 : i + 4], 8)
            if value > 0xFF:
                return None
            out.append(value)
            i += 4
        else:
            return None
    return None


def _parse_line(line: bytes) -> tuple[bytes, bytes, list[bytes]] | None:
    """(pattern, raw pattern token, attributes) of a pattern line; None for blank/comment."""
    body = line.rstrip(b"\n").rstrip(b"\r").lstrip(_BLANKS)
    if not body or body.startswith(b"#"):
        return None
    if body.startswith(b'"'):
        parsed = _unquote(body)
        if parsed is not None:
            pattern, rest = parsed
            return pattern, body[: len(body) - len(rest)], rest.split()
    # git: an unquoted pattern runs up to the first blank.
    end = next((i for i, c in enumerate(body) if c in _BLANKS), len(body))
    return body[:end], body[:end], body[end:].split()


def _filter_state(attrs: list[bytes]) -> bool | None:
    """True/False if this line decides whether the path is xet-filtered; None if silent."""
    state: bool | None = None
    for attr in attrs:
        if attr == b"filter=xet":
            state = True
        elif attr.startswith(b"filter=") or attr in (b"-filter", b"!filter", b"filter"):
            state = False
    return state


def _read_lines(path: Path) -> list[bytes]:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise GitError(f"cannot read {path}: {exc}") from exc
    parts = data.split(b"\n")
    lines = [part + b"\n" for part in parts[:-1]]
    if parts[-1]:
        lines.append(parts[-1])
    return lines


def _states(lines: list[bytes]) -> dict[bytes, bool]:
    """Final xet state per literal pattern, later lines overriding earlier ones."""
    states: dict[bytes, bool] = {}
    for line in lines:
        parsed = _parse_line(line)
        if parsed is None:
            continue
        state = _filter_state(parsed[2])
        if state is not None:
            states[parsed[0]] = state
    return states


def _write(path: Path, lines: list[bytes]) -> None:
    try:
        atomic_write(path, b"".join(lines), keep_mode=True)
    except OSError as exc:
        raise GitError(f"cannot write {path}: {exc}") from exc


@dataclass(frozen=True, slots=True)
class Rule:
    """A ``.gitattributes`` line that decides what gitxet stores: ``always`` a pointer,
    by ``size`` (the threshold), or ``off`` (the filter turned off: plain git)."""

    source: str  # "<file>:<line number>"
    pattern: str
    kind: Literal["always", "size", "off"]


def rules(root: str | os.PathLike[str], files: Iterable[str] = (".gitattributes",)) -> list[Rule]:
    """The lines of the given attributes files (relative to ``root``) that concern gitxet,
    in git's order (later lines win)."""
    out: list[Rule] = []
    for rel in files:
        for number, line in enumerate(_read_lines(Path(root) / rel), start=1):
            parsed = _parse_line(line)
            if parsed is None:
                continue
            state = _filter_state(parsed[2])
            always = ALWAYS.encode() in parsed[2]
            if state is None and not always:
                continue
            kind: Literal["always", "size", "off"] = (
                "off" if state is False else "always" if always else "size"
            )
            out.append(Rule(f"{rel}:{number}", os.fsdecode(parsed[0]), kind))
    return out


def tracked_patterns(root: str | os.PathLike[str]) -> list[str]:
    """Patterns in ``root/.gitattributes`` that currently send files to the xet filter."""
    states = _states(_read_lines(_attributes_path(root)))
    return [os.fsdecode(pattern) for pattern, on in states.items() if on]


def track(
    root: str | os.PathLike[str],
    patterns: Iterable[str],
    *,
    always: bool = False,
    dry_run: bool = False,
) -> list[str]:
    """Add a tracking line for each pattern not already tracked; return the ones changed.

    With ``always`` the line also carries ``xet=always`` (a pointer whatever its size); a
    pattern tracked without it gets it added to its line. ``dry_run`` changes nothing.

    Raises:
        ConfigError: an empty or negative pattern, or one ending in ``/`` (git's attributes
            match files only: such a line would match nothing).
    """
    path = _attributes_path(root)
    wanted = [(p, _encode_pattern(p)) for p in patterns]
    for text, _ in wanted:
        if text.endswith("/"):
            raise ConfigError(
                f"{text!r} would match nothing (.gitattributes patterns match files, not "
                f"directories): track {text + '**'!r} for every file under it"
            )
    lines = _read_lines(path)
    states = _states(lines)
    eol = b"\r\n" if lines and lines[0].endswith(b"\r\n") else b"\n"
    attrs = ATTRIBUTES.encode() + (b" " + ALWAYS.encode() if always else b"")
    changed: list[str] = []
    new_lines: list[bytes] = []
    for text, pattern in wanted:
        if states.get(pattern):
            at = _last_tracking_line(lines, pattern)
            if not always or at is None or _always(lines[at]):
                continue
            body = lines[at].rstrip(b"\r\n")
            lines[at] = body + b" " + ALWAYS.encode() + lines[at][len(body) :]
        else:
            states[pattern] = True
            new_lines.append(_quote(pattern) + b" " + attrs + eol)
        changed.append(text)
    if changed and not dry_run:
        if lines and not lines[-1].endswith(b"\n"):
            lines[-1] += eol
        _write(path, lines + new_lines)
    return changed


def _last_tracking_line(lines: list[bytes], pattern: bytes) -> int | None:
    for i in range(len(lines) - 1, -1, -1):
        parsed = _parse_line(lines[i])
        if parsed is not None and parsed[0] == pattern and _filter_state(parsed[2]):
            return i
    return None


def _always(line: bytes) -> bool:
    parsed = _parse_line(line)
    return parsed is not None and ALWAYS.encode() in parsed[2]


def untrack(
    root: str | os.PathLike[str], patterns: Iterable[str], *, dry_run: bool = False
) -> list[str]:
    """Stop tracking the given patterns; return those that were tracked.

    A line that only carries gitxet's attributes (``xet=always`` included) is removed; on a
    line that also carries other attributes, only gitxet's are taken out. ``dry_run``
    changes nothing.
    """
    path = _attributes_path(root)
    wanted = {_encode_pattern(p): p for p in patterns}
    lines = _read_lines(path)
    kept: list[bytes] = []
    removed: dict[bytes, str] = {}
    for line in lines:
        parsed = _parse_line(line)
        if parsed is None or parsed[0] not in wanted or b"filter=xet" not in parsed[2]:
            kept.append(line)
            continue
        pattern, token, attrs = parsed
        removed[pattern] = wanted[pattern]
        rest = [a for a in attrs if a not in _OURS]
        if rest:
            eol = line[len(line.rstrip(b"\r\n")) :]
            kept.append(token + b" " + b" ".join(rest) + eol)
    if removed and not dry_run:
        _write(path, kept)
    return [text for pattern, text in wanted.items() if pattern in removed]


# ---- path patterns (gitattributes globs) --------------------------------------------------


def _glob_regex(pattern: str) -> str:
    """Regex for one gitattributes-style glob (``*``/``?`` stay within a path component)."""
    out: list[str] = []
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if pattern.startswith("**/", i) and (i == 0 or pattern[i - 1] == "/"):
            out.append("(?:.*/)?")  # zero or more directories
            i += 3
        elif pattern.startswith("**", i) and i + 2 == n and (i == 0 or pattern[i - 1] == "/"):
            out.append(".*")  # everything inside
            i += 2
        elif c == "*":
            out.append("[^/]*")
            i += 1
        elif c == "?":
            out.append("[^/]")
            i += 1
        elif c == "[":
            end = pattern.find("]", i + 2 if pattern[i + 1 : i + 2] in ("!", "^", "]") else i + 1)
            if end < 0:
                out.append(re.escape(c))
                i += 1
                continue
            body = pattern[i + 1 : end]
            if body[:1] in ("!", "^"):
                body = "^" + body[1:]
            out.append("(?!/)[" + body.replace("\\", "\\\\") + "]")
            i = end + 1
        elif c == "\\" and i + 1 < n:
            out.append(re.escape(pattern[i + 1]))
            i += 2
        else:
            out.append(re.escape(c))
            i += 1
    return "".join(out)


def _quote_pattern(pattern: str) -> str:
    if any(ch in pattern for ch in ' \t"\\') or pattern.startswith("#"):
        return '"' + pattern.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return pattern


class PathSelector:
    """Which paths a migration converts: ``include`` (default: all) minus ``exclude``.

    Patterns follow ``.gitattributes``: a pattern without ``/`` matches a file name at any
    depth; one with ``/`` is relative to the top of the repository; ``**`` spans
    directories. A trailing ``/`` means everything under that directory. The same patterns
    are written into ``.gitattributes``, so what the filter tracks afterwards is what was
    converted.
    """

    def __init__(self, include: Sequence[str] = (), exclude: Sequence[str] = ()) -> None:
        self.include = [self._normal(p) for p in include]
        self.exclude = [self._normal(p) for p in exclude]
        self._inc = [self._compile(p) for p in self.include]
        self._exc = [self._compile(p) for p in self.exclude]

    @staticmethod
    def _normal(pattern: str) -> str:
        p = pattern.strip()
        if not p or "\n" in p or "\0" in p:
            raise ConfigError(f"invalid path pattern {pattern!r}")
        if p.startswith("!"):
            raise ConfigError(f"negative patterns are not supported: {pattern!r} (use --exclude)")
        if p.endswith("/"):
            p += "**"
        return p

    @staticmethod
    def _compile(pattern: str) -> re.Pattern[str]:
        if "/" in pattern:
            return re.compile(_glob_regex(pattern.lstrip("/")), re.DOTALL)
        return re.compile("(?:.*/)?" + _glob_regex(pattern), re.DOTALL)

    def selects(self, path: bytes) -> bool:
        """Whether the file at ``path`` (relative to the top, git bytes) is converted."""
        p = os.fsdecode(path)
        if self._inc and not any(r.fullmatch(p) for r in self._inc):
            return False
        return not any(r.fullmatch(p) for r in self._exc)

    def attributes_block(self) -> bytes:
        """The lines appended to the top-level ``.gitattributes``."""
        attrs = "filter=xet diff=xet merge=xet -text"
        lines = ["# git xet migrate: files at least xet.threshold bytes are Xet pointers"]
        lines += [f"{_quote_pattern(p)} {attrs}" for p in self.include or ["*"]]
        lines += [f"{_quote_pattern(p)} !filter !diff !merge" for p in self.exclude]
        return ("\n".join(lines) + "\n").encode()
