"""gitxet.util.atomic: the one atomic writer (replace, keep mode, create-if-absent)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from gitxet.util import atomic
from gitxet.util.atomic import atomic_create, atomic_write, atomic_writer, atomic_writer_at


def debris(directory: Path) -> list[str]:
    return sorted(n for n in os.listdir(directory) if n.startswith(".tmp-"))


@pytest.mark.parametrize("durable", [True, False])
def test_write_replaces_whole_and_sets_mode(tmp_path: Path, durable: bool) -> None:
    path = tmp_path / "sub" / "f"  # the directory is created
    atomic_write(path, b"one", mode=0o600, durable=durable)
    assert path.read_bytes() == b"one" and path.stat().st_mode & 0o777 == 0o600
    atomic_write(str(path), b"two", durable=durable)
    assert path.read_bytes() == b"two" and path.stat().st_mode & 0o777 == 0o644
    assert debris(path.parent) == []


def _no_replace(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    calls: list[object] = []
    real = os.replace

    def spy(*args: object, **kw: object) -> None:
        calls.append(args)
        real(*args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "replace", spy)
    monkeypatch.setattr(atomic, "EXCHANGE_MIN_BYTES", 4)
    return calls


def test_a_big_non_durable_file_takes_the_old_ones_place_by_exchange(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # (a rename over a file makes ext4 write the new data back inside the rename)
    renames = _no_replace(monkeypatch)
    (tmp_path / "t").mkdir()
    (tmp_path / "f").write_bytes(b"pointer")
    fd = os.open(tmp_path, os.O_RDONLY)
    try:
        with atomic_writer_at(fd, "f", durable=False, mode=0o640, tmp_dir=tmp_path / "t") as f:
            f.write(b"the content")
        assert renames == []  # exchanged, not renamed
        assert (tmp_path / "f").read_bytes() == b"the content"
        assert (tmp_path / "f").stat().st_mode & 0o777 == 0o640
        assert os.listdir(tmp_path / "t") == [] and debris(tmp_path) == []
        # a small file, a new name, a durable write: a plain rename
        with atomic_writer_at(fd, "f", durable=False) as f:
            f.write(b"abc")
        with atomic_writer_at(fd, "new", durable=False) as f:
            f.write(b"new content")
        with atomic_writer_at(fd, "f", durable=True) as f:
            f.write(b"durable content")
        assert len(renames) == 3
        assert (tmp_path / "new").read_bytes() == b"new content"
        assert (tmp_path / "f").read_bytes() == b"durable content"
    finally:
        os.close(fd)


def test_an_exchange_never_swaps_in_a_directory_or_follows_a_symlink(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _no_replace(monkeypatch)
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "keep").write_bytes(b"k")
    (tmp_path / "target").write_bytes(b"elsewhere")
    (tmp_path / "link").symlink_to(tmp_path / "target")
    fd = os.open(tmp_path, os.O_RDONLY)
    try:
        with pytest.raises(OSError), atomic_writer_at(fd, "d", durable=False) as f:
            f.write(b"a file over a directory")
        assert (tmp_path / "d" / "keep").read_bytes() == b"k" and debris(tmp_path) == []
        with atomic_writer_at(fd, "link", durable=False) as f:
            f.write(b"replaces the link")
        assert not (tmp_path / "link").is_symlink()
        assert (tmp_path / "link").read_bytes() == b"replaces the link"
        assert (tmp_path / "target").read_bytes() == b"elsewhere" and debris(tmp_path) == []
    finally:
        os.close(fd)


def test_keep_mode_keeps_an_existing_files_bits(tmp_path: Path) -> None:
    path = tmp_path / "hook"
    atomic_write(path, b"new", mode=0o640, keep_mode=True)  # no file yet: mode applies
    assert path.stat().st_mode & 0o777 == 0o640
    path.chmod(0o755)
    atomic_write(path, b"newer", keep_mode=True)
    assert path.read_bytes() == b"newer" and path.stat().st_mode & 0o777 == 0o755


def test_a_failed_write_leaves_the_old_file_and_no_debris(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"old")
    with pytest.raises(RuntimeError), atomic_writer(path) as f:
        f.write(b"half of the new")
        raise RuntimeError("killed midway")
    assert path.read_bytes() == b"old" and debris(tmp_path) == []


def test_tmp_dir_holds_the_temp_file_while_writing(tmp_path: Path) -> None:
    tmp_dir, out = tmp_path / "tmp", tmp_path / "out"
    tmp_dir.mkdir()
    with atomic_writer(out / "f", tmp_dir=tmp_dir) as f:
        f.write(b"x")
        assert len(debris(tmp_dir)) == 1 and not (out / "f").exists()
    assert (out / "f").read_bytes() == b"x" and debris(tmp_dir) == [] and debris(out) == []


def test_create_if_absent_has_exactly_one_winner(tmp_path: Path) -> None:
    path = tmp_path / "obj"
    wins: list[bytes] = []
    start = threading.Barrier(8)

    def writer(i: int) -> None:
        data = bytes([i]) * 4096
        start.wait()
        if atomic_create(path, data):
            wins.append(data)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(wins) == 1 and path.read_bytes() == wins[0]
    assert atomic_create(path, b"late") is False and path.read_bytes() == wins[0]
    assert debris(tmp_path) == []


def test_remove_stale_temps_takes_only_old_temp_files(tmp_path: Path) -> None:
    from gitxet.util.atomic import remove_stale_temps

    names = [".tmp-a.incomplete", ".tmp-b.incomplete", ".tmp-legacy", "data", ".tmp-dir"]
    for n in names[:4]:
        (tmp_path / n).write_bytes(b"x")
    (tmp_path / ".tmp-dir").mkdir()
    old = os.stat(tmp_path / "data").st_mtime - 7200
    for n in (".tmp-a.incomplete", ".tmp-legacy", "data"):
        os.utime(tmp_path / n, (old, old))
    assert remove_stale_temps(tmp_path) == 1  # a: old; b: a live writer's; never others
    assert sorted(os.listdir(tmp_path)) == [".tmp-b.incomplete", ".tmp-dir", ".tmp-legacy", "data"]
    assert remove_stale_temps(tmp_path, any_suffix=True) == 1
    assert remove_stale_temps(tmp_path / "missing") == 0
    assert sorted(os.listdir(tmp_path)) == [".tmp-b.incomplete", ".tmp-dir", "data"]


def test_a_killed_writers_temp_file_is_swept_at_once_a_live_ones_never(tmp_path: Path) -> None:
    """The writer's lock, not the clock, tells a dead writer's temp file (kill -9) from a
    live one's: both are seconds old here."""
    import signal
    import subprocess
    import sys

    from gitxet.util.atomic import remove_stale_temps

    code = (
        "import sys, time\n"
        "from gitxet.util.atomic import atomic_writer\n"
        "with atomic_writer(sys.argv[1]) as f:\n"
        "    f.write(b'half'); f.flush(); print('writing', flush=True); time.sleep(60)\n"
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(tmp_path / f"out{i}")],
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    try:
        for p in procs:
            assert p.stdout is not None and p.stdout.readline() == "writing\n"
        procs[0].send_signal(signal.SIGKILL)
        procs[0].wait(10)
        temps = sorted(tmp_path.glob(".tmp-*.incomplete"))
        assert len(temps) == 2
        later = max(os.stat(t).st_mtime for t in temps) + 10  # past the grace period
        assert remove_stale_temps(tmp_path, now=later) == 1
        assert len(list(tmp_path.glob(".tmp-*.incomplete"))) == 1  # the live writer's
    finally:
        for p in procs:
            p.kill()
            p.wait(10)
            if p.stdout:
                p.stdout.close()


