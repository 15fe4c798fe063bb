"""The one settings source: every default, the size and boolean grammars, the token lookup.

Besides ``gitxet.cli`` this is the only module that reads the environment. Everything that
needs a cache directory, a cache size, the state directory or a token (the CLI, the mount
daemons, ``xet://`` fsspec paths, the Docker and CSI plugins, git's credential helper) asks
:class:`Settings` or the functions below, so they all agree under every variable.

The variables, their meaning and defaults are listed once, in :data:`VARIABLES` (the docs'
configuration table is generated from it).

Token lookup, first hit wins: an explicit token (an option, a volume option, a CSI secret) >
a token file (``--token-file``, ``GITXET_TOKEN_FILE``; re-read whenever it changes, so a
rotated token is picked up by a running mount) > ``GITXET_TOKEN`` > the keyring entry
``git xet login`` wrote for the server > the password of the URL's userinfo.
Credentials never travel further than needed: :func:`strip_credentials`
gives the URL every record, log, message and argv carries.
"""

from __future__ import annotations

import os
import re
import threading
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TypeVar

from gitxet.errors import ConfigError

# ---- names and defaults (each written once) -----------------------------------------------

DEFAULT_CACHE_SIZE = "10G"  # the node cache's cap (a size; DEFAULT_CACHE_BYTES in bytes)

CACHE_DIR_ENV = "GITXET_CACHE_DIR"
CACHE_SIZE_ENV = "GITXET_CACHE_SIZE"
PREFETCH_ENV = "GITXET_PREFETCH"
STATE_DIR_ENV = "GITXET_STATE_DIR"
TOKEN_ENV = "GITXET_TOKEN"
TOKEN_FILE_ENV = "GITXET_TOKEN_FILE"
TOKEN_HOSTS_ENV = "GITXET_TOKEN_HOSTS"
LAZY_ENV = "GITXET_LAZY"
CAS_URL_ENV = "GITXET_CAS_URL"
TIER_TIMEOUT_ENV = "GITXET_TIER_TIMEOUT"

#: Every variable of this module: (name, what it sets, its default). docs/cli.md's
#: "Configuration" section is generated from this table.
VARIABLES: tuple[tuple[str, str, str], ...] = (
    (
        CACHE_DIR_ENV,
        "shared cache of http(s) repositories: verified chunks, git metadata mirrors, "
        "discovered endpoints (mounts, `xet://`, checkout and the plugins share it)",
        "`$XDG_CACHE_HOME/gitxet`, else `~/.cache/gitxet`",
    ),
    (CACHE_SIZE_ENV, "cap of the node cache (a size)", f"`{DEFAULT_CACHE_SIZE}`"),
    (PREFETCH_ENV, "largest read-ahead of sequential remote readers (a size; `0`: off)", "`128M`"),
    (
        STATE_DIR_ENV,
        "mount records and mount daemon logs",
        "`$XDG_STATE_HOME/gitxet`, else `~/.local/state/gitxet`",
    ),
    (TOKEN_ENV, "the token for gitxet servers; beats the keyring (see Tokens)", "none"),
    (
        TOKEN_FILE_ENV,
        "a file holding the token, re-read whenever it changes (rotation); beats `GITXET_TOKEN`",
        "none",
    ),
    (
        TOKEN_HOSTS_ENV,
        "the only servers `GITXET_TOKEN` is given to: `host` or `host:port`, comma-separated "
        "(see Tokens)",
        "every gitxet server",
    ),
    (LAZY_ENV, "leave pointers on checkout, like `xet.lazy` (a boolean)", "`xet.lazy`"),
    (
        CAS_URL_ENV,
        "read file data through this cache tier (`git xet serve --upstream`) instead of the "
        "repository's CAS; git traffic and pushes still go to the origin",
        "none",
    ),
    (
        TIER_TIMEOUT_ENV,
        "how long a cache tier may stay silent (connect or read) before a reader takes it as "
        "down and reads from the origin (a duration)",
        "`30s`",
    ),
)

