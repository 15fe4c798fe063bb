#!/usr/bin/env python3
"""Chunk+hash throughput of gitxet vs hf_xet.hash_files, and peak RSS of a 4 GiB ingest.

Both tools hash the same page-cached file, alternating, several runs; the script prints
MB/s for each run and the median ratio gitxet/hf_xet (goal: >= 1.0). Then a child process
ingests a larger file into a fresh store and reports its peak RSS (goal: <= 300 MB).

    python bench/ingest.py [--size-mib 1024] [--runs 5] [--ingest-mib 4096] [--dir DIR]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time


def make_file(path: str, size: int) -> None:
    if os.path.exists(path) and os.path.getsize(path) == size:
        return
    block = 16 << 20
    with open(path, "wb") as f:
        left = size
        while left > 0:
            n = min(block, left)
            f.write(os.urandom(n))
            left -= n


def page_cache(path: str) -> None:
    with open(path, "rb") as f:
        while f.read(16 << 20):
            pass


def time_gitxet(path: str) -> tuple[float, str]:
    from gitxet.chunking.pipeline import digest_stream
    from gitxet.hashing import to_hex

    t = time.perf_counter()
    with open(path, "rb") as f:
        d = digest_stream(f)
    return time.perf_counter() - t, to_hex(d.hash)


def time_hf(path: str) -> tuple[float, str]:
    import hf_xet

    t = time.perf_counter()
    r = hf_xet.hash_files([path])
    return time.perf_counter() - t, str(r[0].hash)


INGEST_CHILD = r"""
import sys, resource
from gitxet.store.cas import LocalCAS
from gitxet.data.clean import Ingestor
cas = LocalCAS(sys.argv[2], durable=False)
with Ingestor(cas) as ing:
    r = ing.add_path(sys.argv[1])
    ing.flush()
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--ingest-mib", type=int, default=4096, help="0 skips the RSS test")
    ap.add_argument("--dir", default=None, help="where to put the data (default: a temp dir)")
    args = ap.parse_args()

    from gitxet import chunking

    work = args.dir or tempfile.mkdtemp(prefix="gitxet-bench-")
    os.makedirs(work, exist_ok=True)
    path = os.path.join(work, f"random-{args.size_mib}m.bin")
    size = args.size_mib << 20
    make_file(path, size)
    page_cache(path)
    print(f"file: {path} ({size / 1e6:.0f} MB), gitxet chunker: {chunking.IMPLEMENTATION}")
    print(f"{'run':>3} {'gitxet MB/s':>12} {'hf_xet MB/s':>12} {'ratio':>6}")
    ratios = []
    for i in range(args.runs):
        # alternate who goes first so neither always gets the warmer machine
        if i % 2 == 0:
            g, gh = time_gitxet(path)
            h, hh = time_hf(path)
        else:
            h, hh = time_hf(path)
            g, gh = time_gitxet(path)
        if gh != hh:
            sys.exit(f"hash mismatch: gitxet {gh} vs hf_xet {hh}")
        ratios.append(h / g)
        print(f"{i + 1:>3} {size / g / 1e6:>12.0f} {size / h / 1e6:>12.0f} {h / g:>6.2f}")
    print(f"median throughput ratio gitxet/hf_xet: {statistics.median(ratios):.2f} (goal >= 1.0)")

    if args.ingest_mib:
        big = os.path.join(work, f"random-{args.ingest_mib}m.bin")
        make_file(big, args.ingest_mib << 20)
        store = tempfile.mkdtemp(prefix="store-", dir=work)
        t = time.perf_counter()
        out = subprocess.run(
            [sys.executable, "-c", INGEST_CHILD, big, store],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        dt = time.perf_counter() - t
        rss_mb = int(out.strip().splitlines()[-1]) / 1024
        print(
            f"ingest {args.ingest_mib} MiB into a fresh store: {dt:.1f} s "
            f"({(args.ingest_mib << 20) / dt / 1e6:.0f} MB/s), "
            f"peak RSS {rss_mb:.0f} MB (goal <= 300)"
        )
        subprocess.run(["rm", "-rf", store], check=False)
    _ = resource  # imported for the child's use only


if __name__ == "__main__":
    main()
