#!/usr/bin/env python3
"""Read performance of a gitxet mount vs local disk, a minimal pyfuse3 passthrough and rclone.

All in one run, with fio: sequential 1 MiB reads (MB/s) and random 4 KiB reads (IOPS) of
one large file, through

* local disk (the file itself),
* ``shared/bench/fuse_passthrough.py`` (the Python FUSE ceiling; ``--passthrough PATH``,
  else found by ``benchlib.shared_file``: ``$GITXET_BENCH_SHARED``, else a ``shared``
  directory beside the checkout or above it),
* ``rclone mount --vfs-cache-mode full`` of the same directory,
* ``git xet mount`` of a commit holding the file: cold (page cache dropped, fresh mount)
  and warm (read again), and warm with ``--no-read-around`` (every page the kernel misses
  becomes a FUSE request: the per-request cost of the daemon alone).

Also: time until ``git xet mount`` returns for a 10,000-file commit (goal <= 1 s; the median
of ``--ready-runs`` mounts) and the mount daemon's peak RSS while a large file streams
through it (goal <= 300 MB).

    python bench/mount.py [--size-mib 1024] [--rss-mib 4096] [--rand-seconds 10] [--dir D]
                          [--ready-runs 5] [--passthrough PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchlib import drop_caches, not_found, peak_rss_kb, shared_file, work_env

PASSTHROUGH = "bench/fuse_passthrough.py"  # under the shared directory (benchlib.shared_file)


def sh(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> str:
    r = subprocess.run(list(args), cwd=cwd, env=env, capture_output=True, text=True, timeout=3600)
    if r.returncode != 0:
        sys.exit(f"{' '.join(args)} failed: {r.stderr.strip()[-800:]}")
    return r.stdout


def fio(path: Path, size: int, rand_seconds: int) -> tuple[float, float]:
    """(sequential MB/s, random 4 KiB IOPS) for one file."""
    common = [
        "fio",
        "--name=b",
        f"--filename={path}",
        "--ioengine=psync",
        "--output-format=json",
        "--readonly",
    ]
    seq = json.loads(sh(*common, "--rw=read", "--bs=1M", f"--size={size}"))
    rnd = json.loads(
        sh(
            *common,
            "--rw=randread",
            "--bs=4k",
            f"--size={size}",
            f"--runtime={rand_seconds}",
            "--time_based",
        )
    )
    mbps = seq["jobs"][0]["read"]["bw_bytes"] / 1e6
    iops = rnd["jobs"][0]["read"]["iops"]
    return mbps, iops


def wait_mounted(mnt: Path, timeout: float = 30) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        with open("/proc/self/mountinfo") as f:
            if any(line.split()[4] == str(mnt) for line in f):
                return
        time.sleep(0.05)
    sys.exit(f"{mnt} did not mount")


def unmount(mnt: Path) -> None:
    subprocess.run(["fusermount3", "-u", str(mnt)], check=False, capture_output=True)
    time.sleep(0.3)


def make_repo(work: Path, env: dict[str, str], files: dict[str, int], small_files: int = 0) -> Path:
    remote = work / "remote.git"
    repo = work / "repo"
    if (work / "done").exists():
        return remote  # built by an earlier run with the same --dir
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    sh("git", "init", "-q", "--bare", str(remote), env=env)
    sh("git", "init", "-q", str(repo), env=env)
    sh("git", "remote", "add", "origin", str(remote), cwd=repo, env=env)
    sh("git-xet", "init", cwd=repo, env=env)
    for name, size in files.items():
        with open(repo / name, "wb") as f:
            left = size
            while left:
                n = min(left, 16 << 20)
                f.write(os.urandom(n))
                left -= n
    for i in range(small_files):
        d = repo / "many" / f"d{i // 1000:02d}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"f{i:05d}.txt").write_text(f"{i}\n")
    sh("git-xet", "add", ".", cwd=repo, env=env)
    sh("git", "commit", "-q", "-m", "data", cwd=repo, env=env)
    sh("git", "push", "-q", "origin", "main", cwd=repo, env=env)
    (work / "done").touch()
    return remote


def mount_pid(mnt: Path, env: dict[str, str]) -> int:
    out = sh("git-xet", "mounts", "--json", env=env)
    for line in out.splitlines():
        rec = json.loads(line)
        if rec["mountpoint"] == str(mnt):
            return int(rec["pid"])
    return 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--rss-mib", type=int, default=4096, help="0 skips the RSS measurement")
    ap.add_argument("--rand-seconds", type=int, default=10)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--ready-runs", type=int, default=5, help="mounts of the 10,000-file commit")
    ap.add_argument(
        "--passthrough", type=Path, default=None, help=f"the shared {PASSTHROUGH} (found if unset)"
    )
    args = ap.parse_args()
    if shutil.which("fio") is None:
        sys.exit("fio is not installed (Debian: apt-get install fio; rclone is optional)")
    passthrough = args.passthrough or shared_file(PASSTHROUGH)
    if args.passthrough is not None and not args.passthrough.is_file():
        sys.exit(f"--passthrough {args.passthrough}: no such file")
    if passthrough is None:
        print(f"(no pyfuse3 passthrough row: {not_found(PASSTHROUGH, '--passthrough PATH')})")
    size = args.size_mib << 20
    work = Path(args.dir or tempfile.mkdtemp(prefix="gitxet-mountbench-"))
    work.mkdir(parents=True, exist_ok=True)
    env = work_env(work)
    for k, v in (("user.name", "bench"), ("user.email", "b@b"), ("init.defaultBranch", "main")):
        sh("git", "config", "--global", k, v, env=env)

    print(f"building a repo with a {args.size_mib} MiB file ...", flush=True)
    ds = work / "ds"
    ds.mkdir(exist_ok=True)
    remote = make_repo(ds, env, {"big.bin": size})
    src_dir = ds / "repo"
    src = src_dir / "big.bin"
    rows: list[tuple[str, float, float]] = []

    drop_caches()
    rows.append(("local disk (cold)", *fio(src, size, args.rand_seconds)))
    rows.append(("local disk (warm)", *fio(src, size, args.rand_seconds)))

    mnt = work / "mnt"
    mnt.mkdir(exist_ok=True)
    flat = work / "flat"
    flat.mkdir(exist_ok=True)
    if not (flat / "big.bin").exists():
        os.link(src, flat / "big.bin")
    if passthrough is not None:
        print(f"pyfuse3 passthrough: {passthrough}", flush=True)
        p = subprocess.Popen(
            [sys.executable, str(passthrough), str(flat), str(mnt), "--keep-cache"]
        )
        wait_mounted(mnt)
        fio(mnt / "big.bin", size, 2)  # warm it
        rows.append(("pyfuse3 passthrough (warm)", *fio(mnt / "big.bin", size, args.rand_seconds)))
        unmount(mnt)
        p.wait(timeout=30)
    if shutil.which("rclone"):
        cache = work / "rclone-cache"
        p = subprocess.Popen(
            ["rclone", "mount", f":local:{flat}", str(mnt), "--read-only",
             "--vfs-cache-mode", "full",
             "--cache-dir", str(cache)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        wait_mounted(mnt)
        fio(mnt / "big.bin", size, 2)
        rows.append(
            ("rclone --vfs-cache-mode full (warm)", *fio(mnt / "big.bin", size, args.rand_seconds))
        )
        unmount(mnt)
        p.wait(timeout=30)
    else:
        print("(rclone not installed: apt-get install rclone)")

    drop_caches()
    sh("git-xet", "mount", str(remote), "main", str(mnt), env=env)
    try:
        rows.append(("gitxet mount (cold)", *fio(mnt / "big.bin", size, args.rand_seconds)))
        rows.append(("gitxet mount (warm)", *fio(mnt / "big.bin", size, args.rand_seconds)))
    finally:
        sh("git-xet", "unmount", str(mnt), env=env)
    # the same without chunk read-around: every page the kernel misses is a FUSE request
    sh("git-xet", "mount", "--no-read-around", str(remote), "main", str(mnt), env=env)
    try:
        fio(mnt / "big.bin", size, 2)
        rows.append(
            ("gitxet --no-read-around (warm)", *fio(mnt / "big.bin", size, args.rand_seconds))
        )
    finally:
        sh("git-xet", "unmount", str(mnt), env=env)

    print()
    print(f"{'what':<38} {'seq MB/s':>10} {'rand IOPS':>10}")
    for name, mbps, iops in rows:
        print(f"{name:<38} {mbps:>10.0f} {iops:>10.0f}")
    by = {n: (m, i) for n, m, i in rows}
    warm = by["gitxet mount (warm)"]
    if "pyfuse3 passthrough (warm)" in by:
        ratio = warm[0] / by["pyfuse3 passthrough (warm)"][0]
        print(f"warm sequential vs passthrough: {ratio:.2f}x (goal >= 0.7)")
    if "rclone --vfs-cache-mode full (warm)" in by:
        ratio = warm[1] / by["rclone --vfs-cache-mode full (warm)"][1]
        print(f"warm random IOPS vs rclone: {ratio:.2f}x (goal >= 1.0)")

    print("\nbuilding a 10,000-file commit ...", flush=True)
    many = work / "many"
    many.mkdir(exist_ok=True)
    remote10k = make_repo(many, env, {}, small_files=10_000)
    times = []
    for _ in range(max(1, args.ready_runs)):
        t = time.monotonic()
        sh("git-xet", "mount", str(remote10k), "main", str(mnt), env=env)
        times.append(time.monotonic() - t)
        sh("git-xet", "unmount", str(mnt), env=env)
    ready = statistics.median(times)
    print(
        f"git xet mount ready for a 10,000-file commit: {ready:.2f} s, the median of "
        f"{len(times)} ({' '.join(f'{x:.2f}' for x in times)}) (goal <= 1 s)"
    )

    if args.rss_mib:
        print(f"\nbuilding a {args.rss_mib} MiB file for the RSS measurement ...", flush=True)
        rss_dir = work / "rss"
        rss_dir.mkdir(exist_ok=True)
        remote_rss = make_repo(rss_dir, env, {"huge.bin": args.rss_mib << 20})
        shutil.rmtree(rss_dir / "repo", ignore_errors=True)  # keep only the remote (disk)
        sh("git-xet", "mount", str(remote_rss), "main", str(mnt), env=env)
        pid = mount_pid(mnt, env)
        try:
            t = time.monotonic()
            with open(mnt / "huge.bin", "rb") as f:
                while f.read(8 << 20):
                    pass
            dt = time.monotonic() - t
            rss = peak_rss_kb(pid) / 1024
        finally:
            sh("git-xet", "unmount", str(mnt), env=env)
        print(
            f"streamed {args.rss_mib} MiB through the mount in {dt:.1f} s "
            f"({(args.rss_mib << 20) / dt / 1e6:.0f} MB/s); "
            f"daemon peak RSS {rss:.0f} MB (goal <= 300)"
        )
    if not args.dir:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
