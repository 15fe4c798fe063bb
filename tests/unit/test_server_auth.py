"""Tokens (hashed at rest, scopes, revocation) and signed URLs (expiry, forgery)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from gitxet.errors import BackendError, ConfigError
from gitxet.server.auth import TokenStore, valid_repo_name
from gitxet.server.backends import LocalBackend
from gitxet.server.signing import KEY_OBJECT, UrlSigner, load_or_create_key

X = "ab" * 32


def test_tokens_are_stored_hashed_and_scoped(tmp_path: Path) -> None:
    ts = TokenStore(str(tmp_path))
    w, wrec = ts.create("write", label="ci")
    r, rrec = ts.create("read", repo="data")
    raw = (tmp_path / "tokens.json").read_text()
    assert w not in raw and r not in raw and w.split("_", 2)[2] not in raw
    assert os.stat(tmp_path / "tokens.json").st_mode & 0o077 == 0
    assert ts.authenticate(w) == wrec
    assert ts.authenticate(r) == rrec
    assert ts.authenticate(w[:-1] + ("A" if w[-1] != "A" else "B")) is None
    assert ts.authenticate("garbage") is None
    assert wrec.allows("write", "anything") and wrec.allows("read")
    assert rrec.allows("read", "data") and not rrec.allows("read", "other")
    assert not rrec.allows("write", "data")
    assert rrec.allows("read", None)  # the shared CAS
    assert sorted(t.id for t in ts.list()) == sorted([wrec.id, rrec.id])  # order unspecified


def test_revocation_is_seen_by_a_running_store(tmp_path: Path) -> None:
    server_view = TokenStore(str(tmp_path))
    tok, rec = TokenStore(str(tmp_path)).create("read")
    assert server_view.authenticate(tok) == rec
    assert TokenStore(str(tmp_path)).revoke(rec.id) is True
    assert server_view.authenticate(tok) is None
    assert TokenStore(str(tmp_path)).revoke(rec.id) is False


def test_token_input_validation(tmp_path: Path) -> None:
    ts = TokenStore(str(tmp_path))
    with pytest.raises(ConfigError, match="scope"):
        ts.create("admin")
    with pytest.raises(ConfigError, match="repository"):
        ts.create("read", repo="../etc")
    (tmp_path / "tokens.json").write_text(json.dumps({"tokens": [{"id": 1}]}))
    with pytest.raises(ConfigError, match="malformed"):
        ts.list()


@pytest.mark.parametrize(
    ("name", "ok"),
    [("data", True), ("a.b-c_d", True), ("..", False), ("a..b", False), (".hidden", False),
     ("x/y", False), ("x.git", False), ("", False), ("a" * 101, False), ("caf\u00e9", False)],
)  # fmt: skip
def test_repo_names(name: str, ok: bool) -> None:
    assert valid_repo_name(name) is ok


def test_data_urls_expire_and_resist_forgery() -> None:
    s = UrlSigner(b"k" * 32, ttl=100, bucket=50)
    q = dict(kv.split("=", 1) for kv in s.data_query(X, now=1000).split("&"))
    assert int(q["exp"]) % 50 == 0 and 1100 <= int(q["exp"]) < 1150
    assert s.verify_data(X, q["exp"], q["sig"], now=1000)
    assert not s.verify_data(X, q["exp"], q["sig"], now=int(q["exp"]))  # expired
    assert not s.verify_data("cd" * 32, q["exp"], q["sig"], now=1000)  # other xorb
    assert not s.verify_data(X, str(int(q["exp"]) + 50), q["sig"], now=1000)  # extended
    assert not s.verify_data(X, q["exp"], q["sig"][:-1] + "A", now=1000)
    assert not UrlSigner(b"j" * 32).verify_data(X, q["exp"], q["sig"], now=1000)  # other key
    assert not s.verify_data(X, "-5", q["sig"], now=1000)
    # Same bucket, same URL: caches in front of the servers can hit.
    assert s.data_query(X, now=1010) == s.data_query(X, now=1020)


def test_grant_urls_bind_length_and_checksum() -> None:
    s = UrlSigner(b"k" * 32, ttl=100)
    q = dict(kv.split("=", 1) for kv in s.grant_query(X, "g1", 500, 42, now=0).split("&"))
    args = (X, "g1", q["len"], q["crc"], q["exp"], q["sig"])
    assert s.verify_grant(*args, now=0)
    assert not s.verify_grant(X, "g2", *args[2:], now=0)
    assert not s.verify_grant(X, "g1", "501", *args[3:], now=0)
    assert not s.verify_grant(X, "g1", "500", "43", *args[4:], now=0)
    assert not s.verify_grant(*args, now=10**6)


def test_signing_key_is_shared_through_the_backend(tmp_path: Path) -> None:
    b = LocalBackend(str(tmp_path / "cas"))
    k1 = load_or_create_key(b)
    k2 = load_or_create_key(LocalBackend(str(tmp_path / "cas")))
    assert k1 == k2 and len(k1) == 32
    b.put(KEY_OBJECT, b"short")
    with pytest.raises(BackendError):
        load_or_create_key(b)
