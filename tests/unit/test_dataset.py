"""The resolver (gitxet.dataset): remotes of every kind, their search
order, data from whichever remote has it, and repositories opened for reading.

Real git repositories and real stores; no server (tests/system covers http remotes).
"""

from __future__ import annotations

import io
import random
import subprocess
from pathlib import Path

import pytest

from gitxet.data.clean import Ingestor
from gitxet.data.reconstruct import FileReader
from gitxet.data.sources import LayeredSource
from gitxet.data.transfer import LocalDirRemote
from gitxet.dataset import (
    HttpAccess,
    RemoteLayer,
    Remotes,
    Search,
    cas_root,
    fetch_from_any,
    mirror_git_metadata,
    open_commit,
    open_dataset,
    source_with,
)
from gitxet.errors import (
    ConfigError,
    DataUnavailableError,
    FileNotFoundInCASError,
    GitxetError,
    NotFoundError,
    RemoteError,
    XorbNotFoundError,
)
from gitxet.hashing import to_hex
from gitxet.store.cas import LocalCAS


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=cwd, check=True, capture_output=True, text=True
    ).stdout.strip()


def store_file(root: Path, data: bytes) -> bytes:
    """Put ``data`` into the store at ``root``; returns its Xet file hash."""
    with Ingestor(LocalCAS(str(root))) as ing:
        res = ing.add_stream(io.BytesIO(data))
        ing.flush()
    return res.file_hash


@pytest.fixture
def repos(tmp_path: Path) -> dict[str, Path]:
    """A work tree with three remotes: origin and up/stream (bare, path), gone (missing)."""
    work = tmp_path / "work"
    work.mkdir()
    git(work, "init", "-q")
    (work / "f").write_text("one\n")
    git(work, "add", "f")
    git(work, "commit", "-qm", "one")
    out = {"work": work}
    for name in ("origin", "up/stream"):
        bare = tmp_path / (name.replace("/", "-") + ".git")
        git(tmp_path, "init", "-q", "--bare", str(bare))
        git(work, "remote", "add", name, str(bare))
        git(work, "push", "-q", name, "main")
        out[name] = bare
    git(work, "remote", "add", "gone", str(tmp_path / "gone.git"))
    return out


# ---- remote kinds ----------------------------------------------------------------------------


def test_cas_root_of_every_remote_kind(tmp_path: Path) -> None:
    bare = tmp_path / "b.git"
    bare.mkdir()
    tree = tmp_path / "w"
    (tree / ".git").mkdir(parents=True)
    assert cas_root(str(bare)) == str(bare / "xet")
    assert cas_root(f"file://{bare}") == str(bare / "xet")
    assert cas_root(str(tree)) == str(tree / ".git" / "xet")  # a work tree's remote
    assert cas_root("http://host/data.git") is None
    assert cas_root("ssh://host/data.git") is None
    assert cas_root("host:data.git") is None  # scp-like


def test_open_each_kind_of_remote(repos: dict[str, Path]) -> None:
    work = repos["work"]
    git(work, "remote", "add", "ssh", "ssh://host/x.git")
    git(work, "remote", "add", "srv", "http://user:tok@127.0.0.1:1/x.git")
    made: list[str] = []

    def factory(url: str) -> LocalDirRemote:  # stands in for the http CAS
        made.append(url)
        return LocalDirRemote(str(repos["origin"] / "xet"))

    r = Remotes(str(work), factory)
    origin = r.open("origin")
    assert isinstance(origin, LocalDirRemote) and origin.name == str(repos["origin"] / "xet")
    assert r.open("origin") is origin  # opened once
    assert r.open() is origin  # the default remote
    with pytest.raises(ConfigError, match="'gone' is not reachable"):
        r.open("gone")
    with pytest.raises(ConfigError, match=r"'ssh'.*no CAS gitxet can reach"):
        r.open("ssh")
    r.open("srv")
    assert made == ["http://user:tok@127.0.0.1:1/x.git"]
    assert r.describe("srv") == "srv http://127.0.0.1:1/x.git"  # no token in messages
    assert r.is_server("srv") and r.is_server("ssh") and not r.is_server("origin")
    # a URL instead of a name (the pre-push hook passes git's URL)
    assert isinstance(r.open(str(repos["up/stream"])), LocalDirRemote)
    with pytest.raises(ConfigError, match=r"'srv'.*no CAS"):
        Remotes(str(work)).open("srv")  # http needs a factory


def test_default_remote(repos: dict[str, Path]) -> None:
    work = repos["work"]
    assert Remotes(str(work)).default() == "origin"
    git(work, "config", "xet.remote", "up/stream")
    assert Remotes(str(work)).default() == "up/stream"
    git(work, "config", "--unset", "xet.remote")
    git(work, "remote", "remove", "origin")
    assert Remotes(str(work)).default() is None  # two remotes, none of them origin
    git(work, "remote", "remove", "gone")
    assert Remotes(str(work)).default() == "up/stream"  # the only one
    with pytest.raises(ConfigError, match="no git remote"):
        Remotes(str(repos["origin"])).open()