TOKEN_FILE_MAX_BYTES = 64 * 1024  # a token file holds one line; refuse anything bigger
DEFAULT_PREFETCH_BYTES = 128 << 20  # largest read-ahead window of sequential remote readers
# seconds a cache tier may stay silent before it is taken as down: long, so that a busy tier
# (a first byte waits for its 8 MiB range to come from the origin) is not taken for a dead one
DEFAULT_TIER_TIMEOUT = 30.0
KEYRING_SERVICE = "gitxet"  # keyring entries: service "gitxet", user scheme://host[:port]
TOKEN_USERNAME = "gitxet"  # the user name sent with a token in HTTP Basic auth

# ---- sizes ---------------------------------------------------------------------------------

#: The size grammar: a decimal integer, then optionally one of k/m/g/t (binary units, any
#: case) followed optionally by ``b`` or ``ib``: ``1048576``, ``256k``, ``20g``, ``10GiB``,
#: ``4 MB``. No fractions, no bare ``b``, no sign.
SIZE_PATTERN = r"(?P<n>[0-9]+)[ \t]*(?:(?P<unit>[kmgtKMGT])(?:[iI]?[bB])?)?"
_SIZE_RE = re.compile(SIZE_PATTERN, re.ASCII)
_UNITS = {"": 0, "k": 10, "m": 20, "g": 30, "t": 40}
MAX_SIZE = 1 << 60  # anything bigger is a typo, not a cache


def parse_size(text: str) -> int:
    """``"256k"``, ``"1m"``, ``"10GiB"``, ``"20g"``, ``"1048576"`` -> bytes (binary units).

    Raises:
        ConfigError: ``text`` is not a size in that grammar (see :data:`SIZE_PATTERN`).
    """
    m = _SIZE_RE.fullmatch(text.strip()) if isinstance(text, str) else None
    if m is None or len(m.group("n")) > 20:
        raise ConfigError(f"not a size: {text!r} (use e.g. 256k, 20g, 10GiB or 1048576)")
    value = int(m.group("n")) << _UNITS[(m.group("unit") or "").lower()]
    if value > MAX_SIZE:
        raise ConfigError(f"size too large: {text!r}")
    return value


DEFAULT_CACHE_BYTES = parse_size(DEFAULT_CACHE_SIZE)


def check_cas_url(url: str) -> str:
    """``url`` (a cache tier's base URL, ``--cas-url``/``GITXET_CAS_URL``) without a
    trailing slash.

    Raises:
        ConfigError: not an http(s) URL, or it carries credentials, a query or a fragment.
    """
    try:
        s = urllib.parse.urlsplit(url.strip())
    except ValueError:
        s = None
    if s is None or s.scheme not in ("http", "https") or not s.hostname:
        raise ConfigError(
            f"not a cache tier URL: {strip_credentials(url)!r} (use http(s)://host:port)"
        )
    if s.username or s.password or s.query or s.fragment:
        raise ConfigError(
            f"a cache tier URL takes no credentials, query or fragment: {strip_credentials(url)!r}"
        )
    return url.strip().rstrip("/")


_T = TypeVar("_T")


def _parsed(
    explicit: str | None, env: Mapping[str, str], name: str, parse: Callable[[str], _T]
) -> _T | None:
    """``explicit`` (an option's value) parsed, else the variable ``name`` of ``env``, else
    None; a malformed variable is named in the error (its value may be a surprise)."""
    if explicit:
        return parse(explicit)
    text = env.get(name)
    if not text:
        return None
    try:
        return parse(text)
    except ConfigError as exc:
        raise ConfigError(f"{name}: {exc}") from None


def is_size(text: str) -> bool:
    """Whether :func:`parse_size` accepts ``text`` (for validators that must not raise)."""
    try:
        parse_size(text)
    except ConfigError:
        return False
    return True


# ---- durations -----------------------------------------------------------------------------

_DURATION_RE = re.compile(r"(?P<n>[0-9]+(?:\.[0-9]+)?)[ \t]*(?P<unit>ms|s|m|h)?", re.ASCII)
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
MIN_DURATION = 0.1  # seconds: shorter polls only burn CPU
MAX_DURATION = 7 * 86400.0


