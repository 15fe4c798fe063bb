"""The git credential helper's decisions (no network: the probe is off or stubbed)."""

from __future__ import annotations

import pytest

from gitxet.cli import credential
from gitxet.settings import Settings
from tests.helpers.keyring_backends import MemoryKeyring


def test_parse_description_stops_at_the_empty_line() -> None:
    lines = ["protocol=http", "host=h:1", "path=data.git", "wwwauth[]=a", "wwwauth[]=b", ""]
    attrs = credential.parse_description([*lines, "password=late"])
    assert attrs == {"protocol": "http", "host": "h:1", "path": "data.git", "wwwauth[]": "b"}


@pytest.mark.parametrize(
    ("attrs", "url"),
    [
        ({"protocol": "http", "host": "h:1"}, "http://h:1"),
        ({"protocol": "https", "host": "h", "path": "/a/b.git"}, "https://h/a/b.git"),
        ({"protocol": "ssh", "host": "h"}, None),
        ({"protocol": "http", "host": "u@h"}, None),
        ({"protocol": "http"}, None),
    ],
)
def test_describe_url(attrs: dict[str, str], url: str | None) -> None:
    assert credential.describe_url(attrs) == url


def test_keyring_hosts_get_their_token_and_env_beats_it(memkeyring: MemoryKeyring) -> None:
    memkeyring.set_password("gitxet", "http://h:1", "from-keyring")
    attrs = {"protocol": "http", "host": "h:1"}
    assert credential.answer(attrs, Settings.load(env={}), probe=False) == "from-keyring"
    env = {"GITXET_TOKEN": "from-env"}
    assert credential.answer(attrs, Settings.load(env=env), probe=False) == "from-env"
    # another port is another server
    other = {"protocol": "http", "host": "h:2"}
    assert credential.answer(other, Settings.load(env=env), probe=False) is None


def test_env_token_only_for_gitxet_servers(
    memkeyring: MemoryKeyring, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from gitxet.remote import client

    seen: list[str] = []

    def probe(url: str, *, timeout: float = 5.0) -> bool:
        seen.append(url)
        return url.startswith("http://xet")

    monkeypatch.setattr(client, "is_gitxet_server", probe)
    env = Settings.load(env={"GITXET_TOKEN": "t"})
    assert credential.answer({"protocol": "https", "host": "github.com"}, env) is None
    assert credential.answer({"protocol": "http", "host": "xet", "path": "d.git"}, env) == "t"
    assert seen == ["https://github.com/gitxet-probe.git", "http://xet/d.git"]
    assert capsys.readouterr().err == ""
    # no token at all: a gitxet server gets the hint, other hosts nothing
    none = Settings.load(env={})
    assert credential.answer({"protocol": "https", "host": "github.com"}, none) is None
    assert capsys.readouterr().err == ""
    assert credential.answer({"protocol": "http", "host": "xet"}, none) is None
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "git xet login http://xet" in err


def test_env_token_for_a_gitxet_server_does_not_open_the_keyring(
    memkeyring: MemoryKeyring, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gitxet.remote import client

    opened: list[str] = []

    def keyring_token(url: str) -> str | None:
        opened.append(url)
        return "from-keyring" if url.startswith("http://known") else None

    monkeypatch.setattr(credential, "keyring_token", keyring_token)
    monkeypatch.setattr(client, "is_gitxet_server", lambda url, **kw: url.startswith("http://xet"))
    env = Settings.load(env={"GITXET_TOKEN": "t"})
    assert credential.answer({"protocol": "http", "host": "xet", "path": "d.git"}, env) == "t"
    assert opened == []
    # a server that does not look like one but has a keyring entry still gets the env token
    assert credential.answer({"protocol": "http", "host": "known"}, env) == "t"
    assert credential.answer({"protocol": "http", "host": "other"}, env) is None
    assert opened == ["http://known", "http://other"]


def test_token_hosts_bind_the_env_token_to_the_servers_they_name(
    memkeyring: MemoryKeyring, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from gitxet.remote import client

    monkeypatch.setattr(client, "is_gitxet_server", lambda url, *, timeout=5.0: True)
    env = {"GITXET_TOKEN": "ci-token", "GITXET_TOKEN_HOSTS": "data.example.org, 10.0.0.5:8080"}
    settings = Settings.load(env=env)
    named = {"protocol": "https", "host": "data.example.org", "path": "d.git"}
    assert credential.answer(named, settings) == "ci-token"
    assert credential.answer({"protocol": "http", "host": "10.0.0.5:8080"}, settings) == "ci-token"
    # a gitxet server the variable leaves out (another port, a submodule's host) gets nothing,
    # and the hint says why
    for host in ("10.0.0.5:8081", "evil.example.net"):
        assert credential.answer({"protocol": "http", "host": host}, settings) is None
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "GITXET_TOKEN_HOSTS" in err
    # its keyring entry still reaches a server the variable leaves out, never the variable
    memkeyring.set_password("gitxet", "http://evil.example.net", "its-own")
    assert (
        credential.answer({"protocol": "http", "host": "evil.example.net"}, settings) == "its-own"
    )
