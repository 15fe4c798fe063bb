"""gitxet.repo.materialize: writing pointer files' content into a real git work tree and
back, the index restat, the materialized records, store order (no CLI, no filter: pointer
text is committed as it is, so git itself would see content as a change if the restat
did not tell it otherwise)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

import pytest

from gitxet.data.clean import Ingestor
from gitxet.dataset import Remotes
from gitxet.errors import MaterializeError
from gitxet.formats.pointer import Pointer
from gitxet.git import process
from gitxet.hashing import to_hex
from gitxet.repo.content import Content
from gitxet.repo.materialize import MaterializedRecords, Materializer, ReadAhead, store_order
from gitxet.repo.pointers import PointerFile, pointer_files
from gitxet.store.cas import LocalCAS

Git = Callable[..., str]
BIG = os.urandom(200_000)
SMALL = os.urandom(70_000)


def ingest(cas: LocalCAS, *datas: bytes) -> list[Pointer]:
    out: list[Pointer] = []
    with Ingestor(cas) as ing:  # one session: the files share a xorb
        for data in datas:
            r = ing.add_bytes(data)
            out.append(Pointer(sha256=r.sha256, size=r.size, xet_hash=to_hex(r.file_hash)))
        ing.flush()
    return out


@pytest.fixture
def setup(git_repo: Path, run_git_cmd: Git) -> tuple[Materializer, Path, list[Pointer]]:
    cas = LocalCAS(str(git_repo / ".git" / "xet"))
    big, small = ingest(cas, BIG, SMALL)
    (git_repo / "d").mkdir()
    (git_repo / "d" / "big.bin").write_bytes(big.encode())
    (git_repo / "small.bin").write_bytes(small.encode())
    (git_repo / "small.bin").chmod(0o755)
    run_git_cmd(git_repo, "add", "-A")
    run_git_cmd(git_repo, "commit", "-qm", "pointers")
    git_dir = process.git_dir(git_repo).resolve()
    content = Content(cas, Remotes(str(git_repo)))
    m = Materializer(git_dir, git_repo.resolve(), str(git_repo), content, MaterializedRecords(cas))
    return m, git_repo, [big, small]


def not_racy(repo: Path) -> None:
    """Date the index after the files, so that git trusts the stat data it holds instead
    of comparing content (without a filter installed the content is not the blob)."""
    index = repo / ".git" / "index"
    later = index.stat().st_mtime_ns + 3 * 10**9
    os.utime(index, ns=(later, later))


def files(repo: Path) -> list[PointerFile]:
    return pointer_files(str(repo), repo.resolve())


def test_materialize_writes_content_and_restats_the_index(
    setup: tuple[Materializer, Path, list[Pointer]],
) -> None:
    m, repo, (big, small) = setup
    seen: list[int] = []
    assert m.materialize(files(repo), progress=seen.append) == 2
    assert (repo / "d" / "big.bin").read_bytes() == BIG
    assert (repo / "small.bin").read_bytes() == SMALL
    assert (repo / "small.bin").stat().st_mode & 0o777 == 0o755  # git's mode kept
    assert sum(seen) == len(BIG) + len(SMALL)
    # the index has the new stat (the pointer's size would differ): git sees no change,
    # right away (no content comparison of "racily clean" entries: the files are dated
    # before the index's second; without a filter the content would differ from the blob)
    index_second = (repo / ".git" / "index").stat().st_mtime_ns // 10**9
    for name in ("d/big.bin", "small.bin"):
        assert (repo / name).stat().st_mtime_ns // 10**9 < index_second
    assert process.stat_changed(repo) == set()
    assert {f.materialized for f in files(repo)} == {True}
    assert m.materialize(files(repo)) == 0  # nothing left to write
    # the records know each file's pointer while it is untouched
    assert m.records.pointer_for(repo, "d/big.bin") == big.encode()
    assert MaterializedRecords(m.content.cas).pointer_for(repo, "small.bin") == small.encode()
    with open(repo / "small.bin", "ab") as f:
        f.write(b"!")
    assert m.records.pointer_for(repo, "small.bin") is None
    assert m.records.pointer_for(None, "d/big.bin") is None


def test_dematerialize_puts_pointer_text_back(
    setup: tuple[Materializer, Path, list[Pointer]],
) -> None:
    m, repo, (big, _) = setup
    m.materialize(files(repo))
    (repo / "d" / "big.bin").chmod(0o600)
    assert m.dematerialize(files(repo)) == 2
    assert (repo / "d" / "big.bin").read_bytes() == big.encode()
    assert (repo / "d" / "big.bin").stat().st_mode & 0o777 == 0o600  # the file's mode kept
    not_racy(repo)
    assert process.stat_changed(repo) == set()
    assert {f.materialized for f in files(repo)} == {False}


def test_files_the_index_does_not_name_are_refused_by_name(
    setup: tuple[Materializer, Path, list[Pointer]], run_git_cmd: Git
) -> None:
    m, repo, (big, _) = setup
    forged = PointerFile("elsewhere.bin", big, False)  # not in the index
    run_git_cmd(repo, "rm", "-q", "--cached", "small.bin")
    with pytest.raises(MaterializeError) as info:
        m.materialize([*files(repo), forged, PointerFile("../out.bin", big, False)])
    refused = sorted(path for path, _ in info.value.failures)
    assert refused == ["../out.bin", "elsewhere.bin", "small.bin"]
    assert (repo / "d" / "big.bin").read_bytes() == BIG  # the others are written
    assert not (repo / "elsewhere.bin").exists()
    assert not (repo.parent / "out.bin").exists()


def test_store_order_and_read_ahead(setup: tuple[Materializer, Path, list[Pointer]]) -> None:
    m, repo, (big, small) = setup
    listed = sorted(files(repo), key=lambda f: f.path, reverse=True)  # small first
    ordered, ahead = store_order(m.content.cas, listed)
    assert [f.pointer for f in ordered] == [big, small]  # ingest order within the xorb
    asked: list[tuple[bytes, int, int]] = []

    class Recorder:
        def readahead(self, xorb: bytes, lo: int, hi: int) -> None:
            asked.append((xorb, lo, hi))

    xorbs = [b"x1", b"x1", b"x2", b"x3", b""]
    spans = {b"x1": [0, 5], b"x2": [0, 2], b"x3": [1, 4]}
    pacer = ReadAhead(Recorder(), xorbs, spans)  # type: ignore[arg-type]
    got = list(pacer.pace(ordered + ordered + ordered[:1]))
    assert len(got) == 5
    # the first file asks for its xorb and the next; each xorb once
    assert asked == [(b"x1", 0, 5), (b"x2", 0, 2), (b"x3", 1, 4)]
    assert ahead is not None


def ctrl_c_while_writing(real_write: Callable[..., None], victim: Pointer) -> Callable[..., None]:
    """``Content.write`` that writes ``victim``'s first bytes, sends the process SIGINT (as
    Ctrl-C: to its main thread) and would go on for a minute; other files as usual."""

    def write(ptr: Pointer, out: BinaryIO, *args: object, **kw: object) -> None:
        if ptr != victim:
            real_write(ptr, out, *args, **kw)
            return
        out.write(b"the first bytes")
        os.kill(os.getpid(), signal.SIGINT)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            out.write(b"more")
            time.sleep(0.001)

    return write


def test_an_interrupted_materialize_keeps_what_it_wrote_and_stops_the_rest(
    setup: tuple[Materializer, Path, list[Pointer]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C while small.bin is being written (big.bin is done): the interrupt reaches the
    main thread, the writer stops at its next write, its temp file goes, and big.bin's index
    entry is restated, so git sees big.bin unchanged and small.bin still a pointer."""
    m, repo, (big, small) = setup
    real_write = m.content.write
    monkeypatch.setattr(m.content, "write", ctrl_c_while_writing(real_write, small))
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    started = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            m.materialize(files(repo), workers=1)  # one writer: big.bin first (store order)
    finally:
        signal.signal(signal.SIGINT, before)
    assert time.monotonic() - started < 30
    assert (repo / "d" / "big.bin").read_bytes() == BIG
    assert (repo / "small.bin").read_bytes() == small.encode()  # still the pointer
    assert os.listdir(repo / ".git" / "xet" / "tmp") == []  # the writer's temp file went
    not_racy(repo)
    assert process.stat_changed(repo) == set()  # big.bin restated, small.bin untouched
    assert m.records.pointer_for(repo, "d/big.bin") == big.encode()
    assert {f.path: f.materialized for f in files(repo)} == {"d/big.bin": True, "small.bin": False}


