"""Following a branch (``git xet mount --watch``): new opens see the branch's newest commit,
files already open keep reading the commit they were opened at.

:class:`FollowingFS` is a read-only filesystem over several commits: the current one, which
the root and every name looked up in it belong to, and the last :data:`KEEP` earlier ones.
Inode numbers are a hash of (commit, path) (``gitxet.vfs.model``), so an inode names its
commit: a request about an inode goes to the commit that handed it out. A file opened, or a
directory entered, before a switch keeps reading its commit; only the root (inode 1) is
shared, and it always shows the current commit. Switching is one reference swap.

:class:`Follower` polls the branch in a thread and switches when it moved; the adapter's
``on_switch`` then drops what the kernel cached about the root's names (FUSE:
``invalidate_entry``), so the next path walk looks them up again, in the new commit.

The commit served, and the earlier ones still readable, are written to a small JSON file
beside the daemon's log (:func:`state_file_for`): ``git xet mounts`` shows the commit from
it, and a serving process that takes over after a crash (``gitxet.mount.supervisor``) reads
it, so the handles its predecessor gave out still find their commits.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from gitxet.errors import FormatError
from gitxet.formats.record import load_json_object
from gitxet.util.atomic import atomic_write
from gitxet.vfs.model import ROOT_INO, CommitFS
from gitxet.vfs.nodes import Attrs, FSStats

log = logging.getLogger(__name__)

KEEP = 4  # earlier commits kept readable for files opened before a switch
_STATE_VERSION = 1
_STATE_MAX_BYTES = 64 * 1024


def state_file_for(log_path: str) -> str:
    """Where the daemon logging to ``log_path`` records the commits it serves."""
    base, _ = os.path.splitext(log_path)
    return base + ".watch.json"


def write_state(path: str, branch: str, commit: str, history: Sequence[str]) -> None:
    """Record (atomically) that ``commit`` of ``branch`` is served, ``history`` still read."""
    body = {"version": _STATE_VERSION, "branch": branch, "commit": commit}
    body["history"] = list(history)
    atomic_write(path, json.dumps(body, sort_keys=True).encode("utf-8") + b"\n", durable=False)


def read_state(path: str) -> tuple[str, str, list[str]] | None:
    """``(branch, commit, history)`` from :func:`write_state`'s file, or ``None`` when there
    is none or it is unreadable."""
    try:
        with open(path, "rb") as f:
            raw = load_json_object(f.read(_STATE_MAX_BYTES + 1), path, max_bytes=_STATE_MAX_BYTES)
    except (OSError, FormatError):
        return None
    branch, commit, history = raw.get("branch"), raw.get("commit"), raw.get("history")
    if raw.get("version") != _STATE_VERSION or not isinstance(branch, str):
        return None
    if not _is_sha(commit) or not isinstance(history, list) or not all(map(_is_sha, history)):
        return None
    return branch, str(commit), [str(h) for h in history][:KEEP]


def _is_sha(value: Any) -> bool:
    return isinstance(value, str) and len(value) in (40, 64) and not value.strip("0123456789abcdef")


class FollowingFS:
    """A :class:`~gitxet.vfs.nodes.ReadOnlyFS` whose root follows a branch (see the module
    docstring). ``open_commit`` opens one commit; ``history`` names earlier commits whose
    inodes a kernel may still hold (opened only when such an inode shows up)."""

    def __init__(
        self, open_commit: Callable[[str], CommitFS], commit: str, history: Sequence[str] = ()
    ) -> None:
        self._open = open_commit
        self._lock = threading.Lock()
        self._current = open_commit(commit)
        self._old: list[CommitFS] = []  # newest first
        self._pending = [c for c in dict.fromkeys(history) if c != commit][:KEEP]
        self.inline_reads = self._current.inline_reads

    # ---- following

    @property
    def commit(self) -> str:
        """The commit new lookups see."""
        return self._current.commit

    def current(self) -> CommitFS:
        """The filesystem of the commit new lookups see."""
        return self._current

    def history(self) -> list[str]:
        """Earlier commits still readable through handles opened at them, newest first."""
        with self._lock:
            return [fs.commit for fs in self._old] + list(self._pending)

    def switch(self, commit: str) -> CommitFS:
        """Serve ``commit`` to new lookups from now on; returns the previous current one.

        The commit is opened first (that may take a while), then swapped in at once; the
        earliest commit beyond :data:`KEEP` is closed (files still open at it fail).
        """
        new = self._open(commit)
        with self._lock:
            prev, self._current = self._current, new
            self._old.insert(0, prev)
            evicted, self._old = self._old[KEEP:], self._old[:KEEP]
            self._pending = self._pending[: max(0, KEEP - len(self._old))]
        for fs in evicted:
            fs.close()
        return prev

    def _fs(self, ino: int) -> CommitFS:
        """The commit that handed out ``ino`` (the current one for the root and strangers)."""
        with self._lock:
            current, old = self._current, list(self._old)
        if ino == ROOT_INO:
            return current
        for fs in (current, *old):
            if fs.knows(ino):
                return fs
        # not handed out by this process: a handle from before a takeover. Search the
        # commits it may come from (each tree expanded once); else current says "stale"
        for fs in (current, *old):
            if fs.knows(ino, search=True):
                return fs
        while True:
            with self._lock:
                if not self._pending:
                    return current
                sha = self._pending.pop(0)
            try:
                fs = self._open(sha)
            except Exception as exc:
                log.warning("cannot open earlier commit %s: %s", sha[:12], exc)
                continue
            with self._lock:
                self._old.append(fs)
            if fs.knows(ino, search=True):
                return fs

    # ---- ReadOnlyFS

    @property
    def root_ino(self) -> int:
        return ROOT_INO

    def getattr(self, ino: int) -> Attrs:
        return self._fs(ino).getattr(ino)

    def lookup(self, parent_ino: int, name: bytes) -> Attrs:
        return self._fs(parent_ino).lookup(parent_ino, name)

    def parent(self, ino: int) -> int:
        return ROOT_INO if ino == ROOT_INO else self._fs(ino).parent(ino)

    def readdir(self, ino: int) -> list[tuple[bytes, Attrs]]:
        return self._fs(ino).readdir(ino)

    def readlink(self, ino: int) -> bytes:
        return self._fs(ino).readlink(ino)

    def read(self, ino: int, offset: int, size: int) -> bytes:
        return self._fs(ino).read(ino, offset, size)

    def try_read(self, ino: int, offset: int, size: int) -> bytes | None:
        """:meth:`CommitFS.try_read` of the commit that holds ``ino`` (memory only)."""
        with self._lock:
            candidates = (self._current, *self._old)
        for fs in candidates:
            if fs.knows(ino):
                return fs.try_read(ino, offset, size)
        return None

    def chunk_extent(self, ino: int, offset: int) -> tuple[int, int] | None:
        return self._fs(ino).chunk_extent(ino, offset)

    def statfs(self) -> FSStats:
        return self._current.statfs()

    def statfs_nowait(self) -> FSStats:
        return self._current.statfs_nowait()

    def close(self) -> None:
        """Close every commit."""
        with self._lock:
            every = [self._current, *self._old]
            self._old = []
        for fs in every:
            fs.close()


class Follower:
    """Polls a branch every ``interval`` seconds and switches ``fs`` when it moved.

    ``resolve()`` returns the branch's commit now (a rev-parse, or a fetch of an http(s)
    remote first); its failures are logged and the mount keeps serving what it has.
    ``on_switch(previous, current)`` runs after each switch (the adapter drops the kernel's
    cached names); ``state_path`` is rewritten with the commits served.
    """

    def __init__(
        self,
        fs: FollowingFS,
        branch: str,
        resolve: Callable[[], str],
        interval: float,
        *,
        on_switch: Callable[[CommitFS, CommitFS], None] | None = None,
        state_path: str | None = None,
    ) -> None:
        self.fs = fs
        self.branch = branch
        self.resolve = resolve
        self.interval = interval
        self.on_switch = on_switch
        self.state_path = state_path
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failing = False

    def save(self) -> None:
        """Write the state file (if any): the commit served and the earlier ones."""
        if self.state_path is not None:
            try:
                write_state(self.state_path, self.branch, self.fs.commit, self.fs.history())
            except OSError as exc:
                log.warning("cannot write %s: %s", self.state_path, exc)

    def poll(self) -> bool:
        """Resolve the branch once and switch if it moved; returns whether it did."""
        sha = self.resolve()
        if sha == self.fs.commit:
            return False
        started = time.monotonic()
        prev = self.fs.switch(sha)
        self.save()
        if self.on_switch is not None:
            self.on_switch(prev, self.fs.current())
        log.info(
            "%s moved: serving %s (was %s; switched in %.2f s)",
            self.branch,
            sha[:12],
            prev.commit[:12],
            time.monotonic() - started,
        )
        return True

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.poll()
            except Exception as exc:
                if not self._failing:  # once per outage, not once per poll
                    log.warning(
                        "cannot follow %s (still serving %s): %s",
                        self.branch,
                        self.fs.commit[:12],
                        exc,
                    )
                self._failing = True
            else:
                if self._failing:
                    log.info("following %s again", self.branch)
                self._failing = False

    def start(self) -> None:
        """Poll in a daemon thread until :meth:`stop`."""
        self.save()
        self._thread = threading.Thread(target=self._run, name="gitxet-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop polling (waits for a poll in progress, bounded)."""
        self._stop.set()
        if self._thread is not None:
            with contextlib.suppress(RuntimeError):
                self._thread.join(30)
