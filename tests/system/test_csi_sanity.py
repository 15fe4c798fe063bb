"""CSI sanity suite: a gRPC client drives `git xet csi` over its unix socket, as kubelet would.

Real parts throughout: a dataset repo pushed with git-xet to a bare remote, the plugin as a
subprocess, the SubprocessMounter's FUSE daemons, /proc/self/mountinfo. No kubelet exists
here, so the client plays its part: NodePublishVolume to a pod-like target path, reads,
repeats, NodeUnpublishVolume, errors, a plugin killed and restarted.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.fuse_env import mountinfo_has, require_fuse
from tests.helpers.proc import git_env, interpreter_path, remote_and_work
from tests.helpers.secrets import assert_token_nowhere

grpc = pytest.importorskip("grpc")

from gitxet.plugins.csi import csi_pb2, csi_pb2_grpc  # noqa: E402 - after the importorskip

pytestmark = [pytest.mark.fuse, pytest.mark.timeout(300)]

TOKEN = "csi-sanity-token-4f9a1c-do-not-log"
MODE = csi_pb2.VolumeCapability.AccessMode
STEP = 30.0  # seconds for any single wait


@pytest.fixture(autouse=True)
def _fuse_required() -> None:
    require_fuse()


def _env() -> dict[str, str]:
    return dict(os.environ, PATH=interpreter_path())


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A bare remote with two commits of a small dataset (xet-stored files and plain ones)."""
    require_fuse()
    tmp = tmp_path_factory.mktemp("csi-ds")
    env = git_env(tmp)

    def sh(*a: str, cwd: Path = tmp) -> str:
        r = subprocess.run(list(a), cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, f"{a}: {r.stderr}"
        return r.stdout.strip()

    remote, work = remote_and_work(tmp, env)
    rnd = random.Random(6)
    v1 = {
        "images/a.bin": rnd.randbytes(3 << 20),
        "images/b.bin": rnd.randbytes(1 << 20),
        "labels/train.csv": b"file,label\na.bin,1\nb.bin,0\n",
        "README.md": b"# tiny dataset\n",
    }
    for p, d in v1.items():
        (work / p).parent.mkdir(parents=True, exist_ok=True)
        (work / p).write_bytes(d)
    sh("git-xet", "add", ".", cwd=work)
    sh("git", "commit", "-q", "-m", "v1", cwd=work)
    first = sh("git", "rev-parse", "HEAD", cwd=work)
    v2 = dict(v1)
    v2["images/a.bin"] = v1["images/a.bin"][:4096] + rnd.randbytes(8192) + v1["images/a.bin"][4096:]
    (work / "images/a.bin").write_bytes(v2["images/a.bin"])
    sh("git-xet", "add", ".", cwd=work)
    sh("git", "commit", "-q", "-m", "v2", cwd=work)
    sh("git", "push", "-q", "origin", "main", cwd=work)
    return {"remote": str(remote), "v1": v1, "v2": v2, "first": first}


class Plugin:
    """`git xet csi` as a subprocess, its socket, its log, and a client for it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.state = root / "state"
        self.log = root / "plugin.log"
        self.sock_dir = tempfile.mkdtemp(prefix="csi-", dir="/tmp")
        self.endpoint = f"unix://{self.sock_dir}/csi.sock"
        self.proc: subprocess.Popen[bytes] | None = None
        self.channel: Any = None

    def start(self) -> None:
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [
                    "git-xet",
                    "csi",
                    "--node-id=node-1",
                    f"--endpoint={self.endpoint}",
                    f"--state-dir={self.state}",
                    f"--target-root={self.root}",  # kubelet's root dir: pods/ is in it
                    "--log-level=debug",
                ],
                env=_env(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.channel = grpc.insecure_channel(self.endpoint)
        self.identity = csi_pb2_grpc.IdentityStub(self.channel)
        self.node = csi_pb2_grpc.NodeStub(self.channel)
        deadline = time.monotonic() + STEP
        while True:
            assert self.proc.poll() is None, f"plugin exited:\n{self.log.read_text()}"
            try:
                if self.identity.Probe(csi_pb2.ProbeRequest(), timeout=2).ready.value:
                    return
            except grpc.RpcError:
                pass
            assert time.monotonic() < deadline, f"plugin not ready:\n{self.log.read_text()}"
            time.sleep(0.1)

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.channel is not None:
            self.channel.close()
            self.channel = None
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(STEP)
        self.proc = None


@pytest.fixture(scope="module")
def plugin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Plugin]:
    p = Plugin(tmp_path_factory.mktemp("csi-plugin"))
    p.start()
    try:
        yield p
    finally:
        p.kill(signal.SIGTERM)
        _cleanup_mounts(p.state)
        shutil.rmtree(p.sock_dir, ignore_errors=True)


def _cleanup_mounts(state: Path) -> None:
    from gitxet.plugins.mounter import SubprocessMounter

    mounter = SubprocessMounter(str(state / "mounter"))
    for rec in list((state / "mounter" / "mounts").glob("*.json")):
        # records of live and dead mounts alike (a failed test may leave either)
        mounter.unmount(json.loads(rec.read_text())["target"])


def volume(
    target: Path, repo: str, commit: str = "main", volume_id: str = "vol-1", **extra: Any
) -> Any:
    context = {"repo": repo, "commit": commit, **extra.pop("context", {})}
    fields: dict[str, Any] = {
        "volume_id": volume_id,
        "target_path": str(target),
        "volume_capability": csi_pb2.VolumeCapability(
            mount=csi_pb2.VolumeCapability.MountVolume(),
            access_mode=csi_pb2.VolumeCapability.AccessMode(mode=MODE.SINGLE_NODE_WRITER),
        ),
        "readonly": True,
        "volume_context": {
            **context,
            "csi.storage.k8s.io/ephemeral": "true",
            "csi.storage.k8s.io/pod.name": "trainer-0",
        },
        "secrets": {"token": TOKEN},
    }
    fields.update(extra)
    return csi_pb2.NodePublishVolumeRequest(**fields)


def unpublish(plugin: Plugin, target: Path, volume_id: str = "vol-1") -> None:
    plugin.node.NodeUnpublishVolume(
        csi_pb2.NodeUnpublishVolumeRequest(volume_id=volume_id, target_path=str(target)),
        timeout=STEP,
    )


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def pod_target(plugin: Plugin, pod: str) -> Path:
    # kubelet's layout: the parent exists, the target directory is the plugin's to create
    parent = plugin.root / "pods" / pod / "volumes" / "kubernetes.io~csi" / "dataset"
    parent.mkdir(parents=True, exist_ok=True)
    return parent / "mount"


def rpc_error(call: Any) -> Any:
    with pytest.raises(grpc.RpcError) as ei:
        call()
    return ei.value


def test_identity(plugin: Plugin) -> None:
    info = plugin.identity.GetPluginInfo(csi_pb2.GetPluginInfoRequest(), timeout=STEP)
    assert info.name == "xet.gitxet.dev" and info.vendor_version
    caps = plugin.identity.GetPluginCapabilities(csi_pb2.GetPluginCapabilitiesRequest())
    assert not caps.capabilities
    assert plugin.identity.Probe(csi_pb2.ProbeRequest()).ready.value is True
    node = plugin.node.NodeGetInfo(csi_pb2.NodeGetInfoRequest())
    assert node.node_id == "node-1"


def test_publish_read_republish_unpublish(plugin: Plugin, dataset: dict[str, Any]) -> None:
    target = pod_target(plugin, "pod-a")
    plugin.node.NodePublishVolume(volume(target, dataset["remote"]), timeout=STEP)
    try:
        assert mountinfo_has(str(target))
        v2: dict[str, bytes] = dataset["v2"]
        assert sorted(os.listdir(target)) == [
            ".gitattributes",
            ".xetconfig",
            "README.md",
            "images",
            "labels",
        ]
        for path, data in v2.items():
            assert sha((target / path).read_bytes()) == sha(data), path
        with pytest.raises(OSError) as ei:
            (target / "new.txt").write_bytes(b"x")
        assert ei.value.errno == errno.EROFS
        # kubelet retries, and republishes every sync period: same answer, same mount
        records = sorted((plugin.state / "mounter" / "mounts").glob("*.json"))
        before = [r.read_bytes() for r in records]
        plugin.node.NodePublishVolume(volume(target, dataset["remote"]), timeout=STEP)
        assert [r.read_bytes() for r in records] == before
        # a different commit at the same target is a conflict, not a silent swap
        err = rpc_error(
            lambda: plugin.node.NodePublishVolume(
                volume(target, dataset["remote"], commit=dataset["first"]), timeout=STEP
            )
        )
        assert err.code() == grpc.StatusCode.ALREADY_EXISTS
        assert (target / "images/a.bin").read_bytes() == v2["images/a.bin"]
    finally:
        unpublish(plugin, target)
    assert not mountinfo_has(str(target))
    assert not target.exists()
    unpublish(plugin, target)  # idempotent


def test_pinned_commit_and_subdir_on_two_pods(plugin: Plugin, dataset: dict[str, Any]) -> None:
    t1, t2 = pod_target(plugin, "pod-b"), pod_target(plugin, "pod-c")
    old = volume(t1, dataset["remote"], commit=dataset["first"], volume_id="vol-old")
    sub = volume(t2, dataset["remote"], volume_id="vol-sub", context={"subdir": "images"})
    plugin.node.NodePublishVolume(old, timeout=STEP)
    plugin.node.NodePublishVolume(sub, timeout=STEP)
    try:
        assert (t1 / "images/a.bin").read_bytes() == dataset["v1"]["images/a.bin"]
        assert sorted(os.listdir(t2)) == ["a.bin", "b.bin"]
        assert (t2 / "a.bin").read_bytes() == dataset["v2"]["images/a.bin"]
    finally:
        unpublish(plugin, t1, "vol-old")
        unpublish(plugin, t2, "vol-sub")
    assert not mountinfo_has(str(t1)) and not mountinfo_has(str(t2))


@pytest.mark.parametrize(
    ("context", "code", "needle"),
    [
        ({"commit": "no-such-branch"}, "NOT_FOUND", "no-such-branch"),
        ({"repo": "/nonexistent/data.git"}, "NOT_FOUND", "/nonexistent/data.git"),
        ({"subdir": "missing/dir"}, "NOT_FOUND", "missing/dir"),
        ({"cacheSize": "a lot"}, "INVALID_ARGUMENT", "cache_size"),
        ({"colour": "blue"}, "INVALID_ARGUMENT", "colour"),
    ],
)
def test_bad_volumes_leave_nothing_behind(
    plugin: Plugin, dataset: dict[str, Any], context: dict[str, str], code: str, needle: str
) -> None:
    target = pod_target(plugin, "pod-bad")
    ctx = {"repo": dataset["remote"], "commit": "main", **context}
    req = volume(target, ctx.pop("repo"), commit=ctx.pop("commit"), context=ctx)
    err = rpc_error(lambda: plugin.node.NodePublishVolume(req, timeout=STEP))
    assert err.code() == getattr(grpc.StatusCode, code), err.details()
    assert needle in err.details()
    assert not mountinfo_has(str(target)) and not target.exists()


def test_unreachable_server_is_a_clear_error(plugin: Plugin) -> None:
    target = pod_target(plugin, "pod-remote")
    url = "http://127.0.0.1:9/ml/data.git"  # the discard port: nothing answers there
    err = rpc_error(lambda: plugin.node.NodePublishVolume(volume(target, url), timeout=STEP))
    assert err.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.UNAVAILABLE)
    assert url in err.details() and TOKEN not in err.details()
    assert not mountinfo_has(str(target)) and not target.exists()


def test_writable_publish_is_refused(plugin: Plugin, dataset: dict[str, Any]) -> None:
    target = pod_target(plugin, "pod-rw")
    err = rpc_error(
        lambda: plugin.node.NodePublishVolume(
            volume(target, dataset["remote"], readonly=False), timeout=STEP
        )
    )
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION and "read-only" in err.details()
    missing = volume(target, dataset["remote"])
    missing.ClearField("volume_capability")
    err = rpc_error(lambda: plugin.node.NodePublishVolume(missing, timeout=STEP))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert not target.exists()


def test_restart_keeps_mounts_and_state(plugin: Plugin, dataset: dict[str, Any]) -> None:
    target = pod_target(plugin, "pod-restart")
    plugin.node.NodePublishVolume(volume(target, dataset["remote"]), timeout=STEP)
    plugin.kill(signal.SIGKILL)  # no goodbye: records and daemons are all that remain
    try:
        # the mount's daemon is its own process: it kept serving while the plugin was gone
        assert (target / "images/b.bin").read_bytes() == dataset["v2"]["images/b.bin"]
        plugin.start()
        plugin.node.NodePublishVolume(volume(target, dataset["remote"]), timeout=STEP)
        err = rpc_error(
            lambda: plugin.node.NodeUnpublishVolume(
                csi_pb2.NodeUnpublishVolumeRequest(volume_id="vol-x", target_path=str(target))
            )
        )
        assert err.code() == grpc.StatusCode.NOT_FOUND  # not the volume published there
        assert (target / "README.md").read_bytes() == dataset["v2"]["README.md"]
        # a container restart kills the daemons too: the restarted plugin mounts again
        (record,) = (plugin.state / "mounter" / "mounts").glob("*.json")
        daemon = json.loads(record.read_text())["pid"]
        plugin.kill(signal.SIGKILL)
        os.kill(daemon, signal.SIGKILL)
        with pytest.raises(OSError) as ei:
            os.listdir(target)
        assert ei.value.errno in (errno.ENOTCONN, errno.ECONNABORTED)
        plugin.start()  # ready only once recovery is done
        assert json.loads(record.read_text())["pid"] != daemon
        assert (target / "images/a.bin").read_bytes() == dataset["v2"]["images/a.bin"]
    finally:
        if plugin.proc is None:
            plugin.start()
        unpublish(plugin, target)
    assert not mountinfo_has(str(target)) and not target.exists()


def test_a_dead_mount_is_reported_republished_and_unpublished(
    plugin: Plugin, dataset: dict[str, Any]
) -> None:
    """One volume at two targets; the daemon of one killed -9: NodeGetVolumeStats says so
    (and mounts it again), kubelet's republish of the same request is still a no-op, a
    second kill then NodeUnpublish leaves nothing; the other target reads on throughout."""
    a, b = pod_target(plugin, "pod-dead-a"), pod_target(plugin, "pod-dead-b")
    req_a, req_b = volume(a, dataset["remote"]), volume(b, dataset["remote"])
    v2: dict[str, bytes] = dataset["v2"]

    def stats(target: Path) -> Any:
        return plugin.node.NodeGetVolumeStats(
            csi_pb2.NodeGetVolumeStatsRequest(volume_id="vol-1", volume_path=str(target)),
            timeout=STEP,
        )

    def kill_daemon(target: Path) -> None:
        (record,) = [
            r
            for r in (plugin.state / "mounter" / "mounts").glob("*.json")
            if json.loads(r.read_text())["target"] == str(target)
        ]
        os.kill(json.loads(record.read_text())["pid"], signal.SIGKILL)
        deadline = time.monotonic() + STEP
        while mount_answers(target):
            assert time.monotonic() < deadline, "the killed daemon's mount still answers"
            time.sleep(0.05)

    plugin.node.NodePublishVolume(req_a, timeout=STEP)
    try:
        plugin.node.NodePublishVolume(req_b, timeout=STEP)
        assert not stats(a).volume_condition.abnormal
        kill_daemon(a)
        condition = stats(a).volume_condition
        assert condition.abnormal and "restart the pod" in condition.message
        assert (a / "README.md").read_bytes() == v2["README.md"]  # mounted again
        plugin.node.NodePublishVolume(req_a, timeout=STEP)  # kubelet's periodic republish
        assert (a / "images/b.bin").read_bytes() == v2["images/b.bin"]
        kill_daemon(a)
        unpublish(plugin, a)
        assert not mountinfo_has(str(a)) and not a.exists()
        err = rpc_error(lambda: stats(a))
        assert err.code() == grpc.StatusCode.NOT_FOUND
        assert (b / "images/a.bin").read_bytes() == v2["images/a.bin"]
        assert not stats(b).volume_condition.abnormal
    finally:
        unpublish(plugin, a)
        unpublish(plugin, b)
    assert not mountinfo_has(str(b)) and not b.exists()


def mount_answers(target: Path) -> bool:
    try:
        os.listdir(target)
    except OSError:
        return False
    return True


def test_the_token_is_in_no_log_record_or_command_line(plugin: Plugin) -> None:
    # runs after the tests above (file order): every publish so far carried the token
    seen = plugin.log.read_text(errors="replace")
    assert "NodePublishVolume" in seen and "secrets=<redacted keys ['token']>" in seen
    assert_token_nowhere(TOKEN, paths=[plugin.state], texts=[seen], check_cli=False)