# ---- search order ----------------------------------------------------------------------------


def test_search_order_rules(repos: dict[str, Path]) -> None:
    work = repos["work"]
    r = Remotes(str(work))
    # no hint: the default remote, then the others in git's (alphabetical) order
    assert r.search_order() == ["origin", "gone", "up/stream"]
    # an explicit remote goes first
    assert r.search_order("up/stream") == ["up/stream", "origin", "gone"]
    # the remote of the ref being checked out (a name holding '/')
    assert r.search_order(ref="refs/remotes/up/stream/main")[0] == "up/stream"
    # the current branch's remote beats the default remote
    git(work, "config", "branch.main.remote", "up/stream")
    assert Remotes(str(work)).search_order() == ["up/stream", "origin", "gone"]
    # a branch being checked out: its configured remote
    git(work, "config", "branch.topic.remote", "gone")
    assert Remotes(str(work)).search_order(ref="refs/heads/topic")[0] == "gone"


def test_search_order_prefers_remotes_whose_refs_contain_the_commit(
    repos: dict[str, Path],
) -> None:
    work = repos["work"]
    (work / "f").write_text("two\n")
    git(work, "commit", "-qam", "two")
    new = git(work, "rev-parse", "HEAD")
    git(work, "push", "-q", "up/stream", "main")
    git(work, "fetch", "-q", "up/stream")
    old = git(work, "rev-parse", "HEAD~1")
    r = Remotes(str(work))
    assert r.search_order(commit=new) == ["up/stream", "origin", "gone"]
    # both contain the old commit: the usual order among them
    assert r.search_order(commit=old) == ["origin", "up/stream", "gone"]
    # an explicit remote still goes first; junk commits are no hint
    assert r.search_order("gone", commit=new)[:2] == ["gone", "up/stream"]
    assert r.search_order(commit="0" * 40) == ["origin", "gone", "up/stream"]
    assert r.search_order(commit="-x") == ["origin", "gone", "up/stream"]


# ---- data from whichever remote has it -----------------------------------------------------


def test_fetch_from_the_remote_that_has_each_file(repos: dict[str, Path], tmp_path: Path) -> None:
    rnd = random.Random(1)
    a, b = rnd.randbytes(300_000), rnd.randbytes(300_000)
    ha = store_file(repos["origin"] / "xet", a)
    hb = store_file(repos["up/stream"] / "xet", b)
    local = LocalCAS(str(tmp_path / "local"))
    r = Remotes(str(repos["work"]))
    summary = fetch_from_any(local, r, r.search_order(), [ha, hb])
    assert summary.files == 2
    assert FileReader(local, ha).read(0, len(a)) == a
    assert FileReader(local, hb).read(0, len(b)) == b
    # nothing left to fetch: no remote is even opened
    assert fetch_from_any(local, Remotes(str(repos["work"])), ["gone"], [ha, hb]).files == 0


def test_fetch_names_every_remote_tried(repos: dict[str, Path], tmp_path: Path) -> None:
    ghost = bytes(range(32))
    local = LocalCAS(str(tmp_path / "local"))
    r = Remotes(str(repos["work"]))
    with pytest.raises(DataUnavailableError) as ei:
        fetch_from_any(local, r, r.search_order(), [ghost], paths={to_hex(ghost): "d/x.bin"})
    e = ei.value
    assert isinstance(e, FileNotFoundInCASError)  # what older callers catch
    assert [w.split()[0] for w, _ in e.tried] == ["origin", "gone", "up/stream"]
    assert e.tried[0][1] == e.tried[2][1] == "does not have it"
    assert "not reachable" in e.tried[1][1]
    assert "d/x.bin" in str(e) and str(repos["up/stream"]) in str(e)


def test_a_broken_remote_is_skipped_for_one_that_has_the_data(
    repos: dict[str, Path], tmp_path: Path
) -> None:
    data = random.Random(2).randbytes(200_000)
    fh = store_file(repos["origin"] / "xet", data)
    store_file(repos["up/stream"] / "xet", data)
    # origin knows the file (its shard) but lost the xorb (an interrupted copy, say)
    (xorb,) = [p for p in (repos["origin"] / "xet" / "xorbs").rglob("*") if p.is_file()]
    xorb.unlink()
    local = LocalCAS(str(tmp_path / "local"))
    r = Remotes(str(repos["work"]))
    fetch_from_any(local, r, ["origin", "up/stream"], [fh])
    assert FileReader(local, fh).read(0, len(data)) == data
    # one file at a time (the smudge path): same outcome, and origin's failure is noted
    local2 = LocalCAS(str(tmp_path / "local2"))
    search = Search([], [])
    src = source_with(local2, r, ["origin", "up/stream"], fh, search)
    assert src is local2 and FileReader(local2, fh).read(0, 10) == data[:10]
    assert search.tried[0][0].startswith("origin") and "not found" in search.tried[0][1]


