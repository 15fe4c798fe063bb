#!/usr/bin/env python3
"""Daily git workflow on an evolving dataset: gitxet (embedded store) vs git-lfs, same run.

The dataset comes from the shared generator (``make_dataset.py``; 5 versions of ~411-426 MB:
a 200 MiB binary with inserts, a growing CSV, an .npy with edits, 500 small JSON files). It
is run at bench time from its own location (``--make-dataset``; default
``shared/bench/make_dataset.py``, found as ``benchlib.shared_file`` says), never copied here.

For each tool the script makes a work repository and a bare remote on disk, then for each
version copies the files that changed into the work tree (not timed: an editor or a job
rewrote them; then ``sync``, so no tool pays for writing the copy back) and times
``git add -A``, ``git commit`` and ``git push``. After the last version it measures the
remote's size and times a fresh clone (materialized), then checks that the clone holds the
last version byte for byte. The two tools alternate version by
version, so load from other users of the machine hits both alike.

* gitxet: ``git xet init`` (files >= 256 KiB become pointers; the small JSON files stay git
  blobs), ``git push`` runs the pre-push hook that uploads xorbs and shards into
  ``<remote>/xet``; ``git xet clone`` clones and materializes.
* git-lfs: ``git lfs track '*.bin' '*.csv' '*.npy'``. With a remote that is a local path,
  git-lfs (3.x, as in Debian) needs no server and no configuration: it picks its built-in
  ``lfs-standalone-file`` transfer adapter (visible with ``GIT_TRACE=1``) and copies objects
  into ``<remote>/lfs/objects``. Clone is a plain ``git clone`` with git-lfs's filter
  installed (``git lfs install`` in the bench's private HOME).

Goals (issues #3, #13): remote <= 380 MB; first version (v1 add+commit+push) <= 1.0x
git-lfs time; incremental version (mean of v2..) <= 0.45x git-lfs time; clone <= 1.0x
git-lfs time. Page cache stays warm (the machine is shared; nothing is dropped).

    python bench/git_workflow.py [--data DIR] [--work DIR] [--scale 1.0] [--keep]
        [--make-dataset PATH] [--json OUT] [--profile DIR]

``--profile DIR`` runs gitxet's filter process and pre-push hook under cProfile and prints
the top functions of each stage.
"""

from __future__ import annotations

import argparse
import filecmp
import hashlib
import json
import os
import pstats
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from benchlib import byte_compile, not_found, sealed_env, shared_file

MAKER = "bench/make_dataset.py"  # under the shared directory (benchlib.shared_file)
LFS_PATTERNS = ("*.bin", "*.csv", "*.npy")
GOAL_REMOTE_MB = 380.0
GOAL_FIRST = 1.0
GOAL_INCREMENTAL = 0.45
GOAL_CLONE = 1.0
MB = 1e6


@dataclass
class Step:
    add: float
    commit: float
    push: float

    @property
    def total(self) -> float:
        return self.add + self.commit + self.push


@dataclass
class ToolRun:
    name: str
    root: Path
    steps: list[Step] = field(default_factory=list)
    remote_bytes: int = 0
    remote_parts: dict[str, int] = field(default_factory=dict)
    local_store_bytes: int = 0
    clone_s: float = 0.0
    clone_ok: bool = False

    @property
    def work(self) -> Path:
        return self.root / "work"

    @property
    def remote(self) -> Path:
        return self.root / "remote.git"


def sh(args: list[str], cwd: Path, env: dict[str, str]) -> float:
    """Run a command; fail loudly with its output; return wall seconds."""
    t = time.perf_counter()
    r = subprocess.run(args, cwd=cwd, env=env, capture_output=True, check=False)
    dt = time.perf_counter() - t
    if r.returncode != 0:
        sys.exit(
            f"{' '.join(args)} failed in {cwd} ({r.returncode}):\n"
            f"{r.stdout.decode(errors='replace')[-2000:]}\n{r.stderr.decode(errors='replace')[-4000:]}"
        )
    return dt


