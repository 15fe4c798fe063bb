"""gitxet.cli.clone: the token git gets from `git xet clone` (header, environment only)."""

from __future__ import annotations

import base64
import subprocess
import sys
from pathlib import Path

from gitxet.cli.clone import _fast_auth, auth_env, parse_argv
from gitxet.remote.probe import plain_http_probe
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


def test_plain_clone_arguments_are_parsed_without_typer_anything_else_is_not() -> None:
    assert parse_argv(["http://h/d.git"]) == {"src": "http://h/d.git", "directory": None}
    assert parse_argv(["--lazy", "-b", "dev", "--cas-url=http://t", "--", "-src", "d"]) == {
        "lazy": True,
        "branch": "dev",
        "cas_url": "http://t",
        "src": "-src",
        "directory": "d",
    }
    assert parse_argv(["s", "d", "--branch=x", "--cas-url", "u"]) == {
        "branch": "x",
        "cas_url": "u",
        "src": "s",
        "directory": "d",
    }
    assert parse_argv(["-q", "--depth", "1", "s"]) == {"quiet": True, "depth": 1, "src": "s",
                                                        "directory": None}  # fmt: skip
    assert parse_argv(["--quiet", "--depth=3", "s", "d"]) == {
        "quiet": True,
        "depth": 3,
        "src": "s",
        "directory": "d",
    }
    for bad in ([], ["a", "b", "c"], ["--help"], ["-h", "s"], ["--nope", "s"], ["s", "-b"],
                ["--depth", "0", "s"], ["--depth=x", "s"], ["s", "--depth"]):  # fmt: skip
        assert parse_argv(bad) is None, bad


def test_a_clone_starts_without_typer(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "from gitxet.cli.entry import main\n"
        "sys.argv = ['git-xet', 'clone', sys.argv[1]]\n"
        "try:\n"
        "    main()\n"
        "except SystemExit as e:\n"
        "    print('typer' in sys.modules, e.code)\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "nothing-here")],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert r.stdout.split() == ["False", "4"], r  # exit 4: not found, as the full CLI says
    assert "no repository at" in r.stderr and "Traceback" not in r.stderr
    # a usage error still goes to the full CLI, which names the problem
    r = subprocess.run(
        [sys.executable, "-m", "gitxet", "clone", "--nope", "x"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert r.returncode == 2 and "--nope" in r.stderr and "Traceback" not in r.stderr


def test_the_plain_http_probe_knows_a_gitxet_challenge_and_nothing_else() -> None:
    import http.server
    import threading

    answers = {"/x.git": (401, 'Basic realm="gitxet"'), "/y.git": (401, 'Basic realm="other"')}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            status, challenge = answers.get(self.path.split("/info/refs")[0], (404, ""))
            assert self.path.endswith("/info/refs?service=git-upload-pack")
            assert "Authorization" not in self.headers  # anonymous
            self.send_response(status)
            if challenge:
                self.send_header("WWW-Authenticate", challenge)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        base = f"http://127.0.0.1:{srv.server_address[1]}"
        assert plain_http_probe(f"{base}/x.git") is True
        assert plain_http_probe(f"{base}/y.git") is False
        assert plain_http_probe(f"{base}/z.git") is False
        assert plain_http_probe("http://127.0.0.1:9/x.git") is False  # nothing listens
        assert plain_http_probe(f"https://127.0.0.1:{srv.server_address[1]}/x.git") is None
        assert plain_http_probe("http://u:p@127.0.0.1:9/x.git") is None
    finally:
        srv.shutdown()
        srv.server_close()
