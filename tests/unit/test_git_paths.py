"""The path rule (gitxet.git.paths) and the tree parser, fuzzed; git fsck is the oracle."""

from __future__ import annotations

import hashlib
import re
import subprocess
import tempfile
import zlib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gitxet.errors import FormatError
from gitxet.git.objects import (
    MODE_LINK,
    SUPPORTED_MODES,
    TreeRecord,
    count_subtrees,
    parse_tree,
)
from gitxet.git.paths import unsafe_name, unsafe_path

LINK = MODE_LINK

# ---- examples --------------------------------------------------------------------------------

DOTGIT = [
    b".git", b".GIT", b".Git", b".git.", b".git ", b".git. . ", b"git~1", b"GIT~1", b"git~1.",
    b".git::$INDEX_ALLOCATION", b".git:stream", b".git\\x", b"a\\.git", b"x\\git~1\\y",
    ".g\u200cit".encode(), ".\u200dgit".encode(), ".git\u200e".encode(), "\ufeff.git".encode(),
    ".gi\u206ft".encode(), b".git\xff",
]  # fmt: skip
SAFE = [
    b"a", b".gitx", b"x.git", b"..git", b"git~2", b"git", b".gi", b".gitignore",
    b".gitattributes", b".gitmodules", b".gi\xfft", ".g\u00e9t".encode(), b"...", b" .git",
    b"a b", b"\xff\xfe", b"\\", b":",
]  # fmt: skip


@pytest.mark.parametrize("name", DOTGIT)
def test_dotgit_and_look_alikes_are_unsafe(name: bytes) -> None:
    assert unsafe_name(name) is not None
    assert unsafe_path(b"data/" + name + b"/config") is not None


@pytest.mark.parametrize("name", SAFE)
def test_ordinary_names_are_safe(name: bytes) -> None:
    assert unsafe_name(name) is None
    assert unsafe_path(b"data/" + name) is None


@pytest.mark.parametrize(
    "path",
    [b"", b"/etc/x", b"a/../b", b"../x", b"./x", b"a//b", b"a/", b".git/config", b"A/.GIT/hooks"],
)
def test_unsafe_paths(path: bytes) -> None:
    assert unsafe_path(path) is not None


def test_gitmodules_only_unsafe_as_a_symlink() -> None:
    for name in (b".gitmodules", b".GITMODULES", b".gitmodules.", b"gitmod~1", b"GI7EBA~1"):
        assert unsafe_name(name) is None
        assert unsafe_name(name, LINK) is not None, name
        assert unsafe_path(b"sub/" + name, LINK) is not None
    assert unsafe_name(b".gitmodulesx", LINK) is None


# ---- git fsck as the oracle ----------------------------------------------------------------

_PIECES = st.sampled_from(
    [".", "g", "G", "i", "I", "t", "T", "git", ".git", "~", "1", "~1", " ", ":", "\\", "x",
     "modules", "gitmod", "gi7eba", "\u200c", "\u200d", "\u202e", "\u206a", "\ufeff", "\u00e9",
     "\udcff"]
)  # fmt: skip
_INSERTS = st.sampled_from(
    ["\u200c", "\u200f", "\u202a", "\u206f", "\ufeff", "\u00e9", "x", "\udcff"]
)
_TAILS = st.sampled_from(["", " ", ".", ". .", ":", "::$INDEX_ALLOCATION", "\\", "\\x", "x", "~"])


@st.composite
def _near_dotgit(draw: st.DrawFn) -> bytes:
    """.git, git~1 or .gitmodules with random case, inserted code points and tails."""
    core = list(draw(st.sampled_from([".git", "git~1", ".gitmodules", "gitmod~1", "gi7eba~1"])))
    core = [c.upper() if draw(st.booleans()) else c for c in core]
    for _ in range(draw(st.integers(0, 2))):
        core.insert(draw(st.integers(0, len(core))), draw(_INSERTS))
    head = draw(st.sampled_from(["", "", "", "a\\", "x", "\ufeff"]))
    return (head + "".join(core) + draw(_TAILS)).encode("utf-8", "surrogateescape")


_NAMES = st.one_of(
    _near_dotgit(),
    st.lists(_PIECES, min_size=1, max_size=6).map(
        lambda parts: "".join(parts).encode("utf-8", "surrogateescape")
    ),
)


def _loose(objects: Path, kind: bytes, body: bytes) -> bytes:
    data = kind + b" %d\0" % len(body) + body
    sha = hashlib.sha1(data).digest()
    path = objects / sha.hex()[:2] / sha.hex()[2:]
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(zlib.compress(data))
    return sha


