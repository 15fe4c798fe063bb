"""Text from a repository made safe to print: a tree can name a file with a newline, an
escape sequence (``\\x1b]...``: a terminal would act on it) or bytes that are not UTF-8.

:func:`shown` quotes a path the way git does (``core.quotePath=false``): as it is when every
character is printable and none is ``"`` or ``\\``, else in double quotes with those
characters escaped. :func:`one_line` escapes the unprintable characters of a message (which
can hold such a path) so that it stays one line and the terminal only displays it.
:func:`shortened` cuts the middle out of each very long word of a message (a 100 KB argument
echoed back in an error).
"""

from __future__ import annotations

import re

__all__ = ["LONG_WORD", "one_line", "shortened", "shown"]

#: A message's words longer than this are shown cut (:func:`shortened`).
LONG_WORD = 200
_LONG = re.compile(rf"\S{{{LONG_WORD + 1},}}")

_NAMED = {"\n": "\\n", "\t": "\\t", "\r": "\\r", "\a": "\\a", "\b": "\\b", "\f": "\\f", "\v": "\\v"}


def _escape(c: str) -> str:
    if c in _NAMED:
        return _NAMED[c]
    n = ord(c)
    if 0xDC80 <= n <= 0xDCFF:  # a byte that is not UTF-8 (os.fsdecode's surrogateescape)
        return f"\\x{n - 0xDC00:02x}"
    return f"\\x{n:02x}" if n < 0x100 else f"\\u{n:04x}" if n < 0x10000 else f"\\U{n:08x}"


def one_line(text: str) -> str:
    """``text`` with every unprintable character (newlines, escape sequences, bytes that
    are not UTF-8) written as its escape."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else _escape(c) for c in text)


def shown(path: str) -> str:
    """``path`` as git shows it: quoted, with escapes, when it is not plainly printable."""
    if path.isprintable() and '"' not in path and "\\" not in path:
        return path
    body = "".join("\\" + c if c in '"\\' else c if c.isprintable() else _escape(c) for c in path)
    return f'"{body}"'


def shortened(text: str) -> str:
    """``text`` with each word (a run of non-blank characters) longer than
    :data:`LONG_WORD` cut to its start and end around a count of what was left out."""

    def cut(m: re.Match[str]) -> str:
        w = m.group(0)
        return f"{w[:120]}...[{len(w) - 160} more characters]...{w[-40:]}"

    return _LONG.sub(cut, text) if len(text) > LONG_WORD else text