def test_ctrl_c_while_a_finished_file_is_collected_still_restats_it(
    setup: tuple[Materializer, Path, list[Pointer]],
) -> None:
    """Ctrl-C can land anywhere in the main thread, also between taking a finished writer's
    result and recording the file for the restat: that file is in place all the same, so it
    must be restated (else git shows it modified). A trace function raises the interrupt
    on the line right after the first finished future is taken off the list."""
    import linecache
    import sys
    import types

    m, repo, _ = setup
    state = {"popped": False, "fired": False}

    def trace(frame: types.FrameType, event: str, arg: object) -> object:
        if frame.f_code.co_name != "collect":
            return trace
        if event == "line" and not state["fired"]:
            line = linecache.getline(frame.f_code.co_filename, frame.f_lineno)
            if state["popped"]:
                state["fired"] = True
                raise KeyboardInterrupt  # as Ctrl-C arriving right here
            state["popped"] = "futures.pop(fut)" in line and "failed" not in line
        return trace

    sys.settrace(trace)
    try:
        with pytest.raises(KeyboardInterrupt):
            m.materialize(files(repo), workers=1)
    finally:
        sys.settrace(None)
    assert state["fired"]
    not_racy(repo)
    assert process.stat_changed(repo) == set()  # what was put in place is restated
    for f in files(repo):
        path = repo / f.path
        assert f.materialized or path.read_bytes() == f.pointer.encode(), f.path


