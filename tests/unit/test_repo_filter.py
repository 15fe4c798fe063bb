"""gitxet.repo.filter: the clean/smudge handler called directly (no git filter process, no
CLI) on a real git repository and its local store."""

from __future__ import annotations

import io
import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from gitxet.dataset import Remotes
from gitxet.errors import ConfigError, DataUnavailableError
from gitxet.formats.pointer import Pointer
from gitxet.git.filter_protocol import SmudgeMeta
from gitxet.repo.content import Content
from gitxet.repo.filter import DEFAULT_THRESHOLD, FilterHandler
from gitxet.repo.materialize import MaterializedRecords
from gitxet.store.cas import LocalCAS

Git = Callable[..., str]
DATA = os.urandom(150_000)


def handler(repo: Path, **kw: object) -> FilterHandler:
    cas = LocalCAS(str(repo / ".git" / "xet"))
    content = Content(cas, Remotes(str(repo)))
    return FilterHandler(str(repo), repo, content, MaterializedRecords(cas), **kw)  # type: ignore[arg-type]


def clean(h: FilterHandler, data: bytes, path: str = "f.bin") -> bytes:
    out = io.BytesIO()
    h.clean(path, io.BytesIO(data), out)
    return out.getvalue()


def smudge(h: FilterHandler, blob: bytes, path: str = "f.bin") -> bytes:
    out = io.BytesIO()
    h.smudge(path, io.BytesIO(blob), out, SmudgeMeta(ref=None, treeish=None, blob=None))
    return out.getvalue()


def test_threshold_from_the_repository_and_its_errors(git_repo: Path, run_git_cmd: Git) -> None:
    assert handler(git_repo).threshold == DEFAULT_THRESHOLD
    (git_repo / ".xetconfig").write_text("[xet]\n\tthreshold = 1k\n")
    h = handler(git_repo)
    assert h.threshold == 1024
    assert h.threshold_setting() is not None
    (git_repo / ".xetconfig").write_text("[xet]\n\tthreshold = lots\n")
    with pytest.raises(ConfigError, match=r"xet\.threshold in \.xetconfig"):
        _ = handler(git_repo).threshold
    h.threshold = 5  # set by a caller: the configuration is not read again
    assert h.threshold == 5


def test_clean_then_smudge_round_trip(git_repo: Path) -> None:
    h = handler(git_repo)
    h.threshold = 1000
    assert clean(h, b"small\n") == b"small\n"  # under the threshold: stored as it is
    blob = clean(h, DATA)
    ptr = Pointer.decode(blob)
    assert ptr.size == len(DATA)
    assert clean(h, blob) == blob  # a pointer stays a pointer
    assert smudge(h, blob) == DATA
    assert smudge(h, b"not ours\n" * 1000) == b"not ours\n" * 1000
    assert clean(h, DATA, ".gitattributes") == DATA  # git reads it itself: never a pointer
    lazy = handler(git_repo, lazy=True)
    assert smudge(lazy, blob) == blob


def test_an_empty_file_stays_empty_even_when_always_a_pointer(
    git_repo: Path, run_git_cmd: Git
) -> None:
    # git diff never filters an empty work-tree file: a pointer for one would show as
    # "4 deletions" in `git diff` after every add (git-lfs keeps empty files empty too)
    (git_repo / ".gitattributes").write_text(
        "*.bin filter=xet diff=xet merge=xet -text xet=always\n"
    )
    h = handler(git_repo)
    h.threshold = 0
    assert clean(h, b"", "e.bin") == b""
    assert smudge(h, b"", "e.bin") == b""
    assert Pointer.decode(clean(h, b"x", "e.bin")).size == 1  # one byte is data again


def test_smudge_of_data_nobody_has_names_the_file(git_repo: Path) -> None:
    h = handler(git_repo)
    gone = Pointer(sha256="ab" * 32, size=10, xet_hash="cd" * 32)
    with pytest.raises(DataUnavailableError, match=r"lost\.bin"):
        smudge(h, gone.encode(), "lost.bin")


def test_staging_batches_cleans_and_stats_are_recorded(git_repo: Path, tmp_path: Path) -> None:
    stats = tmp_path / "stats.jsonl"
    h = handler(git_repo, stats_path=str(stats))
    h.threshold = 1000
    # The shared prefix is longer than the largest chunk (128 KiB), so a chunk boundary falls
    # inside it whatever the random data: the files share at least their first chunk.
    with h.staging():
        blobs = [clean(h, DATA + bytes([i]) * 2000, f"f{i}") for i in range(3)]
    for i, blob in enumerate(blobs):
        assert smudge(handler(git_repo), blob) == DATA + bytes([i]) * 2000
    lines = [json.loads(line) for line in stats.read_text().splitlines()]
    assert [line["path"] for line in lines] == ["f0", "f1", "f2"]
    assert lines[1]["reused"] > 0  # the second file shares the first one's chunks


def test_materialized_file_is_not_rechunked(git_repo: Path, run_git_cmd: Git) -> None:
    h = handler(git_repo)
    h.threshold = 1000
    blob = clean(h, DATA)
    (git_repo / "m.bin").write_bytes(DATA)
    st = (git_repo / "m.bin").stat()
    h.records.remember({"m.bin": [st.st_size, st.st_mtime_ns, st.st_ino, blob.decode()]})
    # the recorded pointer comes back without the content being read into the store
    assert clean(h, b"x" * len(DATA), "m.bin") == blob


def test_can_delay_only_with_a_server_remote(git_repo: Path, run_git_cmd: Git) -> None:
    run_git_cmd(git_repo, "remote", "add", "local", str(git_repo))
    assert handler(git_repo).can_delay("f.bin") is False
    run_git_cmd(git_repo, "remote", "add", "web", "https://example.invalid/r.git")
    assert handler(git_repo).can_delay("f.bin") is True
