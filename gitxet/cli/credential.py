"""``git-xet credential get|store|erase``: git's credential helper for gitxet servers.

``git xet install`` registers it (``credential.helper = !git-xet credential``, added after
any helper already configured). git asks it for a user name and password when a server
answers 401; it answers with the token of the lookup in :mod:`gitxet.settings`:

* a server with a keyring entry (``git xet login URL``): ``GITXET_TOKEN`` if set, else that
  entry;
* any other server that identifies itself as a gitxet server (an anonymous request gets the
  ``realm="gitxet"`` challenge): ``GITXET_TOKEN`` if set (CI);
* anything else: no answer at all, so git's other helpers (and its prompt) work as before.

``GITXET_TOKEN_HOSTS`` (``host`` or ``host:port``, comma-separated) binds ``GITXET_TOKEN`` to
the servers it names: any other server gets only its keyring entry, if it has one.

When a gitxet server needs a token and none is known, one line on stderr names
``git xet login``. ``store`` and ``erase`` change nothing: the keyring entry belongs to
``git xet login``, and a token set in the environment is the user's to change.
Protocol: https://git-scm.com/docs/git-credential (key=value lines, an empty line ends).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable

from gitxet.errors import GitxetError
from gitxet.settings import TOKEN_ENV, TOKEN_HOSTS_ENV, TOKEN_USERNAME, Settings, keyring_token

_MAX_INPUT = 64 * 1024  # a credential description is a few lines


def parse_description(lines: Iterable[str]) -> dict[str, str]:
    """git's credential description (``key=value`` lines until an empty one); later keys
    win, multi-valued ones (``wwwauth[]``) keep their last value."""
    attrs: dict[str, str] = {}
    for raw in lines:
        line = raw.rstrip("\n")
        if not line:
            break
        key, sep, value = line.partition("=")
        if sep and key and "\0" not in line:
            attrs[key] = value
    return attrs


def describe_url(attrs: dict[str, str]) -> str | None:
    """The http(s) URL a description names (``protocol://host[/path]``), or ``None``."""
    proto, host = attrs.get("protocol", ""), attrs.get("host", "")
    if proto not in ("http", "https") or not host or any(c in host for c in "/@\\ "):
        return None
    path = attrs.get("path", "").strip("/")
    return f"{proto}://{host}" + (f"/{path}" if path else "")


def answer(attrs: dict[str, str], settings: Settings, *, probe: bool = True) -> str | None:
    """The token to give git for ``attrs``, or ``None`` (then nothing is printed); may write
    the ``git xet login`` hint to stderr."""
    url = describe_url(attrs)
    if url is None:
        return None
    env_token = settings.env_token_for(url)  # None where GITXET_TOKEN_HOSTS leaves it out
    gitxet: bool | None = None  # what the probe said (None: not asked)
    if env_token and probe:
        # GITXET_TOKEN (CI, a clone's own run): a gitxet server gets it whatever the keyring
        # holds, so the keyring (~0.3 s to load its backends) is opened only if it is not one
        gitxet = _is_gitxet(url, attrs)
        if gitxet:
            return env_token
    known = keyring_token(url) if settings.use_keyring else None
    if known:
        return env_token or known
    if not probe or gitxet is False or not _is_gitxet(url, attrs):
        return None
    if env_token:
        return env_token
    host = url.split("/", 3)[2]
    # GITXET_TOKEN set here means GITXET_TOKEN_HOSTS does not name this server
    how = f"or add {host} to {TOKEN_HOSTS_ENV}" if settings.env_token else f"or set {TOKEN_ENV}"
    print(
        f"git-xet: {host} is a gitxet server and no token is known: run "
        f"'git xet login {url}' ({how})",
        file=sys.stderr,
    )
    return None


def _is_gitxet(url: str, attrs: dict[str, str]) -> bool:
    from gitxet.remote.client import is_gitxet_server

    # a path makes the probe the very request git just made; without one, any repo name
    # gets the same challenge from a gitxet server
    return is_gitxet_server(url if attrs.get("path") else url + "/gitxet-probe.git")


def run(action: str) -> int:
    """The helper: reads git's description on stdin, answers ``get`` on stdout."""
    data = sys.stdin.read(_MAX_INPUT)
    if action != "get":
        return 0  # store / erase: nothing of ours to change (see the module docstring)
    attrs = parse_description(data.splitlines())
    if attrs.get("password"):
        return 0  # git already has one (e.g. from the URL): nothing to add
    try:
        token = answer(attrs, Settings.load())
    except GitxetError as e:  # e.g. a malformed GITXET_CACHE_SIZE: say so, answer nothing
        print(f"git-xet credential: {e}", file=sys.stderr)
        return 0
    if token is None:
        return 0
    user = attrs.get("username") or TOKEN_USERNAME
    sys.stdout.write(f"username={user}\npassword={token}\n\n")
    sys.stdout.flush()
    return 0
