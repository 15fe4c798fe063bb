"""Test-only mount daemon: serve a deterministic MemoryFS over FUSE in the foreground.

Run as ``python -m tests.helpers.fuse_serve MOUNTPOINT [--fail-reads] [--gate NAME]`` from the
repository root. ``--gate NAME`` makes reads of that one file wait until the daemon receives
SIGUSR1, so a test can hold one read in flight and check that the rest of the mount still
answers; ``--gate-entered PATH`` is created when such a read reaches the daemon (the test
waits for it instead of sleeping). ``--ready-file PATH`` is written once the mount is live.
"""

from __future__ import annotations

import argparse
import logging
import random
import signal
import sys
import threading
from typing import Any

from gitxet.mount.fuse import serve
from tests.helpers.memfs import MemoryFS

PARALLEL_FILES = 8
MANY = 300  # entries in one directory: more than one kernel readdir buffer


def build_tree() -> dict[str, object]:
    """The files the daemon serves; tests call this too and compare."""
    rng = random.Random(20240601)
    tree: dict[str, object] = {
        "README.md": b"# test tree\n",
        "empty.txt": b"",
        "one.bin": b"\x00",
        "edge/page_minus_1.bin": rng.randbytes(4095),
        "edge/page.bin": rng.randbytes(4096),
        "edge/128k_plus_1.bin": rng.randbytes(128 * 1024 + 1),
        "data/big.bin": rng.randbytes(3 * 1024 * 1024 + 17),
        "data/nested/deep/leaf.txt": b"leaf\n",
        "run.sh": b"#!/bin/sh\necho hello\n",
        "link": ("link", "data/big.bin"),
        "dangling": ("link", "nowhere/at/all"),
        "empty_dir": None,
        "spaced name é.txt": b"unicode and spaces\n",
        "slow.bin": rng.randbytes(64 * 1024),
        "fresh.bin": rng.randbytes(200 * 1024),  # read by one test only, so never pre-cached
    }
    for i in range(PARALLEL_FILES):
        tree[f"par/f{i}.bin"] = rng.randbytes(512 * 1024 + i)
    for i in range(MANY):
        tree[f"many/entry_{i:04d}.txt"] = f"{i}\n".encode()
    return tree


class GatedFS(MemoryFS):
    """MemoryFS whose reads of one file wait on ``read_event`` (the others never wait)."""

    def __init__(
        self, files: dict[str, object], gated: str | None, entered: str | None = None
    ) -> None:
        super().__init__(files)
        self._entered = entered
        self._gated_ino: int | None = None
        if gated is not None:
            ino = self.root_ino
            for part in gated.split("/"):
                ino = self.lookup(ino, part.encode()).ino
            self._gated_ino = ino
        self.gate = threading.Event()

    def read(self, ino: int, offset: int, size: int) -> bytes:
        if ino == self._gated_ino:
            if self._entered is not None:
                with open(self._entered, "a"):
                    pass
            self.gate.wait(30)
        return super().read(ino, offset, size)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("mountpoint")
    ap.add_argument("--fail-reads", action="store_true")
    ap.add_argument("--gate")
    ap.add_argument("--gate-entered")
    ap.add_argument("--ready-file")
    ap.add_argument("--grace", type=float, default=5.0)
    ap.add_argument("--fail-ready", action="store_true")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")

    fs = GatedFS(build_tree(), args.gate, args.gate_entered)
    fs.fail_reads = args.fail_reads

    def open_gate(signum: int, frame: Any) -> None:
        fs.gate.set()

    signal.signal(signal.SIGUSR1, open_gate)

    def ready() -> None:
        print("mounted", args.mountpoint, flush=True)
        if args.fail_ready:
            raise RuntimeError("ready callback refuses")
        if args.ready_file:
            with open(args.ready_file, "w") as f:
                f.write("ready\n")

    serve(fs, args.mountpoint, fsname="gitxet-test", ready=ready, shutdown_grace=args.grace)
    print("unmounted", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
