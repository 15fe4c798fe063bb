"""The CSI plugin over its real gRPC socket, with a FakeMounter: every call, every error code."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from gitxet.errors import MountError
from gitxet.plugins.csi import csi_pb2, csi_pb2_grpc
from gitxet.plugins.csi.identity import DRIVER_NAME, IdentityServicer
from gitxet.plugins.csi.node import NodeConfig, NodeService, NodeServicer
from gitxet.plugins.csi.server import CsiServer
from gitxet.plugins.mounter import MountInfo, MountSpec
from tests.helpers.fake_mounter import FakeMounter

SHA1 = "1" * 40
SHA2 = "2" * 40
TOKEN = "tok-Zq8v1-very-secret-value"
MODE = csi_pb2.VolumeCapability.AccessMode


@dataclass
class Plugin:
    node: NodeService
    mounter: FakeMounter
    server: CsiServer
    identity: Any
    stub: Any
    state: Path
    root: Path

    def target(self, name: str = "pod1") -> str:
        return str(self.root / "pods" / name / "mount")


def _start(mounter: Any, state: Path, sock_dir: str, probe: Any = None) -> tuple[Any, ...]:
    node = NodeService(mounter, str(state), NodeConfig(node_id="node-a", max_volumes_per_node=7))
    identity = IdentityServicer("9.9.9", probe or (lambda: node.ready))
    server = CsiServer(f"unix://{sock_dir}/csi.sock", identity, NodeServicer(node))
    server.start()
    channel = grpc.insecure_channel(server.address)
    return node, server, channel


@pytest.fixture
def plugin(tmp_path: Path) -> Iterator[Plugin]:
    sock_dir = tempfile.mkdtemp(prefix="csi-", dir="/tmp")  # socket paths must stay short
    mounter = FakeMounter({"/data/ds.git": {"main": SHA1, "v1": SHA2}})
    node, server, channel = _start(mounter, tmp_path / "state", sock_dir)
    (tmp_path / "pods" / "pod1").mkdir(parents=True)
    (tmp_path / "pods" / "pod2").mkdir(parents=True)
    try:
        yield Plugin(
            node=node,
            mounter=mounter,
            server=server,
            identity=csi_pb2_grpc.IdentityStub(channel),
            stub=csi_pb2_grpc.NodeStub(channel),
            state=tmp_path / "state",
            root=tmp_path,
        )
    finally:
        channel.close()
        server.stop(grace=1)
        shutil.rmtree(sock_dir, ignore_errors=True)


def capability(
    mode: int = MODE.MULTI_NODE_READER_ONLY, flags: tuple[str, ...] = (), block: bool = False
) -> Any:
    cap = csi_pb2.VolumeCapability(access_mode=csi_pb2.VolumeCapability.AccessMode(mode=mode))
    if block:
        cap.block.SetInParent()
    else:
        cap.mount.mount_flags.extend(flags)
    return cap


def publish_request(target: str, **over: Any) -> Any:
    fields: dict[str, Any] = {
        "volume_id": "vol-1",
        "target_path": target,
        "volume_capability": capability(),
        "readonly": True,
        "volume_context": {"repo": "/data/ds.git", "commit": "main"},
    }
    fields.update(over)
    return csi_pb2.NodePublishVolumeRequest(**fields)


def unpublish_request(target: str, volume_id: str = "vol-1") -> Any:
    return csi_pb2.NodeUnpublishVolumeRequest(volume_id=volume_id, target_path=target)


def code_of(call: Any) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as ei:
        call()
    return ei.value.code(), ei.value.details()


# ---- Identity ------------------------------------------------------------------------------


def test_identity_calls(plugin: Plugin) -> None:
    info = plugin.identity.GetPluginInfo(csi_pb2.GetPluginInfoRequest())
    assert info.name == DRIVER_NAME == "xet.gitxet.dev"
    assert info.vendor_version == "9.9.9"
    caps = plugin.identity.GetPluginCapabilities(csi_pb2.GetPluginCapabilitiesRequest())
    assert list(caps.capabilities) == []  # node-only: no CONTROLLER_SERVICE
    probe = plugin.identity.Probe(csi_pb2.ProbeRequest())
    assert probe.HasField("ready") and probe.ready.value is False  # recovery not run yet
    plugin.node.recover()
    assert plugin.identity.Probe(csi_pb2.ProbeRequest()).ready.value is True


def test_probe_reports_an_unhealthy_plugin(tmp_path: Path) -> None:
    sock_dir = tempfile.mkdtemp(prefix="csi-", dir="/tmp")

    def broken() -> bool:
        raise OSError("state dir is read-only")

    _, server, channel = _start(FakeMounter(), tmp_path / "s", sock_dir, probe=broken)
    try:
        stub = csi_pb2_grpc.IdentityStub(channel)
        code, details = code_of(lambda: stub.Probe(csi_pb2.ProbeRequest()))
        assert code == grpc.StatusCode.FAILED_PRECONDITION
        assert "read-only" in details
    finally:
        channel.close()
        server.stop(grace=1)
        shutil.rmtree(sock_dir, ignore_errors=True)


def test_unimplemented_calls_answer_unimplemented(plugin: Plugin) -> None:
    # A CO only calls NodeStageVolume when STAGE_UNSTAGE_VOLUME is advertised; still, the
    # answer to a call we do not serve must be UNIMPLEMENTED, not a crash.
    channel = grpc.insecure_channel(plugin.server.address)
    try:
        stage = channel.unary_unary(
            "/csi.v1.Node/NodeStageVolume",
            request_serializer=lambda b: b,
            response_deserializer=lambda b: b,
        )
        code, _ = code_of(lambda: stage(b""))
        assert code == grpc.StatusCode.UNIMPLEMENTED
    finally:
        channel.close()


def test_node_info_and_capabilities(plugin: Plugin) -> None:
    info = plugin.stub.NodeGetInfo(csi_pb2.NodeGetInfoRequest())
    assert info.node_id == "node-a"
    assert info.max_volumes_per_node == 7
    assert not info.HasField("accessible_topology")
    caps = plugin.stub.NodeGetCapabilities(csi_pb2.NodeGetCapabilitiesRequest())
    rpc = csi_pb2.NodeServiceCapability.RPC
    # no STAGE_UNSTAGE_VOLUME (publish mounts directly); stats carry the volume's condition
    assert [c.rpc.type for c in caps.capabilities] == [rpc.GET_VOLUME_STATS, rpc.VOLUME_CONDITION]


def test_volume_stats_report_and_repair_a_dead_mount(plugin: Plugin) -> None:
    target = plugin.target()
    plugin.stub.NodePublishVolume(
        publish_request(
            target,
            secrets={"token": TOKEN},
            volume_context={"repo": "/data/ds.git", "commit": "main", "subdir": "sub"},
        )
    )
    req = csi_pb2.NodeGetVolumeStatsRequest(volume_id="vol-1", volume_path=target)
    stats = plugin.stub.NodeGetVolumeStats(req)
    assert not stats.volume_condition.abnormal
    # the daemon dies: the next stats call mounts it again (same spec, same token, pinned
    # commit) and reports the volume abnormal, since containers keep the dead mount
    plugin.mounter.dead.add(target)
    first_pid = plugin.mounter.mounts[target].pid
    stats = plugin.stub.NodeGetVolumeStats(req)
    assert stats.volume_condition.abnormal
    assert "restart the pod" in stats.volume_condition.message
    info = plugin.mounter.mounts[target]
    assert info.pid != first_pid and plugin.mounter.is_mounted(target)
    assert info.spec.subdir == "sub" and info.commit_sha == SHA1
    assert plugin.mounter.tokens[target] == TOKEN
    code, _ = code_of(
        lambda: plugin.stub.NodeGetVolumeStats(
            csi_pb2.NodeGetVolumeStatsRequest(volume_id="other", volume_path=target)
        )
    )
    assert code == grpc.StatusCode.NOT_FOUND
    # a republish of a dead mount mounts it again too
    plugin.mounter.dead.add(target)
    plugin.stub.NodePublishVolume(
        publish_request(
            target,
            secrets={"token": TOKEN},
            volume_context={"repo": "/data/ds.git", "commit": "main", "subdir": "sub"},
        )
    )
    assert plugin.mounter.is_mounted(target)
    plugin.stub.NodeUnpublishVolume(unpublish_request(target))
    code, _ = code_of(lambda: plugin.stub.NodeGetVolumeStats(req))
    assert code == grpc.StatusCode.NOT_FOUND


# ---- publish / unpublish -------------------------------------------------------------------


def test_publish_mounts_through_the_mounter_and_is_idempotent(plugin: Plugin) -> None:
    target = plugin.target()
    req = publish_request(
        target,
        volume_context={
            "repo": "/data/ds.git",
            "commit": "main",
            "subdir": "images/",
            "cacheSize": "10GiB",
            "prefetch": "16M",
            "cas": "http://tier:8080",
            "csi.storage.k8s.io/ephemeral": "true",
            "csi.storage.k8s.io/pod.name": "trainer-0",
        },
        secrets={"token": TOKEN},
    )
    plugin.stub.NodePublishVolume(req)
    info = plugin.mounter.mounts[target]
    assert info.commit_sha == SHA1
    assert info.spec == MountSpec(
        "/data/ds.git",
        "main",
        subdir="images",
        cache_size="10GiB",
        prefetch="16M",
        cas="http://tier:8080",
    )
    assert plugin.mounter.tokens[target] == TOKEN
    # the same call again (kubelet retries, requiresRepublish): OK, no second mount, and a
    # rotated secret reaches the running mount
    plugin.stub.NodePublishVolume(req)
    req.secrets["token"] = TOKEN + "-rotated"
    plugin.stub.NodePublishVolume(req)
    assert plugin.mounter.mounts[target].pid == info.pid
    assert plugin.mounter.tokens[target] == TOKEN + "-rotated"
    assert "unmount" not in [c[0] for c in plugin.mounter.calls]
    # the record survives a plugin restart: a new service on the same state still agrees
    again = NodeService(plugin.mounter, str(plugin.state), NodeConfig(node_id="node-a"))
    rec = again.records.get(target)
    assert rec is not None and rec.volume_id == "vol-1" and rec.commit_sha == SHA1
    assert rec.ephemeral
    assert TOKEN not in "".join(p.read_text() for p in (plugin.state / "volumes").iterdir())


def test_same_volume_on_two_targets(plugin: Plugin) -> None:
    for name in ("pod1", "pod2"):
        plugin.stub.NodePublishVolume(publish_request(plugin.target(name)))
    assert set(plugin.mounter.mounts) == {plugin.target("pod1"), plugin.target("pod2")}


def test_kubelet_inline_volume_shape_is_accepted(plugin: Plugin) -> None:
    # kubelet asks for SINGLE_NODE_WRITER on inline ephemeral volumes; readonly decides.
    req = publish_request(
        plugin.target(), volume_capability=capability(MODE.SINGLE_NODE_WRITER, ("ro",))
    )
    plugin.stub.NodePublishVolume(req)
    assert plugin.mounter.is_mounted(plugin.target())


def test_conflicting_publish_is_already_exists(plugin: Plugin) -> None:
    target = plugin.target()
    plugin.stub.NodePublishVolume(publish_request(target))
    other_commit = publish_request(target, volume_context={"repo": "/data/ds.git", "commit": "v1"})
    code, details = code_of(lambda: plugin.stub.NodePublishVolume(other_commit))
    assert code == grpc.StatusCode.ALREADY_EXISTS and "other arguments" in details
    other_volume = publish_request(target, volume_id="vol-2")
    code, details = code_of(lambda: plugin.stub.NodePublishVolume(other_volume))
    assert code == grpc.StatusCode.ALREADY_EXISTS and "vol-1" in details
    assert plugin.mounter.mounts[target].commit_sha == SHA1


def test_publish_again_after_the_mount_died(plugin: Plugin) -> None:
    target = plugin.target()
    plugin.stub.NodePublishVolume(publish_request(target))
    del plugin.mounter.mounts[target]  # the daemon died and nobody re-established it
    plugin.stub.NodePublishVolume(publish_request(target))
    assert plugin.mounter.is_mounted(target)


def test_unpublish_unmounts_removes_the_directory_and_is_idempotent(plugin: Plugin) -> None:
    target = plugin.target()  # does not exist yet: the plugin creates and removes it
    os.makedirs(target)  # FakeMounter does not create it; the real mounter does
    plugin.stub.NodePublishVolume(publish_request(target))
    plugin.stub.NodeUnpublishVolume(unpublish_request(target))
    assert not plugin.mounter.is_mounted(target)
    assert not os.path.exists(target)
    assert plugin.node.records.get(target) is None
    plugin.stub.NodeUnpublishVolume(unpublish_request(target))  # twice: still OK
    # never published at all: OK too (kubelet cleans up after a failed publish)
    plugin.stub.NodeUnpublishVolume(unpublish_request(plugin.target("pod2"), "vol-9"))


def test_unpublish_of_another_volume_is_not_found(plugin: Plugin) -> None:
    target = plugin.target()
    plugin.stub.NodePublishVolume(publish_request(target))
    code, details = code_of(
        lambda: plugin.stub.NodeUnpublishVolume(unpublish_request(target, "vol-other"))
    )
    assert code == grpc.StatusCode.NOT_FOUND and "vol-other" in details
    assert plugin.mounter.is_mounted(target)  # left alone


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"volume_id": ""}, "volume_id"),
        ({"target_path": ""}, "target_path"),
        ({"target_path": "relative/dir"}, "absolute"),
        ({"volume_capability": None}, "volume_capability"),
        ({"volume_capability": csi_pb2.VolumeCapability(mount={})}, "access_mode"),
        (
            {
                "volume_capability": csi_pb2.VolumeCapability(
                    access_mode={"mode": MODE.MULTI_NODE_READER_ONLY}
                )
            },
            "access type",
        ),
        ({"volume_context": {"commit": "main"}}, "'repo' is required"),
        ({"volume_context": {"repo": "/data/ds.git"}}, "'commit' is required"),
        ({"volume_context": {"repo": "/data/ds.git", "commit": "main", "comit": "x"}}, "comit"),
        (
            {"volume_context": {"repo": "/data/ds.git", "commit": "main", "cacheSize": "lots"}},
            "cache_size",
        ),
        (
            {"volume_context": {"repo": "/data/ds.git", "commit": "main", "cacheSize": "1.5G"}},
            "cache_size",
        ),
        (
            {"volume_context": {"repo": "/data/ds.git", "commit": "main", "subdir": "../etc"}},
            "subdir",
        ),
        ({"volume_context": {"repo": "/data/ds.git", "commit": "-x"}}, "commit"),
        ({"secrets": {"token": " "}}, "token"),
        ({"volume_capability": capability(flags=("uid=0",))}, "mount flag"),
    ],
)
def test_invalid_arguments(plugin: Plugin, change: dict[str, Any], needle: str) -> None:
    fields = dict(change)
    req = publish_request(plugin.target(), **{k: v for k, v in fields.items() if v is not None})
    if fields.get("volume_capability", 1) is None:
        req.ClearField("volume_capability")
    code, details = code_of(lambda: plugin.stub.NodePublishVolume(req))
    assert code == grpc.StatusCode.INVALID_ARGUMENT, details
    assert needle in details
    assert not plugin.mounter.mounts


def test_unpublish_invalid_arguments(plugin: Plugin) -> None:
    for req in (unpublish_request(plugin.target(), ""), unpublish_request("")):
        code, _ = code_of(lambda r=req: plugin.stub.NodeUnpublishVolume(r))
        assert code == grpc.StatusCode.INVALID_ARGUMENT


@pytest.mark.parametrize(
    "change",
    [
        {"readonly": False},
        {"volume_capability": capability(block=True)},
        {"volume_capability": capability(flags=("rw",))},
    ],
)
def test_writable_or_block_publish_exceeds_capabilities(
    plugin: Plugin, change: dict[str, Any]
) -> None:
    code, details = code_of(
        lambda: plugin.stub.NodePublishVolume(publish_request(plugin.target(), **change))
    )
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    assert "read-only" in details or "block" in details
    assert not plugin.mounter.mounts


@pytest.mark.parametrize(
    ("context", "needle"),
    [
        ({"repo": "/nowhere.git", "commit": "main"}, "repo"),
        ({"repo": "/data/ds.git", "commit": "no-such-branch"}, "no-such-branch"),
    ],
)
def test_unknown_volume_is_not_found(plugin: Plugin, context: dict[str, str], needle: str) -> None:
    target = plugin.root / "pods" / "pod3" / "mount"  # parent exists, target does not
    target.parent.mkdir()
    code, details = code_of(
        lambda: plugin.stub.NodePublishVolume(publish_request(str(target), volume_context=context))
    )
    assert code == grpc.StatusCode.NOT_FOUND and needle in details
    assert not plugin.mounter.mounts and not target.exists()
    assert plugin.node.records.get(str(target)) is None


def test_daemon_failures_map_to_codes_and_leave_nothing(plugin: Plugin) -> None:
    target = plugin.target("pod2") + "/new"
    cases = [
        (MountError(target, "daemon exited", "git-xet: not found: subdir x", 4), "NOT_FOUND"),
        (MountError(target, "daemon exited", "git-xet: access denied", 5), "PERMISSION_DENIED"),
        (MountError(target, "did not appear within 60 s", "fuse: no device"), "INTERNAL"),
    ]
    for err, want in cases:
        os.makedirs(target)  # as if the mounter made it before failing
        os.rmdir(target)
        plugin.mounter.fail_next = err
        code, details = code_of(lambda: plugin.stub.NodePublishVolume(publish_request(target)))
        assert code == getattr(grpc.StatusCode, want)
        assert err.reason in details and err.log_tail in details  # the daemon's own words
        assert not os.path.exists(target)
        assert plugin.node.records.get(target) is None


def test_the_token_never_reaches_logs_or_error_messages(
    plugin: Plugin, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    target = plugin.target()
    plugin.stub.NodePublishVolume(publish_request(target, secrets={"token": TOKEN}))
    plugin.stub.NodePublishVolume(publish_request(target, secrets={"token": TOKEN}))
    # an error message from below that quotes the token is scrubbed before it leaves
    plugin.mounter.fail_next = MountError(
        plugin.target("pod2"), f"auth failed for token {TOKEN}", f"header: Bearer {TOKEN}"
    )
    code, details = code_of(
        lambda: plugin.stub.NodePublishVolume(
            publish_request(plugin.target("pod2"), volume_id="vol-2", secrets={"token": TOKEN})
        )
    )
    assert code == grpc.StatusCode.INTERNAL and "***" in details and TOKEN not in details
    plugin.stub.NodeUnpublishVolume(unpublish_request(target))
    assert "NodePublishVolume" in caplog.text and "secrets=<redacted keys ['token']>" in caplog.text
    assert TOKEN not in caplog.text
    for rec in caplog.records:
        assert TOKEN not in rec.getMessage()


class BlockingMounter(FakeMounter):
    """A mounter whose first mount waits until released (a slow download)."""

    def __init__(self) -> None:
        super().__init__({"/data/ds.git": {"main": SHA1}})
        self.entered = threading.Event()
        self.release = threading.Event()

    def mount(self, spec: MountSpec, target: str, *, timeout: float = 60) -> MountInfo:
        self.entered.set()
        assert self.release.wait(10)
        return super().mount(spec, target, timeout=timeout)


def test_concurrent_call_on_the_same_target_is_aborted(tmp_path: Path) -> None:
    sock_dir = tempfile.mkdtemp(prefix="csi-", dir="/tmp")
    mounter = BlockingMounter()
    _, server, channel = _start(mounter, tmp_path / "s", sock_dir)
    stub = csi_pb2_grpc.NodeStub(channel)
    target = str(tmp_path / "t")
    try:
        first = stub.NodePublishVolume.future(publish_request(target))
        assert mounter.entered.wait(10)
        code, details = code_of(lambda: stub.NodePublishVolume(publish_request(target)))
        assert code == grpc.StatusCode.ABORTED and "in progress" in details
        # another target is not held up
        other = str(tmp_path / "u")
        mounter.release.set()
        first.result(timeout=10)
        stub.NodePublishVolume(publish_request(other, volume_id="vol-2"))
        assert mounter.is_mounted(target) and mounter.is_mounted(other)
    finally:
        mounter.release.set()
        channel.close()
        server.stop(grace=1)
        shutil.rmtree(sock_dir, ignore_errors=True)


def test_a_torn_record_does_not_wedge_the_target(plugin: Plugin) -> None:
    target = plugin.target()
    plugin.stub.NodePublishVolume(publish_request(target))
    (rec_file,) = (plugin.state / "volumes").iterdir()
    rec_file.write_bytes(b'{"version": 1, "target_pa')
    plugin.stub.NodeUnpublishVolume(unpublish_request(target))
    assert not plugin.mounter.is_mounted(target)
    assert not list((plugin.state / "volumes").iterdir())


def test_targets_outside_the_target_root_are_refused(tmp_path: Path) -> None:
    # kubelet asks for targets below its root directory only; the plugin (root, able to
    # mount anywhere) took any absolute path: '/x/../../etc/y' or a symlink out of the root
    # made a directory and a mount there.
    from gitxet.plugins.csi.volumes import CsiRequestError, parse_publish

    root, outside = tmp_path / "kubelet", tmp_path / "outside"
    (root / "pods" / "p1").mkdir(parents=True)
    outside.mkdir()
    (root / "pods" / "evil").symlink_to(outside)
    mounter = FakeMounter({"/data/ds.git": {"main": SHA1}})
    node = NodeService(mounter, str(tmp_path / "state"), NodeConfig("n", target_root=str(root)))

    def publish(target: str) -> None:
        node.publish(
            parse_publish(
                volume_id="v",
                target_path=target,
                readonly=True,
                volume_context={"repo": "/data/ds.git", "commit": "main"},
                secrets={},
                access_mode=MODE.MULTI_NODE_READER_ONLY,
                mount_flags=[],
            )
        )

    for target in (
        str(outside / "mount"),
        str(root / "pods" / ".." / ".." / "outside" / "mount"),
        str(root / "pods" / "evil" / "mount"),
        str(root),
    ):
        with pytest.raises(CsiRequestError, match="outside the plugin's target root") as ei:
            publish(target)
        assert ei.value.code == "INVALID_ARGUMENT"
        with pytest.raises(CsiRequestError, match="outside the plugin's target root"):
            node.unpublish("v", target)
    assert not (outside / "mount").exists() and mounter.mounts == {}
    ok = str(root / "pods" / "p1" / "mount")
    publish(ok)
    assert ok in mounter.mounts
