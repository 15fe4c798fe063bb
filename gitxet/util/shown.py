"""Text from a repository made safe to print: a tree can name a file with a newline, an
escape sequence (``\\x1b]...``: a terminal would act on it) or bytes that are not UTF-8.

:func:`shown` quotes a path the way git does (``core.quotePath=false``): as it is when every
character is printable and none is ``"`` or ``\\``, else in double quotes with those
characters escaped. :func:`one_line` escapes the unprintable characters of a message (which
can hold such a path) so that it stays one line and the terminal only displays it.
"""

from __future__ import annotations

__all__ = ["one_line", "shown"]

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