def tree_bytes(path: Path) -> int:
    total = 0
    for dirpath, _, files in os.walk(path):
        for f in files:
            p = os.path.join(dirpath, f)
            if not os.path.islink(p):
                total += os.path.getsize(p)
    return total


def version_files(vdir: Path) -> list[Path]:
    return sorted(p.relative_to(vdir) for p in vdir.rglob("*") if p.is_file())


def sync_version(vdir: Path, work: Path) -> int:
    """Copy the files of ``vdir`` that differ from the work tree; returns how many."""
    changed = 0
    for rel in version_files(vdir):
        dst = work / rel
        if dst.exists() and filecmp.cmp(vdir / rel, dst, shallow=False):
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(vdir / rel, dst)
        changed += 1
    return changed


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while b := f.read(8 << 20):
            h.update(b)
    return h.hexdigest()


def ensure_dataset(maker: Path, data: Path, versions: int, scale: float) -> None:
    if all((data / f"v{v}").is_dir() for v in range(1, versions + 1)):
        print(f"dataset: reusing {data}", flush=True)
        return
    if not maker.is_file():
        sys.exit(f"make_dataset.py not found at {maker} (use --make-dataset PATH)")
    print(f"dataset: generating into {data} with {maker} (scale {scale})", flush=True)
    subprocess.run(
        [sys.executable, str(maker), "--out", str(data), "--versions", str(versions),
         "--scale", str(scale)],
        check=True,
    )  # fmt: skip


def setup_gitxet(run: ToolRun, env: dict[str, str], profile: Path | None) -> None:
    sh(["git", "init", "-q", "--bare", str(run.remote)], run.root, env)
    sh(["git", "init", "-q", str(run.work)], run.root, env)
    sh(["git", "remote", "add", "origin", str(run.remote)], run.work, env)
    sh(["git-xet", "init"], run.work, env)
    if profile is not None:
        hook = run.work / ".git" / "hooks" / "pre-push"
        hook.write_text(
            # gitxet's marker line, or the filter would chain this hook behind its own
            "#!/bin/sh\n# gitxet hook\n"
            f'exec {sys.executable} -m cProfile -o "{profile}/pre-push-$$.prof" '
            '-m gitxet pre-push "$@"\n',
            encoding="utf-8",
        )


def setup_lfs(run: ToolRun, env: dict[str, str]) -> None:
    sh(["git", "init", "-q", "--bare", str(run.remote)], run.root, env)
    sh(["git", "init", "-q", str(run.work)], run.root, env)
    sh(["git", "remote", "add", "origin", str(run.remote)], run.work, env)
    sh(["git", "lfs", "install", "--local"], run.work, env)
    sh(["git", "lfs", "track", *LFS_PATTERNS], run.work, env)


def profile_version(run: ToolRun, env: dict[str, str], profile: Path, v: int) -> None:
    """Point the filter's profile output at this version's file."""
    cmd = [sys.executable, "-m", "cProfile", "-o", str(profile / f"filter-v{v}.prof"),
           "-m", "gitxet", "filter-process"]  # fmt: skip
    sh(["git", "config", "filter.xet.process", " ".join(cmd)], run.work, env)


def do_version(run: ToolRun, vdir: Path, v: int, env: dict[str, str]) -> Step:
    changed = sync_version(vdir, run.work)
    # the copy is not timed, and neither is writing it back to disk: without this, whichever
    # tool syncs its own files (gitxet fsyncs what it stores) waits for the copy's ~400 MB
    # of dirty pages too (ext4 commits them first), while one that does not (git-lfs) never does
    os.sync()
    add = sh(["git", "add", "-A"], run.work, env)
    commit = sh(["git", "commit", "-q", "-m", f"v{v}"], run.work, env)
    push = sh(["git", "push", "-q", "origin", "main"], run.work, env)
    step = Step(add, commit, push)
    print(
        f"  {run.name:7s} v{v}: {changed:3d} files changed  add {add:6.2f}s  "
        f"commit {commit:5.2f}s  push {push:6.2f}s  total {step.total:6.2f}s",
        flush=True,
    )
    return step


