"""Token rotation against a real ``git xet serve`` with repo-scoped tokens: a CSI volume
republished with a new token reads with it (the old one revoked) without unmounting, and a
``git xet mount --token-file`` follows its file (real uvicorn, real git, real FUSE)."""

from __future__ import annotations

import errno
import os
import random
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest

from gitxet.plugins.csi import csi_pb2, csi_pb2_grpc
from gitxet.plugins.csi.identity import IdentityServicer
from gitxet.plugins.csi.node import NodeConfig, NodeService, NodeServicer
from gitxet.plugins.csi.server import CsiServer
from gitxet.plugins.mounter import SubprocessMounter
from gitxet.server.auth import TokenStore
from gitxet.settings import TOKEN_ENV, TOKEN_FILE_ENV
from tests.helpers.fuse_env import force_unmount, require_fuse
from tests.helpers.server_env import server_process

pytestmark = [pytest.mark.fuse, pytest.mark.timeout(300)]

A = random.Random(11).randbytes(1 << 20)
B = random.Random(12).randbytes(1 << 20)


def run(*args: str, cwd: Path, check: bool = True) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(list(args), cwd=cwd, capture_output=True, text=True, timeout=240)
    if check and r.returncode != 0:
        raise AssertionError(f"{args}: {r.returncode}\n{r.stdout}\n{r.stderr}")
    return r


@dataclass
class Served:
    url: str  # http://127.0.0.1:P/data.git, no credentials
    tokens: TokenStore


@pytest.fixture
def served(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Served]:
    """A server whose repository ``data`` holds a.bin (first push) and b.bin (second push:
    another shard and xorb, so reading it asks the server again)."""
    require_fuse()
    root = tmp_path / "srv"
    store = TokenStore(str(root))
    write, _ = store.create("write", repo="data")
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    monkeypatch.setenv("GITXET_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("GITXET_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    monkeypatch.delenv(TOKEN_FILE_ENV, raising=False)
    # a server process of its own: git subprocesses forked next to gRPC's threads crash
    with server_process(str(root), None, str(tmp_path / "server.log")) as base:
        url = f"{base}/data.git"
        work = tmp_path / "work"
        run("git", "init", "-q", str(work), cwd=tmp_path)
        run(
            "git", "remote", "add", "origin", url.replace("http://", f"http://u:{write}@"), cwd=work
        )
        run("git-xet", "init", cwd=work)
        for name, data in (("a.bin", A), ("b.bin", B)):
            (work / name).write_bytes(data)
            run("git-xet", "add", name, cwd=work)
            run("git", "commit", "-qm", name, cwd=work)
            run("git", "push", "-q", "origin", "main", cwd=work)
        yield Served(url, store)


def refused(url: str, token: str) -> bool:
    """Whether the server refuses ``token`` (its discovery answers 401/403)."""
    r = httpx.get(f"{url}/info/xet", auth=("gitxet", token), timeout=10)
    return r.status_code in (401, 403)


def read_error(path: Path) -> int | None:
    try:
        path.read_bytes()
    except OSError as exc:
        return exc.errno
    return None


def publish(stub: Any, target: str, token: str, url: str) -> None:
    mode = csi_pb2.VolumeCapability.AccessMode.MULTI_NODE_READER_ONLY
    cap = csi_pb2.VolumeCapability(access_mode=csi_pb2.VolumeCapability.AccessMode(mode=mode))
    cap.mount.SetInParent()
    stub.NodePublishVolume(
        csi_pb2.NodePublishVolumeRequest(
            volume_id="vol-1",
            target_path=target,
            volume_capability=cap,
            readonly=True,
            volume_context={"repo": url, "commit": "main"},
            secrets={"token": token},
        ),
        timeout=120,
    )


def test_a_csi_republish_with_a_new_token_rotates_it_without_unmounting(
    served: Served, tmp_path: Path
) -> None:
    from gitxet.cli._env import plugin_resolver

    old, old_rec = served.tokens.create("read", repo="data")
    env = {k: v for k, v in os.environ.items() if k not in (TOKEN_ENV, TOKEN_FILE_ENV)}
    mounter = SubprocessMounter(str(tmp_path / "csi" / "mounter"), env=env)
    mounter.set_resolver(plugin_resolver(mounter.cache_dir))
    node = NodeService(mounter, str(tmp_path / "csi"), NodeConfig(node_id="n1"))
    sock_dir = tempfile.mkdtemp(prefix="csi-", dir="/tmp")
    server = CsiServer(
        f"unix://{sock_dir}/csi.sock", IdentityServicer("1", lambda: True), NodeServicer(node)
    )
    server.start()
    channel = grpc.insecure_channel(server.address)
    stub = csi_pb2_grpc.NodeStub(channel)
    target = tmp_path / "pods" / "p1" / "mount"
    target.parent.mkdir(parents=True)
    try:
        publish(stub, str(target), old, served.url)
        assert (target / "a.bin").read_bytes() == A
        (info,) = mounter.list()

        served.tokens.revoke(old_rec.id)
        new, _ = served.tokens.create("read", repo="data")
        assert refused(served.url, old) and not refused(served.url, new)
        # the daemon still holds the revoked token: what it has not read yet fails
        assert read_error(target / "b.bin") == errno.EIO

        # kubelet republishes (requiresRepublish) with the secret's new token
        publish(stub, str(target), new, served.url)
        assert (target / "b.bin").read_bytes() == B
        (again,) = mounter.list()
        assert again.pid == info.pid  # the same daemon: never unmounted
        stub.NodeUnpublishVolume(
            csi_pb2.NodeUnpublishVolumeRequest(volume_id="vol-1", target_path=str(target)),
            timeout=60,
        )
        assert not os.listdir(mounter._tokens)  # the token file went with the mount
    finally:
        channel.close()
        server.stop(grace=1)
        shutil.rmtree(sock_dir, ignore_errors=True)
        for m in mounter.list():
            force_unmount(m.target)


def test_a_mount_follows_its_token_file(served: Served, tmp_path: Path) -> None:
    old, old_rec = served.tokens.create("read", repo="data")
    tf = tmp_path / "token"
    tf.write_text(old + "\n")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    run("git-xet", "mount", "--token-file", str(tf), served.url, "main", str(mnt), cwd=tmp_path)
    try:
        assert (mnt / "a.bin").read_bytes() == A
        served.tokens.revoke(old_rec.id)
        new, _ = served.tokens.create("read", repo="data")
        assert read_error(mnt / "b.bin") == errno.EIO
        # rotated the way a secret volume does it: a new file renamed over the old one
        (tmp_path / "token.new").write_text(new + "\n")
        os.replace(tmp_path / "token.new", tf)
        assert (mnt / "b.bin").read_bytes() == B
    finally:
        run("git-xet", "unmount", str(mnt), cwd=tmp_path, check=False)
        force_unmount(str(mnt))


def test_a_bad_token_file_is_one_line(tmp_path: Path) -> None:
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    r = run(
        "git-xet",
        "mount",
        "--token-file",
        str(tmp_path / "missing"),
        "http://127.0.0.1:9/data.git",
        "main",
        str(mnt),
        cwd=tmp_path,
        check=False,
    )
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert "token file" in r.stderr and len(r.stderr.strip().splitlines()) == 1
