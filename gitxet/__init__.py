"""gitxet: versioned datasets for git, stored as Xet chunks, xorbs and shards.

This module deliberately imports nothing at import time so that `git xet filter-process`
starts fast; ``gitxet.open`` and ``gitxet.ls`` (from :mod:`gitxet.fsspec.api`) load on first
use.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"
__all__ = ["__version__"]  # not open/ls: a star import must not replace builtins.open


def __getattr__(name: str) -> Any:
    if name in ("open", "ls"):
        # A dynamic import on purpose: a static one would make every module that imports
        # the package (all of them) depend on the fsspec adapter, against the layering.
        return getattr(importlib.import_module("gitxet.fsspec.api"), name)
    raise AttributeError(f"module 'gitxet' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), "ls", "open"])
