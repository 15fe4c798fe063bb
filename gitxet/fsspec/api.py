"""The small Python API: ``gitxet.open`` and ``gitxet.ls`` over :class:`XetFileSystem`."""

from __future__ import annotations

import os
from typing import IO, Any

from gitxet.fsspec.filesystem import XetFileSystem
from gitxet.fsspec.url import format_url


def xet_url(repo: str | os.PathLike[str], commit: str, path: str = "") -> str:
    """The ``xet://`` URL of ``path`` at ``commit`` of ``repo`` (a relative path is made
    absolute against the current directory; URLs are kept as they are)."""
    spec = os.fspath(repo)
    if "://" not in spec:
        spec = os.path.abspath(os.path.expanduser(spec))
    return format_url(spec, commit, path)


def open(  # the public name is gitxet.open, like builtins.open
    repo: str | os.PathLike[str],
    commit: str,
    path: str,
    mode: str = "rb",
    **kwargs: Any,
) -> IO[Any]:
    """Open ``path`` of ``commit`` (branch, tag or sha) of ``repo`` for reading.

    ``mode`` is ``"rb"`` (a seekable binary file) or ``"r"`` (text; ``encoding`` etc. go in
    ``kwargs``). Other keyword arguments are those of ``XetFileSystem.open``
    (``block_size``, ``cache_type``).
    """
    f: IO[Any] = XetFileSystem().open(xet_url(repo, commit, path), mode, **kwargs)
    return f


def ls(
    repo: str | os.PathLike[str], commit: str, path: str = "", *, detail: bool = False
) -> list[Any]:
    """Names (or, with ``detail=True``, info dicts) of the entries of a directory of a commit.

    Names are paths relative to the commit's root, so they can be passed back as ``path``.
    """
    root = xet_url(repo, commit)
    fs = XetFileSystem()
    entries = fs.ls(xet_url(repo, commit, path), detail=True)
    prefix = len(fs._strip_protocol(root)) + 1
    if detail:
        return [dict(e, path=e["name"][prefix:]) for e in entries]
    return [e["name"][prefix:] for e in entries]