def parse_duration(text: str) -> float:
    """``"1s"``, ``"500ms"``, ``"2m"``, ``"1h"``, ``"30"`` (seconds) -> seconds.

    Raises:
        ConfigError: not a duration in that grammar, or outside 100 ms .. 7 days.
    """
    m = _DURATION_RE.fullmatch(text.strip()) if isinstance(text, str) else None
    if m is None or len(m.group("n")) > 12:
        raise ConfigError(f"not a duration: {text!r} (use e.g. 1s, 500ms, 2m or 30)")
    value = float(m.group("n")) * _DURATION_UNITS[m.group("unit") or "s"]
    if not MIN_DURATION <= value <= MAX_DURATION:
        raise ConfigError(f"duration {text!r} is out of range (100ms to 7 days)")
    return value


# ---- booleans ------------------------------------------------------------------------------

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off", ""})


def parse_address(text: str) -> tuple[str, int]:
    """``HOST:PORT``, ``:PORT`` or ``PORT`` (``[::1]:PORT`` for IPv6) as (host, port); the
    host defaults to loopback (metrics endpoints are not for the world unless asked).

    Raises:
        ConfigError: not an address with a port in 0..65535.
    """
    host, sep, port = text.rpartition(":")
    if not sep:
        host, port = "", text
    host = host.strip("[]") or "127.0.0.1"
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"not an address: {text!r} (use HOST:PORT, e.g. 127.0.0.1:9400)")
    return host, int(port)


def parse_bool(text: str, what: str = "value") -> bool:
    """git's boolean words: true/yes/on/1 and false/no/off/0/empty, any case.

    Raises:
        ConfigError: anything else (naming ``what``).
    """
    t = text.strip().lower()
    if t in _TRUE:
        return True
    if t in _FALSE:
        return False
    raise ConfigError(f"{what}: {text!r} is not a boolean (use true or false)")


# ---- URLs and credentials ------------------------------------------------------------------


def strip_credentials(url: str) -> str:
    """``url`` without ``user:password@`` (and, for http(s), without query and fragment,
    where signatures live). Non-URLs (local paths) come back unchanged."""
    try:
        s = urllib.parse.urlsplit(url)
    except ValueError:
        return "<unparseable url>"
    if not s.scheme or not s.netloc:
        return url
    host = s.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    try:
        port = s.port
    except ValueError:
        port = None
    netloc = host + (f":{port}" if port else "")
    if s.scheme in ("http", "https"):
        s = s._replace(query="", fragment="")
    return s._replace(netloc=netloc).geturl()


def split_credentials(url: str) -> tuple[str, str | None]:
    """``(url without credentials, the token its userinfo carried)``; a URL without
    userinfo comes back unchanged with ``None``."""
    token = url_token(url)
    return (url, None) if token is None else (strip_credentials(url), token)


_URL_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/\s@]+(?:@|%40)")


def redact(text: str) -> str:
    """``text`` with the userinfo of every URL in it removed (for messages and logs), also
    where its ``@`` is written ``%40`` (a repository inside a ``xet://`` URL)."""
    return _URL_USERINFO.sub(r"\1", text)


def url_token(url: str) -> str | None:
    """The token a URL carries in its userinfo (the password, else a lone user name)."""
    try:
        s = urllib.parse.urlsplit(url)
    except ValueError:
        return None
    secret = s.password if s.password else s.username
    return urllib.parse.unquote(secret) if secret else None


def server_key(url: str) -> str:
    """The keyring entry of a server: ``scheme://host[:port]``, without credentials.

    Raises:
        ConfigError: ``url`` is not an http(s) URL.
    """
    try:
        s = urllib.parse.urlsplit(url)
        port = s.port
    except ValueError:
        raise ConfigError(f"not an http(s) URL: {url!r}") from None
    if s.scheme not in ("http", "https") or not s.hostname:
        raise ConfigError(f"not an http(s) URL: {strip_credentials(url)!r}")
    host = f"[{s.hostname}]" if ":" in s.hostname else s.hostname
    return f"{s.scheme}://{host}" + (f":{port}" if port else "")


def parse_token_hosts(text: str) -> frozenset[str]:
    """``GITXET_TOKEN_HOSTS`` (``"data.example.org, 10.0.0.5:8080"``) -> the set of lower-case
    ``host`` / ``host:port`` entries; a ``scheme://`` prefix and a trailing ``/`` are allowed.

    Raises:
        ConfigError: an entry is not a host name with an optional port.
    """
    hosts: set[str] = set()
    for raw in re.split(r"[,\s]+", text.strip()):
        if not raw:
            continue
        entry = re.sub(r"^https?://", "", raw, flags=re.IGNORECASE).rstrip("/").lower()
        if not re.fullmatch(r"(?:[a-z0-9_.-]+|\[[0-9a-f:.]+\])(?::[0-9]{1,5})?", entry):
            raise ConfigError(
                f"{TOKEN_HOSTS_ENV}: not a host or host:port: {strip_credentials(raw)!r}"
            )
        hosts.add(entry)
    if not hosts:
        raise ConfigError(f"{TOKEN_HOSTS_ENV} is set but names no host")
    return frozenset(hosts)


