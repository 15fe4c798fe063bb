"""gitxet.settings: the size and boolean grammars, directories, the token lookup, and the rule
that only ``cli`` and ``settings`` read the environment."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gitxet.errors import ConfigError, MountSpecError
from gitxet.plugins.mounter import MountSpec, validate_spec
from gitxet.settings import (
    DEFAULT_CACHE_BYTES,
    DEFAULT_PREFETCH_BYTES,
    SIZE_PATTERN,
    Settings,
    cache_root,
    is_size,
    parse_bool,
    parse_size,
    server_key,
    state_root,
    strip_credentials,
    url_token,
)
from tests.contracts import env_uses, violations
from tests.helpers.keyring_backends import MemoryKeyring


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("0", 0),
        ("1048576", 1 << 20),
        ("256k", 256 << 10),
        ("1m", 1 << 20),
        ("20g", 20 << 30),
        ("10GiB", 10 << 30),
        ("4 MB", 4 << 20),
        ("2T", 2 << 40),
        (" 96M ", 96 << 20),
    ],
)
def test_sizes(text: str, value: int) -> None:
    assert parse_size(text) == value


@pytest.mark.parametrize(
    "text", ["", "1.5G", "5B", "b", "G", "-1", "+1", "1_000", "٥", "10 G B", "1e9", "lots", "1gg"]
)
def test_not_sizes(text: str) -> None:
    with pytest.raises(ConfigError, match="size"):
        parse_size(text)


def test_size_cap() -> None:
    with pytest.raises(ConfigError, match="too large"):
        parse_size("99999999t")


def _validator_accepts(text: str) -> bool:
    try:
        validate_spec(MountSpec("/r", "main", cache_size=text, prefetch=text))
    except MountSpecError:
        return False
    return True


@settings(max_examples=400, deadline=None)
@given(
    st.one_of(
        st.from_regex(re.compile(SIZE_PATTERN), fullmatch=True),
        st.from_regex(r"[0-9 .]{0,6}[kKmMgGtTbBiI ]{0,4}", fullmatch=True),
        st.text(max_size=12),
    )
)
def test_plugin_validator_and_parser_agree(text: str) -> None:
    """What a Docker/CSI volume accepts at create time, the mount daemon can parse."""
    if "\0" in text or "\n" in text or "\r" in text:
        return  # refused for another reason (control characters), before the size rule
    try:
        parse_size(text)
        parsed = True
    except ConfigError:
        parsed = False
    assert _validator_accepts(text) == parsed == is_size(text)


@pytest.mark.parametrize("text", ["1.5G", "5B"])
def test_validator_refuses_what_the_daemon_cannot_parse(text: str) -> None:
    with pytest.raises(MountSpecError, match="cache_size"):
        validate_spec(MountSpec("/r", "main", cache_size=text))


@pytest.mark.parametrize(
    ("text", "value"),
    [
        *[("1", True), ("TRUE", True), ("yes", True), ("on", True), (" On ", True)],
        *[("0", False), ("false", False), ("No", False), ("off", False), ("", False)],
    ],
)
def test_booleans(text: str, value: bool) -> None:
    assert parse_bool(text) is value


def test_not_a_boolean_names_what() -> None:
    with pytest.raises(ConfigError, match="GITXET_LAZY: 'maybe' is not a boolean"):
        parse_bool("maybe", "GITXET_LAZY")


def test_directories_follow_the_variables(tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path / "h")}
    assert cache_root(None, env) == str(tmp_path / "h" / ".cache" / "gitxet")
    assert state_root(None, env) == str(tmp_path / "h" / ".local" / "state" / "gitxet")
    env |= {"XDG_CACHE_HOME": str(tmp_path / "xc"), "XDG_STATE_HOME": str(tmp_path / "xs")}
    assert cache_root(None, env) == str(tmp_path / "xc" / "gitxet")
    assert state_root(None, env) == str(tmp_path / "xs" / "gitxet")
    env |= {"GITXET_CACHE_DIR": str(tmp_path / "c"), "GITXET_STATE_DIR": str(tmp_path / "s")}
    assert cache_root(None, env) == str(tmp_path / "c")
    assert state_root(None, env) == str(tmp_path / "s")
    assert cache_root(str(tmp_path / "o"), env) == str(tmp_path / "o")


def test_settings_defaults_and_overrides(tmp_path: Path) -> None:
    s = Settings.load(env={"HOME": str(tmp_path)})
    assert (s.cache_bytes, s.prefetch_bytes) == (DEFAULT_CACHE_BYTES, DEFAULT_PREFETCH_BYTES)
    s = Settings.load(env={"GITXET_CACHE_SIZE": "1G", "GITXET_PREFETCH": "0"})
    assert (s.cache_bytes, s.prefetch_bytes) == (1 << 30, 0)
    assert Settings.load(cache_size="2g", env={"GITXET_CACHE_SIZE": "1G"}).cache_bytes == 2 << 30
    with pytest.raises(ConfigError):
        Settings.load(env={"GITXET_CACHE_SIZE": "1.5G"})
    assert "tok" not in repr(Settings.load(token="tok", env={"GITXET_TOKEN": "tok"}))


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({"GITXET_CACHE_SIZE": "1.5G"}, "GITXET_CACHE_SIZE: not a size: '1.5G'"),
        ({"GITXET_PREFETCH": "-5"}, "GITXET_PREFETCH: not a size: '-5'"),
        ({"GITXET_TIER_TIMEOUT": "soon"}, "GITXET_TIER_TIMEOUT: not a duration: 'soon'"),
        ({"GITXET_CAS_URL": "tier:8080"}, "GITXET_CAS_URL: not a cache tier URL: 'tier:8080'"),
    ],
)
def test_a_malformed_variable_is_named(env: dict[str, str], says: str) -> None:
    """The error names the variable that holds the bad value (the user may not know one
    is set: 'not a size: '-5'' alone did not say where the -5 came from)."""
    with pytest.raises(ConfigError) as exc:
        Settings.load(env=env)
    assert str(exc.value).startswith(says), exc.value
    # an explicit value (a command's option) is said as it was
    with pytest.raises(ConfigError) as exc:
        Settings.load(cache_size="1.5G", env={})
    assert str(exc.value).startswith("not a size: '1.5G'")


def test_cache_tier_url() -> None:
    assert Settings.load(env={}).cas_url is None
    s = Settings.load(env={"GITXET_CAS_URL": "http://tier:8080/"})
    assert s.cas_url == "http://tier:8080"
    assert Settings.load(cas_url="https://t2", env={"GITXET_CAS_URL": "http://t"}).cas_url == (
        "https://t2"
    )
    for bad in ("tier:8080", "ftp://t", "http://u:secret@t", "http://t/?sig=x", "http://"):
        with pytest.raises(ConfigError) as exc:
            Settings.load(env={"GITXET_CAS_URL": bad})
        assert "secret" not in str(exc.value)


def test_cache_tier_timeout() -> None:
    assert Settings.load(env={}).tier_timeout == 30.0
    assert Settings.load(env={"GITXET_TIER_TIMEOUT": "5s"}).tier_timeout == 5.0
    assert Settings.load(env={"GITXET_TIER_TIMEOUT": "1500ms"}).tier_timeout == 1.5
    for bad in ("soon", "0", "-1s"):
        with pytest.raises(ConfigError):
            Settings.load(env={"GITXET_TIER_TIMEOUT": bad})


def test_token_lookup_order(memkeyring: MemoryKeyring) -> None:
    url = "http://user:from-url@h:1/data.git"
    memkeyring.set_password("gitxet", "http://h:1", "from-keyring")
    env = {"GITXET_TOKEN": "from-env"}
    assert Settings.load(token="explicit", env=env).token_for(url) == "explicit"
    assert Settings.load(env=env).token_for(url) == "from-env"
    assert Settings.load(env={}).token_for(url) == "from-keyring"
    assert Settings.load(env={}).token_source(url) == "keyring"
    assert Settings.load(env={}).token_for("http://u:from-url@other/x.git") == "from-url"
    assert Settings.load(env={}).token_for("http://other/x.git") is None
    assert Settings.load(env={}, use_keyring=False).token_for(url) == "from-url"


def test_a_keyring_that_keeps_nothing_is_an_error() -> None:
    """``keyring.backends.null`` accepts a password and keeps nothing: login said
    'logged in' and every later command then had no token."""
    import keyring
    import keyring.backends.null

    from gitxet.settings import store_token

    old = keyring.get_keyring()
    keyring.set_keyring(keyring.backends.null.Keyring())
    try:
        with pytest.raises(ConfigError, match="did not keep it"):
            store_token("http://h:1/x.git", "gxt_a_b")
    finally:
        keyring.set_keyring(old)


def test_no_keyring_backend_is_no_token() -> None:
    # the sealed test env has the "fail" backend: like a server without a keyring service
    assert Settings.load(env={}).token_for("http://h:1/x.git") is None


@pytest.mark.parametrize(
    ("url", "clean"),
    [
        ("http://u:secret@h:8080/d.git", "http://h:8080/d.git"),
        ("https://secret@h/d.git?sig=abc#f", "https://h/d.git"),
        ("http://[::1]:80/x", "http://[::1]:80/x"),
        ("/srv/data.git", "/srv/data.git"),
        ("file:///srv/data.git", "file:///srv/data.git"),
    ],
)
def test_strip_credentials(url: str, clean: str) -> None:
    assert strip_credentials(url) == clean
    assert "secret" not in strip_credentials(url)


def test_url_token_and_server_key() -> None:
    assert url_token("http://u:p%40ss@h/x") == "p@ss"
    assert url_token("http://tok@h/x") == "tok"
    assert url_token("http://h/x") is None
    assert server_key("http://u:p@H:81/x.git") == "http://h:81"
    with pytest.raises(ConfigError):
        server_key("ftp://h/x")
    with pytest.raises(ConfigError) as info:
        server_key("ssh://u:secret@h/x")
    assert "secret" not in str(info.value)


def test_environment_scanner_finds_every_form() -> None:
    src = (
        "import os\nimport os as o\nfrom os import environ\n"
        "a = os.environ['X']\nb = o.getenv('Y')\nos.putenv('Z', '1')\nc = os.path.join\n"
    )
    found = {(u.line, u.what) for u in env_uses(src, "m")}
    assert found == {
        (3, "from os import environ"),
        (4, "os.environ"),
        (5, "o.getenv"),
        (6, "os.putenv"),
    }


def test_only_cli_and_settings_read_the_environment() -> None:
    import pkgutil

    import gitxet

    modules = ["gitxet"] + [
        m.name for m in pkgutil.walk_packages(gitxet.__path__, "gitxet.") if "csi_pb2" not in m.name
    ]
    assert violations(modules, ["gitxet.cli", "gitxet.settings"]) == []


def test_redact_drops_userinfo_also_written_with_an_escaped_at() -> None:
    from gitxet.settings import redact

    assert redact("see https://u:tok@h/r.git now") == "see https://h/r.git now"
    assert redact("xet://https://u:tok%40h/r.git@main/x") == "xet://https://h/r.git@main/x"
    kept = "https://h/a%40b/c.git and /srv/x@main"  # (no userinfo: a %40 in a path)
    assert redact(kept) == kept


def test_token_hosts_bind_the_env_token_in_every_lookup(memkeyring: MemoryKeyring) -> None:
    memkeyring.set_password("gitxet", "http://other:1", "from-keyring")
    env = {"GITXET_TOKEN": "from-env", "GITXET_TOKEN_HOSTS": "HTTPS://Data.Example.org/ h:1"}
    settings = Settings.load(env=env)
    assert settings.env_token_hosts == frozenset({"data.example.org", "h:1"})
    assert settings.token_for("https://data.example.org:8443/d.git") == "from-env"  # any port
    assert settings.token_for("http://h:1/d.git") == "from-env"
    assert settings.token_source("http://h:1/d.git") == "GITXET_TOKEN"
    assert settings.token_for("http://h:2/d.git") is None  # another port of a host:port entry
    assert settings.token_for("http://other:1/d.git") == "from-keyring"
    assert settings.token_source("http://other:1/d.git") == "keyring"
    assert settings.token_for("http://u:from-url@evil/d.git") == "from-url"  # the URL's own
    # an explicit token is the caller's choice for that repository: never filtered
    assert Settings.load(token="explicit", env=env).token_for("http://evil/d.git") == "explicit"
    for bad in ("", " , ", "user@host", "host/path", "host:port", "a b@c"):
        with pytest.raises(ConfigError, match="GITXET_TOKEN_HOSTS"):
            Settings.load(env={"GITXET_TOKEN_HOSTS": bad})


_PINNED = r"""
import gc, weakref
from gitxet.settings import keyring_token