# ---- layered sources -------------------------------------------------------------------------


class _Down:
    """A layer whose server is down."""

    is_local = False

    def file_info(self, file_hash: bytes) -> None:
        raise RemoteError("connection refused")

    def layout(self, xorb_hash: bytes) -> None:
        raise RemoteError("connection refused")

    def read_chunks(self, xorb_hash: bytes, start: int, end: int) -> list[bytes]:
        raise AssertionError("not reached")


def test_layered_source_skips_a_failing_layer(tmp_path: Path) -> None:
    data = random.Random(3).randbytes(100_000)
    fh = store_file(tmp_path / "s", data)
    store = LocalCAS(str(tmp_path / "s"))
    layered = LayeredSource([_Down(), store], ["srv", "store"])  # type: ignore[list-item]
    assert not layered.is_local
    assert FileReader(layered, fh).read(5, 10) == data[5:15]
    assert LayeredSource([store]).is_local
    with pytest.raises(DataUnavailableError) as ei:
        layered.file_info(bytes(32 * [7]))
    assert ei.value.tried == [("srv", "connection refused"), ("store", "does not have it")]
    # without names: the old contract (None, or the failing layer's error)
    assert LayeredSource([store]).file_info(bytes(32 * [7])) is None
    with pytest.raises(RemoteError):
        LayeredSource([_Down()]).file_info(fh)  # type: ignore[list-item]


def test_remote_layer_opens_its_server_only_when_asked(repos: dict[str, Path]) -> None:
    opened: list[str] = []

    def factory(url: str) -> LocalDirRemote:
        opened.append(url)
        raise RemoteError("server down")

    git(repos["work"], "remote", "add", "srv", "http://127.0.0.1:1/x.git")
    layer = RemoteLayer(Remotes(str(repos["work"]), factory), "srv")
    assert opened == []
    with pytest.raises(XorbNotFoundError):
        layer.layout(bytes(32))  # knows no xorb before describing a file
    with pytest.raises(RemoteError):
        layer.file_info(bytes(32))
    assert opened == ["http://127.0.0.1:1/x.git"]


# ---- opening a repository for reading --------------------------------------------------------


def test_open_dataset_of_each_local_kind(repos: dict[str, Path], tmp_path: Path) -> None:
    work = repos["work"]
    data = random.Random(4).randbytes(150_000)
    fh = store_file(repos["up/stream"] / "xet", data)
    head = git(work, "rev-parse", "HEAD")
    for spec in (str(work), str(work / ".git"), f"file://{work}"):
        ds = open_dataset(spec)
        assert Path(ds.git_dir) == work / ".git"
        assert ds.resolve("main") == head
        assert ds.resolve(head[:10]) == head
        # the own store has nothing: the data is read in place from the remote that has it
        assert FileReader(ds.chunk_source(), fh).read(0, 100) == data[:100]
    bare = open_dataset(str(repos["origin"]))
    assert Path(bare.git_dir) == repos["origin"]
    assert bare.resolve("main") == head
    with pytest.raises(DataUnavailableError, match="no remote is configured"):
        bare.chunk_source().file_info(fh)


def test_open_dataset_names_what_it_tried(repos: dict[str, Path]) -> None:
    work = repos["work"]
    store_file(work / ".git" / "xet", b"x" * 1000)
    ds = open_dataset(str(work))
    with pytest.raises(DataUnavailableError) as ei:
        ds.chunk_source().file_info(bytes(32 * [9]))
    where = [w for w, _ in ei.value.tried]
    # missing remote dirs (gone, and stores not created yet) are no layer at all
    assert where == ["this repository's store"]
    store_file(repos["origin"] / "xet", b"y" * 1000)
    ds = open_dataset(str(work))
    with pytest.raises(DataUnavailableError) as ei:
        ds.chunk_source().file_info(bytes(32 * [9]))
    assert [w.split()[0] for w, _ in ei.value.tried] == ["this", "origin"]


def test_a_commits_source_asks_the_remotes_holding_it_first(repos: dict[str, Path]) -> None:
    work = repos["work"]
    for name in ("origin", "up/stream"):
        store_file(repos[name] / "xet", name.encode() * 100)
    (work / "f").write_text("two\n")
    git(work, "commit", "-qam", "two")
    git(work, "push", "-q", "up/stream", "main")
    new = git(work, "rev-parse", "HEAD")
    ds = open_dataset(str(work))
    first = [n.split()[0] for n in ds.chunk_source().names or []]  # type: ignore[attr-defined]
    assert first == ["origin", "up/stream"]  # the default remote first
    then = [n.split()[0] for n in ds.chunk_source(new).names or []]  # type: ignore[attr-defined]
    assert then == ["up/stream", "origin"]  # only up/stream has the commit