@pytest.mark.parametrize("unnamed", [True, False])
def test_a_created_file_appears_whole_or_not_at_all_and_replaces_nothing(
    tmp_path: Path, unnamed: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``atomic_creator_at``: no name holds the file while it is written (an unnamed
    ``O_TMPFILE`` file, or the fallback's named temp file), a failed write leaves nothing,
    and an existing name is never replaced (``FileExistsError``)."""
    if not unnamed:
        monkeypatch.setattr(atomic, "_open_unnamed", lambda dir_fd, mode: None)
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with atomic.atomic_creator_at(fd, "f", mode=0o755) as (f, out):
            f.write(b"data")
            assert not (tmp_path / "f").exists()
            assert len(os.listdir(tmp_path)) == (0 if unnamed else 1)
        assert (tmp_path / "f").read_bytes() == b"data" and os.listdir(tmp_path) == ["f"]
        assert out[0].st_ino == (tmp_path / "f").stat().st_ino and out[0].st_size == 4
        assert (tmp_path / "f").stat().st_mode & 0o777 == 0o755
        with pytest.raises(RuntimeError), atomic.atomic_creator_at(fd, "g") as (f, _):
            f.write(b"half")
            raise RuntimeError("killed midway")
        assert os.listdir(tmp_path) == ["f"]
        (tmp_path / "link").symlink_to(tmp_path / "elsewhere")
        for name in ("f", "link"):
            with pytest.raises(FileExistsError), atomic.atomic_creator_at(fd, name) as (f, _):
                f.write(b"new")
        assert (tmp_path / "f").read_bytes() == b"data" and not (tmp_path / "elsewhere").exists()
        assert sorted(os.listdir(tmp_path)) == ["f", "link"]
    finally:
        os.close(fd)


def test_claim_temp_takes_a_dead_writers_file_and_never_a_live_ones(tmp_path: Path) -> None:
    """The node cache's range temp files: a second writer of the same name gets None while
    the first lives, and a file a dead writer left is taken over in place, emptied."""
    from gitxet.util.atomic import claim_temp, temp_writer_alive

    name = str(tmp_path / "range.tmp")
    first = claim_temp(name)
    assert first is not None and temp_writer_alive(name)
    os.write(first, b"half a range")
    assert claim_temp(name) is None  # the first writer lives
    os.close(first)  # it dies: the kernel drops its lock, its file stays
    assert not temp_writer_alive(name)
    second = claim_temp(name)
    assert second is not None and os.fstat(second).st_size == 0
    assert os.fstat(second).st_ino == os.stat(name).st_ino
    os.close(second)
