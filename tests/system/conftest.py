"""System tests: every token a test makes is checked, after the test, to be nowhere it should
not be (any process's argv, mount records and daemon logs, the caches, `git xet mounts
--json`, `git xet env`, the captured log). Tokens are collected where they are made
(``TokenStore.create``); tests with tokens from elsewhere call
:func:`tests.helpers.secrets.assert_tokens_nowhere` themselves."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from gitxet.server.auth import TokenStore
from gitxet.settings import cache_root, state_root
from tests.helpers.secrets import assert_tokens_nowhere


@pytest.fixture(autouse=True)
def _tokens_do_not_leak(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> Iterator[list[str]]:
    made: list[str] = []
    create = TokenStore.create

    def recording(self: TokenStore, *args: Any, **kwargs: Any) -> Any:
        token, rec = create(self, *args, **kwargs)
        made.append(token)
        return token, rec

    monkeypatch.setattr(TokenStore, "create", recording)
    yield made
    if not made:
        return
    dirs = [d for d in (state_root(), cache_root()) if os.path.isdir(d)]
    assert_tokens_nowhere(made, paths=dirs, texts=[caplog.text], env=dict(os.environ))
