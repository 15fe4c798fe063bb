"""The daily workflow with the real git binary on the embedded store (issue: git workflow)."""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gitxet.chunking import chunk_bytes
from gitxet.formats import shard as shardfmt
from gitxet.hashing import chunk_hash, to_hex
from gitxet.store.cas import LocalCAS

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(autouse=True)
def gitxet_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """git calls ``git-xet`` back: make sure it is this interpreter's."""
    bindir = os.path.dirname(sys.executable)
    monkeypatch.setenv("PATH", bindir + os.pathsep + os.environ.get("PATH", ""))


def run(
    *args: str, cwd: Path | str | None = None, check: bool = True, **kw: object
) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(list(args), cwd=cwd, capture_output=True, text=True, timeout=300, **kw)  # type: ignore[call-overload]
    if check and r.returncode != 0:
        raise AssertionError(f"{args} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
    return r  # type: ignore[no-any-return]


def git(*args: str, cwd: Path | str) -> str:
    return run("git", *args, cwd=cwd).stdout


def xet(*args: str, cwd: Path | str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return run("git-xet", *args, cwd=cwd, check=check)


def make_versions(n: int = 3, size: int = 64 << 20) -> list[tuple[bytes, bytes]]:
    """(binary, csv) for n versions: inserts/overwrites in the binary, a growing CSV."""
    rnd = random.Random(42)
    binary = bytearray(rnd.randbytes(size))
    rows = [f"{i},{rnd.random():.6f},{rnd.randrange(10**6)}\n" for i in range(20000)]
    out = []
    for v in range(n):
        if v:
            for _ in range(3):
                at = rnd.randrange(len(binary))
                binary[at:at] = rnd.randbytes(rnd.randrange(10, 4000))
                at = rnd.randrange(len(binary) - 512)
                binary[at : at + 512] = rnd.randbytes(512)
            rows += [
                f"{i},{rnd.random():.6f},{rnd.randrange(10**6)}\n"
                for i in range(len(rows), len(rows) + 5000)
            ]
        out.append((bytes(binary), "".join(rows).encode()))
    return out


def init_repo(tmp: Path) -> tuple[Path, Path]:
    remote = tmp / "remote.git"
    work = tmp / "work"
    git("init", "-q", "--bare", str(remote), cwd=tmp)
    git("init", "-q", str(work), cwd=tmp)
    git("remote", "add", "origin", str(remote), cwd=work)
    xet("init", cwd=work)
    return remote, work


def remote_consistent(remote: Path) -> None:
    """Every xorb any remote shard references is stored (the invariant pushes keep)."""
    cas = LocalCAS(str(remote / "xet"))
    for name in cas.shard_names():
        s = shardfmt.parse_shard(cas.shard_bytes(name))
        for x in {t.xorb_hash for f in s.files for t in f.terms} | {x.xorb_hash for x in s.xorbs}:
            assert cas.has_xorb(x), f"shard {name} references missing xorb {to_hex(x)}"


def test_end_to_end_three_versions(tmp_path: Path) -> None:
    remote, work = init_repo(tmp_path)
    versions = make_versions()
    for i, (binary, csv) in enumerate(versions):
        (work / "data").mkdir(exist_ok=True)
        (work / "data" / "model.bin").write_bytes(binary)
        (work / "table.csv").write_bytes(csv)
        (work / "README").write_text(f"version {i}\n")
        r = xet("add", "data", "table.csv", "README", cwd=work)
        assert "stored as Xet pointers" in r.stdout
        git("commit", "-q", "-m", f"v{i}", cwd=work)
        git("tag", f"v{i}", cwd=work)
    git("push", "-q", "origin", "main", "--tags", cwd=work)
    remote_consistent(remote)

    clone = tmp_path / "clone"
    xet("clone", str(remote), str(clone), cwd=tmp_path)
    assert (clone / "data" / "model.bin").read_bytes() == versions[-1][0]
    assert (clone / "table.csv").read_bytes() == versions[-1][1]
    # older versions too, through checkout (smudge)
    git("checkout", "-q", "v0", cwd=clone)
    assert (clone / "data" / "model.bin").read_bytes() == versions[0][0]
    assert (clone / "table.csv").read_bytes() == versions[0][1]

    unique: dict[bytes, int] = {}
    for binary, csv in versions:
        for c in chunk_bytes(binary) + chunk_bytes(csv):
            unique[chunk_hash(c)] = len(c)
    stored = sum(f.stat().st_size for f in (remote / "xet").rglob("*") if f.is_file())
    assert stored <= 1.3 * sum(unique.values()), (stored, sum(unique.values()))


def test_install_then_plain_clone_and_lazy_checkout(tmp_path: Path) -> None:
    remote, work = init_repo(tmp_path)
    rnd = random.Random(1)
    files = {f"d/f{i}.bin": rnd.randbytes(300_000 + i) for i in range(3)}
    for name, data in files.items():
        (work / name).parent.mkdir(exist_ok=True)
        (work / name).write_bytes(data)
    (work / "small.txt").write_text("small\n")
    xet("add", ".", cwd=work)
    git("commit", "-q", "-m", "one", cwd=work)
    git("push", "-q", "origin", "main", cwd=work)

    xet("install", cwd=tmp_path)  # global
    plain = tmp_path / "plain"
    git("clone", "-q", str(remote), str(plain), cwd=tmp_path)
    for name, data in files.items():
        assert (plain / name).read_bytes() == data

    lazy = tmp_path / "lazy"
    xet("clone", "--lazy", str(remote), str(lazy), cwd=tmp_path)
    assert (lazy / "d/f0.bin").read_bytes().startswith(b"version https://gitxet.dev/spec/v1\n")
    xet("checkout", "d/f1.bin", cwd=lazy)
    assert (lazy / "d/f1.bin").read_bytes() == files["d/f1.bin"]
    assert (lazy / "d/f0.bin").read_bytes().startswith(b"version ")
    assert (lazy / "d/f2.bin").read_bytes().startswith(b"version ")
    assert git("status", "--porcelain", cwd=lazy).strip() == ""
    ls = xet("ls-files", "--json", cwd=lazy).stdout
    assert '"materialized": true' in ls and '"materialized": false' in ls
    xet("dematerialize", "d/f1.bin", cwd=lazy)
    assert (lazy / "d/f1.bin").read_bytes().startswith(b"version ")


def test_branches_and_merges_of_pointer_files(tmp_path: Path) -> None:
    remote, work = init_repo(tmp_path)
    rnd = random.Random(2)
    base = rnd.randbytes(400_000)
    (work / "a.bin").write_bytes(base)
    xet("add", "a.bin", cwd=work)
    git("commit", "-q", "-m", "base", cwd=work)
    git("checkout", "-q", "-b", "feature", cwd=work)
    feat = base + rnd.randbytes(1000)
    (work / "a.bin").write_bytes(feat)
    (work / "b.bin").write_bytes(rnd.randbytes(300_000))
    xet("add", "a.bin", "b.bin", cwd=work)
    git("commit", "-q", "-m", "feature", cwd=work)
    git("checkout", "-q", "main", cwd=work)
    assert (work / "a.bin").read_bytes() == base
    assert not (work / "b.bin").exists()
    (work / "c.bin").write_bytes(rnd.randbytes(300_000))
    xet("add", "c.bin", cwd=work)
    git("commit", "-q", "-m", "main side", cwd=work)
    git("merge", "-q", "--no-edit", "feature", cwd=work)
    assert (work / "a.bin").read_bytes() == feat
    assert (work / "b.bin").exists() and (work / "c.bin").exists()
    git("push", "-q", "origin", "main", cwd=work)
    clone = tmp_path / "clone"
    xet("clone", str(remote), str(clone), cwd=tmp_path)
    assert (clone / "a.bin").read_bytes() == feat


def test_killed_push_keeps_remote_consistent_and_rerun_completes(tmp_path: Path) -> None:
    remote, work = init_repo(tmp_path)
    rnd = random.Random(3)
    for i in range(6):
        (work / f"f{i}.bin").write_bytes(rnd.randbytes(3 << 20))
    xet("add", ".", cwd=work)
    git("commit", "-q", "-m", "data", cwd=work)
    for delay in (0.05, 0.2, 0.4):
        p = subprocess.Popen(
            ["git", "push", "-q", "origin", "main"],
            cwd=work,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        # the kill lands ``delay`` after gitxet's pre-push hook started, not before it ran
        end = time.monotonic() + 60
        while p.poll() is None and not _gitxet_pids(work, b"pre-push"):
            assert time.monotonic() < end, "the pre-push hook never started"
            time.sleep(0.002)
        time.sleep(delay)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        remote_consistent(remote)
    # A receive-pack killed while updating a ref leaves git's own ref lock behind (git
    # tells the user to remove it); that is git's, not gitxet's, so clear it like a user.
    for lock in [*remote.glob("refs/**/*.lock"), *remote.glob("*.lock")]:
        lock.unlink()
    git("push", "-q", "origin", "main", cwd=work)
    remote_consistent(remote)
    clone = tmp_path / "clone"
    xet("clone", str(remote), str(clone), cwd=tmp_path)
    for i in range(6):
        assert (clone / f"f{i}.bin").read_bytes() == (work / f"f{i}.bin").read_bytes()


def pushed_big_file(tmp_path: Path, data: bytes) -> Path:
    """A remote whose main holds ``big.bin`` (``data``), added, committed and pushed."""
    remote, work = init_repo(tmp_path)
    (work / "big.bin").write_bytes(data)
    xet("add", "big.bin", cwd=work)
    git("commit", "-q", "-m", "big", cwd=work)
    git("push", "-q", "origin", "main", cwd=work)
    return remote


def test_killed_checkout_leaves_no_half_written_file(tmp_path: Path) -> None:
    data = random.Random(4).randbytes(8 << 20)
    remote = pushed_big_file(tmp_path, data)
    clone = tmp_path / "clone"
    xet("clone", "--lazy", str(remote), str(clone), cwd=tmp_path)
    for delay in (0.05, 0.15, 0.3):
        p = subprocess.Popen(
            ["git-xet", "checkout"],
            cwd=clone,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        time.sleep(delay)
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        content = (clone / "big.bin").read_bytes()
        assert content == data or content.startswith(b"version https://gitxet.dev/spec/v1\n")
        # nothing half-written anywhere in the work tree either
        status = git("status", "--porcelain", "--untracked-files=all", cwd=clone)
        assert "??" not in status, status
    xet("checkout", cwd=clone)
    assert (clone / "big.bin").read_bytes() == data
    # a rerun also settles what a killed run left stat-dirty (written, not yet recorded)
    assert git("status", "--porcelain", cwd=clone).strip() == ""
    xet("dematerialize", cwd=clone)
    (clone / "big.bin").write_bytes(data)  # as if killed right after the rename
    # dated back, so git cannot find the entry "racily clean" (same second as the index)
    past = time.time() - 60
    os.utime(clone / "big.bin", (past, past))
    assert git("diff-files", "--name-only", cwd=clone).strip() == "big.bin"
    xet("checkout", cwd=clone)
    assert git("diff-files", "--name-only", cwd=clone).strip() == ""


def test_a_killed_clone_is_finished_by_running_it_again(tmp_path: Path) -> None:
    """A 'git xet clone' killed after git's clone left a work tree with files missing
    ('git status' listed every one as deleted, and 'git xet checkout' wrote nothing when
    no index had been read yet): the clone run again, or 'git xet checkout', finishes it."""
    remote, work = init_repo(tmp_path)
    rnd = random.Random(5)
    (work / "sub").mkdir()
    for i in range(4):
        (work / "sub" / f"p{i}.bin").write_bytes(rnd.randbytes(300_000))
    (work / "small.txt").write_text("small\n")
    xet("add", ".", cwd=work)
    git("commit", "-q", "-m", "data", cwd=work)
    git("push", "-q", "origin", "main", cwd=work)
    expected = git("ls-files", "-s", cwd=work)

    def finished(clone: Path) -> None:
        assert git("status", "--porcelain", cwd=clone) == ""
        assert git("ls-files", "-s", cwd=clone) == expected
        for i in range(4):
            name = f"sub/p{i}.bin"
            assert (clone / name).read_bytes() == (work / name).read_bytes()
        assert (clone / "small.txt").read_text() == "small\n"
        assert run("git", "config", "xet.cloneUnfinished", cwd=clone, check=False).stdout == ""
        assert (clone / ".git" / "hooks" / "pre-push").exists()
        assert xet("fsck", cwd=clone).returncode == 0

    def unfinished_clone(clone: Path) -> None:
        """What git's clone leaves for gitxet to check out (the filter configured)."""
        git("clone", "-q", "--no-checkout", "-c", "xet.cloneUnfinished=true", str(remote),
            str(clone), cwd=tmp_path)  # fmt: skip
        xet("install", "--local", cwd=clone)

    # killed before the index was read (while the data was fetched): every file missing
    a = tmp_path / "a"
    unfinished_clone(a)
    r = xet("clone", str(remote), "a", cwd=tmp_path)
    assert "finishing the interrupted clone in a" in r.stderr
    finished(a)
    # a finished clone is not cloned into again: git's own refusal
    r = xet("clone", str(remote), "a", cwd=tmp_path, check=False)
    assert r.returncode != 0 and "already exists" in r.stderr
    # killed half-way through writing the files (the index read, some written): checkout
    b = tmp_path / "b"
    unfinished_clone(b)
    git("read-tree", "HEAD", cwd=b)
    (b / "sub").mkdir()
    (b / "sub" / "p1.bin").write_bytes((work / "sub" / "p1.bin").read_bytes())
    r = xet("checkout", cwd=b / "sub")
    assert "finishing the interrupted clone" in r.stderr
    finished(b)
    # killed before git had fetched anything: a clear line, no traceback
    c = tmp_path / "c"
    git("init", "-q", str(c), cwd=tmp_path)
    git("remote", "add", "origin", str(remote), cwd=c)
    git("config", "xet.cloneUnfinished", "true", cwd=c)
    r = xet("clone", str(remote), "c", cwd=tmp_path, check=False)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert "stopped before git had fetched it: remove it and clone again" in r.stderr
    # a real kill -9 wherever it lands, then the clone again
    d = tmp_path / "d"
    p = subprocess.Popen(
        ["git-xet", "clone", str(remote), str(d)],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    end = time.monotonic() + 60
    while p.poll() is None and not (d / ".git" / "index").exists():
        assert time.monotonic() < end, "the clone never read its index"
        time.sleep(0.002)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(p.pid, signal.SIGKILL)
    p.wait()
    # (a clone that ended before the kill is refused as an existing directory)
    xet("clone", str(remote), str(d), cwd=tmp_path, check=p.returncode != 0)
    finished(d)


def _file_size_limit(nbytes: int) -> None:
    """In the child: no file written past ``nbytes`` (EFBIG, as a full disk's ENOSPC)."""
    import resource

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, nbytes))


def test_a_clone_that_runs_out_of_space_says_how_to_finish_it(tmp_path: Path) -> None:
    """A clone whose disk fills once git has cloned: one line naming the error and how to
    finish the clone ('No space left on device' alone before), the run again finishes it."""
    data = random.Random(7).randbytes(3 << 20)
    remote = pushed_big_file(tmp_path, data)
    clone = tmp_path / "clone"
    r = subprocess.run(
        ["git-xet", "clone", str(remote), str(clone)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=lambda: _file_size_limit(1 << 20),
    )
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("git-xet: ")]
    assert lines[-1].endswith(
        "; the clone in " + str(clone) + " is not finished: run the same 'git xet clone' "
        "again (or 'git xet checkout' in it) to finish it"
    ), r.stderr
    if (clone / "big.bin").exists():  # nothing half-written at its name: its pointer
        assert (clone / "big.bin").read_bytes().startswith(b"version https://gitxet.dev/")
    xet("clone", str(remote), str(clone), cwd=tmp_path)
    assert (clone / "big.bin").read_bytes() == data
    assert git("status", "--porcelain", cwd=clone) == ""


def _gitxet_pids(cwd: Path, command: bytes) -> list[int]:
    """Pids of ``git-xet <command>`` processes working in ``cwd``."""
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes()
            where = os.readlink(d / "cwd")
        except OSError:
            continue
        if command in cmd.split(b"\0") and where == str(cwd):
            pids.append(int(d.name))
    return pids


def _kill_filter_during(args: list[str], cwd: Path, delay: float) -> None:
    """Run git ``args`` and SIGKILL its gitxet filter ``delay`` s after the filter starts."""
    p = subprocess.Popen(
        ["git", *args], cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    end = time.monotonic() + 60
    while p.poll() is None and time.monotonic() < end:
        pids = _gitxet_pids(cwd, b"filter-process")
        if pids:
            time.sleep(delay)
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            break
        time.sleep(0.002)
    p.wait(timeout=60)


def test_killed_filter_never_leaves_half_a_file(tmp_path: Path) -> None:
    remote, work = init_repo(tmp_path)
    rnd = random.Random(8)
    data = rnd.randbytes(48 << 20)
    (work / "big.bin").write_bytes(data)
    xet("add", "big.bin", cwd=work)
    git("commit", "-q", "-m", "big", cwd=work)
    git("push", "-q", "origin", "main", cwd=work)
    pointer = git("cat-file", "-p", "HEAD:big.bin", cwd=work).encode()

    # smudge killed midway: the work-tree file is the old content or the new, never a part
    clone = tmp_path / "clone"
    xet("clone", "--lazy", str(remote), str(clone), cwd=tmp_path)
    git("config", "xet.lazy", "false", cwd=clone)
    for delay in (0.0, 0.05, 0.15, 0.3):
        # (git rewrites only files that differ from the index: remove it to force a smudge)
        (clone / "big.bin").unlink(missing_ok=True)
        _kill_filter_during(["checkout", "-f", "HEAD", "--", "big.bin"], clone, delay)
        if (clone / "big.bin").exists():  # git writes nothing when the filter fails
            assert (clone / "big.bin").read_bytes() == data, delay
    (clone / "big.bin").unlink(missing_ok=True)
    git("checkout", "-f", "HEAD", "--", "big.bin", cwd=clone)
    assert (clone / "big.bin").read_bytes() == data
    assert git("status", "--porcelain", "--untracked-files=all", cwd=clone).strip() == ""

    # clean killed midway: the index keeps the old entry, the store stays consistent, and a
    # rerun completes
    edited = data[:1000] + rnd.randbytes(3 << 20) + data[1000:]
    (work / "big.bin").write_bytes(edited)
    for delay in (0.0, 0.1, 0.3):
        _kill_filter_during(["add", "big.bin"], work, delay)
        staged = git("cat-file", "-p", ":big.bin", cwd=work).encode()
        # the old pointer, or (the add won the race) a whole new one
        assert staged == pointer or f"size {len(edited)}\n".encode() in staged
        remote_consistent(work / ".git")
    git("add", "big.bin", cwd=work)
    git("commit", "-q", "-m", "edit", cwd=work)
    git("push", "-q", "origin", "main", cwd=work)
    remote_consistent(remote)
    git("pull", "-q", "--ff-only", cwd=clone)
    assert (clone / "big.bin").read_bytes() == edited


def test_corrupt_remote_xorb_names_file_and_xorb(tmp_path: Path) -> None:
    remote, work = init_repo(tmp_path)
    (work / "x.bin").write_bytes(random.Random(5).randbytes(1 << 20))
    xet("add", "x.bin", cwd=work)
    git("commit", "-q", "-m", "x", cwd=work)
    git("push", "-q", "origin", "main", cwd=work)
    (xorb,) = [p for p in (remote / "xet" / "xorbs").rglob("*") if p.is_file()]
    raw = bytearray(xorb.read_bytes())
    raw[500] ^= 0xFF
    xorb.write_bytes(bytes(raw))
    r = xet("clone", str(remote), str(tmp_path / "c"), cwd=tmp_path, check=False)
    assert r.returncode != 0
    assert "x.bin" in r.stderr and xorb.name in r.stderr
    assert "Traceback" not in r.stderr
    # the file the clone could not write holds its pointer text (git wrote it after all)
    pointer = git("cat-file", "-p", "HEAD:x.bin", cwd=work).encode()
    assert (tmp_path / "c" / "x.bin").read_bytes() == pointer


def test_clone_writes_files_git_then_sees_unchanged(tmp_path: Path) -> None:
    remote, work = init_repo(tmp_path)
    rnd = random.Random(6)
    files = {"a.bin": rnd.randbytes(2 << 20), "d/e/b.bin": rnd.randbytes(700_000)}
    for name, data in files.items():
        (work / name).parent.mkdir(parents=True, exist_ok=True)
        (work / name).write_bytes(data)
    (work / "run.bin").write_bytes(rnd.randbytes(300_000))
    (work / "run.bin").chmod(0o755)
    xet("add", ".", cwd=work)
    git("commit", "-q", "-m", "data", cwd=work)
    git("push", "-q", "origin", "main", cwd=work)
    clone = tmp_path / "clone"
    trace = tmp_path / "trace"
    env = {**os.environ, "GIT_TRACE": str(trace)}
    run("git-xet", "clone", str(remote), str(clone), cwd=tmp_path, env=env)
    for name, data in files.items():
        assert (clone / name).read_bytes() == data
    assert os.access(clone / "run.bin", os.X_OK)
    # the index entries were given the new stat in place: no `update-index --refresh`
    # that would pipe every byte back through the filter
    assert "update-index" not in trace.read_text()
    # the files are dated before the index's second: git reads "racily clean" entries
    # (mtime in the index's own second) back through the filter in the next status
    index_second = (clone / ".git" / "index").stat().st_mtime_ns // 10**9
    for name in [*files, "run.bin"]:
        assert (clone / name).stat().st_mtime_ns // 10**9 < index_second
    # the index already holds the written files' stat: git neither reports them changed
    # nor starts the filter to read 3 MB back. (The small files git wrote itself,
    # `.gitattributes`, may be racily clean: an index dated later leaves those out.)
    future = time.time() + 60
    os.utime(clone / ".git" / "index", (future, future))
    r = run("git", "status", "--porcelain", cwd=clone, env={**os.environ, "GIT_TRACE": "1"})
    assert r.stdout.strip() == ""
    assert "filter-process" not in r.stderr
    git("diff", "--exit-code", cwd=clone)


def test_clone_quiet_and_shallow_as_git_clone_takes_them(tmp_path: Path) -> None:
    """'git xet clone -q --depth 1' (what CI scripts pass 'git clone'): git's last commit
    only, the files written, nothing said; it was 'No such option: -q'."""
    remote, work = init_repo(tmp_path)
    rnd = random.Random(8)
    for i in range(2):
        (work / "a.bin").write_bytes(rnd.randbytes(1 << 20))
        xet("add", "a.bin", cwd=work)
        git("commit", "-q", "-m", f"v{i}", cwd=work)
    git("push", "-q", "origin", "main", cwd=work)
    clone = tmp_path / "clone"
    for args in (["-q", "--depth", "1"], ["--quiet", "--depth=1", "--lazy"]):
        r = run("git-xet", "clone", *args, f"file://{remote}", str(clone), cwd=tmp_path)
        assert r.stderr == "" and r.stdout == "", r.stderr
        assert git("rev-list", "--count", "HEAD", cwd=clone).strip() == "1"
        if "--lazy" not in args:
            assert (clone / "a.bin").read_bytes() == (work / "a.bin").read_bytes()
        assert git("status", "--porcelain", cwd=clone) == ""
        shutil.rmtree(clone)
    r = run("git-xet", "clone", "--depth", "0", str(remote), str(clone), cwd=tmp_path, check=False)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr


def test_clone_with_one_corrupt_xorb_writes_the_other_files(tmp_path: Path) -> None:
    remote, work = init_repo(tmp_path)
    rnd = random.Random(7)
    a, b = rnd.randbytes(1 << 20), rnd.randbytes(1 << 20)
    (work / "a.bin").write_bytes(a)
    xet("add", "a.bin", cwd=work)
    git("commit", "-q", "-m", "a", cwd=work)
    git("push", "-q", "origin", "main", cwd=work)
    before = set((remote / "xet" / "xorbs").rglob("*"))
    (work / "b.bin").write_bytes(b)
    xet("add", "b.bin", cwd=work)
    git("commit", "-q", "-m", "b", cwd=work)
    git("push", "-q", "origin", "main", cwd=work)
    (xorb,) = [p for p in set((remote / "xet" / "xorbs").rglob("*")) - before if p.is_file()]
    raw = bytearray(xorb.read_bytes())
    raw[700] ^= 0xFF
    xorb.write_bytes(bytes(raw))
    clone = tmp_path / "c"
    r = xet("clone", str(remote), str(clone), cwd=tmp_path, check=False)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert "b.bin" in r.stderr and xorb.name in r.stderr
    assert (clone / "a.bin").read_bytes() == a
    assert (clone / "b.bin").read_bytes().startswith(b"version https://gitxet.dev/spec/v1\n")
    assert git("status", "--porcelain", cwd=clone).strip() == ""


def test_bad_input_gives_one_clear_line(tmp_path: Path) -> None:
    # no git repository
    r = xet("status", cwd=tmp_path, check=False)
    assert r.returncode != 0 and "Traceback" not in r.stderr and r.stderr.strip()
    _remote, work = init_repo(tmp_path)
    # unknown remote
    r = xet("push", "nosuchremote", cwd=work, check=False)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    # missing CAS data: a pointer whose data exists nowhere
    ptr = (
        "version https://gitxet.dev/spec/v1\n"
        f"oid sha256:{'a' * 64}\nsize 1000\nxet-hash {'b' * 64}\n"
    )
    (work / "ghost.bin").write_text(ptr)
    git("add", "ghost.bin", cwd=work)
    git("commit", "-q", "-m", "ghost", cwd=work)
    r = xet("checkout", "ghost.bin", cwd=work, check=False)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert "b" * 16 in r.stderr or "not found" in r.stderr
    # ... and a push of it is refused before any ref moves, naming the file
    r = run("git", "push", "origin", "main", cwd=work, check=False)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert "ghost.bin: its data is not in this repository's store" in r.stderr
    assert git("ls-remote", "origin", cwd=work).strip() == ""
    # malformed pointer in a commit: served as a plain file, not an error
    (work / "weird.bin").write_text("version https://gitxet.dev/spec/v1\noid sha256:zz\n")
    git("add", "weird.bin", cwd=work)
    git("commit", "-q", "-m", "weird", cwd=work)
    r = xet("ls-files", cwd=work)
    assert "weird.bin" not in r.stdout


def test_plain_git_clone_without_install_says_how_and_checkout_configures_the_filter(
    tmp_path: Path,
) -> None:
    """A plain ``git clone`` by a user who never ran ``git xet install``: the files are
    pointers, ``git xet status`` says how to get their data, and ``git xet checkout``
    configures the filter in that repository, saying so (it used to write the data with no
    filter configured: git then called every file modified, and a ``git commit -a`` would
    have stored the whole file in git). A push from the plain clone then sends data."""
    remote, work = init_repo(tmp_path)
    data = random.Random(31).randbytes(400_000)
    (work / "big.bin").write_bytes(data)
    xet("add", "big.bin", cwd=work)
    git("commit", "-qm", "big", cwd=work)
    git("push", "-q", "origin", "main", cwd=work)
    git("--git-dir", str(remote), "symbolic-ref", "HEAD", "refs/heads/main", cwd=tmp_path)
    plain = tmp_path / "plain"
    git("clone", "-q", str(remote), str(plain), cwd=tmp_path)
    assert (plain / "big.bin").read_bytes().startswith(b"version https://gitxet.dev/spec/v1\n")
    assert "'git xet checkout' writes their data" in xet("status", cwd=plain).stdout
    r = xet("checkout", cwd=plain)
    assert "configured git's xet filter in this repository" in r.stderr, r.stderr
    assert "git xet install" in r.stderr
    assert (plain / "big.bin").read_bytes() == data
    assert git("status", "--porcelain", cwd=plain) == ""
    assert "configured" not in xet("checkout", cwd=plain).stderr  # once
    more = random.Random(32).randbytes(300_000)
    (plain / "more.bin").write_bytes(more)
    (plain / "big.bin").write_bytes(data[:1000] + more)
    git("commit", "-qam", "more", cwd=plain)  # -a: through the filter, a pointer again
    git("add", "more.bin", cwd=plain)
    git("commit", "-qm", "more", cwd=plain)
    git("push", "-q", "origin", "main", cwd=plain)
    remote_consistent(remote)
    out = xet("fsck", "--all", cwd=remote).stdout
    assert "3 in the local store, 0 only on the remote, 0 missing" in out, out


def test_checkout_never_writes_over_a_file_the_user_changed(tmp_path: Path) -> None:
    """``git xet checkout`` wrote the committed data over a materialized file the user had
    edited, and over a pointer file the user had replaced: their changes were lost. Such
    files are now named and kept; the others are still written."""
    remote, work = init_repo(tmp_path)
    rnd = random.Random(41)
    a, b, c = rnd.randbytes(300_000), rnd.randbytes(310_000), rnd.randbytes(320_000)
    for name, data in (("a.bin", a), ("b.bin", b), ("c.bin", c)):
        (work / name).write_bytes(data)
    xet("add", ".", cwd=work)
    git("commit", "-qm", "three", cwd=work)
    git("push", "-q", "origin", "main", cwd=work)
    clone = tmp_path / "clone"
    xet("clone", str(remote), str(clone), cwd=tmp_path)
    xet("dematerialize", "b.bin", "c.bin", cwd=clone)
    (clone / "a.bin").write_bytes(a + b"my edit")  # an edited materialized file
    (clone / "b.bin").write_bytes(b"my own small file\n")  # a pointer the user replaced
    r = xet("checkout", cwd=clone, check=False)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert "a.bin: has changes of its own" in r.stderr and "1 more" in r.stderr, r.stderr
    assert (clone / "a.bin").read_bytes() == a + b"my edit"
    assert (clone / "b.bin").read_bytes() == b"my own small file\n"
    assert (clone / "c.bin").read_bytes() == c  # the untouched pointer is written
    assert sorted(git("status", "--porcelain", cwd=clone).split()) == ["M", "M", "a.bin", "b.bin"]
