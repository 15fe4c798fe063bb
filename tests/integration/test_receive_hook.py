"""A bare remote on a path gets gitxet's pre-receive hook from the first gitxet push into it;
from then on a push whose pointers name data its store lacks is refused there (issue 13)."""

from __future__ import annotations

import hashlib
import os
import random
import sys
from pathlib import Path

import pytest

from gitxet.formats.pointer import Pointer
from tests.helpers.proc import git, run

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(autouse=True)
def gitxet_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])


def test_embedded_remote_refuses_dangling_pointers(tmp_path: Path) -> None:
    remote = tmp_path / "remote.git"
    git("init", "-q", "--bare", str(remote), cwd=tmp_path)
    user_hook = remote / "hooks" / "pre-receive"
    user_hook.write_text("#!/bin/sh\ncat >/dev/null\necho 'user hook ran' >&2\n")
    user_hook.chmod(0o755)
    work = tmp_path / "work"
    git("init", "-q", str(work), cwd=tmp_path)
    git("remote", "add", "origin", str(remote), cwd=work)
    run("git-xet", "init", cwd=work)
    data = random.Random(1).randbytes(500_000)
    (work / "a.bin").write_bytes(data)
    git("add", ".", cwd=work)
    git("commit", "-qm", "one", cwd=work)
    r = run("git", "push", "origin", "main", cwd=work)
    assert "user hook ran" in r.stderr  # chained, still runs
    assert b"# gitxet hook" in user_hook.read_bytes()
    assert (remote / "hooks" / "pre-receive.gitxet-chained").exists()
    tip = git("rev-parse", "refs/heads/main", cwd=remote)

    # a plain git repository (no gitxet at all) commits a pointer to data nobody uploaded
    plain = tmp_path / "plain"
    git("clone", "-q", "--no-checkout", str(remote), str(plain), cwd=tmp_path)
    git("checkout", "-q", "-b", "side", cwd=plain)
    ptr = Pointer(hashlib.sha256(b"x").hexdigest(), 4321, random.Random(2).randbytes(32).hex())
    (plain / "deep" / "dir").mkdir(parents=True)
    (plain / "deep" / "dir" / "file.bin").write_bytes(ptr.encode())
    git("add", "deep", cwd=plain)
    git("commit", "-qm", "dangling", cwd=plain)
    r = run("git", "push", "origin", "side:main", cwd=plain, check=False)
    assert r.returncode != 0, r.stderr
    assert "deep/dir/file.bin" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert git("rev-parse", "refs/heads/main", cwd=remote) == tip

    # the same file with its data pushed by gitxet goes through; a clone reads it back
    (work / "b.bin").write_bytes(random.Random(3).randbytes(400_000))
    git("add", ".", cwd=work)
    git("commit", "-qm", "two", cwd=work)
    git("push", "-q", "origin", "main", cwd=work)
    # its pre-push left a receipt for the commit whose data it stored, and the hook took it
    assert list((remote / "xet" / "receipts").iterdir()) == []
    clone = tmp_path / "clone"
    run("git-xet", "clone", str(remote), str(clone), cwd=tmp_path)
    assert (clone / "a.bin").read_bytes() == data
