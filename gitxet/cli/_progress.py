"""Progress bars: rich on a terminal, silent otherwise (pipes, CI logs, git's filter)."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


def human_size(n: int) -> str:
    """``n`` bytes for people: ``512 B``, ``3.4 MiB``, ``1.2 TiB``."""
    if n < 1024:
        return f"{n} B"
    value = float(n)
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        value /= 1024
        if value < 1024 or unit == "TiB":
            break
    return f"{value:.1f} {unit}"


def stderr_console() -> Any:
    from rich.console import Console

    return Console(stderr=True)


def interactive() -> bool:
    return sys.stderr.isatty()


@contextmanager
def byte_progress(description: str, total: int | None) -> Iterator[Callable[[int], None]]:
    """Yield an ``advance(nbytes)`` callback; draws a bar only on a terminal."""
    if not interactive():
        yield lambda n: None
        return
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    lock = threading.Lock()
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=stderr_console(),
        transient=False,
    ) as progress:
        task = progress.add_task(description, total=total)

        def advance(n: int) -> None:
            with lock:
                progress.advance(task, n)

        yield advance
