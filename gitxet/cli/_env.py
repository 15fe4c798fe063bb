"""The one place that turns the environment into settings for remote (http) access.

``GITXET_CACHE_DIR`` (default ``$XDG_CACHE_HOME/gitxet``, else ``~/.cache/gitxet``) holds the
shared chunk cache and git metadata mirrors; ``GITXET_TOKEN`` or the keyring (``git xet
login``) give the token; ``GITXET_CACHE_SIZE`` caps the chunk cache (default 10G).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gitxet.errors import ConfigError

if TYPE_CHECKING:  # kept out of start-up: every git-xet command imports this module
    from gitxet.data.transfer import CASRemote
    from gitxet.repo import HttpAccess


def parse_size(text: str) -> int:
    from gitxet.repo import parse_size as parse

    return parse(text)


TOKEN_ENV = "GITXET_TOKEN"
KEYRING_SERVICE = "gitxet"


def keyring_key(url: str) -> str:
    """The keyring entry for a server: scheme://host[:port], without credentials."""
    from urllib.parse import urlsplit

    s = urlsplit(url)
    if s.scheme not in ("http", "https") or not s.hostname:
        raise ConfigError(f"not an http(s) URL: {url!r}")
    host = s.hostname + (f":{s.port}" if s.port else "")
    return f"{s.scheme}://{host}"


def token_for(url: str) -> str | None:
    """The token to use for ``url``: ``$GITXET_TOKEN``, else the one ``login`` stored."""
    env = os.environ.get(TOKEN_ENV)
    if env:
        return env
    import keyring
    import keyring.errors

    try:
        return keyring.get_password(KEYRING_SERVICE, keyring_key(url))
    except (keyring.errors.KeyringError, ConfigError):
        return None


def cache_root(override: str | None = None) -> str:
    if override:
        return os.path.abspath(override)
    env = os.environ.get("GITXET_CACHE_DIR")
    if env:
        return os.path.abspath(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return os.path.join(base, "gitxet")


def prefetch_bytes(text: str | None = None, value: int | None = None) -> int:
    """How far past a read the mount fetches (``--prefetch``/``GITXET_PREFETCH``, 4M)."""
    if value is not None:
        return value
    return parse_size(text or os.environ.get("GITXET_PREFETCH") or "4m")


def cache_bytes(override: str | None = None) -> int:
    return parse_size(override or os.environ.get("GITXET_CACHE_SIZE") or "10g")


def remote_factory(
    root: str,
    max_bytes: int,
    *,
    offline: bool = False,
    token: str | None = None,
    read_ahead: int | None = None,
) -> Callable[[str], CASRemote]:
    """The CAS remote of an http(s) git URL, with this machine's token lookup.

    httpx and the rest are imported on first use: local repositories never pay for them.
    """

    def make(url: str) -> CASRemote:
        from gitxet.data.remote_source import http_remote_factory

        build = http_remote_factory(
            root,
            max_bytes,
            offline=offline,
            token=token,
            token_lookup=token_for,
            read_ahead=prefetch_bytes(None, read_ahead),
        )
        return build(url)

    return make


def http_access(
    url: str,
    cache_dir: str | None = None,
    cache_size: str | None = None,
    *,
    offline: bool = False,
    token: str | None = None,
    prefetch: str | None = None,
) -> HttpAccess:
    """Settings for opening the dataset at ``url`` (mount, warmup, plugins).

    ``token`` (e.g. a Docker volume option or a CSI secret) beats the environment/keyring.
    """
    if token is None and url.startswith(("http://", "https://")):
        token = token_for(url)
    root = cache_root(cache_dir)
    size = cache_bytes(cache_size)
    make = remote_factory(
        root, size, offline=offline, token=token, read_ahead=prefetch_bytes(prefetch)
    )
    from gitxet.repo import HttpAccess

    return HttpAccess(root, token, offline, size, make)


def plugin_resolver() -> Callable[[Any], str]:
    """A Mounter ``resolve`` that also opens http(s) repos with the spec's own token."""

    def resolve(spec: Any) -> str:
        from gitxet.plugins.mounter import resolve_local

        return resolve_local(
            spec, http_access(spec.repo, cache_size=spec.cache_size, token=spec.token)
        )

    return resolve
