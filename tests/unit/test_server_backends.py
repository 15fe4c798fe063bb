"""The local-directory backend contract and ``--storage`` URL parsing (S3: system tests)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from gitxet.errors import BackendError, ConfigError
from gitxet.server.backends import LocalBackend, ObjectMissingError, S3Backend, open_backend


def test_local_backend_contract(tmp_path: Path) -> None:
    b = LocalBackend(str(tmp_path / "s"), durable=False)
    assert b.put("xorbs/default/aa", b"0123456789") is True
    assert b.get("xorbs/default/aa") == b"0123456789"
    assert b.get_range("xorbs/default/aa", 2, 3) == b"234"
    assert b.get_range("xorbs/default/aa", 8, 10) == b"89"
    assert b.get_tail("xorbs/default/aa", 4) == (b"6789", 10)
    assert b.get_tail("xorbs/default/aa", 100) == (b"0123456789", 10)
    assert b.exists("xorbs/default/aa") and not b.exists("xorbs/default/bb")
    b.put("shards/x.shard", b"s")
    assert list(b.list("xorbs/")) == ["xorbs/default/aa"]
    assert list(b.list("shards/")) == ["shards/x.shard"]
    assert list(b.list("nothing/")) == []
    for op in (
        lambda: b.get("missing"),
        lambda: b.get_range("missing", 0, 1),
        lambda: b.get_tail("m", 1),
    ):
        with pytest.raises(ObjectMissingError):
            op()
    b.delete("shards/x.shard")
    b.delete("shards/x.shard")
    assert not b.exists("shards/x.shard")
    # No temp files are left behind.
    assert sorted(p.name for p in (tmp_path / "s" / "xorbs" / "default").iterdir()) == ["aa"]


def test_put_if_absent_has_one_winner(tmp_path: Path) -> None:
    b = LocalBackend(str(tmp_path), durable=False)
    results: list[bool] = []

    def put(i: int) -> None:
        results.append(b.put("meta/key", bytes([i]) * 32, if_absent=True))

    threads = [threading.Thread(target=put, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results.count(True) == 1
    assert b.get("meta/key") in {bytes([i]) * 32 for i in range(8)}


@pytest.mark.parametrize("key", ["../x", "/abs", "a/../b", "a//b", ".hidden", "a/.b", "", "a\\b"])
def test_keys_cannot_escape(tmp_path: Path, key: str) -> None:
    b = LocalBackend(str(tmp_path))
    with pytest.raises(BackendError, match="invalid object key"):
        b.put(key, b"x")


def test_open_backend(tmp_path: Path) -> None:
    b = open_backend(None, str(tmp_path))
    assert isinstance(b, LocalBackend) and b.root == str(tmp_path / "cas")
    assert isinstance(open_backend(f"file://{tmp_path}/d", "/r"), LocalBackend)
    assert isinstance(open_backend(str(tmp_path / "e"), "/r"), LocalBackend)
    s = open_backend("s3://bkt/some/prefix?endpoint_url=http://127.0.0.1:9&region=eu-west-1", "/r")
    assert isinstance(s, S3Backend) and s.bucket == "bkt" and s.prefix == "some/prefix/"
    assert "secret" not in s.description.lower()
    s.close()
    with pytest.raises(ConfigError, match="scheme"):
        open_backend("gs://x", "/r")
    with pytest.raises(ConfigError, match="bucket"):
        open_backend("s3:///x", "/r")
    with pytest.raises(ConfigError, match="unknown"):
        open_backend("s3://b?secret=1", "/r")


def test_temp_files_go_to_one_directory_and_stale_ones_are_swept(tmp_path: Path) -> None:
    import os

    root = tmp_path / "s"
    b = LocalBackend(str(root), durable=False)
    b.put("xorbs/default/aa", b"1")
    b.put("shards/x.shard", b"2", if_absent=True)
    leftovers = [
        root / ".tmp" / ".tmp-killed.incomplete",  # what a killed writer leaves now
        root / "xorbs" / "default" / ".tmp-old.incomplete",  # ... and left before
        root / "shards" / ".tmp-older",
    ]
    for p in leftovers:
        p.write_bytes(b"half")
        os.utime(p, (1, 1))
    live = root / ".tmp" / ".tmp-live.incomplete"
    live.write_bytes(b"being written")
    assert b.remove_stale_temps() == 3
    assert not any(p.exists() for p in leftovers) and live.exists()
    assert list(b.list("xorbs/")) == ["xorbs/default/aa"] and b.get("shards/x.shard") == b"2"
    (root / "xorbs" / "default" / ".tmp-again").write_bytes(b"")
    os.utime(root / "xorbs" / "default" / ".tmp-again", (1, 1))
    assert b.remove_stale_temps() == 0  # the sweep beside objects runs once per root


def test_version_changes_when_a_key_is_added(tmp_path: Path) -> None:
    b = LocalBackend(str(tmp_path / "s"), durable=False)
    v0 = b.version("shard-log/")
    assert v0 is not None and v0[1] == "missing"
    b.put("shard-log/0001-a", b"")
    v1 = b.version("shard-log/")
    b.put("shard-log/0002-b", b"")
    v2 = b.version("shard-log/")
    assert v1 is not None and v2 is not None and len({v0[1], v1[1], v2[1]}) == 3
