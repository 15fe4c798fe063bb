"""The CSI server's socket handling, its state lock, and the strict volume records."""

from __future__ import annotations

import json
import os
import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from gitxet.errors import ConfigError, FormatError
from gitxet.plugins.csi import csi_pb2, csi_pb2_grpc
from gitxet.plugins.csi.identity import IdentityServicer
from gitxet.plugins.csi.node import NodeConfig, NodeService, NodeServicer
from gitxet.plugins.csi.server import CsiServer, parse_endpoint
from gitxet.plugins.csi.volumes import VolumeRecord, VolumeRecords
from gitxet.settings import strip_credentials as safe_repo
from gitxet.util.statelock import lock_state_dir
from tests.helpers.fake_mounter import FakeMounter


@pytest.mark.parametrize(
    ("endpoint", "path"),
    [
        ("unix:///csi/csi.sock", "/csi/csi.sock"),
        ("unix:/csi/csi.sock", "/csi/csi.sock"),
        ("/var/lib/kubelet/plugins/x/csi.sock", "/var/lib/kubelet/plugins/x/csi.sock"),
        ("unix:///csi//a/../csi.sock", "/csi/csi.sock"),
    ],
)
def test_parse_endpoint(endpoint: str, path: str) -> None:
    assert parse_endpoint(endpoint) == path


@pytest.mark.parametrize(
    ("endpoint", "why"),
    [
        ("tcp://127.0.0.1:10000", "only unix sockets"),
        ("unix://csi.sock", "absolute"),
        ("csi.sock", "absolute"),
        ("unix:///" + "x" * 120, "longer than"),
    ],
)
def test_bad_endpoints(endpoint: str, why: str) -> None:
    with pytest.raises(ConfigError, match=why):
        parse_endpoint(endpoint)


@pytest.fixture
def sock_dir() -> Iterator[str]:
    d = tempfile.mkdtemp(prefix="csi-", dir="/tmp")
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _server(sock: str, state: Path) -> CsiServer:
    node = NodeService(FakeMounter(), str(state), NodeConfig(node_id="n"))
    return CsiServer(f"unix://{sock}", IdentityServicer("1", lambda: True), NodeServicer(node))


def test_socket_left_by_a_dead_plugin_is_replaced(sock_dir: str, tmp_path: Path) -> None:
    sock = os.path.join(sock_dir, "sub", "csi.sock")  # the directory is created too
    os.makedirs(os.path.dirname(sock))
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(sock)  # bound, never listening, closed: what a SIGKILLed server leaves
    stale.close()
    server = _server(sock, tmp_path)
    server.start()
    try:
        with grpc.insecure_channel(server.address) as ch:
            info = csi_pb2_grpc.IdentityStub(ch).GetPluginInfo(csi_pb2.GetPluginInfoRequest())
        assert info.name == "xet.gitxet.dev"
        # a second server on the same socket is refused while the first one answers
        with pytest.raises(ConfigError, match="another process"):
            _server(sock, tmp_path / "other").start()
    finally:
        server.stop(grace=1)
    assert not os.path.exists(sock)


def test_a_file_in_the_way_is_not_deleted(sock_dir: str, tmp_path: Path) -> None:
    sock = os.path.join(sock_dir, "csi.sock")
    Path(sock).write_text("not a socket")
    with pytest.raises(ConfigError, match="not a socket"):
        _server(sock, tmp_path).start()
    assert Path(sock).read_text() == "not a socket"


def test_state_dir_lock_is_exclusive(tmp_path: Path) -> None:
    fd = lock_state_dir(str(tmp_path / "state"), lock_name="csi.lock", owner="CSI plugin")
    assert (tmp_path / "state" / "csi.lock").exists()
    try:
        with pytest.raises(ConfigError, match="another CSI plugin"):
            lock_state_dir(str(tmp_path / "state"), lock_name="csi.lock", owner="CSI plugin")
    finally:
        os.close(fd)
    os.close(lock_state_dir(str(tmp_path / "state")))  # free again once released


def _record(**over: object) -> VolumeRecord:
    fields: dict[str, object] = {
        "target_path": "/var/lib/kubelet/pods/p/volumes/kubernetes.io~csi/d/mount",
        "volume_id": "csi-abc",
        "fingerprint": "f" * 64,
        "repo": "/srv/data.git",
        "commit": "main",
        "commit_sha": "a" * 40,
        "ephemeral": True,
        "created_target": True,
    }
    fields.update(over)
    return VolumeRecord(**fields)  # type: ignore[arg-type]


def test_records_round_trip(tmp_path: Path) -> None:
    recs = VolumeRecords(str(tmp_path / "v"))
    assert recs.list() == [] and recs.get("/x") is None
    rec = _record()
    recs.put(rec)
    assert recs.get(rec.target_path) == rec
    assert recs.list() == [rec]
    recs.remove(rec.target_path)
    recs.remove(rec.target_path)
    assert recs.get(rec.target_path) is None


@pytest.mark.parametrize(
    ("mutate", "why"),
    [
        (lambda b: b.update(version=2), "unsupported version"),
        (lambda b: b.update(extra=1), "unknown fields"),
        (lambda b: b.pop("volume_id"), "missing field"),
        (lambda b: b.update(ephemeral="yes"), "wrong type"),
        (lambda b: b.update(repo=True), "wrong type"),
        (lambda b: b.update(target_path="relative"), "not absolute"),
    ],
)
def test_records_are_parsed_strictly(mutate: object, why: str) -> None:
    body = json.loads(_record().to_json())
    mutate(body)  # type: ignore[operator]
    with pytest.raises(FormatError, match=why):
        VolumeRecord.from_json(json.dumps(body).encode(), "rec")


@pytest.mark.parametrize(
    ("data", "why"),
    [(b"{", "not JSON"), (b"[]", "not a JSON object"), (b" " * 70000, "larger than")],
)
def test_garbage_records(data: bytes, why: str) -> None:
    with pytest.raises(FormatError, match=why):
        VolumeRecord.from_json(data, "rec")


def test_safe_repo_hides_credentials_in_urls() -> None:
    assert safe_repo("https://bob:s3cret@hub.example/ml/d.git") == "https://hub.example/ml/d.git"
    assert safe_repo("https://hub.example/ml/d.git") == "https://hub.example/ml/d.git"
    assert safe_repo("/srv/data.git") == "/srv/data.git"
