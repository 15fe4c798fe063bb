"""Strict versioned JSON records."""

from __future__ import annotations

import json

import pytest

from gitxet.errors import FormatError
from gitxet.formats.record import parse_record

TYPES = {"name": str, "pid": int, "at": (float, int), "flag": bool}


def rec(**body: object) -> bytes:
    base: dict[str, object] = {"version": 1, "name": "x", "pid": 5, "at": 1.5, "flag": True}
    base.update(body)
    return json.dumps({k: v for k, v in base.items() if v is not ...}).encode()


def test_valid_record() -> None:
    assert parse_record(rec(), "r", version=1, types=TYPES) == {
        "name": "x",
        "pid": 5,
        "at": 1.5,
        "flag": True,
    }
    assert parse_record(rec(at=2), "r", version=1, types=TYPES)["at"] == 2


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (rec(version=2), "unsupported version"),
        (rec(extra=1), "unknown fields"),
        (rec(pid=...), "missing field 'pid'"),
        (rec(pid=True), "field 'pid' has the wrong type"),
        (rec(flag=1), "field 'flag' has the wrong type"),
        (rec(name=3), "field 'name' has the wrong type"),
        (b"[1, 2]", "not a JSON object"),
        (b"{not json", "not JSON"),
        (b"\xff\xfe", "not JSON"),
        (b" " * 70_000, "larger than"),
    ],
)
def test_malformed_records_name_the_defect(data: bytes, reason: str) -> None:
    with pytest.raises(FormatError, match=reason):
        parse_record(data, "r", version=1, types=TYPES)
