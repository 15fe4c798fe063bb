"""The pure parts of history migration: LFS pointers, path patterns, fast-export paths."""

from __future__ import annotations

import io

import pytest

from gitxet.errors import ConfigError, GitError, PointerFormatError
from gitxet.migrate import LfsPointer, PathSelector, _copy_data, _unquote_path, parse_lfs_pointer

OID = "4d7a214614ab2935c943f9e0ff69d22eadbb8f32b1258daaa5e2ca24d17e2393"
GOOD = f"version https://git-lfs.github.com/spec/v1\noid sha256:{OID}\nsize 12345\n".encode()


def test_lfs_pointer_parses() -> None:
    assert parse_lfs_pointer(GOOD) == LfsPointer(OID, 12345)
    old = GOOD.replace(b"git-lfs.github.com", b"hawser.github.com")
    assert parse_lfs_pointer(old) == LfsPointer(OID, 12345)
    # unknown (non-extension) keys sorted after oid/size are allowed by the spec
    extra = GOOD + b"x-custom hello\n"
    assert parse_lfs_pointer(extra) == LfsPointer(OID, 12345)


@pytest.mark.parametrize(
    "data",
    [b"", b"hello\n", b"version https://gitxet.dev/spec/v1\n", GOOD + b"x" * 1024],
)
def test_non_lfs_content_is_not_a_pointer(data: bytes) -> None:
    assert parse_lfs_pointer(data) is None


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (GOOD[:-1], "newline"),
        (GOOD.replace(b"size 12345", b"size 012"), "size"),
        (GOOD.replace(b"size 12345", b"size -1"), "size"),
        (GOOD.replace(b"sha256:", b"sha1:"), "oid"),
        (GOOD.replace(OID.encode(), OID[:-1].encode()), "oid"),
        (GOOD + b"size 1\n", "twice"),
        (GOOD.replace(b"oid", b"Oid"), "key value"),
        (GOOD + b"ext-0-foo sha256:" + OID.encode() + b"\n", "extension"),
        (GOOD.replace(b"\nsize 12345\n", b"\n") + b"size 1\nbb x\naa y\n", "order"),
    ],
)
def test_damaged_lfs_pointers_are_refused_by_name(data: bytes, reason: str) -> None:
    with pytest.raises(PointerFormatError, match=reason):
        parse_lfs_pointer(data)


@pytest.mark.parametrize(
    ("include", "exclude", "path", "selected"),
    [
        ((), (), b"a/b/c.bin", True),
        (("*.bin",), (), b"a/b/c.bin", True),
        (("*.bin",), (), b"c.bin.txt", False),
        (("data/*.bin",), (), b"data/x.bin", True),
        (("data/*.bin",), (), b"data/sub/x.bin", False),
        (("data/*.bin",), (), b"other/data/x.bin", False),
        (("/top.bin",), (), b"top.bin", True),
        (("/top.bin",), (), b"sub/top.bin", False),
        (("data/",), (), b"data/deep/x", True),
        (("data/",), (), b"datax/y", False),
        (("**/models/*.pt",), (), b"models/a.pt", True),
        (("**/models/*.pt",), (), b"x/y/models/a.pt", True),
        (("a/**/z",), (), b"a/z", True),
        (("a/**/z",), (), b"a/b/c/z", True),
        (("f?.bin",), (), b"f1.bin", True),
        (("f?.bin",), (), b"f/.bin", False),
        (("f[0-3].bin",), (), b"f2.bin", True),
        (("f[!0-3].bin",), (), b"f7.bin", True),
        (("f[!0-3].bin",), (), b"f2.bin", False),
        ((), ("*.keep",), b"logs/x.keep", False),
        (("*.bin",), ("tmp/",), b"tmp/a.bin", False),
        ((), (), "ü/é.bin".encode(), True),
    ],
)
def test_path_selection_follows_gitattributes_patterns(
    include: tuple[str, ...], exclude: tuple[str, ...], path: bytes, selected: bool
) -> None:
    assert PathSelector(include, exclude).selects(path) is selected


def test_attributes_block_names_what_is_converted() -> None:
    block = PathSelector(["*.bin", "my dir/"], ["*.keep"]).attributes_block()
    lines = block.decode().splitlines()
    assert lines[0].startswith("#")
    assert lines[1:] == [
        "*.bin filter=xet diff=xet merge=xet -text",
        '"my dir/**" filter=xet diff=xet merge=xet -text',
        "*.keep !filter !diff !merge",
    ]
    assert PathSelector().attributes_block().endswith(b"\n* filter=xet diff=xet merge=xet -text\n")


@pytest.mark.parametrize("pattern", ["", "  ", "!x", "a\nb"])
def test_bad_patterns_are_refused(pattern: str) -> None:
    with pytest.raises(ConfigError):
        PathSelector([pattern])


def test_fast_export_paths_unquote() -> None:
    assert _unquote_path(b"plain/path with blanks") == b"plain/path with blanks"
    assert _unquote_path(b'"\\303\\274.txt"') == "ü.txt".encode()
    assert _unquote_path(b'"a\\tb\\n\\"q\\"\\\\"') == b'a\tb\n"q"\\'
    for bad in (b'"open', b'"bad\\q"', b'"'):
        with pytest.raises(GitError):
            _unquote_path(bad)


def test_data_blocks_pass_through_exactly() -> None:
    payload = b"commit refs/heads/x\nM 100644 abc evil\n" * 3
    src = io.BytesIO(payload + b"rest\n")
    dst = io.BytesIO()
    _copy_data(b"data %d\n" % len(payload), src, dst)
    assert dst.getvalue() == b"data %d\n" % len(payload) + payload
    assert src.read() == b"rest\n"
    with pytest.raises(GitError, match="inside a data block"):
        _copy_data(b"data 100\n", io.BytesIO(b"short"), io.BytesIO())
    with pytest.raises(GitError, match="unsupported"):
        _copy_data(b"data <<EOF\n", io.BytesIO(b""), io.BytesIO())
