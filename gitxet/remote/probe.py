"""Whether a repository URL is served by a gitxet server, asked without httpx.

A gitxet server answers an anonymous ``info/refs`` request with 401 and the
``realm="gitxet"`` challenge. :func:`gitxet.remote.client.is_gitxet_server` asks through
httpx (proxies, TLS); :func:`plain_http_probe` asks a plain ``http://`` URL directly with
the standard library, for a caller that knows no proxy applies and must not wait for httpx
to load (``git xet clone`` asks before it starts git).
"""

from __future__ import annotations

import http.client
from urllib.parse import urlsplit

USER_AGENT = "gitxet"


def info_refs_url(repo_url: str) -> str:
    """The URL a probe asks: git's smart-HTTP ref advertisement of ``repo_url``."""
    return repo_url.rstrip("/") + "/info/refs?service=git-upload-pack"


def is_gitxet_challenge(status: int, www_authenticate: str) -> bool:
    """Whether an anonymous answer is a gitxet server asking for its token."""
    return status == 401 and 'realm="gitxet"' in www_authenticate


def plain_http_probe(repo_url: str, *, timeout: float = 5.0) -> bool | None:
    """:func:`is_gitxet_challenge` of ``repo_url`` (``http://`` only, no proxy, redirects
    not followed); None when it cannot be asked this way (another scheme, userinfo in the
    URL). Any failure to connect or read is "no"."""
    parts = urlsplit(repo_url)
    if parts.scheme != "http" or not parts.hostname or "@" in parts.netloc:
        return None
    target = info_refs_url(repo_url)
    path = target[len(f"{parts.scheme}://{parts.netloc}") :] or "/"
    try:
        conn = http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=timeout)
        try:
            conn.request("GET", path, headers={"User-Agent": USER_AGENT})
            r = conn.getresponse()
            return is_gitxet_challenge(r.status, r.getheader("www-authenticate") or "")
        finally:
            conn.close()
    except (OSError, http.client.HTTPException, ValueError):
        return False
