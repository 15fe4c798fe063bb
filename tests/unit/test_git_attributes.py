"""Editing .gitattributes: idempotent, surgical, and understood by git itself."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from gitxet.errors import ConfigError
from gitxet.git.attributes import (
    ATTRIBUTES,
    AUTO_TRACK_LINE,
    default_auto_track_line,
    track,
    tracked_patterns,
    untrack,
)


def check_attr(repo: Path, path: str, attr: str = "filter") -> str:
    out = subprocess.run(
        ["git", "check-attr", "-z", attr, "--", path],
        cwd=repo,
        check=True,
        capture_output=True,
    ).stdout
    return out.split(b"\0")[2].decode()


def test_track_creates_file_and_is_idempotent(git_repo: Path) -> None:
    assert tracked_patterns(git_repo) == []
    assert track(git_repo, ["*.bin", "data/**"]) == ["*.bin", "data/**"]
    text = (git_repo / ".gitattributes").read_text()
    assert text == f"*.bin {ATTRIBUTES}\ndata/** {ATTRIBUTES}\n"
    assert track(git_repo, ["*.bin", "data/**", "*.bin"]) == []
    assert (git_repo / ".gitattributes").read_text() == text
    assert tracked_patterns(git_repo) == ["*.bin", "data/**"]
    assert (git_repo / ".gitattributes").stat().st_mode & 0o777 == 0o644
    for path, want in [("a.bin", "xet"), ("data/x/y.csv", "xet"), ("a.txt", "unspecified")]:
        assert check_attr(git_repo, path) == want
    assert check_attr(git_repo, "a.bin", "text") == "unset"
    assert check_attr(git_repo, "a.bin", "diff") == "xet"


def test_other_lines_are_preserved_byte_for_byte(git_repo: Path) -> None:
    original = b"# comment\r\n*.txt text eol=lf\r\n\r\n  *.png binary\r\n*.jpg -text"
    (git_repo / ".gitattributes").write_bytes(original)
    (git_repo / ".gitattributes").chmod(0o664)
    assert track(git_repo, ["*.bin"]) == ["*.bin"]
    data = (git_repo / ".gitattributes").read_bytes()
    # Missing final newline fixed, the file's CRLF style reused.
    assert data == original + b"\r\n*.bin " + ATTRIBUTES.encode() + b"\r\n"
    assert (git_repo / ".gitattributes").stat().st_mode & 0o777 == 0o664
    assert untrack(git_repo, ["*.bin"]) == ["*.bin"]
    assert (git_repo / ".gitattributes").read_bytes() == original + b"\r\n"


def test_untrack_keeps_foreign_attributes_and_lines(git_repo: Path) -> None:
    (git_repo / ".gitattributes").write_text(
        "*.bin filter=xet diff=xet merge=xet -text\n"
        "*.csv filter=xet diff=xet merge=xet -text eol=lf\n"
        "*.zip filter=lfs diff=lfs merge=lfs -text\n"
    )
    assert untrack(git_repo, ["*.csv", "*.zip", "*.none"]) == ["*.csv"]
    assert (git_repo / ".gitattributes").read_text() == (
        "*.bin filter=xet diff=xet merge=xet -text\n"
        "*.csv eol=lf\n"
        "*.zip filter=lfs diff=lfs merge=lfs -text\n"
    )
    before = (git_repo / ".gitattributes").read_bytes()
    assert untrack(git_repo, ["*.csv"]) == []
    assert (git_repo / ".gitattributes").read_bytes() == before
    assert untrack(git_repo, ["*.bin"]) == ["*.bin"]
    assert tracked_patterns(git_repo) == []


def test_later_lines_override_earlier_ones(git_repo: Path) -> None:
    (git_repo / ".gitattributes").write_text(
        f"*.bin {ATTRIBUTES}\n*.bin -filter\n*.dat filter=lfs\n*.dat {ATTRIBUTES}\n"
    )
    assert tracked_patterns(git_repo) == ["*.dat"]
    assert check_attr(git_repo, "x.bin") == "unset"
    # Tracking again appends a line that wins over the -filter above it.
    assert track(git_repo, ["*.bin", "*.dat"]) == ["*.bin"]
    assert check_attr(git_repo, "x.bin") == "xet"
    assert tracked_patterns(git_repo) == ["*.bin", "*.dat"]


@pytest.mark.parametrize(
    ("name", "path"),
    [
        ("my file.bin", "my file.bin"),
        ("tab\there.bin", "tab\there.bin"),
        ("#hash.bin", "#hash.bin"),
        ('quote".bin', 'quote".bin'),
        # Patterns are globs: a literal backslash in a path is written "\\" in the pattern.
        ("back\\\\slash.bin", "back\\slash.bin"),
        ("caf\u00e9 x", "caf\u00e9 x"),
    ],
)
def test_special_patterns_are_quoted_so_git_agrees(git_repo: Path, name: str, path: str) -> None:
    assert track(git_repo, [name]) == [name]
    assert check_attr(git_repo, path) == "xet"
    assert tracked_patterns(git_repo) == [name]
    assert track(git_repo, [name]) == []
    assert untrack(git_repo, [name]) == [name]
    assert check_attr(git_repo, path) == "unspecified"
    assert (git_repo / ".gitattributes").read_bytes() == b""


@pytest.mark.parametrize("bad", ["", "!*.bin", "a\0b", "data/"])
def test_invalid_patterns_are_refused(git_repo: Path, bad: str) -> None:
    with pytest.raises(ConfigError):
        track(git_repo, [bad])
    assert not (git_repo / ".gitattributes").exists()


def test_a_directory_pattern_is_refused_with_the_one_that_works(git_repo: Path) -> None:
    """'data/' in .gitattributes matches nothing (git matches attributes against files):
    tracking it said it was done and changed nothing; 'data/**' is what the user meant."""
    (git_repo / "data").mkdir()
    with pytest.raises(ConfigError, match=r"track 'data/\*\*' for every file"):
        track(git_repo, ["data/"])
    assert track(git_repo, ["data/**"]) == ["data/**"]
    assert check_attr(git_repo, "data/x/y.bin") == "xet"
    # a line someone wrote by hand is still untracked by its pattern
    (git_repo / ".gitattributes").write_bytes(b"old/ filter=xet diff=xet merge=xet -text\n")
    assert untrack(git_repo, ["old/"]) == ["old/"]


def test_auto_track_line_is_valid_and_git_understands_it(git_repo: Path) -> None:
    assert default_auto_track_line() == "* filter=xet diff=xet merge=xet -text" == AUTO_TRACK_LINE
    pattern = default_auto_track_line().split()[0]
    assert track(git_repo, [pattern]) == ["*"]
    assert (git_repo / ".gitattributes").read_text() == AUTO_TRACK_LINE + "\n"
    assert check_attr(git_repo, "deep/any.thing") == "xet"


def test_malformed_quoted_pattern_is_read_like_git(git_repo: Path) -> None:
    # An unterminated quote is not a quoted pattern; git takes the token literally.
    (git_repo / ".gitattributes").write_text('"a.bin filter=xet\n')
    assert tracked_patterns(git_repo) == ['"a.bin']


def test_track_always_marks_upgrades_and_untrack_undoes_exactly(git_repo: Path) -> None:
    from gitxet.git.attributes import ALWAYS, rules

    assert track(git_repo, ["*"]) == ["*"]
    assert track(git_repo, ["*.jpg"], always=True, dry_run=True) == ["*.jpg"]
    assert (git_repo / ".gitattributes").read_text() == AUTO_TRACK_LINE + "\n"
    assert track(git_repo, ["*.jpg", "*"], always=True) == ["*.jpg", "*"]
    text = (git_repo / ".gitattributes").read_text()
    assert text == f"{AUTO_TRACK_LINE} {ALWAYS}\n*.jpg {ATTRIBUTES} {ALWAYS}\n"
    assert track(git_repo, ["*.jpg"], always=True) == []
    assert check_attr(git_repo, "a/b.jpg", "xet") == "always"
    assert [(r.source, r.pattern, r.kind) for r in rules(git_repo)] == [
        (".gitattributes:1", "*", "always"),
        (".gitattributes:2", "*.jpg", "always"),
    ]
    assert untrack(git_repo, ["*.jpg"], dry_run=True) == ["*.jpg"]
    assert (git_repo / ".gitattributes").read_text() == text
    assert untrack(git_repo, ["*.jpg"]) == ["*.jpg"]
    assert check_attr(git_repo, "a/b.jpg", "xet") == "always"  # still the "*" line's
    (git_repo / ".gitattributes").write_text(f"*.bin {ATTRIBUTES}\n*.tmp -filter\n")
    assert [(r.pattern, r.kind) for r in rules(git_repo)] == [("*.bin", "size"), ("*.tmp", "off")]
