"""gitxet.repo.content: fetching, reconstructing and uploading the data behind pointers,
between real git repositories and their local stores (path remotes, no CLI)."""

from __future__ import annotations

import io
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from gitxet.data.clean import Ingestor
from gitxet.dataset import Remotes
from gitxet.errors import DataUnavailableError, IntegrityError, NotFoundError
from gitxet.formats.pointer import Pointer
from gitxet.hashing import from_hex, to_hex
from gitxet.repo.content import Content
from gitxet.store.cas import LocalCAS

Git = Callable[..., str]
DATA = os.urandom(300_000)


def new_repo(path: Path, git: Git) -> Path:
    path.mkdir()
    git(path, "init", "-q")
    return path


def store(repo: Path) -> LocalCAS:
    return LocalCAS(str(repo / ".git" / "xet"))


def ingest(cas: LocalCAS, data: bytes) -> Pointer:
    with Ingestor(cas) as ing:
        result = ing.add_bytes(data)
        ing.flush()
    return Pointer(sha256=result.sha256, size=result.size, xet_hash=to_hex(result.file_hash))


@pytest.fixture
def pair(tmp_path: Path, run_git_cmd: Git) -> tuple[Content, Pointer, Path]:
    """A repository whose remote ``origin`` (a path) has DATA in its store."""
    origin = new_repo(tmp_path / "origin", run_git_cmd)
    ptr = ingest(store(origin), DATA)
    here = new_repo(tmp_path / "here", run_git_cmd)
    run_git_cmd(here, "remote", "add", "origin", str(origin))
    return Content(store(here), Remotes(str(here))), ptr, here


def test_write_fetches_from_the_remote_that_has_it(pair: tuple[Content, Pointer, Path]) -> None:
    content, ptr, _ = pair
    assert content.cas.file_info(from_hex(ptr.xet_hash)) is None
    out = io.BytesIO()
    content.write(ptr, out)
    assert out.getvalue() == DATA
    empty = Pointer(
        sha256="e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
        size=0,
        xet_hash="0" * 64,
    )
    out = io.BytesIO()
    content.write(empty, out)  # nothing to fetch for an empty file
    assert out.getvalue() == b""


def test_ensure_local_copies_into_the_store(pair: tuple[Content, Pointer, Path]) -> None:
    content, ptr, _ = pair
    summary = content.ensure_local([ptr])
    assert summary is not None
    assert content.cas.file_info(from_hex(ptr.xet_hash)) is not None
    assert content.ensure_local([ptr]) is None  # nothing missing any more
    out = io.BytesIO()
    content.write(ptr, out, remote=None)
    assert out.getvalue() == DATA


def test_missing_data_is_named_by_path(pair: tuple[Content, Pointer, Path]) -> None:
    content, ptr, _ = pair
    gone = Pointer(sha256=ptr.sha256, size=ptr.size, xet_hash="ab" * 32)
    content.names[gone.xet_hash] = "models/lost.bin"
    with pytest.raises(DataUnavailableError) as info:
        content.write(gone, io.BytesIO())
    assert "models/lost.bin" in str(info.value)
    assert "origin" in str(info.value)  # the remotes asked are named


def test_a_pointer_with_the_wrong_size_is_refused(pair: tuple[Content, Pointer, Path]) -> None:
    content, ptr, _ = pair
    liar = Pointer(sha256=ptr.sha256, size=ptr.size + 1, xet_hash=ptr.xet_hash)
    out = io.BytesIO()
    with pytest.raises(IntegrityError):
        content.write(liar, out)
    assert out.getvalue() == b""


def test_push_uploads_copies_from_other_remotes_and_names_what_is_nowhere(
    pair: tuple[Content, Pointer, Path], tmp_path: Path, run_git_cmd: Git
) -> None:
    content, ptr, here = pair
    backup = new_repo(tmp_path / "backup", run_git_cmd)
    run_git_cmd(here, "remote", "add", "backup", str(backup))
    local = ingest(content.cas, b"local data " * 5000)
    summary = content.push("backup", [local])
    assert summary.files == 1 and summary.xorbs_sent >= 1
    out = io.BytesIO()
    Content(store(backup), Remotes(str(backup))).write(local, out)
    assert out.getvalue() == b"local data " * 5000
    # only on origin: copied here, then pushed (the backup gets data, not a dangling pointer)
    assert content.push("backup", [ptr]).files == 1
    out = io.BytesIO()
    Content(store(backup), Remotes(str(backup))).write(ptr, out)
    assert out.getvalue() == DATA
    gone = Pointer(sha256=ptr.sha256, size=ptr.size, xet_hash="cd" * 32)  # on no remote
    content.names[gone.xet_hash] = "data/nowhere.bin"
    with pytest.raises(NotFoundError, match=r"data/nowhere\.bin"):
        content.push("backup", [gone])
    # a remote that could not be asked may have it: the error names it and why
    run_git_cmd(here, "remote", "add", "down", "http://127.0.0.1:9/x.git")
    content = Content(store(here), Remotes(str(here)))
    content.names[gone.xet_hash] = "data/nowhere.bin"
    with pytest.raises(DataUnavailableError, match=r"data/nowhere\.bin.*down http://127"):
        content.push("backup", [gone])


def test_a_pointer_whose_sha256_disagrees_is_refused(pair: tuple[Content, Pointer, Path]) -> None:
    """The ``oid`` is normative (docs/internals/pointer.md rule 5): a pointer naming real data
    by its xet-hash but another SHA-256 is refused once the bytes are hashed."""
    content, ptr, _ = pair
    liar = Pointer(sha256="ab" * 32, size=ptr.size, xet_hash=ptr.xet_hash)
    with pytest.raises(IntegrityError, match=r"sha256"):
        content.write(liar, io.BytesIO())
    content.ensure_local([ptr])  # and from the local store (the other copy path)
    with pytest.raises(IntegrityError, match=r"sha256"):
        content.write(liar, io.BytesIO())
    out = io.BytesIO()
    content.write(ptr, out)
    assert out.getvalue() == DATA
    empty_liar = Pointer(sha256="ab" * 32, size=0, xet_hash="0" * 64)
    with pytest.raises(IntegrityError, match=r"sha256"):
        content.write(empty_liar, io.BytesIO())
