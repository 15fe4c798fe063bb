"""gitxet.cli.clone: the token git gets from `git xet clone` (header, environment only)."""

from __future__ import annotations

import base64

from gitxet.cli.clone import _fast_auth, auth_env
from gitxet.settings import Settings

URL = "http://127.0.0.1:8080/data.git"


def test_auth_env_adds_a_header_for_that_url_after_the_callers_own_variables() -> None:
    env = auth_env(URL, "gxt_tok", {"GIT_CONFIG_COUNT": "1"})
    assert env["GIT_CONFIG_COUNT"] == "3" and "GIT_CONFIG_KEY_0" not in env
    basic = base64.b64encode(b"gitxet:gxt_tok").decode()
    assert env["GIT_CONFIG_KEY_1"] == f"http.{URL}.extraHeader"
    assert env["GIT_CONFIG_VALUE_1"] == f"Authorization: Basic {basic}"
    assert (env["GIT_CONFIG_KEY_2"], env["GIT_CONFIG_VALUE_2"]) == (
        f"http.{URL}.followRedirects",
        "false",
    )
    assert auth_env(URL, "gxt_tok", {})["GIT_CONFIG_KEY_0"] == f"http.{URL}.extraHeader"
    # git refuses a malformed count itself: nothing is added to it
    assert auth_env(URL, "gxt_tok", {"GIT_CONFIG_COUNT": "x"}) == {}
    assert auth_env(URL, "gxt_tok", {"GIT_CONFIG_COUNT": "-1"}) == {}


def test_no_header_for_a_server_that_is_not_gitxet_or_a_url_with_credentials() -> None:
    settings = Settings.load(env={"GITXET_TOKEN": "gxt_tok"}, use_keyring=False)
    # nothing listens on port 9 (discard): not a gitxet server, so the token is not offered
    assert _fast_auth("http://127.0.0.1:9/data.git", settings) == ({}, False)
    assert _fast_auth("http://me:pw@127.0.0.1:9/data.git", settings) == ({}, False)
    assert _fast_auth("/srv/data.git", settings) == ({}, False)