def host_allowed(url: str, hosts: frozenset[str]) -> bool:
    """Whether ``url``'s server is in ``hosts`` (an entry without a port allows every port)."""
    try:
        s = urllib.parse.urlsplit(url)
        port = s.port
    except ValueError:
        return False
    if not s.hostname:
        return False
    host = f"[{s.hostname}]" if ":" in s.hostname else s.hostname
    return host in hosts or (port is not None and f"{host}:{port}" in hosts)


_keyring_chosen = threading.Lock()
_keyring_ready = False


def _new_keyring_lock_in_child() -> None:
    # a fork while another thread held the lock (choosing, on a thread the child does not
    # have) would leave the child's first token lookup waiting for ever
    global _keyring_chosen
    _keyring_chosen = threading.Lock()


os.register_at_fork(after_in_child=_new_keyring_lock_in_child)


def _choose_keyring() -> None:
    """Let ``keyring`` choose its backend, on a thread of its own, once a process.

    Choosing imports keyring's backends, and ``keyring.backends.Windows`` keeps the error
    of its failed import in a module global, traceback and all: every frame on the stack
    at that moment, with its locals, stayed alive for the life of the process (a clone of
    100,000 files kept its lists and sets of every file's hash)."""
    global _keyring_ready
    with _keyring_chosen:
        if not _keyring_ready:
            chooser = threading.Thread(target=_choose_backend, name="gitxet-keyring")
            chooser.start()
            chooser.join()
            _keyring_ready = True


def _choose_backend() -> None:
    import keyring

    try:
        keyring.get_keyring()
    except Exception:  # the lookups that follow say what is wrong
        return


def keyring_token(url: str) -> str | None:
    """The token ``git xet login`` stored for ``url``'s server, or ``None`` (also when no
    keyring backend works on this machine)."""
    _choose_keyring()
    import keyring
    import keyring.errors

    try:
        return keyring.get_password(KEYRING_SERVICE, server_key(url))
    except (keyring.errors.KeyringError, ConfigError):
        return None
    except RuntimeError:  # some backends raise plain errors when their service is down
        return None


def store_token(url: str, token: str) -> str:
    """Store ``token`` for ``url``'s server in the keyring; returns the entry's key.

    Raises:
        ConfigError: not an http(s) URL, or no keyring backend can store it.
    """
    _choose_keyring()
    import keyring
    import keyring.errors

    key = server_key(url)
    try:
        keyring.set_password(KEYRING_SERVICE, key, token)
        kept = keyring.get_password(KEYRING_SERVICE, key)
    except (keyring.errors.KeyringError, RuntimeError) as e:
        raise ConfigError(f"cannot store the token in the keyring: {e}") from None
    if kept != token:  # a backend that drops what it is given (keyring.backends.null)
        backend = type(keyring.get_keyring())
        raise ConfigError(
            f"cannot store the token in the keyring: {backend.__module__}.{backend.__name__} "
            "did not keep it"
        )
    return key


def delete_token(url: str) -> bool:
    """Forget the keyring entry of ``url``'s server; returns whether there was one."""
    _choose_keyring()
    import keyring
    import keyring.errors

    try:
        keyring.delete_password(KEYRING_SERVICE, server_key(url))
    except keyring.errors.PasswordDeleteError:
        return False
    except (keyring.errors.KeyringError, RuntimeError) as e:
        raise ConfigError(f"cannot change the keyring: {e}") from None
    return True


# ---- the settings ------------------------------------------------------------------------


def _abspath_home(path: str) -> str:
    return os.path.abspath(os.path.expanduser(path))


