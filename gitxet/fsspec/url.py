"""The ``xet://`` URL grammar: which repository, which revision, which path.

::

    xet://<repo>@<rev>[/<path>]

    <repo>  an absolute path (``/srv/data.git``) or a URL with a scheme (``file:///srv/d.git``),
            everything up to the FIRST ``@``; write a literal ``@`` as ``%40``, ``%`` as ``%25``
    <rev>   a branch, tag or (abbreviated) commit id, up to the next ``/``; write a ``/`` in a
            branch name as ``%2F`` (``feature%2Fx``), ``%`` as ``%25``
    <path>  ``/``-separated path inside the commit, taken literally (no %-decoding); empty
            parts and ``.`` are dropped, ``..`` is refused

So ``xet:///srv/data.git@main/train/x.parquet`` is ``train/x.parquet`` at branch ``main`` of
the repository ``/srv/data.git``. Only ``<repo>`` and ``<rev>`` are %-decoded, and only the
escapes above are needed, because the first ``@`` always ends the repository and the first
``/`` after it always ends the revision; paths, which may hold anything, are never escaped.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gitxet.errors import URLFormatError
from gitxet.settings import redact

PROTOCOL = "xet"
_PREFIXES = (PROTOCOL + "://", PROTOCOL + "::")
_ESCAPE = re.compile(r"%([0-9A-Fa-f]{2})")
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
_MAX_URL = 64 * 1024  # a URL longer than this is a mistake, not a path


@dataclass(frozen=True, slots=True)
class XetURL:
    """A parsed ``xet://`` URL. ``prefix`` is ``<repo>@<rev>`` exactly as it was written."""

    repo: str
    rev: str
    path: str  # normalized, no leading or trailing "/", "" for the root
    prefix: str

    def name(self, path: str | None = None) -> str:
        """The fsspec name (no protocol) of ``path`` (default: this URL's path)."""
        p = self.path if path is None else path
        return f"{self.prefix}/{p}" if p else self.prefix


def strip_protocol(url: str) -> str:
    """``url`` without a leading ``xet://`` (or ``xet::``)."""
    for pre in _PREFIXES:
        if url.startswith(pre):
            return url[len(pre) :]
    return url


def _unescape(text: str, what: str, url: str) -> str:
    if "%" in text:
        stray = _ESCAPE.sub("", text)
        if "%" in stray:
            raise URLFormatError(url, f"bad %-escape in the {what} (write '%' as '%25')")
    return _ESCAPE.sub(lambda m: chr(int(m.group(1), 16)), text)


def normalize_path(path: str, url: str = "") -> str:
    """A path inside a commit without empty or ``.`` parts; ``..`` raises URLFormatError."""
    parts = [p for p in path.split("/") if p and p != "."]
    if ".." in parts:
        raise URLFormatError(url or path, "'..' is not allowed in a path inside a commit")
    return "/".join(parts)


def parse_url(url: str) -> XetURL:
    """Split a ``xet://`` URL (or the same without its protocol) into repo, rev and path.

    Raises:
        URLFormatError: no ``@``, an empty repository or revision, a relative repository
            path, a bad %-escape, ``..`` in the path, or a NUL byte.
    """
    try:
        return _parse_url(url)
    except URLFormatError as exc:  # the URL as written, less a token in its repository's
        raise URLFormatError(redact(exc.what), exc.reason) from None


def _parse_url(url: str) -> XetURL:
    if len(url) > _MAX_URL:
        raise URLFormatError(url[:80] + "...", f"longer than {_MAX_URL} characters")
    if "\0" in url:
        raise URLFormatError(url, "contains a NUL character")
    body = strip_protocol(url)
    at = body.find("@")
    if at < 0:
        raise URLFormatError(url, "expected xet://<repo>@<revision>/<path>: no '@'")
    repo_text = body[:at]
    slash = body.find("/", at + 1)
    rev_text = body[at + 1 :] if slash < 0 else body[at + 1 : slash]
    rest = "" if slash < 0 else body[slash + 1 :]
    if not repo_text:
        raise URLFormatError(url, "no repository before '@'")
    if not rev_text:
        raise URLFormatError(url, "no revision after '@'")
    repo = _unescape(repo_text, "repository", url)
    rev = _unescape(rev_text, "revision", url)
    if not (repo.startswith("/") or _SCHEME.match(repo)):
        raise URLFormatError(url, "the repository must be an absolute path or a URL")
    scheme = _SCHEME.match(repo)
    if scheme and "/" not in repo[scheme.end() :] and "@" in body[at + 1 :]:
        # xet://https://user:TOKEN@host/repo@main: the first '@' ended the repository
        raise URLFormatError(
            url,
            "credentials in the repository URL: write its '@' as %40, or give the token "
            "with token= (or GITXET_TOKEN)",
        )
    return XetURL(repo, rev, normalize_path(rest, url), f"{repo_text}@{rev_text}")


def format_url(repo: str, rev: str, path: str = "", *, protocol: bool = True) -> str:
    """The URL of ``path`` at ``rev`` of ``repo`` (escaping what the grammar needs)."""
    repo_text = repo.replace("%", "%25").replace("@", "%40")
    rev_text = rev.replace("%", "%25").replace("/", "%2F")
    p = normalize_path(path)
    body = f"{repo_text}@{rev_text}" + (f"/{p}" if p else "")
    return f"{PROTOCOL}://{body}" if protocol else body


def canonical(path: str) -> str:
    """``path`` without protocol, trailing ``/`` and redundant path parts; never raises.

    The ``<repo>@<rev>`` prefix is kept as written, so names round-trip; text that is not a
    valid URL is only stripped (errors are reported where the path is used).
    """
    body = strip_protocol(path)
    at = body.find("@")
    if at < 0:
        return body.rstrip("/")
    slash = body.find("/", at + 1)
    if slash < 0:
        return body
    parts = [p for p in body[slash + 1 :].split("/") if p and p != "."]
    return body[:slash] + "".join("/" + p for p in parts)
