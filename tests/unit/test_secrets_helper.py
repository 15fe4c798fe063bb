"""The token-leak check of the system tests (tests/helpers/secrets.py) can fail: a token in
a file, in a text or in a process's argv is found, for each of several tokens at once."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.secrets import assert_token_nowhere, assert_tokens_nowhere

TOKENS = ["gxt_aaaaaaaaaaaa_" + "A" * 43, "gxt_bbbbbbbbbbbb_" + "B" * 43]


def test_a_clean_machine_passes(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("nothing here")
    assert_tokens_nowhere(TOKENS, paths=[tmp_path], texts=["x"], cwd=tmp_path)


@pytest.mark.parametrize("which", [0, 1])
def test_a_token_in_a_file_or_a_text_is_found(tmp_path: Path, which: int) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "log").write_text(f"auth {TOKENS[which]}\n")
    with pytest.raises(AssertionError, match=f"token #{which} in .*log"):
        assert_tokens_nowhere(TOKENS, paths=[tmp_path], check_cli=False)
    with pytest.raises(AssertionError, match="output #1"):
        assert_token_nowhere(TOKENS[which], texts=["", f"x{TOKENS[which]}"], check_cli=False)


def test_a_token_in_an_argv_is_found() -> None:
    code = "import sys; print('ready', flush=True); sys.stdin.read()"
    with subprocess.Popen(
        [sys.executable, "-c", code, TOKENS[1]], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    ) as p:
        try:
            assert p.stdout is not None and p.stdout.readline() == b"ready\n"
            with pytest.raises(AssertionError, match=f"token #1 in the argv of pid {p.pid}"):
                assert_tokens_nowhere(TOKENS, check_cli=False)
        finally:
            assert p.stdin is not None
            p.stdin.close()
            p.wait(30)