def test_a_clone_creates_absent_files_and_an_interrupt_leaves_none_half_written(
    setup: tuple[Materializer, Path, list[Pointer]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``absent``: the work tree holds none of the files (a clone whose checkout left them
    out). Each is created whole in place; Ctrl-C while small.bin is written leaves no
    small.bin at all (never a partial file), and big.bin restated. A file that is there
    after all is checked like any other: the user's own content is kept, by name."""
    m, repo, (_, small) = setup
    listed = files(repo)
    for f in listed:
        (repo / f.path).unlink()
    real_write = m.content.write
    monkeypatch.setattr(m.content, "write", ctrl_c_while_writing(real_write, small))
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            m.materialize(listed, workers=1, absent=True)  # big.bin first (store order)
    finally:
        signal.signal(signal.SIGINT, before)
    assert (repo / "d" / "big.bin").read_bytes() == BIG
    assert not (repo / "small.bin").exists()
    not_racy(repo)
    assert process.stat_changed(repo) == {"small.bin"}  # missing; big.bin restated
    assert {f.path: f.materialized for f in files(repo)} == {"d/big.bin": True, "small.bin": False}
    monkeypatch.setattr(m.content, "write", real_write)
    assert m.materialize(files(repo), absent=True) == 1  # what `git xet checkout` does
    assert (repo / "small.bin").read_bytes() == SMALL
    assert os.stat(repo / "small.bin").st_mode & 0o777 == 0o755  # git's mode for it
    (repo / "small.bin").write_bytes(b"the user's own")
    with pytest.raises(MaterializeError) as err:
        m.materialize([PointerFile("small.bin", small, None)], absent=True)
    assert "small.bin" in str(err.value) and "own" in str(err.value).lower()
    assert (repo / "small.bin").read_bytes() == b"the user's own"
