"""The CLI's view of :mod:`gitxet.settings`: command-line overrides on top of the environment.

Every variable, default and the token lookup live in ``gitxet.settings``; this module only
turns the options of a command into a :class:`~gitxet.settings.Settings` and the access
objects built from it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gitxet.settings import TOKEN_ENV, TOKEN_FILE_ENV, Settings

if TYPE_CHECKING:  # kept out of start-up: every git-xet command imports this module
    from gitxet.dataset import HttpAccess


def settings(
    cache_dir: str | None = None,
    cache_size: str | None = None,
    *,
    token: str | None = None,
    prefetch: str | None = None,
    cas_url: str | None = None,
    token_file: str | None = None,
) -> Settings:
    """Settings of this command: its options > the environment > the defaults."""
    return Settings.load(
        cache_dir=cache_dir,
        cache_size=cache_size,
        prefetch=prefetch,
        token=token,
        cas_url=cas_url,
        token_file=token_file,
    )


def check_environment() -> None:
    """Every ``GITXET_*`` variable parsed now, before git runs a filter that reads them: a
    malformed one is then one line from gitxet, not the filter's line followed by git's
    'the remote end hung up unexpectedly'.

    Raises:
        ConfigError: a malformed size, duration, URL or boolean.
    """
    from gitxet.settings import lazy_default

    Settings.load(use_keyring=False)
    lazy_default()


def http_access(
    cache_dir: str | None = None,
    cache_size: str | None = None,
    *,
    offline: bool = False,
    token: str | None = None,
    prefetch: str | None = None,
    cas_url: str | None = None,
    token_file: str | None = None,
) -> HttpAccess:
    """Access to http(s) repositories for mount, warmup and the plugins.

    ``token`` (e.g. a Docker volume option or a CSI secret) beats the environment/keyring;
    ``token_file`` (``--token-file``) beats ``GITXET_TOKEN_FILE``; ``cas_url``
    (``--cas-url``) beats ``GITXET_CAS_URL``.
    """
    from gitxet.dataset import HttpAccess

    s = settings(
        cache_dir,
        cache_size,
        token=token,
        prefetch=prefetch,
        cas_url=cas_url,
        token_file=token_file,
    )
    return HttpAccess.from_settings(s, offline=offline)


def plugin_resolver(cache_dir: str | None = None) -> Callable[[Any], str]:
    """A Mounter ``resolve`` that also opens http(s) repos with the spec's own token (and
    never the plugin's ``GITXET_TOKEN``/``GITXET_TOKEN_FILE``, which its volumes do not get
    either)."""

    def resolve(spec: Any) -> str:
        from gitxet.dataset import HttpAccess
        from gitxet.plugins.mounter import resolve_local

        env = {k: v for k, v in os.environ.items() if k not in (TOKEN_ENV, TOKEN_FILE_ENV)}
        s = Settings.load(
            cache_dir=cache_dir,
            cache_size=spec.cache_size,
            prefetch=spec.prefetch,
            token=spec.token,
            env=env,
            token_file=getattr(spec, "token_file", None),
        )
        return resolve_local(spec, HttpAccess.from_settings(s))

    return resolve
