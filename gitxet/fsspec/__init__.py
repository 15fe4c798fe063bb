"""gitxet as an fsspec filesystem: ``xet://<repo>@<rev>/<path>`` (see ``docs/python.md``).

Registered with fsspec through the ``fsspec.specs`` entry point, so ``fsspec.open("xet://...")``
works without importing gitxet. An adapter like the mount: it sits on ``gitxet.repo`` and
``gitxet.vfs`` and never imports ``gitxet.mount`` or ``gitxet.server``.

``gitxet.open`` and ``gitxet.ls`` live in :mod:`gitxet.fsspec.api`; they are not exported
here, so that a star import never replaces the builtin ``open``.
"""

from gitxet.fsspec.api import xet_url
from gitxet.fsspec.file import AdaptiveReadahead, XetFile
from gitxet.fsspec.filesystem import XetFileSystem
from gitxet.fsspec.sources import FetchStats
from gitxet.fsspec.url import XetURL, format_url, parse_url

__all__ = [
    "AdaptiveReadahead",
    "FetchStats",
    "XetFile",
    "XetFileSystem",
    "XetURL",
    "format_url",
    "parse_url",
    "xet_url",
]
