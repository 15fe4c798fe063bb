"""Every user mistake: one line (plus at most a hint), the documented exit code, no traceback,
no internal git command line, no token (issue 19; docs/cli.md "Exit codes").

Each case runs the real ``git-xet`` program against real repositories, a real server on
127.0.0.1 and a port nothing listens on.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gitxet.server.auth import TokenStore
from gitxet.server.run import BackgroundServer, ServerConfig

pytestmark = pytest.mark.timeout(300)

SECRET = "tok-SECRET-never-shown-0123456789"
OK, ERROR, USAGE, INTEGRITY, NOT_FOUND, DENIED = 0, 1, 2, 3, 4, 5


@dataclass(frozen=True)
class Case:
    name: str
    args: tuple[str, ...]
    cwd: str  # a key of the scenario's directories
    code: int
    says: str = ""  # a fragment the first line must hold
    env: tuple[tuple[str, str], ...] = ()  # added to the environment


def _git_config(key: str, value: str) -> tuple[tuple[str, str], ...]:
    """A git config key for one command, through git's environment (as ``git -c``)."""
    return (("GIT_CONFIG_COUNT", "1"), ("GIT_CONFIG_KEY_0", key), ("GIT_CONFIG_VALUE_0", value))


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def git(*args: str, cwd: Path) -> None:
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