def read_token_file(path: str) -> str:
    """The token in ``path``: one non-empty line of UTF-8 text (surrounding whitespace
    ignored), at most :data:`TOKEN_FILE_MAX_BYTES`.

    Raises:
        ConfigError: the file cannot be read or does not hold one token.
    """
    try:
        with open(path, "rb") as f:
            data = f.read(TOKEN_FILE_MAX_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"cannot read the token file {path}: {exc.strerror or exc}") from None
    if len(data) > TOKEN_FILE_MAX_BYTES:
        raise ConfigError(f"token file {path} is larger than {TOKEN_FILE_MAX_BYTES} bytes")
    try:
        token = data.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise ConfigError(f"token file {path} is not UTF-8 text") from None
    if not token or "\n" in token or "\0" in token:
        raise ConfigError(f"token file {path} must hold one non-empty line")
    return token


class TokenFile:
    """A token kept in a file, re-read whenever the file changes (token rotation).

    Each :meth:`read` stats the file (about a microsecond) and reads it again only when
    its device, inode, modification time or size changed: a Kubernetes secret volume or an
    ``mv`` replaces it, an editor rewrites it. While the file is briefly missing (being
    replaced) the last token read is used. Thread-safe.
    """

    def __init__(self, path: str) -> None:
        self.path = os.path.abspath(os.path.expanduser(path))
        self._lock = threading.Lock()
        self._key: tuple[int, int, int, int] | None = None
        self._token: str | None = None

    def read(self) -> str:
        """The current token.

        Raises:
            ConfigError: the file cannot be read (and never could) or holds no token.
        """
        try:
            st = os.stat(self.path)
        except OSError as exc:
            with self._lock:
                if self._token is not None:
                    return self._token  # being replaced: the last token still stands
            raise ConfigError(
                f"cannot read the token file {self.path}: {exc.strerror or exc}"
            ) from None
        key = (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)
        with self._lock:
            if key == self._key and self._token is not None:
                return self._token
        token = read_token_file(self.path)
        with self._lock:
            self._key, self._token = key, token
        return token

    def __repr__(self) -> str:
        return f"TokenFile({self.path!r})"


