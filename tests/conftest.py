"""Test-wide fixtures: seal git (and gitxet) off from the host machine.

Every test runs with a private HOME and XDG directories, no system git config, a private
global git config that only sets an identity and the default branch, and none of the
``GIT_*`` / ``GITXET_*`` variables that leak in from a developer shell or from a git hook
running the suite (``GIT_DIR`` inside a hook would point every ``git`` call at the wrong
repository). The pattern follows git-lfs ``t/testenv.sh``.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

# The CI switch (a skipped FUSE/NFS/Docker test fails under CI=true), as conftest hooks.
from tests.helpers.ci import pytest_make_collect_report, pytest_runtest_makereport

# Subprocesses left running: named (with the test that started them) and stopped.
from tests.helpers.leaks import pytest_runtest_setup, pytest_sessionfinish

__all__ = [
    "pytest_make_collect_report",
    "pytest_runtest_makereport",
    "pytest_runtest_setup",
    "pytest_sessionfinish",
]
from tests.helpers.keyring_backends import FileKeyring, MemoryKeyring, use_file_keyring

GIT_IDENTITY = {"name": "Gitxet Test", "email": "test@gitxet.invalid"}

_GLOBAL_CONFIG = f"""\
[user]
\tname = {GIT_IDENTITY["name"]}
\temail = {GIT_IDENTITY["email"]}
[init]
\tdefaultBranch = main
[advice]
\tdetachedHead = false
[commit]
\tgpgSign = false
[tag]
\tgpgSign = false
[core]
\tautocrlf = false
\tfsmonitor = false
[protocol "file"]
\tallow = always
"""

# Variables we keep even though they match the prefixes below (none today; a hook for the
# future, e.g. GIT_TRACE when debugging a single test locally would be removed too).
_KEEP: frozenset[str] = frozenset()


def seal_git_env(monkeypatch: pytest.MonkeyPatch, home: Path) -> None:
    """Point git (and gitxet, and every process started after this) at a private ``home``
    with only the test identity as global config; drop every ``GIT_*``/``GITXET_*``
    variable. ``monkeypatch`` undoes it."""
    for name in list(os.environ):
        if (name.startswith(("GIT_", "GITXET_")) and name not in _KEEP) or name in (
            "EMAIL",
            "XDG_CONFIG_DIRS",
        ):
            monkeypatch.delenv(name, raising=False)

    for sub in (".config", ".cache", ".local/share", ".local/state"):
        (home / sub).mkdir(parents=True, exist_ok=True)
    global_config = home / ".gitconfig"
    global_config.write_text(_GLOBAL_CONFIG, encoding="utf-8")

    # Keyring: never the user's. Processes started by a test see a backend that stores
    # nothing; tests that need one use tests/helpers/keyring_backends.py.
    keyring_cfg = home / ".config" / "python_keyring"
    keyring_cfg.mkdir(parents=True, exist_ok=True)
    (keyring_cfg / "keyringrc.cfg").write_text(
        "[backend]\ndefault-keyring=keyring.backends.fail.Keyring\n", encoding="utf-8"
    )

    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / ".config"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(home / ".cache"))
    monkeypatch.setenv("XDG_DATA_HOME", str(home / ".local/share"))
    monkeypatch.setenv("XDG_STATE_HOME", str(home / ".local/state"))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(global_config))
    monkeypatch.setenv("GIT_TERMINAL_PROMPT", "0")
    monkeypatch.setenv("GIT_ASKPASS", "true")
    # Never walk up out of the temp area into a repository that happens to contain it.
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(home.parent.parent))
    # Stable, non-localized git messages for tests that match on stderr.
    monkeypatch.setenv("LC_ALL", "C")
    monkeypatch.setenv("LANGUAGE", "C")


@pytest.fixture(autouse=True)
def sealed_git_env(
    monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Path]:
    """Give each test a private HOME and a git config that cannot see the host's.

    Yields the private HOME. The global config file is ``$GIT_CONFIG_GLOBAL``
    (``HOME/.gitconfig``); tests may add to it with ``git config --global``.
    """
    # A separate directory (not tmp_path) so tests that list tmp_path never see it.
    home = tmp_path_factory.mktemp("home")
    seal_git_env(monkeypatch, home)
    import keyring
    import keyring.backends.fail

    old_keyring = keyring.get_keyring()
    keyring.set_keyring(keyring.backends.fail.Keyring())
    yield home
    keyring.set_keyring(old_keyring)


def _git(cwd: Path, *args: str) -> str:
    result = subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True)
    return result.stdout


@pytest.fixture
def memkeyring() -> Iterator[MemoryKeyring]:
    """An in-memory keyring for this process (the user's is never touched)."""
    import keyring

    kr = MemoryKeyring()
    keyring.set_keyring(kr)
    yield kr


@pytest.fixture
def file_keyring(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> FileKeyring:
    """A file keyring seen by this process and every process a test starts."""
    return use_file_keyring(monkeypatch, tmp_path)


@pytest.fixture
def git_repo(tmp_path: Path) -> Path:
    """An empty git repository (branch ``main``) at ``tmp_path / "repo"``."""
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    return repo


@pytest.fixture
def run_git_cmd() -> Callable[..., str]:
    """``run_git_cmd(cwd, *args) -> stdout``: run git in the sealed env, failing loudly."""
    return _git