def finish(run: ToolRun, last: Path, env: dict[str, str]) -> None:
    run.remote_bytes = tree_bytes(run.remote)
    side = "xet" if run.name == "gitxet" else "lfs"
    run.remote_parts = {
        side: tree_bytes(run.remote / side),
        "git": tree_bytes(run.remote / "objects"),
    }
    run.local_store_bytes = tree_bytes(run.work / ".git" / side)
    clone = run.root / "clone"
    if run.name == "gitxet":
        run.clone_s = sh(["git-xet", "clone", str(run.remote), str(clone)], run.root, env)
    else:
        run.clone_s = sh(["git", "clone", "-q", str(run.remote), str(clone)], run.root, env)
    run.clone_ok = all(
        (clone / rel).is_file() and sha256_of(clone / rel) == sha256_of(last / rel)
        for rel in version_files(last)
    )
    print(
        f"  {run.name:7s} remote {run.remote_bytes / MB:8.1f} MB  clone {run.clone_s:6.2f}s  "
        f"clone identical: {run.clone_ok}",
        flush=True,
    )


def _parts(r: ToolRun) -> str:
    return ", ".join(f"{k} {v / MB:.1f}" for k, v in r.remote_parts.items())


def report(runs: dict[str, ToolRun], versions: int) -> dict[str, object]:
    x, lfs = runs["gitxet"], runs["lfs"]
    print()
    print("| version | gitxet add | commit | push | **total** | git-lfs add | commit | push |"
          " **total** | ratio |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for i in range(versions):
        a, b = x.steps[i], lfs.steps[i]
        print(
            f"| v{i + 1} | {a.add:.2f} | {a.commit:.2f} | {a.push:.2f} | **{a.total:.2f}** "
            f"| {b.add:.2f} | {b.commit:.2f} | {b.push:.2f} | **{b.total:.2f}** "
            f"| {a.total / b.total:.2f}x |"
        )
    inc_x = sum(s.total for s in x.steps[1:]) / max(1, versions - 1)
    inc_l = sum(s.total for s in lfs.steps[1:]) / max(1, versions - 1)
    print()
    print("| | gitxet | git-lfs | ratio | goal |")
    print("|---|---:|---:|---:|---|")
    rx, rl = x.remote_bytes / MB, lfs.remote_bytes / MB
    verdict = {True: "met", False: "MISSED"}
    rows = [
        (
            f"remote MB after v{versions}",
            f"{rx:.1f} ({_parts(x)})",
            f"{rl:.1f} ({_parts(lfs)})",
            f"{rx / rl:.2f}x",
            f"<= {GOAL_REMOTE_MB:.0f} MB: {verdict[rx <= GOAL_REMOTE_MB]}",
        ),
        (
            "first version s (v1 add+commit+push)",
            f"{x.steps[0].total:.2f}",
            f"{lfs.steps[0].total:.2f}",
            f"{x.steps[0].total / lfs.steps[0].total:.2f}x",
            f"<= {GOAL_FIRST}x: {verdict[x.steps[0].total <= GOAL_FIRST * lfs.steps[0].total]}",
        ),
        (
            f"incremental version s (mean v2..v{versions})",
            f"{inc_x:.2f}",
            f"{inc_l:.2f}",
            f"{inc_x / inc_l:.2f}x",
            f"<= {GOAL_INCREMENTAL}x: {verdict[inc_x <= GOAL_INCREMENTAL * inc_l]}",
        ),
        (
            "fresh clone s",
            f"{x.clone_s:.2f}",
            f"{lfs.clone_s:.2f}",
            f"{x.clone_s / lfs.clone_s:.2f}x",
            f"<= {GOAL_CLONE}x: {verdict[x.clone_s <= GOAL_CLONE * lfs.clone_s]}",
        ),
        (
            "local store MB",
            f"{x.local_store_bytes / MB:.1f}",
            f"{lfs.local_store_bytes / MB:.1f}",
            "",
            "",
        ),
        ("clone byte-identical", str(x.clone_ok), str(lfs.clone_ok), "", ""),
    ]
    for row in rows:
        print("| " + " | ".join(row) + " |")
    return {
        name: {
            "steps": [s.__dict__ | {"total": s.total} for s in r.steps],
            "remote_bytes": r.remote_bytes,
            "remote_parts": r.remote_parts,
            "local_store_bytes": r.local_store_bytes,
            "clone_s": r.clone_s,
            "clone_ok": r.clone_ok,
        }
        for name, r in runs.items()
    }


def print_profiles(profile: Path) -> None:
    for pattern, title in (("filter-v*.prof", "filter (add)"), ("pre-push-*.prof", "pre-push")):
        files = sorted(str(p) for p in profile.glob(pattern))
        if not files:
            continue
        print(f"\n== profile: gitxet {title}, {len(files)} process(es), top by cumulative ==")
        stats = pstats.Stats(files[0])
        for f in files[1:]:
            stats.add(f)
        stats.sort_stats("cumulative").print_stats(25)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--make-dataset", type=Path, default=None)
    ap.add_argument("--data", type=Path, help="dataset directory (reused if complete)")
    ap.add_argument("--work", type=Path, help="where repositories go (default: a temp dir)")
    ap.add_argument("--versions", type=int, default=5)
    ap.add_argument("--scale", type=float, default=1.0, help="make_dataset.py --scale")
    ap.add_argument("--keep", action="store_true", help="keep repositories (and dataset)")
    ap.add_argument("--json", type=Path, help="also write the results as JSON")
    ap.add_argument("--profile", type=Path, help="cProfile gitxet's filter and pre-push here")
    a = ap.parse_args()

    if shutil.which("git-lfs") is None:
        sys.exit("git-lfs is not installed (Debian: apt-get install git-lfs)")
    if a.work is not None:
        a.work.mkdir(parents=True, exist_ok=True)
    base = Path(tempfile.mkdtemp(prefix="gitxet-bench-", dir=a.work))
    data = a.data or base / "data"
    try:
        maker = a.make_dataset or shared_file(MAKER)
        if maker is None:
            sys.exit(not_found(MAKER, "--make-dataset PATH"))
        ensure_dataset(maker, data, a.versions, a.scale)
        byte_compile()
        env = sealed_env(base / "home")
        sh(["git", "lfs", "install", "--skip-repo"], base, env)
        profile = a.profile.resolve() if a.profile else None
        if profile is not None:
            profile.mkdir(parents=True, exist_ok=True)
        runs = {name: ToolRun(name, base / name) for name in ("gitxet", "lfs")}
        for r in runs.values():
            r.root.mkdir()
        setup_gitxet(runs["gitxet"], env, profile)
        setup_lfs(runs["lfs"], env)
        for v in range(1, a.versions + 1):
            print(f"version {v}", flush=True)
            order = ("gitxet", "lfs") if v % 2 else ("lfs", "gitxet")
            for name in order:
                if name == "gitxet" and profile is not None:
                    profile_version(runs[name], env, profile, v)
                runs[name].steps.append(do_version(runs[name], data / f"v{v}", v, env))
        last = data / f"v{a.versions}"
        for name in ("gitxet", "lfs"):
            finish(runs[name], last, env)
        results = report(runs, a.versions)
        if a.json:
            a.json.write_text(json.dumps(results, indent=2), encoding="utf-8")
        if profile is not None:
            print_profiles(profile)
    finally:
        if a.keep:
            print(f"\nkept {base}")
        else:
            shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
