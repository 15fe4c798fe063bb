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


#: seconds between progress lines when stderr is not a terminal (CI logs, pipes)
LOG_EVERY = 5.0


class Bar:
    """``bar(n)`` advances by ``n`` bytes; ``bar.expect(total)`` sets (or raises) the
    total once a lower layer knows it. The count never passes the total."""

    def __init__(self, total: int | None) -> None:
        self.total = total
        self.done = 0
        self._lock = threading.Lock()
        self._on_change: Callable[[], None] | None = None

    def __call__(self, n: int) -> None:
        with self._lock:
            self.done += n
            if self.total is not None and self.done > self.total:
                self.total = self.done  # an estimate was low: grow it, never overshoot
        if self._on_change is not None:
            self._on_change()

    def expect(self, total: int) -> None:
        with self._lock:
            self.total = max(total, self.done)
        if self._on_change is not None:
            self._on_change()

    def line(self, description: str) -> str:
        with self._lock:
            done, total = self.done, self.total
        if total:
            pct = 100.0 * done / total
            return f"git-xet: {description}: {human_size(done)} of {human_size(total)} ({pct:.0f}%)"
        return f"git-xet: {description}: {human_size(done)}"


@contextmanager
def byte_progress(
    description: str, total: int | None, *, every: float = LOG_EVERY, quiet: bool = False
) -> Iterator[Bar]:
    """Yield a :class:`Bar`: drawn on a terminal; elsewhere one line every ``every``
    seconds on stderr while the work lasts (nothing for work that ends sooner); never shown
    with ``quiet``."""
    bar = Bar(total)
    if quiet:
        yield bar
        return
    if not interactive():
        stop = threading.Event()

        def log() -> None:
            while not stop.wait(every):
                print(bar.line(description), file=sys.stderr, flush=True)

        t = threading.Thread(target=log, name="gitxet-progress", daemon=True)
        t.start()
        try:
            yield bar
        finally:
            stop.set()
            t.join(1.0)
        return
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

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

        def update() -> None:
            progress.update(task, completed=bar.done, total=bar.total)

        bar._on_change = update
        yield bar
        if bar.total is None or bar.done < bar.total:  # ends full: the work is done
            progress.update(task, total=bar.done, completed=bar.done)
