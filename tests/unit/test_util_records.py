"""gitxet.util.records.RecordDir: one strict JSON record per key, written atomically."""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path

import pytest

from gitxet.errors import FormatError
from gitxet.formats.record import parse_record
from gitxet.util.records import RecordDir, record_name


@dataclass(frozen=True)
class Rec:
    path: str
    n: int


def load(data: bytes, what: str) -> Rec:
    return Rec(**parse_record(data, what, version=1, types={"path": str, "n": int}))


def dump(rec: Rec) -> bytes:
    return json.dumps({"version": 1, "path": rec.path, "n": rec.n}).encode()


def store(tmp_path: Path, **kw: object) -> RecordDir[Rec]:
    return RecordDir(tmp_path / "recs", key=lambda r: r.path, load=load, dump=dump, **kw)  # type: ignore[arg-type]


def test_put_get_list_remove(tmp_path: Path) -> None:
    recs = store(tmp_path)
    assert recs.list() == [] and recs.get("/a") is None and recs.remove("/a") is False
    for rec in (Rec("/b", 2), Rec("/a", 1), Rec("/a/b", 3), Rec("/a_b", 4)):
        recs.put(rec)
    recs.put(Rec("/a", 10))  # replaces
    assert recs.get("/a") == Rec("/a", 10)
    assert [r.path for r in recs.list()] == ["/a", "/a/b", "/a_b", "/b"]  # sorted by key
    assert recs.remove("/a") is True and recs.get("/a") is None
    d = tmp_path / "recs"
    assert stat.S_IMODE(d.stat().st_mode) == 0o700
    names = sorted(os.listdir(d))
    assert names == sorted(record_name(k) + ".json" for k in ("/a/b", "/a_b", "/b"))
    assert all(stat.S_IMODE((d / n).stat().st_mode) == 0o600 for n in names)


def test_keys_need_not_be_file_names(tmp_path: Path) -> None:
    recs = store(tmp_path)
    odd = "/x/../y\n\udcff" + "z" * 5000  # slashes, newline, undecodable byte, too long
    recs.put(Rec(odd, 1))
    assert recs.get(odd) == Rec(odd, 1) and len(record_name(odd)) == 32


def test_reads_are_strict(tmp_path: Path) -> None:
    recs = store(tmp_path, max_bytes=200)
    recs.put(Rec("/a", 1))
    path = Path(recs.path("/a"))
    path.write_bytes(dump(Rec("/elsewhere", 1)))  # a record copied under another key
    with pytest.raises(FormatError, match="another key"):
        recs.get("/a")
    path.write_bytes(b" " * 201)
    with pytest.raises(FormatError, match="larger than 200"):
        recs.list()
    path.write_bytes(json.dumps({"version": 1, "path": "/a"}).encode())
    with pytest.raises(FormatError, match="missing field 'n'"):
        recs.get("/a")
