"""HMAC-signed, expiring URLs for xorb data and xorb upload grants.

hf_xet sends no ``Authorization`` header to the URLs a reconstruction or a grant hands out,
so those URLs authorise themselves: the query carries an expiry (unix seconds) and an
HMAC-SHA256 over what the URL allows. A data URL signs ``(xorb, expiry)``; a grant URL
signs ``(xorb, grant id, length, checksum, expiry)``. Changing any byte of the path or the
query, or presenting it after the expiry, makes :meth:`UrlSigner.verify_data` /
:meth:`UrlSigner.verify_grant` return ``False`` (the app answers 403).

Expiries are rounded up to ``bucket`` seconds so that every client asking within one
bucket gets the *same* URL for a xorb: an HTTP cache in front of the servers keyed on the
full URL then hits across clients (see ``docs/operations/server.md``).

The key is 32 random bytes stored in the backend (``meta/url-signing.key``) so that all
replicas on one bucket accept each other's URLs.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets
import time

from gitxet.errors import BackendError
from gitxet.remote.protocol import parse_decimal
from gitxet.server.backends import Backend, ObjectMissingError

__all__ = ["KEY_OBJECT", "UrlSigner", "load_or_create_key"]

KEY_OBJECT = "meta/url-signing.key"
KEY_LEN = 32
#: What a signature (unpadded urlsafe base64 of 32 bytes) and a grant id look like; any
#: other value is refused before it reaches the MAC (non-ASCII would make it raise).
_SIG_RE = re.compile(r"[A-Za-z0-9_-]{43}")
_GRANT_ID_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")


def load_or_create_key(backend: Backend) -> bytes:
    """The shared signing key, created (exactly once, whoever wins) on first use.

    Raises:
        BackendError: the stored key is not 32 bytes, or the backend fails.
    """
    try:
        key = backend.get(KEY_OBJECT)
    except ObjectMissingError:
        backend.put(KEY_OBJECT, secrets.token_bytes(KEY_LEN), if_absent=True)
        key = backend.get(KEY_OBJECT)  # whoever won the race, everyone uses the same key
    if len(key) != KEY_LEN:
        raise BackendError(KEY_OBJECT, f"signing key is {len(key)} bytes, expected {KEY_LEN}")
    return key


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


class UrlSigner:
    """Signs and checks URL queries; ``ttl`` is how long a URL stays valid (at least)."""

    def __init__(self, key: bytes, *, ttl: int = 3600, bucket: int = 600) -> None:
        if len(key) < 16:
            raise ValueError("signing key too short")
        self._key = key
        self.ttl = ttl
        self.bucket = max(1, bucket)

    def _mac(self, *fields: str) -> str:
        msg = "\x00".join(fields).encode("ascii")
        return _b64(hmac.new(self._key, msg, hashlib.sha256).digest())

    def expiry(self, now: float | None = None) -> int:
        """An expiry ``ttl`` to ``ttl + bucket`` seconds from now, on a bucket boundary."""
        t = int(time.time() if now is None else now) + self.ttl
        return -(-t // self.bucket) * self.bucket

    @staticmethod
    def _valid(exp: str, sig: str, now: float | None) -> int | None:
        """The expiry if ``exp`` is a future time and ``sig`` is shaped like a signature."""
        e = parse_decimal(exp, 12)
        if e is None or not _SIG_RE.fullmatch(sig):
            return None
        return e if e > (time.time() if now is None else now) else None

    # ---- data URLs ---------------------------------------------------------------------

    def data_query(self, xorb_hex: str, now: float | None = None) -> str:
        """Query string (without ``?``) authorising ranged GETs of one xorb."""
        exp = str(self.expiry(now))
        return f"exp={exp}&sig={self._mac('data', xorb_hex, exp)}"

    def verify_data(self, xorb_hex: str, exp: str, sig: str, now: float | None = None) -> bool:
        """Whether ``(exp, sig)`` authorise reading ``xorb_hex`` now."""
        if self._valid(exp, sig, now) is None or not xorb_hex.isascii():
            return False
        return hmac.compare_digest(self._mac("data", xorb_hex, exp), sig)

    # ---- grant URLs --------------------------------------------------------------------

    def grant_query(
        self, xorb_hex: str, grant_id: str, length: int, crc: int | None, now: float | None = None
    ) -> str:
        """Query string authorising one upload of ``length`` bytes with checksum ``crc``."""
        exp = str(self.expiry(now))
        c = "" if crc is None else str(crc)
        mac = self._mac("grant", xorb_hex, grant_id, str(length), c, exp)
        return f"len={length}&crc={c}&exp={exp}&sig={mac}"

    def verify_grant(
        self,
        xorb_hex: str,
        grant_id: str,
        length: str,
        crc: str,
        exp: str,
        sig: str,
        now: float | None = None,
    ) -> bool:
        """Whether the grant query fields authorise an upload now."""
        if self._valid(exp, sig, now) is None or parse_decimal(length) is None:
            return False
        if crc and parse_decimal(crc, 20) is None:
            return False
        if not (_GRANT_ID_RE.fullmatch(grant_id) and xorb_hex.isascii()):
            return False
        return hmac.compare_digest(self._mac("grant", xorb_hex, grant_id, length, crc, exp), sig)