class Held:  # stands for a clone's list of 100,000 file hashes
    pass

def caller():
    held = Held()
    keyring_token("http://127.0.0.1:9/x.git")
    return weakref.ref(held)

ref = caller()
gc.collect()
print("kept" if ref() is not None else "freed")
"""


def test_the_first_keyring_lookup_keeps_no_callers_locals_alive(tmp_path: Path) -> None:
    """keyring chooses its backend at the first lookup of a process, importing its backends;
    ``keyring.backends.Windows`` keeps its failed import's traceback in a module global,
    and with it every frame then on the stack: a clone whose first lookup came while it
    listed 100,000 files kept that listing (~0.3 KB a file) to its end."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON_KEYRING")}
    env.update(HOME=str(tmp_path), XDG_CONFIG_HOME=str(tmp_path / "config"))
    r = subprocess.run(
        [sys.executable, "-c", _PINNED], env=env, capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "freed"


def test_a_fork_while_the_keyring_is_being_chosen_leaves_the_child_a_free_lock() -> None:
    """Another thread choosing the keyring backend holds a lock; a child forked meanwhile
    has no such thread, and its first token lookup waited for ever on the copy."""
    import gitxet.settings as gitxet_settings

    with gitxet_settings._keyring_chosen:  # as the choosing thread holds it
        pid = os.fork()
        if pid == 0:  # the child: the lock must be free
            os._exit(0 if gitxet_settings._keyring_chosen.acquire(timeout=5) else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
