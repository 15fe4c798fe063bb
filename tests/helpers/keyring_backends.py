"""Keyring backends for tests, never the user's: one in memory, one in a JSON file.

The file backend is what subprocesses (git's credential helper, mount daemons) see: a test
writes ``$XDG_CONFIG_HOME/python_keyring/keyringrc.cfg`` naming it (:func:`use_file_keyring`),
and keyring loads it from this directory in every process that runs with that config home.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import keyring
import keyring.backend
import keyring.errors
import pytest


class MemoryKeyring(keyring.backend.KeyringBackend):
    """Entries in a dict, for one process."""

    priority = 1  # type: ignore[assignment]

    def __init__(self) -> None:
        super().__init__()
        self.items: dict[tuple[str, str], str] = {}

    def get_password(self, service: str, username: str) -> str | None:
        return self.items.get((service, username))

    def set_password(self, service: str, username: str, password: str) -> None:
        self.items[(service, username)] = password

    def delete_password(self, service: str, username: str) -> None:
        if self.items.pop((service, username), None) is None:
            raise keyring.errors.PasswordDeleteError(username)


class FileKeyring(keyring.backend.KeyringBackend):
    """Entries in ``$GITXET_TEST_KEYRING`` (JSON), shared by every process of a test."""

    priority = 1  # type: ignore[assignment]

    @property
    def path(self) -> str:
        return os.environ["GITXET_TEST_KEYRING"]

    def _load(self) -> dict[str, str]:
        try:
            with open(self.path, encoding="utf-8") as f:
                data: dict[str, str] = json.load(f)
                return data
        except FileNotFoundError:
            return {}

    def get_password(self, service: str, username: str) -> str | None:
        return self._load().get(f"{service}\0{username}")

    def set_password(self, service: str, username: str, password: str) -> None:
        data = self._load()
        data[f"{service}\0{username}"] = password
        tmp = self.path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(data, f)
        os.replace(tmp, self.path)

    def delete_password(self, service: str, username: str) -> None:
        data = self._load()
        if data.pop(f"{service}\0{username}", None) is None:
            raise keyring.errors.PasswordDeleteError(username)
        with open(self.path, "w", encoding="utf-8") as f:
            json.dump(data, f)


def use_file_keyring(monkeypatch: pytest.MonkeyPatch, where: Path) -> FileKeyring:
    """Make this process and every child (same ``XDG_CONFIG_HOME``) use a
    :class:`FileKeyring` under ``where``. Restore with :func:`keyring.set_keyring`."""
    config_home = Path(os.environ.get("XDG_CONFIG_HOME") or where / "config")
    cfg = config_home / "python_keyring"
    cfg.mkdir(parents=True, exist_ok=True)
    here = os.path.dirname(os.path.abspath(__file__))
    (cfg / "keyringrc.cfg").write_text(
        f"[backend]\ndefault-keyring=keyring_backends.FileKeyring\nkeyring-path={here}\n",
        encoding="utf-8",
    )
    monkeypatch.setenv("XDG_CONFIG_HOME", str(config_home))
    monkeypatch.setenv("GITXET_TEST_KEYRING", str(where / "keyring.json"))
    kr = FileKeyring()
    keyring.set_keyring(kr)
    return kr
