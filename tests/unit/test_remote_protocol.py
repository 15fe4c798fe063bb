"""The shared CAS protocol models: JSON round trips, strict parsing, ranges, CRC-64/NVME."""

from __future__ import annotations

import itertools
import random

import pytest

from gitxet.errors import RemoteError
from gitxet.remote import protocol as p

X1 = "11" * 32
X2 = "22" * 32


def _recon() -> p.Reconstruction:
    return p.Reconstruction(
        terms=[p.Term(X1, 0, 3, 300), p.Term(X2, 1, 2, 50), p.Term(X1, 3, 4, 90)],
        fetch={
            X1: [p.FetchInfo(0, 4, "http://h/d/x1?s=1", 0, 399)],
            X2: [p.FetchInfo(1, 2, "http://h/d/x2?s=2", 100, 149)],
        },
        offset_into_first_range=17,
    )


@pytest.mark.parametrize("version", [1, 2])
def test_reconstruction_round_trips(version: int) -> None:
    r = _recon()
    doc = r.to_v1() if version == 1 else r.to_v2()
    back = p.Reconstruction.from_v1(doc) if version == 1 else p.Reconstruction.from_v2(doc)
    assert back == r
    assert back.fetch_for(r.terms[2]).url == "http://h/d/x1?s=1"


def test_v2_groups_ranges_by_url() -> None:
    r = p.Reconstruction(
        [p.Term(X1, 0, 1, 10), p.Term(X1, 5, 6, 10)],
        {X1: [p.FetchInfo(0, 1, "u", 0, 17), p.FetchInfo(5, 6, "u", 90, 107)]},
    )
    doc = r.to_v2()
    assert doc["xorbs"][X1] == [
        {
            "url": "u",
            "ranges": [
                {"chunks": {"start": 0, "end": 1}, "bytes": {"start": 0, "end": 17}},
                {"chunks": {"start": 5, "end": 6}, "bytes": {"start": 90, "end": 107}},
            ],
        }
    ]


@pytest.mark.parametrize(
    ("mutate", "needle"),
    [
        (lambda d: d.update(terms="x"), "terms"),
        (lambda d: d["terms"][0].update(hash="zz"), "hash"),
        (lambda d: d["terms"][0].update(range={"start": 3, "end": 3}), "empty chunk range"),
        (lambda d: d["terms"][0].update(unpacked_length=-1), "unpacked_length"),
        (lambda d: d["terms"][0].update(unpacked_length=True), "unpacked_length"),
        (lambda d: d.update(offset_into_first_range=300), "offset_into_first_range"),
        (lambda d: d["fetch_info"][X1][0].update(url_range={"start": 5, "end": 4}), "inverted"),
        (lambda d: d["fetch_info"][X1][0].update(url=None), "url"),
    ],
)
def test_v1_parse_is_strict(mutate, needle: str) -> None:  # type: ignore[no-untyped-def]
    doc = _recon().to_v1()
    mutate(doc)
    with pytest.raises(RemoteError, match=needle):
        p.Reconstruction.from_v1(doc)


def test_fetch_for_missing_entry_is_an_error() -> None:
    r = _recon()
    with pytest.raises(RemoteError, match="no entry covers"):
        r.fetch_for(p.Term(X2, 0, 2, 1))


def test_range_header() -> None:
    assert p.parse_range_header("bytes=0-0") == (0, 0)
    assert p.parse_range_header("bytes=10-") == (10, None)
    assert p.format_range(3, 9) == "bytes=3-9"
    for bad in ("bytes=5-4", "bytes=-5", "bytes=0-1,3-4", "items=0-1", "bytes=a-b"):
        with pytest.raises(ValueError):
            p.parse_range_header(bad)


def test_crc64nvme_check_value_and_native_agrees_with_python() -> None:
    assert p.crc64nvme(b"123456789") == 0xAE8B14860A799888
    assert p._crc64nvme_py(b"123456789") == 0xAE8B14860A799888
    data = random.Random(1).randbytes(5000)
    assert p.crc64nvme(data) == p._crc64nvme_py(data)
    assert p.crc64nvme(memoryview(data)) == p._crc64nvme_py(data)


def test_grant_models() -> None:
    req = p.grant_request(1234, 2**64 - 1)
    assert req == {"length": 1234, "checksum": {"algo": "crc64nvme", "value": str(2**64 - 1)}}
    assert p.parse_grant_request(req) == (1234, 2**64 - 1)
    assert p.parse_grant_request({"length": 5}) == (5, None)
    with pytest.raises(RemoteError):
        p.parse_grant_request({"length": 5, "checksum": {"algo": "crc64nvme", "value": "-1"}})
    g = p.Grant("abc_1", "PUT", "http://h/u?x", {"Content-Type": "application/octet-stream"})
    assert p.Grant.from_json(g.to_json()) == g
    with pytest.raises(RemoteError, match=r"grant\.id"):
        p.Grant.from_json({"id": "../x", "url": "u"})


def test_discovery_document() -> None:
    d = p.Discovery("http://h:1", access_token="t", expires=5)
    assert p.Discovery.from_json(d.to_json()) == d
    assert p.Discovery.from_json({"casUrl": "https://h/"}).cas_url == "https://h"
    with pytest.raises(RemoteError, match="casUrl"):
        p.Discovery.from_json({"casUrl": "ftp://h"})


def test_xorb_location_round_trip_and_hostile_documents() -> None:
    from gitxet.hashing import chunk_hash, merkle_root, to_hex

    hashes = tuple(chunk_hash(bytes([i])) for i in range(5))
    data = (0, 10, 25, 26, 40, 64)
    sizes = [b - a for a, b in itertools.pairwise(data)]
    xh = to_hex(merkle_root(list(zip(hashes, sizes, strict=True))))
    loc = p.XorbLocation(xh, "http://h/x", hashes, (0, 18, 41, 50, 72, 104), data)
    doc = loc.to_json()
    again = p.XorbLocation.from_json(doc)
    assert again == loc and again.verify()
    bad_values = [
        ("byte_offsets", [0, 18, 41, 50, 72, True]),  # a JSON true is not a number
        ("byte_offsets", [0, 18, 41, 50, 72, -1]),
        ("byte_offsets", [0, 18, 41, 50, 72, "104"]),
        ("byte_offsets", [0, 18, 41, 41, 72, 104]),  # not strictly increasing
        ("data_offsets", [0, 10, 25, 26, 40, 64.0]),
        ("data_offsets", [1, 10, 25, 26, 40, 64]),  # not from 0
        ("data_offsets", [0, 10, 25, 26, 40]),  # one short
        ("chunk_hashes", [*doc["chunk_hashes"][:4], doc["chunk_hashes"][4].upper()]),
        ("chunk_hashes", [*doc["chunk_hashes"][:4], None]),
        ("chunk_hashes", "not a list"),
        ("chunk_hashes", []),
    ]
    for key, value in bad_values:
        with pytest.raises(RemoteError):
            p.XorbLocation.from_json({**doc, key: value})
    # well formed but not this xorb's layout: parsed, and refused by verify()
    other = {**doc, "chunk_hashes": list(reversed(doc["chunk_hashes"]))}
    assert not p.XorbLocation.from_json(other).verify()
