"""Plain git against a real `git xet serve` on loopback, authenticated by gitxet's credential
helper: after `git xet install` + `git xet login URL` (or with GITXET_TOKEN set), `git clone`,
`git fetch` and `git push` need no token in the URL and never prompt; with neither, git fails
with one line naming `git xet login`. The keyring is a file backend the test sets up."""

from __future__ import annotations

import base64
import os
import random
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gitxet.server.auth import TokenStore
from gitxet.server.run import BackgroundServer, ServerConfig
from tests.helpers.keyring_backends import FileKeyring
from tests.helpers.secrets import assert_token_nowhere

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def srv(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, file_keyring: FileKeyring
) -> Iterator[tuple[str, str]]:
    """(repo URL without credentials, write token); git-xet on PATH, installed globally."""
    root = tmp_path / "srv"
    write, _ = TokenStore(str(root)).create("write")
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    monkeypatch.setenv("GITXET_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("GITXET_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("GIT_TERMINAL_PROMPT", "0")
    monkeypatch.delenv("GIT_ASKPASS", raising=False)  # conftest's `true` would answer empty
    run("git-xet", "install", cwd=tmp_path)
    with BackgroundServer(ServerConfig(root=str(root), port=0)) as s:
        yield f"{s.url}/data.git", write


def run(
    *args: str,
    cwd: Path,
    env: dict[str, str] | None = None,
    check: bool = True,
    stdin: str | None = None,
) -> subprocess.CompletedProcess[str]:
    full = dict(os.environ)
    full.update(env or {})
    r = subprocess.run(
        list(args), cwd=cwd, env=full, capture_output=True, text=True, timeout=240, input=stdin
    )
    if check and r.returncode != 0:
        raise AssertionError(f"{args}: {r.returncode}\n{r.stdout}\n{r.stderr}")
    return r


def _make_work(tmp_path: Path, url: str) -> tuple[Path, bytes]:
    work = tmp_path / "work"
    run("git", "init", "-q", str(work), cwd=tmp_path)
    run("git-xet", "init", cwd=work)
    big = random.Random(7).randbytes(2 << 20)
    (work / "big.bin").write_bytes(big)
    run("git-xet", "add", ".", cwd=work)
    run("git", "commit", "-qm", "v1", cwd=work)
    run("git", "remote", "add", "origin", url, cwd=work)
    return work, big


def test_login_makes_plain_git_work(srv: tuple[str, str], tmp_path: Path) -> None:
    url, token = srv
    assert (
        "git-xet credential"
        in run("git", "config", "--global", "credential.helper", cwd=tmp_path).stdout
    )
    work, big = _make_work(tmp_path, url)
    # neither a login nor GITXET_TOKEN: git fails at once, with one line naming the fix
    r = run("git", "push", "-q", "origin", "main", cwd=work, check=False)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    hints = [ln for ln in r.stderr.splitlines() if "git xet login" in ln]
    assert len(hints) == 1, r.stderr
    assert url.rsplit("/", 1)[0] in hints[0]

    login = run("git-xet", "login", url, "--token-stdin", cwd=tmp_path, stdin=token + "\n")
    run("git", "push", "-q", "origin", "main", cwd=work)  # git and the pre-push upload
    clone = tmp_path / "clone"
    r = run("git", "clone", "-q", url, str(clone), cwd=tmp_path)
    assert (clone / "big.bin").read_bytes() == big  # smudged with the keyring's token

    (work / "more.txt").write_text("v2\n")
    run("git", "add", "more.txt", cwd=work)
    run("git", "commit", "-qm", "v2", cwd=work)
    run("git", "push", "-q", "origin", "main", cwd=work)
    fetched = run("git", "fetch", "-q", "origin", cwd=clone)
    head = run("git", "rev-parse", "origin/main", cwd=clone).stdout
    assert head == run("git", "rev-parse", "main", cwd=work).stdout
    assert_token_nowhere(
        token,
        paths=[clone / ".git" / "config", work / ".git" / "config", tmp_path / "state"],
        texts=[login.stdout, login.stderr, r.stderr, fetched.stderr],
        cwd=clone,
    )


def test_gitxet_token_makes_plain_git_work(srv: tuple[str, str], tmp_path: Path) -> None:
    url, token = srv
    env = {"GITXET_TOKEN": token}
    work, big = _make_work(tmp_path, url)
    pushed = run("git", "push", "-q", "origin", "main", cwd=work, env=env)
    clone = tmp_path / "clone"
    cloned = run("git", "clone", "-q", url, str(clone), cwd=tmp_path, env=env)
    assert (clone / "big.bin").read_bytes() == big
    run("git", "fetch", "-q", "origin", cwd=clone, env=env)
    # a wrong token: git fails, never prompts, no traceback
    r = run(
        "git", "fetch", "-q", "origin", cwd=clone, env={"GITXET_TOKEN": "gxt_nope"}, check=False
    )
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert_token_nowhere(
        token,
        paths=[clone / ".git" / "config", tmp_path / "state"],
        texts=[pushed.stderr, cloned.stderr],
        env={**os.environ, **env},
        cwd=clone,
    )


def test_token_hosts_keep_gitxet_token_from_servers_they_do_not_name(
    srv: tuple[str, str], tmp_path: Path
) -> None:
    """GITXET_TOKEN_HOSTS binds the CI token: a server it leaves out (a submodule's, say)
    gets no token from git's helper nor from the filters, and git says which variable."""
    url, token = srv
    work, big = _make_work(tmp_path, url)
    host = url.split("/")[2]  # 127.0.0.1:PORT
    elsewhere = {"GITXET_TOKEN": token, "GITXET_TOKEN_HOSTS": "data.example.org"}
    r = run("git", "push", "-q", "origin", "main", cwd=work, env=elsewhere, check=False)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    hints = [ln for ln in r.stderr.splitlines() if "GITXET_TOKEN_HOSTS" in ln]
    assert len(hints) == 1 and host in hints[0], r.stderr
    named = {"GITXET_TOKEN": token, "GITXET_TOKEN_HOSTS": f"data.example.org,{host}"}
    run("git", "push", "-q", "origin", "main", cwd=work, env=named)
    clone = tmp_path / "clone"
    run("git", "clone", "-q", url, str(clone), cwd=tmp_path, env=named)
    assert (clone / "big.bin").read_bytes() == big
    # the same host on another port is another server
    other_port = {"GITXET_TOKEN": token, "GITXET_TOKEN_HOSTS": "127.0.0.1:1"}
    r = run("git", "fetch", "-q", "origin", cwd=clone, env=other_port, check=False)
    assert r.returncode != 0 and "Traceback" not in r.stderr


def test_helper_says_nothing_for_other_hosts(srv: tuple[str, str], tmp_path: Path) -> None:
    url, token = srv
    env = {"GITXET_TOKEN": token}
    # a host that is not a gitxet server (here: nothing listens) gets no token and no hint
    other = run(
        "git-xet", "credential", "get", cwd=tmp_path, env=env,
        stdin="protocol=http\nhost=127.0.0.1:9\npath=x.git\n\n",
    )  # fmt: skip
    assert (other.stdout, other.stderr) == ("", "")
    # ssh, or a description that already has a password: nothing either
    ssh = run(
        "git-xet", "credential", "get", cwd=tmp_path, env=env, stdin="protocol=ssh\nhost=h\n\n"
    )
    assert ssh.stdout == ""
    host = url.split("/")[2]
    ours = run(
        "git-xet", "credential", "get", cwd=tmp_path, env=env,
        stdin=f"protocol=http\nhost={host}\n\n",
    )  # fmt: skip
    assert ours.stdout == f"username=gitxet\npassword={token}\n\n"
    # store and erase change nothing and print nothing
    for action in ("store", "erase"):
        r = run(
            "git-xet", "credential", action, cwd=tmp_path, env=env,
            stdin=f"protocol=http\nhost={host}\nusername=gitxet\npassword={token}\n\n",
        )  # fmt: skip
        assert (r.stdout, r.stderr) == ("", "")
    # uninstall removes our helper and nothing else
    run("git", "config", "--global", "--add", "credential.helper", "cache", cwd=tmp_path)
    run("git-xet", "uninstall", cwd=tmp_path)
    helpers = run("git", "config", "--global", "--get-all", "credential.helper", cwd=tmp_path)
    assert helpers.stdout.splitlines() == ["cache"]


def test_git_xet_clone_authenticates_git_without_a_credential_round_trip(
    srv: tuple[str, str], tmp_path: Path
) -> None:
    """`git xet clone` with GITXET_TOKEN: git gets the token as a header for that URL, from
    the environment of its own process (no 401, no credential helper started)."""
    url, token = srv
    env = {"GITXET_TOKEN": token}
    work, big = _make_work(tmp_path, url)
    run("git", "push", "-q", "origin", "main", cwd=work, env=env)
    # git with no credential helper at all (an empty value clears the list), and no prompt:
    # only the header can authenticate it
    no_helper = {
        **env,
        "GIT_CONFIG_COUNT": "1",
        "GIT_CONFIG_KEY_0": "credential.helper",
        "GIT_CONFIG_VALUE_0": "",
    }
    plain = run("git", "clone", "-q", url, str(tmp_path / "plain"), cwd=tmp_path, env=no_helper,
                check=False)  # fmt: skip
    assert plain.returncode != 0  # the control: without the header, git cannot
    clone = tmp_path / "clone"
    cloned = run("git-xet", "clone", url, str(clone), cwd=tmp_path, env=no_helper)
    assert (clone / "big.bin").read_bytes() == big
    assert run("git", "status", "--porcelain", cwd=clone).stdout == ""
    basic = base64.b64encode(f"gitxet:{token}".encode()).decode()
    config = (clone / ".git" / "config").read_text()
    assert basic not in config and basic not in cloned.stderr
    assert_token_nowhere(
        token,
        paths=[clone / ".git" / "config", tmp_path / "state"],
        texts=[cloned.stdout, cloned.stderr],
        env={**os.environ, **env},
        cwd=clone,
    )


def test_a_plugin_never_resolves_a_volume_with_its_own_gitxet_token(
    srv: tuple[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The Docker and CSI plugins keep their GITXET_TOKEN from their volumes (a volume brings
    # its own token), but the git metadata mirror ran git with the plugin's environment,
    # and git's credential helper answered with that token: a volume without a token
    # resolved (the repo's refs were read with the plugin's authority), then its daemon
    # failed. A volume without a token must be refused at once.
    from gitxet.cli._env import plugin_resolver
    from gitxet.errors import GitxetError
    from gitxet.plugins.mounter import MountSpec

    url, token = srv
    work, _ = _make_work(tmp_path, url)
    run("git", "push", "-q", "origin", "main", cwd=work, env={"GITXET_TOKEN": token})
    monkeypatch.setenv("GITXET_TOKEN", token)  # the plugin's own
    resolve = plugin_resolver(str(tmp_path / "plugin-cache"))
    with pytest.raises(GitxetError, match="asks for credentials and none were given"):
        resolve(MountSpec(repo=url, commit="main"))
    sha = run("git", "rev-parse", "main", cwd=work).stdout.strip()
    assert resolve(MountSpec(repo=url, commit="main", token=token)) == sha
