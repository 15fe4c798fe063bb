"""A DataLoader worker's job without torch: read whole files through an fsspec filesystem
handed over by pickling (spawned workers) or by a fork. A module of its own, so a spawned
worker imports only this and fsspec, not the test module's pandas and pyarrow."""

from __future__ import annotations

import hashlib
from typing import Any


def read_all(job: tuple[Any, list[str]]) -> list[str]:
    """SHA-256 of each file of ``job``: (filesystem, names)."""
    fs, names = job
    return [hashlib.sha256(fs.cat_file(n)).hexdigest() for n in names]
