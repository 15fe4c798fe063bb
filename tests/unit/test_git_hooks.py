"""gitxet's git hooks: install/uninstall without clobbering user hooks, and real pushes."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from gitxet.errors import ConfigError, GitError, HookConflictError
from gitxet.git.hooks import (
    CHAINED_SUFFIX,
    HOOK_MARKER,
    HOOK_NAMES,
    RECEIPTS,
    PushRef,
    ensure_hook,
    hooks_dir,
    install_hooks,
    is_gitxet_hook,
    parse_pre_push_input,
    parse_pre_receive_input,
    render_hook,
    uninstall_hooks,
)

Git = Callable[..., str]
USER_HOOK = b"#!/bin/sh\necho user hook\n"


def test_render_substitutes_and_quotes_the_program() -> None:
    text = render_hook("pre-push")
    assert HOOK_MARKER in text.splitlines()
    assert text.startswith("#!/bin/sh\n")
    assert 'exec git-xet pre-push "$@"' in text
    assert "@" not in text.replace('"$@"', "")
    for program in ("'/opt/my tools/python' -m gitxet", ["/opt/my tools/python", "-m", "gitxet"]):
        spaced = render_hook("post-merge", program)
        assert "exec '/opt/my tools/python' -m gitxet post-merge \"$@\"" in spaced
        assert "command -v '/opt/my tools/python'" in spaced
    assert "exec python -m gitxet pre-push" in render_hook("pre-push", "python  -m gitxet")
    with pytest.raises(ConfigError):
        render_hook("pre-commit")
    with pytest.raises(ConfigError):
        render_hook("pre-push", "")
    with pytest.raises(ConfigError):
        render_hook("pre-push", "'unterminated")
    with pytest.raises(ConfigError):
        render_hook("pre-push", ["git-xet", "a\nb"])


def test_hook_scripts_are_valid_shell() -> None:
    for name in HOOK_NAMES:
        result = subprocess.run(["sh", "-n"], input=render_hook(name).encode(), check=False)
        assert result.returncode == 0, name


def test_install_update_uninstall(git_repo: Path) -> None:
    directory = hooks_dir(git_repo)
    assert directory == git_repo / ".git" / "hooks"
    changes = install_hooks(git_repo)
    assert [(c.name, c.action) for c in changes] == [(n, "created") for n in HOOK_NAMES]
    for name in HOOK_NAMES:
        path = directory / name
        assert is_gitxet_hook(path)
        assert os.access(path, os.X_OK)
    assert {c.action for c in install_hooks(git_repo)} == {"unchanged"}
    assert {c.action for c in install_hooks(git_repo, program="python -m gitxet")} == {"updated"}
    assert "python -m gitxet pre-push" in (directory / "pre-push").read_text()
    changes = uninstall_hooks(git_repo)
    assert {c.action for c in changes} == {"removed"}
    assert not any((directory / n).exists() for n in HOOK_NAMES)
    assert {c.action for c in uninstall_hooks(git_repo)} == {"absent"}


def test_user_hook_is_never_clobbered(git_repo: Path) -> None:
    directory = hooks_dir(git_repo)
    (directory / "post-merge").write_bytes(USER_HOOK)
    with pytest.raises(HookConflictError) as info:
        install_hooks(git_repo)
    assert info.value.hook == "post-merge"
    # All or nothing: the hooks before the conflicting one were not written either.
    assert not (directory / "pre-push").exists()
    assert (directory / "post-merge").read_bytes() == USER_HOOK
    changes = {c.name: c.action for c in uninstall_hooks(git_repo)}
    assert changes["post-merge"] == "foreign"
    assert (directory / "post-merge").read_bytes() == USER_HOOK
    assert not is_gitxet_hook(directory / "post-merge")
    assert not is_gitxet_hook(directory)  # a directory is not our hook either


def test_ensure_hook_creates_chains_and_never_writes_outside(
    git_repo: Path, tmp_path: Path
) -> None:
    directory = hooks_dir(git_repo)
    assert ensure_hook(git_repo).action == "created"
    assert ensure_hook(git_repo).action == "unchanged"
    (directory / "pre-push").unlink()
    (directory / "pre-push").write_bytes(USER_HOOK)
    assert ensure_hook(git_repo).action == "chained"
    assert (directory / ("pre-push" + CHAINED_SUFFIX)).read_bytes() == USER_HOOK
    # a user hook with one already parked: nothing written, the caller warns
    (directory / "pre-push").write_bytes(USER_HOOK)
    assert ensure_hook(git_repo).action == "foreign"
    assert (directory / "pre-push").read_bytes() == USER_HOOK
    # from a linked worktree: the shared hooks directory is inside the common git dir
    (directory / "pre-push").unlink()
    subprocess.run(["git", "commit", "-q", "--allow-empty", "-m", "x"], cwd=git_repo, check=True)
    wt = tmp_path / "wt"
    subprocess.run(["git", "worktree", "add", "-q", str(wt)], cwd=git_repo, check=True)
    assert ensure_hook(wt).action == "created"
    assert is_gitxet_hook(directory / "pre-push")
    # core.hooksPath outside the repository: left alone
    shared = tmp_path / "shared"
    subprocess.run(["git", "config", "core.hooksPath", str(shared)], cwd=git_repo, check=True)
    assert ensure_hook(git_repo).action == "foreign"
    assert not shared.exists()


def test_chain_moves_user_hook_aside_and_restores_it(git_repo: Path) -> None:
    directory = hooks_dir(git_repo)
    (directory / "pre-push").write_bytes(USER_HOOK)
    (directory / "pre-push").chmod(0o750)
    changes = {c.name: c.action for c in install_hooks(git_repo, on_conflict="chain")}
    assert changes == {"pre-push": "chained", "post-checkout": "created", "post-merge": "created"}
    assert (directory / ("pre-push" + CHAINED_SUFFIX)).read_bytes() == USER_HOOK
    assert is_gitxet_hook(directory / "pre-push")
    # A second user hook cannot be chained while the first is still parked.
    (directory / "post-merge").unlink()
    (directory / "post-merge").write_bytes(USER_HOOK)
    (directory / ("post-merge" + CHAINED_SUFFIX)).write_bytes(b"older")
    with pytest.raises(HookConflictError):
        install_hooks(git_repo, on_conflict="chain")
    (directory / ("post-merge" + CHAINED_SUFFIX)).unlink()
    changes = {c.name: c.action for c in uninstall_hooks(git_repo)}
    assert changes == {"pre-push": "restored", "post-checkout": "removed", "post-merge": "foreign"}
    assert (directory / "pre-push").read_bytes() == USER_HOOK
    assert (directory / "pre-push").stat().st_mode & 0o777 == 0o750
    assert not (directory / ("pre-push" + CHAINED_SUFFIX)).exists()


def test_chained_hook_restored_even_if_ours_was_deleted(git_repo: Path) -> None:
    directory = hooks_dir(git_repo)
    (directory / "post-checkout").write_bytes(USER_HOOK)
    install_hooks(git_repo, ["post-checkout"], on_conflict="chain")
    (directory / "post-checkout").unlink()
    assert [c.action for c in uninstall_hooks(git_repo, ["post-checkout"])] == ["restored"]
    assert (directory / "post-checkout").read_bytes() == USER_HOOK


def test_core_hooks_path_is_respected(git_repo: Path, run_git_cmd: Git) -> None:
    run_git_cmd(git_repo, "config", "core.hooksPath", "team-hooks")
    assert hooks_dir(git_repo) == git_repo / "team-hooks"
    install_hooks(git_repo, ["pre-push"])
    assert is_gitxet_hook(git_repo / "team-hooks" / "pre-push")


def test_parse_pre_push_input() -> None:
    a, b, z = "a" * 40, "b" * 40, "0" * 40
    data = (
        f"refs/heads/main {a} refs/heads/main {b}\n"
        f"(delete) {z} refs/heads/old {b}\n"
        f"refs/heads/new {a} refs/heads/new {z}\n"
        f"refs/tags/v1 {'c' * 64} refs/tags/v1 {'0' * 64}\n"
    ).encode()
    refs = parse_pre_push_input(data)
    assert refs[0] == PushRef("refs/heads/main", a, "refs/heads/main", b)
    assert refs[1].is_delete and not refs[1].is_new
    assert refs[2].is_new and not refs[2].is_delete
    assert refs[3].local_oid == "c" * 64
    assert parse_pre_push_input(b"") == []
    for bad in [
        f"refs/heads/main {a} refs/heads/main\n",
        f"refs/heads/main {a}  refs/heads/main {b}\n",
        f"refs/heads/main {'A' * 40} refs/heads/main {b}\n",
        f"refs/heads/main {a[:-1]} refs/heads/main {b}\n",
    ]:
        with pytest.raises(GitError):
            parse_pre_push_input(bad.encode())


def test_parse_pre_receive_input() -> None:
    a, z = "a" * 40, "0" * 40
    refs = parse_pre_receive_input(f"{z} {a} refs/heads/new\n{a} {z} refs/heads/gone\n".encode())
    assert [(r.ref, r.is_delete) for r in refs] == [
        ("refs/heads/new", False),
        ("refs/heads/gone", True),
    ]
    assert parse_pre_receive_input(b"") == []
    for bad in [f"{a} refs/heads/x\n", f"{a} {'g' * 40} refs/heads/x\n", f"{a}  {a} r\n"]:
        with pytest.raises(GitError):
            parse_pre_receive_input(bad.encode())


def test_the_receive_hook_is_installed_apart_from_the_client_set(git_repo: Path) -> None:
    (change,) = install_hooks(git_repo, ["pre-receive"], program=["/opt/x/python", "-m", "gitxet"])
    text = change.path.read_text()
    assert change.action == "created" and "/opt/x/python -m gitxet pre-receive" in text
    assert "pre-receive" not in HOOK_NAMES  # `git xet install` never puts it in a clone


# ---- the hooks under a real git push ------------------------------------------------------


@pytest.fixture
def pushable(git_repo: Path, run_git_cmd: Git, tmp_path: Path) -> Path:
    remote = tmp_path / "remote.git"
    run_git_cmd(tmp_path, "init", "-q", "--bare", str(remote))
    run_git_cmd(git_repo, "remote", "add", "origin", str(remote))
    (git_repo / "f.txt").write_text("hello\n")
    run_git_cmd(git_repo, "add", "f.txt")
    run_git_cmd(git_repo, "commit", "-qm", "one")
    return git_repo


def fake_program(tmp_path: Path, exit_code: int = 0) -> tuple[Path, Path]:
    """A stand-in for git-xet, in a directory with a blank in its name."""
    tools = tmp_path / "my tools"
    tools.mkdir(exist_ok=True)
    log = tmp_path / "calls"
    script = tools / "fake-xet"
    script.write_text(
        f'#!/bin/sh\nprintf "%s\\n" "$*" >> "{log}.args"\ncat >> "{log}.stdin"\nexit {exit_code}\n'
    )
    script.chmod(0o755)
    return script, log


def test_pre_push_hook_runs_with_args_and_stdin(pushable: Path, tmp_path: Path) -> None:
    script, log = fake_program(tmp_path)
    install_hooks(pushable, program=[str(script)])
    subprocess.run(["git", "push", "-q", "origin", "main"], cwd=pushable, check=True)
    remote = str(tmp_path / "remote.git")
    assert Path(f"{log}.args").read_text() == f"pre-push origin {remote}\n"
    (ref,) = parse_pre_push_input(Path(f"{log}.stdin").read_bytes())
    assert ref.local_ref == "refs/heads/main" and ref.is_new


def test_pre_push_failure_blocks_the_push(pushable: Path, tmp_path: Path) -> None:
    script, _ = fake_program(tmp_path, exit_code=1)
    install_hooks(pushable, ["pre-push"], program=[str(script)])
    result = subprocess.run(["git", "push", "-q", "origin", "main"], cwd=pushable, check=False)
    assert result.returncode != 0
    refs = subprocess.run(
        ["git", "ls-remote", "origin"], cwd=pushable, capture_output=True, check=True
    ).stdout
    assert refs == b""


def test_missing_program_blocks_the_push_with_a_message(pushable: Path) -> None:
    install_hooks(pushable, ["pre-push"], program="gitxet-surely-not-installed")
    result = subprocess.run(
        ["git", "push", "-q", "origin", "main"], cwd=pushable, capture_output=True, check=False
    )
    assert result.returncode != 0
    assert b"gitxet-surely-not-installed was not found" in result.stderr


def test_chained_user_hook_sees_same_input_and_can_veto(pushable: Path, tmp_path: Path) -> None:
    script, log = fake_program(tmp_path)
    directory = hooks_dir(pushable)
    user_log = tmp_path / "user"
    (directory / "pre-push").write_text(
        f'#!/bin/sh\necho "$1" > "{user_log}.args"\ncat > "{user_log}.stdin"\n'
    )
    (directory / "pre-push").chmod(0o755)
    install_hooks(pushable, ["pre-push"], program=[str(script)], on_conflict="chain")
    subprocess.run(["git", "push", "-q", "origin", "main"], cwd=pushable, check=True)
    assert Path(f"{user_log}.args").read_text() == "origin\n"
    assert Path(f"{user_log}.stdin").read_bytes() == Path(f"{log}.stdin").read_bytes() != b""

    # A failing user hook stops the push before gitxet runs.
    (directory / ("pre-push" + CHAINED_SUFFIX)).write_text("#!/bin/sh\nexit 3\n")
    Path(f"{log}.args").unlink()
    (pushable / "g.txt").write_text("more\n")
    subprocess.run(["git", "add", "g.txt"], cwd=pushable, check=True)
    subprocess.run(["git", "commit", "-qm", "two"], cwd=pushable, check=True)
    result = subprocess.run(["git", "push", "-q", "origin", "main"], cwd=pushable, check=False)
    assert result.returncode != 0
    assert not Path(f"{log}.args").exists()


def test_post_checkout_and_post_merge_hooks_run(pushable: Path, tmp_path: Path) -> None:
    script, log = fake_program(tmp_path)
    install_hooks(pushable, program=[str(script)])
    subprocess.run(["git", "checkout", "-q", "-b", "side"], cwd=pushable, check=True)
    (pushable / "side.txt").write_text("side\n")
    subprocess.run(["git", "add", "side.txt"], cwd=pushable, check=True)
    subprocess.run(["git", "commit", "-qm", "side"], cwd=pushable, check=True)
    subprocess.run(["git", "checkout", "-q", "main"], cwd=pushable, check=True)
    subprocess.run(["git", "merge", "-q", "side"], cwd=pushable, check=True)
    lines = Path(f"{log}.args").read_text().splitlines()
    assert lines[0].startswith("post-checkout ") and lines[0].endswith(" 1")
    assert "post-merge 0" in lines


def test_receive_hook_takes_commits_with_receipts_without_the_checker(tmp_path: Path) -> None:
    program, log = fake_program(tmp_path, exit_code=1)  # the checker refuses everything
    git_dir = tmp_path / "bare.git"
    (git_dir / "hooks").mkdir(parents=True)
    hook = git_dir / "hooks" / "pre-receive"
    hook.write_text(render_hook("pre-receive", [str(program)]))
    hook.chmod(0o755)
    receipts = git_dir / RECEIPTS
    a, b, z = "a" * 40, "b" * 40, "0" * 40

    def push(lines: str) -> int:
        env = {**os.environ, "GIT_DIR": "."}
        r = subprocess.run([str(hook)], cwd=git_dir, input=lines, text=True, env=env, timeout=30)
        return r.returncode

    assert push(f"{z} {a} refs/heads/main\n") == 1  # no receipts at all: checked
    receipts.mkdir(parents=True)
    (receipts / a).touch()
    # every new tip has one (a deletion needs none): taken, the receipts used up
    assert push(f"{z} {a} refs/heads/main\n{b} {z} refs/heads/old\n") == 0
    assert list(receipts.iterdir()) == []
    assert (log.parent / "calls.stdin").read_text() == f"{z} {a} refs/heads/main\n"
    (receipts / a).touch()
    assert push(f"{z} {a} refs/heads/main\n{z} {b} refs/heads/side\n") == 1  # b has none
    assert (receipts / a).exists()  # kept: nothing was taken
    assert (log.parent / "calls.stdin").read_text().endswith(f"{z} {b} refs/heads/side\n")
