"""A hostile repository against every reader and writer of trees (issue 12).

The trees (tests/helpers/hostile.py) hold ``.git`` directories and look-alikes whose
``config`` runs a command through ``core.fsmonitor``, ``..``/``.``/absolute names, names
with ``/``, duplicates, a 1 GiB symlink target and a garbage subtree. They are run against
``git xet clone`` (lazy and not), ``git xet checkout``/``dematerialize``, the Python API,
a real FUSE mount, the NFS server read by libnfs and ``xet://`` through fsspec. Each must:
write nothing outside the work tree, leave ``.git/config`` alone, never list a ``.git``,
never let ``git status`` inside a mount run the tree's config, keep its memory under
200 MB after reading the 1 GiB link, and still serve the rest of the tree.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from gitxet.errors import MaterializeError, UnsafePathError
from gitxet.formats.pointer import Pointer
from gitxet.mount.nfs.mountd import MOUNT_PROGRAM, MountProc
from gitxet.mount.nfs.nfs3 import NFS_PROGRAM, Proc
from gitxet.mount.nfs.rpc import MSG_REPLY, RecordReader, encode_call, frame_record
from gitxet.mount.nfs.xdr import Packer, Unpacker
from gitxet.repo.pointers import PointerFile
from gitxet.repo.repository import XetRepo
from gitxet.vfs.model import BROKEN_LINK_TARGET
from tests.helpers.fuse_env import require_fuse
from tests.helpers.hostile import DOTGIT_NAMES, HFS_NAME, Hostile, build
from tests.helpers.proc import git_env, run, use_interpreter

pytestmark = pytest.mark.timeout(600)

RSS_LIMIT_KB = 200 * 1024
SHOWN_AT_ROOT = {".gitattributes", "broken", "data", "dup.txt", "huge-link", "ok.txt"}
TIMEOUT = 120


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> Hostile:
    tmp = tmp_path_factory.mktemp("hostile")
    env = git_env(tmp)
    return build(tmp, env)


@pytest.fixture(autouse=True)
def on_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    use_interpreter(monkeypatch, tmp_path)


@pytest.fixture
def untouched(hostile: Hostile, tmp_path: Path) -> Iterator[None]:
    """Around a test: nothing outside the work trees changed, git ran nothing of the tree."""
    before = hostile.snapshot_outside()
    yield
    assert not hostile.marker.exists(), "git ran the hostile config's fsmonitor"
    assert hostile.snapshot_outside() == before
    assert not hostile.absolute.exists()
    for base in (tmp_path, hostile.work.parent):
        assert not (base / "escape.bin").exists()


def assert_clean_git_dir(clone: Path, config_before: bytes) -> None:
    assert (clone / ".git" / "config").read_bytes() == config_before
    r = run("git", "config", "--get", "core.fsmonitor", cwd=clone, check=False)
    assert r.stdout.strip() in ("", "false")
    assert not any(p.name == ".git" for p in (clone / ".git").rglob("*"))


def one_error_line(stderr: str) -> str:
    lines = [ln for ln in stderr.splitlines() if ln.startswith("git-xet: ")]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


# ---- clone / checkout / dematerialize ------------------------------------------------------


@pytest.mark.usefixtures("untouched")
@pytest.mark.parametrize("lazy", [True, False])
def test_clone_and_checkout_of_hostile_names_write_nothing_unsafe(
    hostile: Hostile, tmp_path: Path, lazy: bool
) -> None:
    clone = tmp_path / "clone"
    r = run(
        "git-xet", "clone", *(["--lazy"] if lazy else []), str(hostile.work), str(clone),
        "-b", "hostile-names", cwd=tmp_path, check=False,
    )  # fmt: skip
    assert r.returncode != 0 and "invalid path" in r.stderr  # git itself refuses the tree
    config = (clone / ".git" / "config").read_bytes()
    r = run("git-xet", "checkout", cwd=clone, check=False)
    assert "Traceback" not in r.stderr
    run("git-xet", "dematerialize", cwd=clone, check=False)
    run("git", "status", cwd=clone, check=False)
    assert_clean_git_dir(clone, config)
    for name in DOTGIT_NAMES:
        if name != ".git":  # that one is checked above
            assert not (clone / name).exists()


@pytest.mark.usefixtures("untouched")
@pytest.mark.parametrize("lazy", [True, False])
def test_checkout_refuses_a_dotgit_look_alike_by_name_and_writes_the_rest(
    hostile: Hostile, tmp_path: Path, lazy: bool
) -> None:
    clone = tmp_path / "clone"
    r = run(
        "git-xet", "clone", *(["--lazy"] if lazy else []), str(hostile.work), str(clone),
        "-b", "hostile-hfs", cwd=tmp_path, check=False,
    )  # fmt: skip
    config = (clone / ".git" / "config").read_bytes()
    if lazy:  # git (HFS+ rules off on Linux) checked the look-alike out: as a pointer
        assert r.returncode == 0, r.stderr
        r = run("git-xet", "checkout", cwd=clone, check=False)
    assert r.returncode == 1
    line = one_error_line(r.stderr)
    assert repr(f"{HFS_NAME}/config") in line and "refusing to write" in line
    assert (clone / "data" / "big.bin").read_bytes() == hostile.big
    assert (clone / HFS_NAME / "config").read_bytes() != hostile.evil_config  # a pointer
    r = run("git-xet", "dematerialize", cwd=clone)
    assert Pointer.decode((clone / "data" / "big.bin").read_bytes()).size == len(hostile.big)
    r = run("git-xet", "checkout", "data", cwd=clone)  # the safe part alone: fine
    assert (clone / "data" / "big.bin").read_bytes() == hostile.big
    assert run("git", "status", "--porcelain", cwd=clone).stdout == ""
    assert_clean_git_dir(clone, config)


@pytest.mark.usefixtures("untouched")
def test_checkout_never_writes_through_a_symlinked_directory(
    hostile: Hostile, tmp_path: Path
) -> None:
    clone = tmp_path / "clone"
    run("git-xet", "clone", "--lazy", str(hostile.work), str(clone), "-b", "hostile-hfs",
        cwd=tmp_path)  # fmt: skip
    shutil.rmtree(clone / "data")
    (clone / "data").symlink_to(hostile.outside)  # what a local attacker or a bad merge leaves
    r = run("git-xet", "checkout", "data", cwd=clone, check=False)
    assert r.returncode == 1
    line = one_error_line(r.stderr)
    assert "data/big.bin" in line and "symlink" in line
    assert sorted(os.listdir(hostile.outside)) == ["victim.txt"]


@pytest.mark.usefixtures("untouched")
def test_the_api_refuses_hostile_paths_and_writes_the_safe_ones(
    hostile: Hostile, tmp_path: Path
) -> None:
    """materialize()/dematerialize() given paths straight from a hostile tree (what the
    old ``ls-tree``-based checkout did): each refused by name, the safe file written."""
    clone = tmp_path / "clone"
    run("git-xet", "clone", "--lazy", str(hostile.work), str(clone), "-b", "hostile-hfs",
        cwd=tmp_path)  # fmt: skip
    config = (clone / ".git" / "config").read_bytes()
    repo = XetRepo(clone)
    good = {f.path: f for f in repo.pointer_files(None)}["data/big.bin"]
    evil = Pointer.decode(run("git", "cat-file", "-p", "hostile:.git/config",
                              cwd=hostile.work).stdout.encode())  # fmt: skip
    bad = [
        "../escape.bin",
        str(hostile.absolute),
        ".git/config",
        ".GIT/config",
        "git~1/config",
        "a/../../escape.bin",
        "ok.txt",
    ]  # fmt: skip  (ok.txt: the index names a plain blob)
    files = [good, *(PointerFile(p, evil, False) for p in bad)]
    with pytest.raises(MaterializeError) as e:
        repo.materialize(files)
    assert sorted(p for p, _ in e.value.failures) == sorted(bad)
    assert all(isinstance(c, UnsafePathError) for _, c in e.value.failures)
    assert (clone / "data" / "big.bin").read_bytes() == hostile.big
    with pytest.raises(MaterializeError) as e:
        repo.dematerialize([PointerFile(p, evil, True) for p in bad])
    assert sorted(p for p, _ in e.value.failures) == sorted(bad)
    assert (clone / "ok.txt").read_bytes() == hostile.ok
    assert_clean_git_dir(clone, config)


# ---- mounts and fsspec ---------------------------------------------------------------------


def walk_names(root: Path) -> set[str]:
    """Every name listed anywhere under ``root`` (no symlink followed, broken dirs skipped)."""
    seen: set[str] = set()
    for _dir, dirs, files in os.walk(root, onerror=lambda e: None):
        seen.update(dirs)
        seen.update(files)
    return seen


def peak_rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise AssertionError("no VmHWM")


def no_git_anywhere(names: set[str]) -> None:
    hidden = {*DOTGIT_NAMES, "..", ".", "a/b", "config", "HEAD"}
    assert not names & hidden, names & hidden


@pytest.mark.fuse
@pytest.mark.usefixtures("untouched")
def test_fuse_mount_hides_dotgit_bounds_the_link_and_serves_the_rest(
    hostile: Hostile, tmp_path: Path
) -> None:
    require_fuse()
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    run("git-xet", "mount", str(hostile.work), "hostile", str(mnt), cwd=tmp_path)
    try:
        (rec,) = [json.loads(x) for x in run("git-xet", "mounts", "--json", cwd=tmp_path)
                  .stdout.splitlines()]  # fmt: skip
        assert set(os.listdir(mnt)) == SHOWN_AT_ROOT
        no_git_anywhere(walk_names(mnt))
        for name in DOTGIT_NAMES:
            assert not os.path.lexists(mnt / name)
        assert os.readlink(mnt / "huge-link") == os.fsdecode(BROKEN_LINK_TARGET)
        assert os.lstat(mnt / "huge-link").st_size == len(BROKEN_LINK_TARGET)
        assert not (mnt / "huge-link").exists()  # a broken link
        assert peak_rss_kb(rec["pid"]) < RSS_LIMIT_KB
        assert (mnt / "data" / "big.bin").read_bytes() == hostile.big
        assert (mnt / "ok.txt").read_bytes() == hostile.ok
        assert (mnt / "dup.txt").read_bytes() == hostile.dup
        with pytest.raises(OSError) as e:
            os.listdir(mnt / "broken")
        assert e.value.errno == errno.EIO
        for cwd in (mnt, mnt / "data"):
            r = run("git", "status", cwd=cwd, check=False)
            assert r.returncode != 0 and "not a git repository" in r.stderr
        os.listdir(mnt)  # a second listing: nothing logged twice
        log = Path(rec["log"]).read_text()
        assert "Traceback" not in log
        dotgit = [ln for ln in log.splitlines() if "'/.git' is not shown" in ln]
        assert len(dotgit) == 1 and hostile_commit(hostile) in dotgit[0], log
        assert peak_rss_kb(rec["pid"]) < RSS_LIMIT_KB
    finally:
        run("git-xet", "unmount", str(mnt), cwd=tmp_path, check=False)


def hostile_commit(hostile: Hostile) -> str:
    return run("git", "rev-parse", "hostile", cwd=hostile.work).stdout.strip()


def nfs_ls(url: str) -> dict[str, tuple[str, int]]:
    r = subprocess.run(["nfs-ls", url], capture_output=True, text=True, timeout=TIMEOUT)
    assert r.returncode == 0, r.stderr
    out = {}
    for line in r.stdout.splitlines():
        if line.strip():
            mode, _n, _u, _g, size, name = line.split(maxsplit=5)
            out[name] = (mode, int(size))
    return out


def nfs_readlink(url: str, name: bytes) -> bytes | None:
    """MNT of the export, LOOKUP of ``name`` in it, READLINK (raw ONC RPC, as a kernel
    client would send them); None when the LOOKUP fails."""
    query = dict(kv.split("=") for kv in url.partition("?")[2].split("&"))

    def call(port: int, prog: int, proc: int, args: bytes) -> Unpacker:
        with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT) as sock:
            sock.sendall(frame_record(encode_call(9, prog, 3, proc, args)))
            record = RecordReader(sock.recv, 1 << 20).read()
        assert record is not None
        u = Unpacker(record)
        assert (u.u32(), u.u32(), u.u32()) == (9, MSG_REPLY, 0)
        u.u32()
        u.opaque()
        assert u.u32() == 0  # accepted
        return u

    def post_op_attr(u: Unpacker) -> None:
        if u.boolean():
            for _ in range(21):  # fattr3: 84 bytes
                u.u32()

    p = Packer()
    p.string(b"/")
    u = call(int(query["mountport"]), MOUNT_PROGRAM, MountProc.MNT, p.getvalue())
    assert u.u32() == 0
    root = u.opaque()
    p = Packer()
    p.opaque(root)
    p.string(name)
    u = call(int(query["nfsport"]), NFS_PROGRAM, Proc.LOOKUP, p.getvalue())
    if u.u32() != 0:
        return None
    fh = u.opaque()
    p = Packer()
    p.opaque(fh)
    u = call(int(query["nfsport"]), NFS_PROGRAM, Proc.READLINK, p.getvalue())
    assert u.u32() == 0
    post_op_attr(u)
    return u.string()


@pytest.mark.nfs
@pytest.mark.usefixtures("untouched")
def test_nfs_listing_hides_dotgit_bounds_the_link_and_serves_the_rest(
    hostile: Hostile, tmp_path: Path
) -> None:
    if shutil.which("nfs-ls") is None or shutil.which("nfs-cat") is None:
        pytest.skip("nfs-ls/nfs-cat not installed (apt-get install libnfs-utils)")
    with subprocess.Popen(
        ["git-xet", "nfs-serve", str(hostile.work), "hostile"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    ) as p:
        try:
            assert p.stdout is not None
            url = p.stdout.readline().strip()
            base, _, query = url.partition("?")
            root = nfs_ls(url)
            assert set(root) == SHOWN_AT_ROOT
            assert root["huge-link"] == ("lrwxrwxrwx", len(BROKEN_LINK_TARGET))
            assert set(nfs_ls(f"{base.rstrip('/')}//data?{query}")) == {"big.bin"}
            for name in DOTGIT_NAMES:
                r = subprocess.run(["nfs-ls", f"{base.rstrip('/')}//{name}?{query}"],
                                   capture_output=True, timeout=TIMEOUT)  # fmt: skip
                assert r.returncode != 0 and not r.stdout.strip()
            assert nfs_readlink(url, b"huge-link") == BROKEN_LINK_TARGET
            for name in (b".git", b"git~1", b".GIT"):  # LOOKUP of a hidden name: NOENT
                assert nfs_readlink(url, name) is None
            for path, want in (("data/big.bin", hostile.big), ("ok.txt", hostile.ok),
                               ("dup.txt", hostile.dup)):  # fmt: skip
                r = subprocess.run(["nfs-cat", f"{base.rstrip('/')}//{path}?{query}"],
                                   capture_output=True, timeout=TIMEOUT)  # fmt: skip
                assert r.returncode == 0 and r.stdout == want, (path, r.stderr)
            assert peak_rss_kb(p.pid) < RSS_LIMIT_KB
        finally:
            p.terminate()
            p.wait(timeout=30)


FSSPEC_PROBE = textwrap.dedent(
    """
    import json, sys
    from gitxet.fsspec import XetFileSystem, format_url
    repo, rev = sys.argv[1], sys.argv[2]
    fs = XetFileSystem()
    url = lambda p="": format_url(repo, rev, p)
    out = {"root": sorted(e["name"].rsplit("/", 1)[-1] for e in fs.ls(url(), detail=True))}
    out["all"] = sorted(fs.find(url(), withdirs=True))
    link = fs.info(url("huge-link"))
    out["link"] = [link["type"], link.get("destination"), link["size"]]
    out["big"] = fs.cat_file(url("data/big.bin")).hex()
    out["dup"] = fs.cat_file(url("dup.txt")).decode()
    missing = []
    for p in (".git/config", ".GIT/config", "git~1/config", "../escape.bin", "a/b"):
        try:
            fs.cat_file(url(p))
        except (FileNotFoundError, ValueError):
            missing.append(p)
    out["missing"] = missing
    with open("/proc/self/status") as f:
        out["peak_kb"] = [int(l.split()[1]) for l in f if l.startswith("VmHWM:")][0]
    print(json.dumps(out))
    """
)


@pytest.mark.usefixtures("untouched")
def test_fsspec_hides_dotgit_bounds_the_link_and_serves_the_rest(
    hostile: Hostile, tmp_path: Path
) -> None:
    r = run(sys.executable, "-c", FSSPEC_PROBE, str(hostile.work), "hostile", cwd=tmp_path)
    out = json.loads(r.stdout)
    assert set(out["root"]) == SHOWN_AT_ROOT
    no_git_anywhere({p.rsplit("/", 1)[-1] for p in out["all"]})
    assert out["link"][1] == os.fsdecode(BROKEN_LINK_TARGET)
    assert out["link"][2] == len(BROKEN_LINK_TARGET)
    assert bytes.fromhex(out["big"]) == hostile.big
    assert out["dup"] == hostile.dup.decode()
    assert len(out["missing"]) == 5
    assert out["peak_kb"] < RSS_LIMIT_KB
