"""Installing and removing the filter.xet.* config: exact, recorded, reversible."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from gitxet.errors import ConfigError
from gitxet.git import config as gc
from gitxet.git import process as gp

Git = Callable[..., str]

EXPECTED = {
    "filter.xet.process": "git-xet filter-process",
    "filter.xet.required": "true",
    "filter.xet.clean": "git-xet clean -- %f",
    "filter.xet.smudge": "git-xet smudge -- %f",
}


def local_keys(repo: Path) -> dict[str, list[str]]:
    pairs = gp.config_get_regexp(repo, r"^(filter\.xet|gitxet)\.", "local")
    out: dict[str, list[str]] = {}
    for k, v in pairs:
        out.setdefault(k, []).append(v)
    return out


def test_filter_settings_defaults_and_derived_program() -> None:
    assert gc.filter_settings() == EXPECTED
    derived = gc.filter_settings("/opt/py/bin/python -m gitxet filter-process")
    assert derived["filter.xet.clean"] == "/opt/py/bin/python -m gitxet clean -- %f"
    assert derived["filter.xet.smudge"] == "/opt/py/bin/python -m gitxet smudge -- %f"
    custom = gc.filter_settings("xet-proc", clean_cmd="c %f", smudge_cmd="s %f")
    assert (custom["filter.xet.clean"], custom["filter.xet.smudge"]) == ("c %f", "s %f")
    with pytest.raises(ConfigError):
        gc.filter_settings("two\nlines")
    with pytest.raises(ConfigError):
        gc.filter_settings("  ")


def test_install_local_writes_exact_keys_and_record(git_repo: Path) -> None:
    assert not gc.is_installed("local", git_repo)
    report = gc.install("local", git_repo)
    assert report.written == list(EXPECTED) and report.unchanged == []
    keys = local_keys(git_repo)
    assert {k: v[0] for k, v in keys.items() if k.startswith("filter.")} == EXPECTED
    assert sorted(keys[gc.RECORD_KEY]) == sorted(f"{k} {v}" for k, v in EXPECTED.items())
    assert gc.is_installed("local", git_repo)
    assert gc.installed("local", git_repo) == EXPECTED
    # git itself sees the driver.
    assert gp.config_get(git_repo, "filter.xet.required") == "true"


def test_install_is_idempotent(git_repo: Path) -> None:
    gc.install("local", git_repo)
    before = (git_repo / ".git" / "config").read_bytes()
    report = gc.install("local", git_repo)
    assert report.written == [] and report.unchanged == list(EXPECTED)
    assert (git_repo / ".git" / "config").read_bytes() == before


def test_uninstall_removes_exactly_what_was_written(git_repo: Path) -> None:
    original = (git_repo / ".git" / "config").read_text()
    gp.config_set(git_repo, "filter.xet.extra", "user setting")
    gp.config_set(git_repo, "core.editor", "vi")
    gc.install("local", git_repo)
    report = gc.uninstall("local", git_repo)
    assert sorted(report.removed) == sorted(EXPECTED) and report.kept == []
    assert local_keys(git_repo) == {"filter.xet.extra": ["user setting"]}
    assert gp.config_get(git_repo, "core.editor") == "vi"
    gp.config_unset(git_repo, "filter.xet.extra")
    gp.config_unset(git_repo, "core.editor")
    gp.config_remove_empty_section(git_repo, "core.editor")
    assert "xet" not in (git_repo / ".git" / "config").read_text()
    assert gc.uninstall("local", git_repo).removed == []  # nothing left: a no-op
    assert "[core]" in original


def test_user_value_that_matched_is_not_removed(git_repo: Path) -> None:
    gp.config_set(git_repo, "filter.xet.required", "true")  # the user set it first
    report = gc.install("local", git_repo)
    assert "filter.xet.required" in report.unchanged
    gc.uninstall("local", git_repo)
    assert local_keys(git_repo) == {"filter.xet.required": ["true"]}


def test_key_changed_after_install_is_kept(git_repo: Path) -> None:
    gc.install("local", git_repo)
    gp.config_set(git_repo, "filter.xet.process", "my-own-filter")
    gp.config_unset(git_repo, "filter.xet.smudge")  # deleted by hand: neither removed nor kept
    assert "filter.xet.process" not in gc.installed("local", git_repo)
    report = gc.uninstall("local", git_repo)
    assert report.kept == ["filter.xet.process"]
    assert sorted(report.removed) == ["filter.xet.clean", "filter.xet.required"]
    assert local_keys(git_repo) == {"filter.xet.process": ["my-own-filter"]}


def test_conflict_refuses_without_changing_anything(git_repo: Path) -> None:
    gp.config_set(git_repo, "filter.xet.clean", "other-tool clean %f")
    before = (git_repo / ".git" / "config").read_bytes()
    with pytest.raises(ConfigError, match=r"filter\.xet\.clean"):
        gc.install("local", git_repo)
    assert (git_repo / ".git" / "config").read_bytes() == before
    report = gc.install("local", git_repo, force=True)
    assert "filter.xet.clean" in report.written
    gc.uninstall("local", git_repo)
    assert local_keys(git_repo) == {}


def test_reinstall_with_new_command_upgrades_our_keys(git_repo: Path) -> None:
    gc.install("local", git_repo)
    report = gc.install("local", git_repo, "python -m gitxet filter-process")
    assert sorted(report.written) == [
        "filter.xet.clean",
        "filter.xet.process",
        "filter.xet.smudge",
    ]
    assert gc.installed("local", git_repo)["filter.xet.clean"] == "python -m gitxet clean -- %f"
    assert len(local_keys(git_repo)[gc.RECORD_KEY]) == 4
    assert sorted(gc.uninstall("local", git_repo).removed) == sorted(EXPECTED)
    assert local_keys(git_repo) == {}


def test_multi_valued_user_key_is_a_conflict(git_repo: Path) -> None:
    gp.config_add(git_repo, "filter.xet.process", "a")
    gp.config_add(git_repo, "filter.xet.process", "b")
    with pytest.raises(ConfigError):
        gc.install("local", git_repo)
    gc.install("local", git_repo, force=True)
    assert gp.config_get_all(git_repo, "filter.xet.process") == ["git-xet filter-process"]


def test_global_scope(sealed_git_env: Path, git_repo: Path) -> None:
    gc.install("global", None)
    text = (sealed_git_env / ".gitconfig").read_text()
    assert "process = git-xet filter-process" in text
    assert gc.is_installed("global") and not gc.is_installed("local", git_repo)
    # The repository sees the global driver through git's merged view.
    assert gp.config_get(git_repo, "filter.xet.process") == "git-xet filter-process"
    gc.uninstall("global")
    text = (sealed_git_env / ".gitconfig").read_text()
    assert "[filter" not in text and "[gitxet]" not in text and "name = Gitxet Test" in text


def test_local_scope_needs_a_repo() -> None:
    with pytest.raises(ConfigError, match="repository"):
        gc.install("local")
    with pytest.raises(ConfigError, match="repository"):
        gc.uninstall("local")


def test_credential_helper_is_added_after_others_and_removed_alone(git_repo: Path) -> None:
    gp.config_add(git_repo, "credential.helper", "store", "local")
    assert gc.install_credential_helper("local", git_repo, "!git-xet credential")
    assert gp.config_get_all(git_repo, "credential.helper", "local") == [
        "store",
        "!git-xet credential",
    ]
    assert not gc.install_credential_helper("local", git_repo, "!git-xet credential")
    # a new program path replaces our old value, never the user's
    assert gc.install_credential_helper("local", git_repo, "!/opt/py -m gitxet credential")
    assert gp.config_get_all(git_repo, "credential.helper", "local") == [
        "store",
        "!/opt/py -m gitxet credential",
    ]
    gp.config_add(git_repo, "credential.helper", "cache", "local")  # the user adds one later
    assert gc.installed("local", git_repo)["credential.helper"] == "!/opt/py -m gitxet credential"
    report = gc.uninstall("local", git_repo)
    assert "credential.helper" in report.removed
    assert gp.config_get_all(git_repo, "credential.helper", "local") == ["store", "cache"]


def test_a_helper_the_user_set_is_never_removed(git_repo: Path) -> None:
    gp.config_add(git_repo, "credential.helper", "!git-xet credential", "local")
    assert not gc.install_credential_helper("local", git_repo, "!git-xet credential")
    gc.uninstall("local", git_repo)
    assert gp.config_get_all(git_repo, "credential.helper", "local") == ["!git-xet credential"]