def test_open_dataset_bad_specs(tmp_path: Path, repos: dict[str, Path]) -> None:
    with pytest.raises(NotFoundError, match="no such repository"):
        open_dataset(str(tmp_path / "nope"))
    (tmp_path / "plain").mkdir()
    with pytest.raises(NotFoundError, match="not a git repository"):
        open_dataset(str(tmp_path / "plain"))
    with pytest.raises(NotFoundError, match="only local paths"):
        open_dataset("ssh://host/x.git")
    with pytest.raises(NotFoundError, match="need server access") as ei:
        open_dataset("http://user:s3cret@127.0.0.1:1/x.git")
    assert "s3cret" not in str(ei.value)
    ds = open_dataset(str(repos["work"]))
    for rev in ("no-such-branch", "-x", "", "main:f"):
        with pytest.raises(NotFoundError, match="no such revision"):
            ds.resolve(rev)
    tree = git(repos["work"], "rev-parse", "main^{tree}")
    for rev in ("main^{tree}", tree, tree[:12]):  # (was a bare git error, exit 1)
        with pytest.raises(NotFoundError, match=r"is a tree, not a commit"):
            ds.resolve(rev)
    # a path relative to a work directory: git refuses it (was a bare GitError, which the
    # CSI plugin answered as an internal error and the Docker plugin as 'git rev-parse failed')
    for rev in ("HEAD:../..", "main:./f"):
        with pytest.raises(NotFoundError, match=r"is not a revision of .*relative path"):
            ds.resolve(rev)


def test_an_http_mirror_is_made_over_http_only(tmp_path: Path, repos: dict[str, Path]) -> None:
    """The mirror a mount or plugin makes of an http(s) URL uses http(s) only, whatever
    git's config rewrites the URL to (a file:// repository here, or ext::) or the server
    redirects to."""
    url = "http://127.0.0.1:9/data.git"
    git(tmp_path, "config", "--global", f"url.file://{repos['origin']}.insteadOf", url)
    with pytest.raises(GitxetError, match="not allowed"):
        mirror_git_metadata(url, HttpAccess(str(tmp_path / "cache")))
    assert not list((tmp_path / "cache" / "repos").iterdir())  # no mirror, no temp left


def test_open_commit_resolves_revision_and_subdir(repos: dict[str, Path]) -> None:
    work = repos["work"]
    (work / "d" / "e").mkdir(parents=True)
    (work / "d" / "e" / "x.txt").write_text("x\n")
    git(work, "add", "d")
    git(work, "commit", "-qm", "d")
    head = git(work, "rev-parse", "HEAD")
    opened = open_commit(str(work), "main", "d/")
    try:
        assert opened.commit == head and Path(opened.dataset.git_dir) == work / ".git"
        names = [n for n, _ in opened.fs.readdir(opened.fs.root_ino)]
        assert b"e" in names
    finally:
        opened.close()
    with pytest.raises(FileNotFoundError):
        open_commit(str(work), "main", "nope")
    with pytest.raises(NotADirectoryError):
        open_commit(str(work), "main", "f")
    with pytest.raises(NotFoundError, match="no such revision"):
        open_commit(str(work), "nope")
    # the cheap check callers make before handing a commit to a daemon
    ds = opened.dataset
    ds.check_subdir(head, "")
    ds.check_subdir(head, "d/e/")
    with pytest.raises(NotFoundError, match="'nope' does not exist"):
        ds.check_subdir(head, "nope")
    with pytest.raises(NotFoundError, match=r"'d/e/x.txt' is not a directory"):
        ds.check_subdir(head, "d/e/x.txt")
    for bad in ("d/../d", "./d", "d//e"):
        with pytest.raises(NotFoundError, match="not a plain relative path"):
            ds.check_subdir(head, bad)


def test_layered_source_does_not_look_again_for_a_xorb_it_reads_from(tmp_path: Path) -> None:
    data = random.Random(4).randbytes(100_000)
    fh = store_file(tmp_path / "s", data)
    store = LocalCAS(str(tmp_path / "s"))
    looked: list[bytes] = []
    has_xorb = store.has_xorb

    def counted(xorb_hash: bytes) -> bool:
        looked.append(xorb_hash)
        return has_xorb(xorb_hash)

    store.has_xorb = counted  # type: ignore[method-assign]
    layered = LayeredSource([store])
    assert FileReader(layered, fh).read(0, 10) == data[:10]  # the xorb is found, read from
    before = len(looked)
    assert before > 0
    assert layered.file_info(fh) is not None
    assert len(looked) == before  # known to hold it: no second look (a stat each)
