"""gitxet.git.process against the real git binary in a sealed environment."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from gitxet.errors import GitCommandError, GitError, GitObjectNotFoundError, NotARepositoryError
from gitxet.git import process as gp

Git = Callable[..., str]

ODD_NAMES = [
    b"plain.txt",
    b"with space.bin",
    b"tab\there",
    b"new\nline",
    b"caf\xc3\xa9.txt",  # UTF-8
    b"latin\xe9.raw",  # not UTF-8
    b"dir/sub/deep.dat",
]


def write(repo: Path, name: bytes, data: bytes) -> None:
    path = repo / os.fsdecode(name)  # surrogateescape keeps non-UTF-8 bytes exact
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


@pytest.fixture
def repo(git_repo: Path, run_git_cmd: Git) -> Path:
    for i, name in enumerate(ODD_NAMES):
        write(git_repo, name, b"x" * (i * 100))
    (git_repo / "run.sh").write_text("#!/bin/sh\n")
    (git_repo / "run.sh").chmod(0o755)
    (git_repo / "link").symlink_to("plain.txt")
    run_git_cmd(git_repo, "add", "-A")
    run_git_cmd(git_repo, "commit", "-qm", "first")
    return git_repo


def test_run_git_returns_stdout_and_raises_with_first_stderr_line(repo: Path) -> None:
    assert gp.run_git(["rev-parse", "--is-inside-work-tree"], repo) == b"true\n"
    with pytest.raises(GitCommandError) as info:
        gp.run_git(["rev-parse", "--verify", "no-such-ref"], repo)
    assert info.value.returncode == 128
    assert info.value.stderr.startswith("fatal:")
    assert info.value.argv == ["rev-parse", "--verify", "no-such-ref"]
    assert isinstance(info.value, GitError)
    assert gp.run_git(["rev-parse", "--verify", "nope"], repo, check=False) == b""
    assert gp.run_git(["hash-object", "--stdin"], repo, input=b"hi\n").strip() == (
        b"45b983be36b73c0788dc9cbcb76cbb80fc7bb057"
    )


def test_paths(repo: Path) -> None:
    sub = repo / "dir" / "sub"
    assert gp.git_dir(sub) == repo / ".git"
    assert gp.toplevel(sub) == repo
    with pytest.raises(NotARepositoryError, match="not a git repository"):
        gp.toplevel(repo.parent)
    assert gp.locate(sub) == (repo / ".git", repo / ".git", repo)  # from one git process
    assert gp.locate(repo / ".git") == (repo / ".git",) * 2 + (None,)  # no work tree there
    with pytest.raises(NotARepositoryError, match="not a git repository"):
        gp.locate(repo.parent)


def test_locate_bare(tmp_path: Path, run_git_cmd: Git) -> None:
    bare = tmp_path / "bare.git"
    run_git_cmd(tmp_path, "init", "-q", "--bare", str(bare))
    assert gp.locate(bare) == (bare, bare, None)


def test_locate_linked_worktree(repo: Path, run_git_cmd: Git) -> None:
    """A 'git worktree add' work tree has its own git dir; its common dir is the main one's
    (where the store is)."""
    run_git_cmd(repo, "commit", "-q", "--allow-empty", "-m", "c")
    linked = repo.parent / "linked"
    run_git_cmd(repo, "worktree", "add", "-q", "-b", "other", str(linked))
    (linked / "d").mkdir()
    where = gp.locate(linked / "d")
    assert where == (repo / ".git" / "worktrees" / "linked", repo / ".git", linked)


def test_git_version() -> None:
    version = gp.git_version()
    assert version >= (2, 20)


def test_rev_parse(repo: Path, run_git_cmd: Git) -> None:
    head = run_git_cmd(repo, "rev-parse", "HEAD").strip()
    assert gp.rev_parse(repo, "HEAD") == head
    assert gp.rev_parse(repo, "main") == head
    assert len(gp.rev_parse(repo, "HEAD:plain.txt")) == 40
    with pytest.raises(GitObjectNotFoundError) as info:
        gp.rev_parse(repo, "does-not-exist")
    assert info.value.name == "does-not-exist"
    with pytest.raises(GitError, match="invalid revision"):
        gp.rev_parse(repo, "--all")


def test_ls_tree_bytes_paths_modes_sizes(repo: Path, run_git_cmd: Git) -> None:
    entries = {e.path: e for e in gp.ls_tree(repo, "HEAD")}
    assert set(entries) == {*ODD_NAMES, b"run.sh", b"link"}
    for i, name in enumerate(ODD_NAMES):
        e = entries[name]
        assert (e.mode, e.type, e.size) == (0o100644, "blob", i * 100)
        assert e.oid == gp.run_git([b"rev-parse", b"HEAD:" + name], repo).strip().decode()
    assert entries[b"run.sh"].mode == 0o100755
    assert entries[b"link"].mode == 0o120000 and entries[b"link"].size == len("plain.txt")
    top = {e.path: e for e in gp.ls_tree(repo, "HEAD", recursive=False)}
    assert top[b"dir"].type == "tree" and top[b"dir"].size is None
    only = gp.ls_tree(repo, "HEAD", [b"dir/sub"])
    assert [e.path for e in only] == [b"dir/sub/deep.dat"]


def test_ls_tree_submodule_entry(repo: Path, run_git_cmd: Git) -> None:
    head = run_git_cmd(repo, "rev-parse", "HEAD").strip()
    run_git_cmd(repo, "update-index", "--add", "--cacheinfo", f"160000,{head},vendor/lib")
    tree = run_git_cmd(repo, "write-tree").strip()
    (entry,) = [e for e in gp.ls_tree(repo, tree) if e.path == b"vendor/lib"]
    assert (entry.mode, entry.type, entry.oid, entry.size) == (0o160000, "commit", head, None)


def test_ls_tree_stops_cleanly_and_reports_errors(repo: Path) -> None:
    it = gp.iter_ls_tree(repo, "HEAD")
    first = next(it)
    assert isinstance(first.path, bytes)
    it.close()  # kills git; a leaked pipe would fail the test via ResourceWarning
    with pytest.raises(GitObjectNotFoundError, match="nope"):
        gp.ls_tree(repo, "nope")
    with pytest.raises(GitError, match="tree-ish"):
        gp.ls_tree(repo, "-r")


def test_cat_file_read_stream_info(repo: Path, run_git_cmd: Git) -> None:
    big = bytes(range(256)) * 5000
    write(repo, b"big.bin", big)
    run_git_cmd(repo, "add", "big.bin")
    run_git_cmd(repo, "commit", "-qm", "big")
    with gp.CatFile(repo) as cat:
        kind, data = cat.read("HEAD:plain.txt")
        assert (kind, data) == ("blob", b"")
        kind, data = cat.read("HEAD:with space.bin")
        assert (kind, data) == ("blob", b"x" * 100)
        assert cat.read("HEAD")[0] == "commit"
        assert cat.read("HEAD^{tree}")[0] == "tree"
        info = cat.info("HEAD:big.bin")
        assert (info.type, info.size) == ("blob", len(big))
        with cat.stream(info.oid) as stream:
            assert (stream.type, stream.size, stream.oid) == ("blob", len(big), info.oid)
            got = bytearray()
            while chunk := stream.read(70_000):
                got += chunk
        assert bytes(got) == big
        # A stream closed half-read is skipped; the next answer is still right.
        with cat.stream("HEAD:big.bin") as stream:
            assert stream.read(10) == big[:10]
        assert cat.read("HEAD:dir/sub/deep.dat") == ("blob", b"x" * 600)
        with pytest.raises(GitError, match="over 100"):
            cat.read("HEAD:big.bin", max_size=100)
        assert cat.read("HEAD:with space.bin", max_size=100)[1] == b"x" * 100
        with pytest.raises(GitObjectNotFoundError):
            cat.read("HEAD:missing")
        with pytest.raises(GitObjectNotFoundError):
            cat.info("0" * 40)
        with pytest.raises(GitError, match="invalid object name"):
            cat.read("a\nb")
        # Asking again while this thread holds a stream would dead-lock: refuse instead.
        with cat.stream("HEAD:plain.txt"), pytest.raises(GitError, match="still open"):
            cat.read("HEAD")
        assert cat.read("HEAD:plain.txt") == ("blob", b"")


def test_cat_file_threads(repo: Path) -> None:
    expected = {name: b"x" * (i * 100) for i, name in enumerate(ODD_NAMES)}
    names = [n for n in expected if b"\n" not in n]
    errors: list[BaseException] = []
    with gp.CatFile(repo) as cat:

        def worker() -> None:
            try:
                for _ in range(20):
                    for n in names:
                        text = "HEAD:" + n.decode("utf-8", "surrogateescape")
                        assert cat.read(text)[1] == expected[n]
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=worker) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not errors


def test_cat_file_outside_repo_fails_cleanly(tmp_path: Path) -> None:
    with gp.CatFile(tmp_path) as cat, pytest.raises(GitError):
        cat.read("HEAD")


def test_config_round_trip(repo: Path) -> None:
    assert gp.config_get(repo, "gitxet.test") is None
    assert gp.config_unset(repo, "gitxet.test") is False
    gp.config_set(repo, "gitxet.test", "multi\nline = value ")
    assert gp.config_get(repo, "gitxet.test") == "multi\nline = value "
    assert gp.config_get(repo, "gitxet.test", "local") == "multi\nline = value "
    assert gp.config_get(repo, "gitxet.test", "global") is None
    gp.config_add(repo, "gitxet.list", "a")
    gp.config_add(repo, "gitxet.list", "b")
    assert gp.config_get_all(repo, "gitxet.list") == ["a", "b"]
    assert gp.config_get(repo, "gitxet.list") == "b"
    assert gp.config_get_regexp(repo, r"^gitxet\.") == [
        ("gitxet.test", "multi\nline = value "),
        ("gitxet.list", "a"),
        ("gitxet.list", "b"),
    ]
    assert gp.config_unset(repo, "gitxet.list") is True
    assert gp.config_get_all(repo, "gitxet.list") == []
    assert gp.config_remove_empty_section(repo, "gitxet") is False  # still has gitxet.test
    assert "[gitxet]" in (repo / ".git" / "config").read_text()
    gp.config_unset(repo, "gitxet.test")
    # An older git leaves the empty header behind; simulate that.
    with (repo / ".git" / "config").open("a") as f:
        f.write('[gitxet]\n[filter "xet"]\n')
    assert gp.config_remove_empty_section(repo, "gitxet") is True
    assert gp.config_remove_empty_section(repo, "filter.xet") is True
    assert gp.config_remove_empty_section(repo, "filter.xet") is True  # already gone
    text = (repo / ".git" / "config").read_text()
    assert "[gitxet]" not in text and "xet" not in text


def test_config_global_scope_without_repo(tmp_path: Path, sealed_git_env: Path) -> None:
    gp.config_set(None, "gitxet.where", "global", "global")
    assert gp.config_get(None, "gitxet.where", "global") == "global"
    assert "where = global" in (sealed_git_env / ".gitconfig").read_text()
    with pytest.raises(GitCommandError):
        gp.config_set(tmp_path, "gitxet.where", "x", "local")  # no repository here
    with pytest.raises(GitError, match="invalid config key"):
        gp.config_get(None, "--list")


def test_remotes(repo: Path, run_git_cmd: Git) -> None:
    assert gp.list_remotes(repo) == []
    assert gp.remote_url(repo, "origin") is None
    run_git_cmd(repo, "remote", "add", "origin", "gh:owner/repo")
    run_git_cmd(repo, "remote", "add", "backup", "/srv/backup.git")
    run_git_cmd(repo, "config", "url.https://github.com/.insteadOf", "gh:")
    assert gp.list_remotes(repo) == ["backup", "origin"]
    assert gp.remote_url(repo, "origin") == "https://github.com/owner/repo"
    assert gp.remote_url(repo, "backup") == "/srv/backup.git"


def test_rev_list_objects_and_small_blobs(repo: Path, run_git_cmd: Git, tmp_path: Path) -> None:
    remote = tmp_path / "remote.git"
    run_git_cmd(tmp_path, "init", "-q", "--bare", str(remote))
    run_git_cmd(repo, "remote", "add", "origin", str(remote))
    run_git_cmd(repo, "push", "-q", "origin", "main")
    first = gp.rev_parse(repo, "HEAD")

    write(repo, b"new/small.txt", b"tiny\n")
    write(repo, b"new/large.bin", b"L" * 5000)
    run_git_cmd(repo, "add", "-A")
    run_git_cmd(repo, "commit", "-qm", "second")
    second = gp.rev_parse(repo, "HEAD")

    everything = list(gp.rev_list_objects(repo, ["HEAD"]))
    assert {o.oid for o in everything} >= {first, second}
    commits = [o for o in everything if o.path is None]
    assert {o.oid for o in commits} == {first, second}

    new = list(gp.rev_list_objects(repo, ["HEAD"], exclude_remote="origin"))
    new_paths = {o.path for o in new if o.path}
    assert b"new/small.txt" in new_paths and b"new/large.bin" in new_paths
    assert b"plain.txt" not in new_paths  # the remote has it already
    assert {o.oid for o in new if o.path is None} == {second}
    assert list(gp.rev_list_objects(repo, ["HEAD"], exclude=[second])) == []

    small = list(gp.small_blobs(repo, ["HEAD"], exclude_remote="origin"))
    assert [(b.path, b.size) for b in small] == [(b"new/small.txt", 5)]
    assert small[0].oid == gp.rev_parse(repo, "HEAD:new/small.txt")
    sizes = {b.path: b.size for b in gp.small_blobs(repo, ["HEAD"], max_size=1000)}
    assert sizes[b"plain.txt"] == 0 and b"new/large.bin" not in sizes
    assert b"dir/sub/deep.dat" in sizes  # 600 bytes, under the cap

    it = gp.small_blobs(repo, ["HEAD"], max_size=10**9)
    next(it)
    it.close()  # both git processes are stopped; a leak would raise ResourceWarning

    with pytest.raises(GitObjectNotFoundError, match="no-such-branch"):
        list(gp.small_blobs(repo, ["no-such-branch"]))
    # a remote tip this clone never fetched: skipped when asked, an error otherwise
    unknown = "1" * 40
    skipped = gp.small_blobs(repo, ["HEAD"], [unknown, first], ignore_missing=True)
    assert [(b.path, b.size) for b in skipped] == [(b"new/small.txt", 5)]
    with pytest.raises(GitError):
        list(gp.small_blobs(repo, ["HEAD"], [unknown]))
    with pytest.raises(GitError, match="invalid revision"):
        list(gp.rev_list_objects(repo, ["--all"]))
    with pytest.raises(GitError, match="at least one"):
        list(gp.rev_list_objects(repo, []))


def test_batch_check_streams_many_names(repo: Path) -> None:
    names = ["HEAD:plain.txt", "HEAD:nope", "HEAD", "0" * 40] + ["HEAD:with space.bin"] * 3000
    answers = list(gp.batch_check(repo, names))
    assert [n for n, _ in answers] == names
    assert answers[0][1] is not None and answers[0][1].size == 0
    assert answers[1][1] is None and answers[3][1] is None
    assert answers[2][1] is not None and answers[2][1].type == "commit"
    assert {a[1] for a in answers[4:]} == {answers[4][1]}
    assert answers[4][1] is not None and answers[4][1].size == 100
    assert list(gp.batch_check(repo, [])) == []
    it = gp.batch_check(repo, (f"HEAD:{i}" for i in range(100_000)))
    assert next(it)[1] is None
    it.close()  # kills git and the feeder thread ends; nothing leaks
    with pytest.raises(GitError, match="invalid object name"):
        list(gp.batch_check(repo, ["HEAD", "bad\nname"]))


def test_index_files_stat_changed_and_refresh(repo: Path, run_git_cmd: Git) -> None:
    files = gp.index_files(repo)
    assert files["run.sh"][0] == 0o100755
    assert files["plain.txt"] == (0o100644, run_git_cmd(repo, "rev-parse", ":plain.txt").strip())
    assert "link" not in files  # regular files only
    assert set(gp.index_files(repo, ["dir"])) == {"dir/sub/deep.dat"}
    assert gp.stat_changed(repo) == set()
    st = (repo / "plain.txt").stat()
    os.utime(repo / "plain.txt", ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert gp.stat_changed(repo) == {"plain.txt"}
    gp.refresh_index(repo, ["plain.txt"])  # same content: git takes the new stat
    assert gp.stat_changed(repo) == set()


def test_blob_sizes_and_refs(repo: Path, run_git_cmd: Git) -> None:
    oid = run_git_cmd(repo, "rev-parse", ":dir/sub/deep.dat").strip()
    assert gp.blob_sizes(repo, [oid, "0" * 40]) == {oid: 600}
    assert gp.blob_sizes(repo, []) == {}
    head = run_git_cmd(repo, "rev-parse", "HEAD").strip()
    run_git_cmd(repo, "tag", "v1")
    run_git_cmd(repo, "branch", "other")
    assert gp.ref_tips(repo, ["refs/heads", "refs/tags"]) == [head]
    dates = gp.ref_dates(repo, ["refs/heads"])
    assert sorted(ref for _, _, ref in dates) == ["refs/heads/main", "refs/heads/other"]
    assert all(oid == head and isinstance(when, int) for oid, when, _ in dates)


@pytest.mark.parametrize(
    ("stderr", "said"),
    [
        (
            "fatal: could not read Username for 'http://h/d.git': No such device or address",
            "asks for credentials and none were given (git xet login http://h/d.git, or set "
            "GITXET_TOKEN)",
        ),
        ("fatal: Authentication failed for 'http://h/d.git/'", "refused the credentials"),
        (
            "fatal: unable to access 'http://h/d.git/': The requested URL returned error: 403",
            "refused the credentials",
        ),
    ],
)
def test_remote_failure_tells_missing_from_refused_credentials(stderr: str, said: str) -> None:
    from gitxet.errors import AuthError

    err = gp.remote_failure("http://h/d.git", stderr)
    assert isinstance(err, AuthError)
    assert said in str(err)