@dataclass(frozen=True)
class Settings:
    """Resolved settings of this process (see the module docstring for the variables).

    Build it with :meth:`load` (environment + explicit overrides); pass it down instead of
    re-reading the environment. ``token`` is an explicit token, which beats every lookup;
    ``token_file`` comes next (re-read when it changes).
    """

    cache_dir: str
    cache_bytes: int
    prefetch_bytes: int
    state_dir: str
    token: str | None = field(default=None, repr=False)
    env_token: str | None = field(default=None, repr=False)
    #: the servers ``env_token`` may go to (``GITXET_TOKEN_HOSTS``), or None: every server
    env_token_hosts: frozenset[str] | None = field(default=None, repr=False)
    use_keyring: bool = True
    #: a cache tier to read file data through (``GITXET_CAS_URL``), or None: the origin
    cas_url: str | None = None
    #: a file holding the token (``--token-file``, ``GITXET_TOKEN_FILE``), or None
    token_file: TokenFile | None = field(default=None, compare=False, repr=False)
    #: seconds the cache tier may stay silent before it is taken as down
    #: (``GITXET_TIER_TIMEOUT``)
    tier_timeout: float = DEFAULT_TIER_TIMEOUT

    @classmethod
    def load(
        cls,
        *,
        cache_dir: str | None = None,
        cache_size: str | None = None,
        prefetch: str | None = None,
        state_dir: str | None = None,
        token: str | None = None,
        env: Mapping[str, str] | None = None,
        use_keyring: bool = True,
        cas_url: str | None = None,
        token_file: str | None = None,
    ) -> Settings:
        """Settings from explicit values, else the environment (``env``, default
        ``os.environ``), else the defaults.

        Raises:
            ConfigError: a malformed size, duration or cache tier URL.
        """
        e = os.environ if env is None else env
        cache_bytes = _parsed(cache_size, e, CACHE_SIZE_ENV, parse_size)
        prefetch_bytes = _parsed(prefetch, e, PREFETCH_ENV, parse_size)
        tier_timeout = _parsed(None, e, TIER_TIMEOUT_ENV, parse_duration)
        tf = token_file or e.get(TOKEN_FILE_ENV) or None
        hosts = e.get(TOKEN_HOSTS_ENV)
        return cls(
            cache_dir=cache_root(cache_dir, e),
            cache_bytes=DEFAULT_CACHE_BYTES if cache_bytes is None else cache_bytes,
            prefetch_bytes=DEFAULT_PREFETCH_BYTES if prefetch_bytes is None else prefetch_bytes,
            state_dir=state_root(state_dir, e),
            token=token or None,
            env_token=e.get(TOKEN_ENV) or None,
            env_token_hosts=parse_token_hosts(hosts) if hosts is not None else None,
            use_keyring=use_keyring,
            cas_url=_parsed(cas_url, e, CAS_URL_ENV, check_cas_url),
            token_file=TokenFile(tf) if tf else None,
            tier_timeout=DEFAULT_TIER_TIMEOUT if tier_timeout is None else tier_timeout,
        )

    def with_token(self, token: str | None) -> Settings:
        """The same settings with an explicit token (``None``: keep the lookup)."""
        return self if not token else replace(self, token=token)

    def env_token_for(self, url: str) -> str | None:
        """``GITXET_TOKEN`` if it may be given to ``url``'s server (``GITXET_TOKEN_HOSTS``
        names it, or is unset), else ``None``."""
        if self.env_token and (
            self.env_token_hosts is None or host_allowed(url, self.env_token_hosts)
        ):
            return self.env_token
        return None

    def token_for(self, url: str) -> str | None:
        """The token for ``url``: explicit > token file > ``GITXET_TOKEN`` > keyring > URL
        userinfo.

        Raises:
            ConfigError: a token file is set but cannot be read.
        """
        if self.token:
            return self.token
        if self.token_file is not None:
            return self.token_file.read()
        env_token = self.env_token_for(url)
        if env_token:
            return env_token
        if self.use_keyring and url.startswith(("http://", "https://")):
            found = keyring_token(url)
            if found:
                return found
        return url_token(url)

    def token_source(self, url: str) -> str | None:
        """Where :meth:`token_for` finds the token: ``option``, ``GITXET_TOKEN``,
        ``keyring``, ``url`` or ``None`` (for ``git xet env``; never the token itself)."""
        if self.token:
            return "option"
        if self.token_file is not None:
            return "token file"
        if self.env_token_for(url):
            return TOKEN_ENV
        if self.use_keyring and url.startswith(("http://", "https://")) and keyring_token(url):
            return "keyring"
        return "url" if url_token(url) else None


def cache_root(override: str | None = None, env: Mapping[str, str] | None = None) -> str:
    """The shared cache directory: ``override`` > ``GITXET_CACHE_DIR`` >
    ``$XDG_CACHE_HOME/gitxet`` > ``~/.cache/gitxet``."""
    e = os.environ if env is None else env
    if override:
        return _abspath_home(override)
    if e.get(CACHE_DIR_ENV):
        return _abspath_home(e[CACHE_DIR_ENV])
    base = e.get("XDG_CACHE_HOME") or os.path.join(e.get("HOME") or "~", ".cache")
    return os.path.join(_abspath_home(base), "gitxet")


def state_root(override: str | None = None, env: Mapping[str, str] | None = None) -> str:
    """The state directory (mount records, daemon logs): ``override`` > ``GITXET_STATE_DIR``
    > ``$XDG_STATE_HOME/gitxet`` > ``~/.local/state/gitxet``."""
    e = os.environ if env is None else env
    if override:
        return _abspath_home(override)
    if e.get(STATE_DIR_ENV):
        return _abspath_home(e[STATE_DIR_ENV])
    base = e.get("XDG_STATE_HOME") or os.path.join(e.get("HOME") or "~", ".local", "state")
    return os.path.join(_abspath_home(base), "gitxet")


def lazy_default(env: Mapping[str, str] | None = None) -> bool | None:
    """``GITXET_LAZY`` as a boolean, or ``None`` when unset (``xet.lazy`` then decides)."""
    e = os.environ if env is None else env
    value = e.get(LAZY_ENV)
    return None if value is None else parse_bool(value, LAZY_ENV)


def child_env(
    extra: Mapping[str, str] | None = None, *, drop: tuple[str, ...] = ()
) -> dict[str, str]:
    """This process's environment for a child process, minus ``drop``, plus ``extra``
    (how lower layers hand a subprocess a secret without putting it in argv)."""
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(extra or {})
    return env
