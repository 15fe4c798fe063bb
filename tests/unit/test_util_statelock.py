"""gitxet.util.statelock: one process per state dir; a socket is cleared only when dead."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from gitxet.errors import ConfigError, StateBusyError
from gitxet.util.statelock import clear_stale_socket, lock_state_dir


def test_the_lock_is_exclusive_and_released_with_its_fd(tmp_path: Path) -> None:
    state = str(tmp_path / "state")
    fd = lock_state_dir(state, lock_name="x.lock", owner="test")
    assert (tmp_path / "state").stat().st_mode & 0o777 == 0o700
    try:
        with pytest.raises(StateBusyError, match="another test process uses this state dir"):
            lock_state_dir(state, lock_name="x.lock", owner="test")
        os.close(lock_state_dir(state, lock_name="other.lock"))  # another name, another lock
    finally:
        os.close(fd)
    os.close(lock_state_dir(state, lock_name="x.lock"))


def test_missing_and_dead_sockets_are_fine(tmp_path: Path) -> None:
    path = str(tmp_path / "s.sock")
    clear_stale_socket(path)  # nothing there
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(path)  # bound, never listening: connect is refused, as after a crash
    dead.close()
    clear_stale_socket(path)
    assert not os.path.exists(path)


def test_a_listening_socket_is_kept(tmp_path: Path) -> None:
    path = str(tmp_path / "s.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as live:
        live.bind(path)
        live.listen(8)
        with pytest.raises(StateBusyError, match="another process is serving"):
            clear_stale_socket(path)
    assert os.path.exists(path)


def test_a_full_backlog_is_not_a_dead_process(tmp_path: Path) -> None:
    path = str(tmp_path / "s.sock")
    waiting: list[socket.socket] = []
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as live:
        live.bind(path)
        live.listen(0)
        try:
            while True:
                c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                c.setblocking(False)
                waiting.append(c)
                try:
                    c.connect(path)
                except BlockingIOError:
                    break
            with pytest.raises(StateBusyError, match="still serves"):
                clear_stale_socket(path, timeout=0.5)
        finally:
            for c in waiting:
                c.close()
    assert os.path.exists(path)


def test_a_file_that_is_not_a_socket_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "s.sock"
    path.write_text("data")
    with pytest.raises(ConfigError, match="not a socket"):
        clear_stale_socket(str(path))
    assert path.read_text() == "data"
