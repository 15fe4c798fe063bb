"""Bearer tokens with scopes, stored hashed in ``<root>/tokens.json``.

A token looks like ``gxt_<id>_<secret>``: the id (12 hex digits) names the record and is
what logs, ``token list`` and ``token revoke`` show; the secret (256 random bits) is shown
once, at creation, and only its SHA-256 is stored. A slow KDF is not needed because the
secret is random, not a password. Comparison is constant-time.

Scopes: ``read`` allows clones, fetches, reconstructions, data URLs and dedup queries;
``write`` allows all of that plus pushes and uploads. A token limited to one repository
(``--repo NAME``) can reach only that repository over git. The CAS is one
content-addressed namespace shared by the repositories of a server, so any valid token can
use it within its read/write scope; run separate servers for tenants that must not share
data (``docs/operations/server.md``).

The file is rewritten atomically under a lock, and a running server notices changes (by
mtime and size) on the next request, so ``git xet token create`` works while it serves.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import secrets
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any

from gitxet.errors import ConfigError
from gitxet.store.locking import file_lock
from gitxet.util.atomic import atomic_write

__all__ = ["SCOPES", "TokenRecord", "TokenStore", "valid_repo_name"]

SCOPES = ("read", "write")
PREFIX = "gxt_"
_TOKEN_RE = re.compile(r"^gxt_([0-9a-f]{12})_([A-Za-z0-9_-]{43})$")
_REPO_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


def valid_repo_name(name: str) -> bool:
    """A repository name: letters, digits, ``.``, ``_``, ``-``; no ``..``, no ``.git`` end."""
    return bool(_REPO_RE.match(name)) and ".." not in name and not name.endswith(".git")


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode("ascii")).hexdigest()


@dataclass(frozen=True)
class TokenRecord:
    """What is stored about a token (never the token itself)."""

    id: str
    digest: str
    scope: str
    repo: str | None
    created: int
    label: str = ""

    def allows(self, need: str, repo: str | None = None) -> bool:
        """Whether this token may do ``need`` (``read``/``write``) on ``repo``.

        ``repo=None`` means the shared CAS, which every token may use within its scope.
        """
        if need not in SCOPES:
            raise ValueError(f"unknown scope {need!r}")
        if need == "write" and self.scope != "write":
            return False
        return self.repo is None or repo is None or self.repo == repo


class TokenStore:
    """The token file of a server root."""

    def __init__(self, root: str) -> None:
        self.path = os.path.join(os.path.abspath(root), "tokens.json")
        self._lock_path = os.path.join(os.path.abspath(root), "locks", "tokens")
        self._mu = threading.Lock()
        self._stamp: tuple[int, int] | None = None
        self._by_id: dict[str, TokenRecord] = {}

    # ---- file -------------------------------------------------------------------------

    def _read(self) -> dict[str, TokenRecord]:
        try:
            with open(self.path, encoding="utf-8") as f:
                doc: Any = json.load(f)
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as e:
            raise ConfigError(f"cannot read token file {self.path}: {e}") from None
        out: dict[str, TokenRecord] = {}
        items = doc.get("tokens", []) if isinstance(doc, dict) else None
        if not isinstance(items, list):
            raise ConfigError(f"token file {self.path} is malformed")
        for item in items:
            try:
                rec = TokenRecord(**item)
            except TypeError:
                raise ConfigError(f"token file {self.path} has a malformed entry") from None
            if rec.scope not in SCOPES:
                raise ConfigError(f"token {rec.id} in {self.path} has unknown scope {rec.scope!r}")
            out[rec.id] = rec
        return out

    def _write(self, records: dict[str, TokenRecord]) -> None:
        doc = {"version": 1, "tokens": [asdict(r) for r in records.values()]}
        data = (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode("utf-8")
        atomic_write(self.path, data, mode=0o600)

    def _current(self) -> dict[str, TokenRecord]:
        try:
            st = os.stat(self.path)
            stamp: tuple[int, int] | None = (st.st_mtime_ns, st.st_size)
        except FileNotFoundError:
            stamp = None
        with self._mu:
            if stamp != self._stamp or stamp is None:
                self._by_id = self._read() if stamp is not None else {}
                self._stamp = stamp
            return self._by_id

    # ---- management (the CLI) -----------------------------------------------------------

    def create(
        self, scope: str = "read", repo: str | None = None, label: str = ""
    ) -> tuple[str, TokenRecord]:
        """Make a new token; returns ``(token, record)``. The token is not stored.

        Raises:
            ConfigError: unknown scope or invalid repository name.
        """
        if scope not in SCOPES:
            raise ConfigError(f"scope must be one of {', '.join(SCOPES)}, not {scope!r}")
        if repo is not None and not valid_repo_name(repo):
            raise ConfigError(f"invalid repository name {repo!r}")
        tid = secrets.token_hex(6)
        token = f"{PREFIX}{tid}_{secrets.token_urlsafe(32)}"
        rec = TokenRecord(tid, _digest(token), scope, repo, int(time.time()), label)
        with file_lock(self._lock_path):
            records = self._read()
            records[tid] = rec
            self._write(records)
        return token, rec

    def list(self) -> list[TokenRecord]:
        """Every token record, oldest first."""
        return sorted(self._read().values(), key=lambda r: r.created)  # stable: file order

    def revoke(self, token_id: str) -> bool:
        """Delete a token by id; ``False`` if there was none."""
        with file_lock(self._lock_path):
            records = self._read()
            if records.pop(token_id, None) is None:
                return False
            self._write(records)
        return True

    # ---- checking (the server) ------------------------------------------------------------

    def authenticate(self, token: str) -> TokenRecord | None:
        """The record of a valid token, else ``None`` (constant-time on the secret)."""
        m = _TOKEN_RE.match(token)
        if m is None:
            return None
        rec = self._current().get(m.group(1))
        if rec is None:
            return None
        return rec if hmac.compare_digest(rec.digest, _digest(token)) else None
