"""The repository's own rules: .xetconfig precedence, files never stored as pointers."""

from __future__ import annotations

import subprocess
from pathlib import Path

from gitxet.git.checkattr import AttrQuery
from gitxet.git.xetconfig import (
    THRESHOLD_KEY,
    Setting,
    is_never_pointer,
    read_setting,
    shadowed_warning,
    write_setting,
)


def git(repo: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True)


def test_threshold_comes_from_worktree_then_index_then_head_then_git_config(
    git_repo: Path,
) -> None:
    assert read_setting(git_repo, git_repo, THRESHOLD_KEY) is None
    git(git_repo, "config", THRESHOLD_KEY, "1m")
    assert read_setting(git_repo, git_repo, THRESHOLD_KEY) == Setting("1m", "git config")
    path = write_setting(git_repo, THRESHOLD_KEY, "0")
    assert path.read_text() == "[xet]\n\tthreshold = 0\n"
    # the repository's file wins; the git config value it overrides is reported
    assert read_setting(git_repo, git_repo, THRESHOLD_KEY) == Setting("0", ".xetconfig", "1m")
    git(git_repo, "add", ".xetconfig")
    git(git_repo, "commit", "-qm", "rules")
    path.unlink()  # a sparse checkout, say: the index's copy counts
    found = read_setting(git_repo, git_repo, THRESHOLD_KEY)
    assert found == Setting("0", ".xetconfig (index)", "1m")
    git(git_repo, "rm", "-q", "--cached", ".xetconfig")
    found = read_setting(git_repo, git_repo, THRESHOLD_KEY)
    assert found == Setting("0", ".xetconfig (HEAD)", "1m")
    # a .xetconfig that leaves the key unset: git config applies
    (git_repo / ".xetconfig").write_text("[xet]\n\tother = 1\n")
    assert read_setting(git_repo, git_repo, THRESHOLD_KEY) == Setting("1m", "git config")
    # includes are never followed: a cloned repository configures nothing else
    (git_repo / "evil").write_text("[xet]\n\tthreshold = 5\n")
    (git_repo / ".xetconfig").write_text("[include]\n\tpath = evil\n")
    assert read_setting(git_repo, git_repo, THRESHOLD_KEY) == Setting("1m", "git config")


def test_a_git_config_value_the_repository_overrides_is_named(git_repo: Path) -> None:
    write_setting(git_repo, THRESHOLD_KEY, "256k")
    assert shadowed_warning(THRESHOLD_KEY, read_setting(git_repo, git_repo, THRESHOLD_KEY)) is None
    git(git_repo, "config", THRESHOLD_KEY, "256k")  # the same value: nothing to say
    assert shadowed_warning(THRESHOLD_KEY, read_setting(git_repo, git_repo, THRESHOLD_KEY)) is None
    git(git_repo, "config", THRESHOLD_KEY, "0")
    warning = shadowed_warning(THRESHOLD_KEY, read_setting(git_repo, git_repo, THRESHOLD_KEY))
    assert warning == (
        "git config xet.threshold = 0 has no effect: the repository's .xetconfig sets 256k "
        "for every clone (change it with 'git xet track --threshold 0')"
    )


def test_files_git_reads_are_never_pointers() -> None:
    for path in (".gitattributes", "a/b/.gitattributes", ".gitignore", "d/.gitignore",
                 ".gitmodules", ".lfsconfig", ".xetconfig", ".mailmap"):  # fmt: skip
        assert is_never_pointer(path), path
    assert not is_never_pointer("x.gitattributes")
    assert not is_never_pointer(".gitattributes/x")


def test_attr_query_answers_like_git(git_repo: Path) -> None:
    (git_repo / ".gitattributes").write_text("* filter=xet\n*.jpg xet=always\nraw/** -xet\n")
    q = AttrQuery(git_repo, ["xet", "filter"])
    try:
        assert q.get("a/b.jpg") == {"xet": "always", "filter": "xet"}
        assert q.get("raw/c.jpg") == {"xet": "unset", "filter": "xet"}
        assert q.get("weird name \u00e9.txt") == {"xet": "unspecified", "filter": "xet"}
        # prefetched questions: answered for the right path, also when never read
        q.prefetch("a/b.jpg")
        assert q.get("a/b.jpg") == {"xet": "always", "filter": "xet"}
        q.prefetch("raw/c.jpg")
        q.prefetch("d.txt")
        assert q.get("raw/x.jpg") == {"xet": "unset", "filter": "xet"}
        q.prefetch("e.jpg")
        assert q.get("e.jpg") == {"xet": "always", "filter": "xet"}
    finally:
        q.close()
