"""``mounted_elsewhere``: whether another mount namespace (a container's) holds a mount, as
the Docker plugin asks after a restart before it drops the mount IDs of containers removed
while it was down. Real namespaces: ``unshare -m`` copies the mount table, as a container's
runtime does."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from gitxet.mount.runner import mounted_elsewhere

pytestmark = [pytest.mark.fuse, pytest.mark.timeout(60)]  # root, as mounts need


def sh(*args: str) -> None:
    subprocess.run(list(args), check=True, capture_output=True, timeout=30)


@pytest.fixture
def private_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A tmpfs under a private bind of tmp_path: never propagated to another namespace."""
    if os.geteuid() != 0:
        pytest.skip("needs root to mount")
    with namespace_holder():  # a namespace without the mount: one to look at besides ours
        yield from _mounted(tmp_path)


def _mounted(tmp_path: Path) -> Iterator[Path]:
    base = tmp_path / "base"
    base.mkdir()
    sh("mount", "--bind", str(base), str(base))
    try:
        sh("mount", "--make-private", str(base))
        (base / "fs").mkdir()
        sh("mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(base / "fs"))
        try:
            yield base / "fs"
        finally:
            sh("umount", "-l", str(base / "fs"))
    finally:
        sh("umount", "-l", str(base))


@contextlib.contextmanager
def namespace_holder() -> Iterator[None]:
    """A process in a mount namespace of its own (a copy of ours) while the block runs."""
    with subprocess.Popen(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", "echo up; exec cat"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    ) as holder:
        assert holder.stdout is not None and holder.stdin is not None
        try:
            assert holder.stdout.readline() == b"up\n"
            yield
        finally:
            holder.stdin.close()  # cat ends: the namespace goes with its last process
            holder.wait(30)


def test_a_mount_held_by_another_namespace_is_seen_until_it_ends(private_tmpfs: Path) -> None:
    assert mounted_elsewhere(str(private_tmpfs)) is False
    assert mounted_elsewhere(str(private_tmpfs.parent / "nothing-here")) is None
    with namespace_holder():  # a copy of the mount table now holds the tmpfs too
        assert mounted_elsewhere(str(private_tmpfs)) is True
    assert mounted_elsewhere(str(private_tmpfs)) is False
