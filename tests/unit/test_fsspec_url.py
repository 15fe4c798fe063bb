"""The ``xet://`` URL grammar and the adaptive read-ahead cache (no repository needed)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gitxet.errors import URLFormatError
from gitxet.fsspec.file import MIN_WINDOW, AdaptiveReadahead
from gitxet.fsspec.filesystem import XetFileSystem
from gitxet.fsspec.url import canonical, format_url, parse_url


def test_parse_plain_url() -> None:
    u = parse_url("xet:///srv/data.git@main/train/x.parquet")
    assert (u.repo, u.rev, u.path) == ("/srv/data.git", "main", "train/x.parquet")
    assert u.prefix == "/srv/data.git@main"
    assert u.name() == "/srv/data.git@main/train/x.parquet"
    assert parse_url("/srv/data.git@main").path == ""  # no protocol, no path: the root
    assert parse_url("xet:///srv/d@v1/").path == ""


def test_escapes_in_repo_and_revision_only() -> None:
    u = parse_url("xet:///srv/a%40b%25c.git@feature%2Fx/dir/f@1%41.txt")
    assert u.repo == "/srv/a@b%c.git"
    assert u.rev == "feature/x"
    assert u.path == "dir/f@1%41.txt"  # paths are literal
    assert u.prefix == "/srv/a%40b%25c.git@feature%2Fx"


def test_url_repos_and_revisions_with_at() -> None:
    u = parse_url("xet://file:///srv/d.git@main/a")
    assert (u.repo, u.rev, u.path) == ("file:///srv/d.git", "main", "a")
    assert parse_url("xet:///r@HEAD@{1}/x").rev == "HEAD@{1}"  # only the first '@' splits


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("xet:///srv/data.git/x", "no '@'"),
        ("xet://@main/x", "no repository"),
        ("xet:///srv/d.git@/x", "no revision"),
        ("xet:///srv/d.git@", "no revision"),
        ("xet://data.git@main/x", "absolute path"),
        ("xet:///srv/d%4.git@main", "bad %-escape"),
        ("xet:///srv/d.git@ma%zzin", "bad %-escape"),
        ("xet:///srv/d.git@main/a/../b", "'..'"),
        ("xet:///srv/d.git@main/a\0b", "NUL"),
        ("xet:///" + "a" * 70_000 + "@main", "longer than"),
    ],
)
def test_malformed_urls(url: str, why: str) -> None:
    with pytest.raises(URLFormatError, match=why) as exc:
        parse_url(url)
    assert isinstance(exc.value, ValueError)


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("xet://https://user:S3CRET@host/d.git@main/x", "credentials"),
        ("xet://https://S3CRET@host:8080/d.git@main/x", "credentials"),
        ("xet://https://user:S3CRET%40host/d.git@main/a/../b", "'..'"),
        ("xet://https://user:S3CRET%40host/d.git@ma%zzin", "bad %-escape"),
    ],
)
def test_a_token_in_the_repository_never_reaches_the_error(url: str, why: str) -> None:
    with pytest.raises(URLFormatError, match=why) as exc:
        parse_url(url)
    assert "S3CRET" not in str(exc.value)


def test_a_token_in_the_repository_is_not_in_a_failed_opens_message(tmp_path: Path) -> None:
    # (port 9, discard: refused at once) the repository URL carries its token %40-escaped
    xfs = XetFileSystem(cache_dir=str(tmp_path / "cache"), skip_instance_cache=True)
    try:
        with pytest.raises(OSError) as exc:
            xfs.cat_file("xet://http://user:S3CRET%40127.0.0.1:9/d.git@main/x")
        assert "127.0.0.1:9/d.git" in str(exc.value) and "S3CRET" not in str(exc.value)
    finally:
        xfs.close()


_text = st.text(st.characters(blacklist_characters="\0", blacklist_categories=("Cs",)), min_size=1)


@given(
    repo=_text.map(lambda t: "/" + t),
    rev=_text,
    parts=st.lists(_text.filter(lambda t: "/" not in t and t not in (".", "..")), max_size=4),
)
def test_format_then_parse_round_trips(repo: str, rev: str, parts: list[str]) -> None:
    path = "/".join(parts)
    u = parse_url(format_url(repo, rev, path))
    assert (u.repo, u.rev, u.path) == (repo, rev, path)


def test_canonical_and_parent() -> None:
    assert canonical("xet:///r%40x@main//a/./b/") == "/r%40x@main/a/b"
    assert canonical("xet:///r@main/") == "/r@main"
    assert canonical("/no/at/") == "/no/at"  # not a URL: only stripped, never an error
    assert XetFileSystem._parent("xet:///r@main/a/b") == "/r@main/a"
    assert XetFileSystem._parent("/r@main/a") == "/r@main"
    assert XetFileSystem._parent("/r@main") == "/r@main"


# ---- read-ahead ------------------------------------------------------------------------------


class Recorder:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.calls: list[tuple[int, int]] = []

    def __call__(self, start: int, end: int) -> bytes:
        self.calls.append((start, end))
        return self.data[start:end]


def test_sequential_reads_open_the_window_and_random_reads_close_it() -> None:
    data = random.Random(1).randbytes(40 << 20)
    rec = Recorder(data)
    cache = AdaptiveReadahead(8 << 20, rec, len(data))
    pos, step = 0, 10_000
    while pos < len(data):
        assert cache._fetch(pos, pos + step) == data[pos : pos + step]
        pos += step
    sizes = [e - s for s, e in rec.calls]
    assert sizes[0] == step  # the first read: exactly what was asked
    assert sizes[1] == step + MIN_WINDOW
    assert max(sizes) <= step + (8 << 20)  # never more than the block size ahead
    assert len(rec.calls) < 15 and sum(sizes) == len(data)  # nothing read twice
    rec.calls.clear()
    for off in (5 << 20, 1 << 20, 30 << 20, 7):
        assert cache._fetch(off, off + 4096) == data[off : off + 4096]
    assert [e - s for s, e in rec.calls] == [4096] * 4


def test_partial_hits_reuse_the_buffer_and_clamp_to_the_end() -> None:
    data = bytes(range(256)) * 1000
    rec = Recorder(data)
    cache = AdaptiveReadahead(1 << 20, rec, len(data))
    assert cache._fetch(0, 100) == data[:100]
    assert cache._fetch(100, 200) == data[100:200]  # sequential: reads ahead
    assert rec.calls[-1] == (100, 200 + MIN_WINDOW)
    assert cache._fetch(150, 250) == data[150:250]  # inside the window: no call
    assert len(rec.calls) == 2
    end = 200 + MIN_WINDOW
    assert cache._fetch(end - 10, end + 10) == data[end - 10 : end + 10]  # head reused
    assert rec.calls[-1][0] == end
    assert cache._fetch(len(data) - 5, len(data) + 100) == data[-5:]
    assert cache._fetch(len(data), len(data) + 1) == b""
    assert cache._fetch(None, None) == data


def test_block_sized_reads_pass_through_unbuffered() -> None:
    data = random.Random(2).randbytes(5 << 20)
    rec = Recorder(data)
    cache = AdaptiveReadahead(1 << 20, rec, len(data))
    pos = 0
    while pos < len(data):
        assert cache._fetch(pos, pos + (1 << 20)) == data[pos : pos + (1 << 20)]
        pos += 1 << 20
    # each read fetched exactly itself: no read-ahead copied into a buffer
    assert rec.calls == [(k << 20, (k + 1) << 20) for k in range(5)]
    assert cache.cache == b""
    assert cache._fetch(100, 200) == data[100:200]  # small reads buffer again