def _fsck_flags(names: list[bytes], mode: bytes) -> dict[bytes, bool]:
    """name -> whether git fsck flags a tree holding only that entry (dot-git or a
    .gitmodules symlink), all names in one repository and one fsck run."""
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp)
        subprocess.run(["git", "init", "-q", str(repo)], check=True)
        objects = repo / ".git" / "objects"
        blob = _loose(objects, b"blob", b"target")
        trees = {_loose(objects, b"tree", mode + b" " + n + b"\0" + blob).hex(): n for n in names}
        r = subprocess.run(
            ["git", "fsck", "--no-dangling", "--no-progress"],
            cwd=repo,
            capture_output=True,
            text=True,
            check=False,
        )
    pattern = r"tree ([0-9a-f]{40}): (?:hasDotgit|gitmodulesSymlink)"
    flagged = set(re.findall(pattern, r.stdout + r.stderr))
    return {n: sha in flagged for sha, n in trees.items()}


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_NAMES, min_size=1, max_size=40, unique=True), st.booleans())
def test_rule_agrees_with_git_fsck(names: list[bytes], link: bool) -> None:
    names = [n for n in names if n not in (b".", b"..")]  # fsck names these differently
    if not names:
        return
    mode = b"120000" if link else b"100644"
    for name, flagged in _fsck_flags(names, mode).items():
        ours = unsafe_name(name, LINK if link else 0o100644) is not None
        assert ours == flagged, (name, "git fsck flags it" if flagged else "git fsck accepts it")


def test_fsck_oracle_sees_the_examples() -> None:
    got = _fsck_flags(DOTGIT + SAFE, b"100644")
    assert [n for n in DOTGIT if not got[n]] == []
    assert [n for n in SAFE if got[n]] == []


# ---- the tree parser, fuzzed ---------------------------------------------------------------

_MODES = st.sampled_from([0o100644, 0o100755, 0o40000, 0o120000, 0o160000, 0o100664, 0o100600])
_ANY_NAME = st.one_of(_NAMES, st.binary(max_size=12).filter(lambda b: b"\0" not in b))
_ENTRY = st.tuples(_MODES, _ANY_NAME, st.binary(min_size=20, max_size=20))


@settings(max_examples=200, deadline=None)
@given(st.lists(_ENTRY, max_size=12))
def test_parse_tree_keeps_exactly_the_safe_entries(entries: list[tuple[int, bytes, bytes]]) -> None:
    raw = b"".join(b"%o %s\0%s" % (mode, name, sha) for mode, name, sha in entries)
    hidden: list[tuple[bytes, str]] = []
    got = parse_tree(raw, 20, "t", lambda n, why: hidden.append((n, why)))
    want, seen = [], set()
    for mode, name, sha in entries:
        if unsafe_name(name, mode) is None and mode in SUPPORTED_MODES and name not in seen:
            seen.add(name)
            want.append(TreeRecord(name, mode, sha))
    assert got == want
    assert len(got) + len(hidden) == len(entries)
    assert all(unsafe_name(r.name, r.mode) is None for r in got)


# names of a few lowercase letters: most take the regex fast path, those starting with 'g'
# (and the other names mixed in) the careful one
_PLAIN_NAME = st.binary(min_size=1, max_size=6).map(lambda b: bytes(0x61 + c % 20 for c in b))
_MOSTLY_PLAIN = st.tuples(
    _MODES, st.one_of(_PLAIN_NAME, _PLAIN_NAME, _ANY_NAME), st.binary(min_size=20, max_size=20)
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_MOSTLY_PLAIN, max_size=12))
def test_plain_trees_parse_and_count_like_the_careful_rule(
    entries: list[tuple[int, bytes, bytes]],
) -> None:
    raw = b"".join(b"%o %s\0%s" % (mode, name, sha) for mode, name, sha in entries)
    got = parse_tree(raw, 20, "t")
    want, seen = [], set()
    for mode, name, sha in entries:
        if unsafe_name(name, mode) is None and mode in SUPPORTED_MODES and name not in seen:
            seen.add(name)
            want.append(TreeRecord(name, mode, sha))
    assert got == want
    if len({name for _, name, _ in entries}) == len(entries):  # (a repeated name counts twice)
        assert count_subtrees(raw, 20) == sum(1 for r in got if r.mode in (0o40000, 0o160000))


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=200))
def test_parse_tree_of_any_bytes_returns_safe_entries_or_format_error(raw: bytes) -> None:
    try:
        got = parse_tree(raw, 20, "t")
    except FormatError:
        return
    names = [r.name for r in got]
    assert len(names) == len(set(names))
    assert all(unsafe_name(r.name, r.mode) is None for r in got)


@settings(max_examples=150, deadline=None)
@given(st.lists(_ANY_NAME, min_size=1, max_size=5), st.booleans())
def test_a_path_is_safe_iff_every_component_is(parts: list[bytes], absolute: bool) -> None:
    path = (b"/" if absolute else b"") + b"/".join(parts)
    components = path.split(b"/")
    expect_safe = not absolute and all(unsafe_name(p) is None for p in components)
    assert (unsafe_path(path) is None) == expect_safe