@pytest.fixture
def scene(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    """Directories the cases run in, and a real server with a token."""
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    remote = tmp_path / "remote.git"
    work = tmp_path / "work"
    git("init", "-q", "--bare", str(remote), cwd=tmp_path)
    git("init", "-q", str(work), cwd=tmp_path)
    git("remote", "add", "origin", str(remote), cwd=work)
    subprocess.run(["git-xet", "init"], cwd=work, check=True, capture_output=True, timeout=60)
    (work / "big.bin").write_bytes(os.urandom(300_000))
    (work / "small.txt").write_text("hello\n")
    git("add", ".", cwd=work)
    git("commit", "-q", "-m", "one", cwd=work)
    git("push", "-q", "origin", "main", cwd=work)
    # a clone whose file's data is nowhere: the store and the remote's store are emptied
    orphan = tmp_path / "orphan"
    git("clone", "-q", "-c", "xet.lazy=true", str(remote), str(orphan), cwd=tmp_path)
    git("remote", "remove", "origin", cwd=orphan)
    # a lazy clone whose remote is a server that is down: its data may be there, not "missing"
    behind = tmp_path / "behind"
    git("clone", "-q", "-c", "xet.lazy=true", str(remote), str(behind), cwd=tmp_path)
    down = f"http://user:{SECRET}@127.0.0.1:{_closed_port()}/data.git"
    git("remote", "set-url", "origin", down, cwd=behind)
    damaged = tmp_path / "damaged"
    subprocess.run(["git-xet", "clone", str(remote), str(damaged)], cwd=tmp_path, check=True)
    xorbs = [p for p in (damaged / ".git" / "xet" / "xorbs").rglob("*") if p.is_file()]
    assert xorbs
    for xorb in xorbs:
        raw = bytearray(xorb.read_bytes())
        raw[100] ^= 0xFF
        xorb.unlink()  # it may be a hard link to the remote's xorb
        xorb.write_bytes(bytes(raw))
    badcfg = tmp_path / "badcfg"  # a committed threshold that is not a size
    git("init", "-q", str(badcfg), cwd=tmp_path)
    subprocess.run(["git-xet", "init"], cwd=badcfg, check=True, capture_output=True, timeout=60)
    (badcfg / ".xetconfig").write_text("[xet]\n\tthreshold = abc\n")
    (badcfg / "big.bin").write_bytes(os.urandom(300_000))
    unborn = tmp_path / "unborn"
    git("init", "-q", str(unborn), cwd=tmp_path)
    plain = tmp_path / "plain"  # a repository without gitxet
    git("init", "-q", str(plain), cwd=tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    (tmp_path / "mnt").mkdir()
    full = tmp_path / "full"
    full.mkdir()
    (full / "keep.txt").write_text("mine\n")
    root = tmp_path / "srv"
    ts = TokenStore(str(root))
    write, _ = ts.create("write")
    monkeypatch.setenv("GITXET_TOKEN", write)  # must never be printed
    with BackgroundServer(ServerConfig(root=str(root), port=0)) as srv:
        yield {
            "work": str(work),
            "orphan": str(orphan),
            "damaged": str(damaged),
            "unborn": str(unborn),
            "badcfg": str(badcfg),
            "plain": str(plain),
            "outside": str(outside),
            "tmp": str(tmp_path),
            "mnt": str(tmp_path / "mnt"),
            "full": str(full),
            "behind": str(behind),
            "down": down,
            "server": srv.url,
            "srvroot": str(root),
            "write": write,
        }


#: A 100 KB argument: an error shows it cut (its start and end), never whole
LONG = "L" * 100_000

CASES = [
    Case("add a 100 KB path", ("add", LONG), "work", NOT_FOUND, "L" * 100),
    Case("push to a 100 KB remote name", ("push", LONG), "work", NOT_FOUND, "more characters"),
    Case("checkout a 100 KB path", ("checkout", LONG), "work", NOT_FOUND, "more characters"),
    Case("fsck a 100 KB extra argument", ("fsck", LONG), "work", USAGE, "more characters"),
    Case(
        "fetch from a remote that does not exist",
        ("fetch", "nosuch"),
        "work",
        NOT_FOUND,
        "no remote named 'nosuch'",
    ),
    Case(
        "checkout a path that is not there",
        ("checkout", "missing.bin"),
        "work",
        NOT_FOUND,
        "missing.bin",
    ),
    Case("dematerialize a path that is not there", ("dematerialize", "nope"), "work", NOT_FOUND),
    Case(
        "unmount what is not mounted",
        ("unmount", "/not/mounted"),
        "work",
        NOT_FOUND,
        "no gitxet mount at /not/mounted",
    ),
    Case("unmount another filesystem", ("unmount", "/proc"), "work", NOT_FOUND, "proc"),
    Case("status outside a repository", ("status",), "outside", USAGE, "not a git repository"),
    Case("ls-files outside a repository", ("ls-files",), "outside", USAGE, "not a git repository"),
    Case("fetch outside a repository", ("fetch",), "outside", USAGE, "not a git repository"),
    Case("init outside a repository", ("init",), "outside", USAGE, "'git init' makes one"),
    Case(
        "warmup a path the commit lacks",
        ("warmup", "{work}", "HEAD", "nosuch"),
        "tmp",
        NOT_FOUND,
        "git-xet: not found: /nosuch: no such file",
    ),
    Case("status before the first commit", ("status",), "unborn", OK),
    Case("ls-files before the first commit", ("ls-files",), "unborn", OK),
    Case(
        "ls-files of a revision that does not exist",
        ("ls-files", "nosuchrev"),
        "work",
        NOT_FOUND,
        "nosuchrev",
    ),
    Case(
        "mount a server that is down",
        ("mount", "{down}", "main", "{mnt}"),
        "work",
        ERROR,
        "cannot reach",
    ),
    Case("push to a server that is down", ("push", "{down}"), "work", ERROR, "cannot reach"),
    Case("fetch from a server that is down", ("fetch",), "behind", ERROR, "cannot reach"),
    Case(
        "checkout from a server that is down",
        ("checkout", "big.bin"),
        "behind",
        ERROR,
        "cannot reach",
    ),
    Case("fsck with the server that has the data down", ("fsck",), "behind", ERROR, "asked"),
    Case("warm up a server that is down", ("warmup", "{down}", "main"), "work", ERROR),
    Case(
        "mount over a directory with files",
        ("mount", ".", "main", "{full}"),
        "work",
        USAGE,
        "--nonempty",
    ),
    Case(
        "mount a revision that does not exist",
        ("mount", ".", "nosuchrev", "{mnt}"),
        "work",
        NOT_FOUND,
        "nosuchrev",
    ),
    Case(
        "mount a repository that does not exist",
        ("mount", "/no/such/repo", "main", "{mnt}"),
        "work",
        NOT_FOUND,
    ),
    Case(
        "mount a subdirectory that does not exist",
        ("mount", ".", "main", "{mnt}", "--subdir", "nosuch"),
        "work",
        NOT_FOUND,
        "nosuch",
    ),
    Case(
        "mount a server repository that does not exist",
        ("mount", "{server}/nosuch.git", "main", "{mnt}"),
        "work",
        NOT_FOUND,
    ),
    Case(
        "push to a remote that does not exist",
        ("push", "nosuch"),
        "work",
        NOT_FOUND,
        "no remote named",
    ),
    Case("pull from a remote that does not exist", ("pull", "nosuch"), "work", NOT_FOUND),
    Case("push with no remote", ("push",), "unborn", USAGE, "no remote"),
    Case("add without init", ("add", "x"), "plain", USAGE, "git xet init"),
    Case("add a file that does not exist", ("add", "nosuch.bin"), "work", NOT_FOUND, "nosuch.bin"),
    Case(
        "clone a repository that does not exist",
        ("clone", "/no/such/repo.git", "{tmp}/c"),
        "tmp",
        NOT_FOUND,
    ),
    Case("hash a file that does not exist", ("hash", "nosuch"), "work", NOT_FOUND),
    Case("a command that does not exist", ("bogus",), "work", USAGE, "bogus"),
    Case("an option that does not exist", ("status", "--bogus"), "work", USAGE, "--bogus"),
    Case("a missing argument", ("mount",), "work", USAGE),
    Case("checkout data no remote has", ("checkout",), "orphan", NOT_FOUND, "big.bin"),
    Case("fsck of a damaged store", ("fsck",), "damaged", INTEGRITY, "damaged"),
    Case(
        "revoke a token that does not exist",
        ("token", "revoke", "--root", "{srvroot}", "nosuch"),
        "work",
        NOT_FOUND,
    ),
    Case(
        "serve on a port out of range",
        ("serve", "--root", "{tmp}/srv2", "--port", "99999"),
        "work",
        USAGE,
        "--port",
    ),
    Case(
        "serve a --cache-size without --upstream (a server keeps no cache)",
        ("serve", "--root", "{tmp}/srv2", "--port", "0", "--cache-size", "abc"),
        "work",
        USAGE,
        "--cache-size is for a cache tier",
    ),
    Case(
        "serve a --root that is a file",
        ("serve", "--root", "{work}/big.bin", "--port", "0"),
        "work",
        USAGE,
        "is not a directory",
    ),
    Case(
        "create a token under a --root that is a file",
        ("token", "create", "--root", "{work}/big.bin"),
        "work",
        USAGE,
        "is not a directory",
    ),
    Case("untrack a pattern that is no rule", ("untrack", "nosuch*"), "work", ERROR, "nosuch"),
    Case("log in with a wrong token", ("login", "--token-stdin", "{server}/x.git"), "work", DENIED),
    Case(
        "log in with the server's URL, not a repository's",
        ("login", "--token-stdin", "{server}"),
        "work",
        USAGE,
        "NAME.git",
    ),
    # a malformed setting is said by gitxet before git runs the filter (which said it and
    # then git: 'fatal: the remote end hung up unexpectedly'), or clones
    Case(
        "add with a cache size that is not a size",
        ("add", "big.bin"),
        "work",
        ERROR,
        "not a size: 'abc'",
        (("GITXET_CACHE_SIZE", "abc"),),
    ),
    Case(
        "add with GITXET_LAZY not a boolean",
        ("add", "big.bin"),
        "work",
        ERROR,
        "GITXET_LAZY",
        (("GITXET_LAZY", "maybe"),),
    ),
    Case(
        "add with xet.lazy not a boolean",
        ("add", "big.bin"),
        "work",
        ERROR,
        "xet.lazy: 'maybe' is not a boolean",
        _git_config("xet.lazy", "maybe"),
    ),
    Case(
        "clone with GITXET_LAZY not a boolean",
        ("clone", "{work}", "{tmp}/lazyclone"),
        "tmp",
        ERROR,
        "GITXET_LAZY",
        (("GITXET_LAZY", "maybe"),),
    ),
    Case(
        "prune with a negative xet.recentRefsDays",
        ("prune", "--dry-run"),
        "work",
        ERROR,
        "xet.recentRefsDays: not a number of days (0 or more): '-5'",
        _git_config("xet.recentRefsDays", "-5"),
    ),
]


def _fill(arg: str, dirs: dict[str, str]) -> str:
    return arg.format(**dirs) if "{" in arg else arg


def _check(case: Case, scene: dict[str, str]) -> str | None:
    """None if ``case`` behaves as documented, else what went wrong."""
    args = [_fill(a, scene) for a in case.args]
    stdin = "wrong-token\n" if case.args[0] == "login" else ""
    r = subprocess.run(
        ["git-xet", *args],
        cwd=scene[case.cwd],
        capture_output=True,
        text=True,
        input=stdin,
        timeout=120,
        env={**os.environ, **dict(case.env)},
    )
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    out = r.stderr + r.stdout
    problems = []
    if r.returncode != case.code:
        problems.append(f"exit {r.returncode}, documented {case.code}")
    if "Traceback" in out or "failed (128)" in out or "internal error" in out:
        problems.append("a traceback or internals")
    if SECRET in out or scene["write"] in out:
        problems.append("a token")
    if len(r.stderr) > 2000:
        problems.append(f"{len(r.stderr)} characters")
    if case.code != OK:
        if not 1 <= len(lines) <= 2 or not lines[0].startswith("git-xet: "):
            problems.append(f"{len(lines)} lines")
        elif len(lines) == 2 and not lines[1].startswith("hint: "):
            problems.append("a second line that is not a hint")
        elif case.says not in lines[0]:
            problems.append(f"no {case.says!r}")
    if not problems:
        return None
    return f"{case.name}: {'; '.join(problems)}\n  stderr: {r.stderr.strip()}"


def test_every_mistake_says_one_line_and_its_code(scene: dict[str, str]) -> None:
    failures = [f for f in (_check(c, scene) for c in CASES) if f]
    assert not failures, "\n".join(failures)
    assert not os.path.exists(os.path.join(scene["tmp"], "lazyclone"))  # refused before git


#: Commands that run git for the user: git prints its own message (docs/cli.md "Exit
#: codes"), the exit is 1, and still no traceback, internals or token.
GIT_CASES = [
    Case("clone from a server that is down", ("clone", "{down}", "{tmp}/c2"), "tmp", ERROR),
    Case("pull from a server that is down", ("pull",), "behind", ERROR),
    Case(
        "add under a .xetconfig whose threshold is not a size", ("add", "big.bin"), "badcfg", ERROR
    ),
]


def test_commands_running_git_fail_with_gits_message(scene: dict[str, str]) -> None:
    for case in GIT_CASES:
        args = [_fill(a, scene) for a in case.args]
        r = subprocess.run(
            ["git-xet", *args], cwd=scene[case.cwd], capture_output=True, text=True, timeout=120
        )
        out = r.stderr + r.stdout
        assert r.returncode == case.code, f"{case.name}: {r.returncode}\n{r.stderr}"
        assert r.stderr.strip().splitlines()[-1].startswith("fatal: "), r.stderr
        assert "Traceback" not in out and "internal error" not in out, r.stderr
        assert SECRET not in out and scene["write"] not in out, r.stderr


def test_every_documented_code_is_exercised() -> None:
    """The table in docs/cli.md names these codes; each has a case here."""
    assert {c.code for c in CASES} == {OK, ERROR, USAGE, INTEGRITY, NOT_FOUND, DENIED}


def test_no_arguments_show_the_help_and_help_takes_a_command(tmp_path: Path) -> None:
    """``git xet`` and ``git xet token`` alone print their help and exit 2 with nothing
    else on stderr (they used to add an empty 'git-xet: ' line and a hint); ``git xet help
    [COMMAND...]`` is ``--help`` (it was 'No such command')."""
    env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    for args, usage in (
        ((), "Usage: git-xet [OPTIONS] COMMAND"),
        (("token",), "Usage: git-xet token"),
    ):
        r = subprocess.run(
            ["git-xet", *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
        )
        assert r.returncode == USAGE and usage in r.stdout, (r.stdout, r.stderr)
        assert r.stderr.strip() == "", r.stderr
    for args, usage in (
        (("help",), "Usage: git-xet [OPTIONS] COMMAND"),
        (("help", "mount"), "Usage: git-xet mount"),
        (("help", "token", "create"), "Usage: git-xet token create"),
    ):
        r = subprocess.run(
            ["git-xet", *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
        )
        assert r.returncode == OK and usage in r.stdout, (args, r.stdout, r.stderr)
