"""deploy/kubernetes: every kustomization renders with kubectl's kustomize and validates
against the Kubernetes schemas, and the rendered objects agree with the plugin's code."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

import gitxet
from gitxet.plugins.csi.identity import DRIVER_NAME
from gitxet.plugins.csi.volumes import ATTRIBUTES

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy" / "kubernetes"
KUSTOMIZATIONS = ("base", "overlays/dev", "overlays/prod", "examples", "cache-tier")
# The oldest Kubernetes the manifests are written for (docs/operations/kubernetes.md) and the
# newest schema kubernetes-validate ships.
K8S_VERSIONS = ("1.28.0", kubernetes_validate.latest_version())


def _kubectl() -> str:
    path = shutil.which("kubectl")
    if path is None:
        if os.environ.get("CI"):
            pytest.fail("kubectl must be installed in CI (its built-in kustomize renders deploy/)")
        pytest.skip("kubectl is not installed")
    return path


_rendered: dict[str, list[dict[str, Any]]] = {}


def render(name: str) -> list[dict[str, Any]]:
    if name not in _rendered:
        r = subprocess.run(
            [_kubectl(), "kustomize", str(DEPLOY / name)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode == 0, f"kubectl kustomize {name}: {r.stderr}"
        _rendered[name] = [d for d in yaml.safe_load_all(r.stdout) if d]
    return _rendered[name]


def find(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    hits = [
        d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)
    ]
    assert len(hits) == 1, f"{kind}/{name}: {len(hits)} objects"
    return hits[0]


def container(ds: dict[str, Any], name: str) -> dict[str, Any]:
    (c,) = [c for c in ds["spec"]["template"]["spec"]["containers"] if c["name"] == name]
    return c


@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_renders_and_validates(name: str) -> None:
    docs = render(name)
    assert docs
    for version in K8S_VERSIONS:
        for doc in docs:
            kubernetes_validate.validate(doc, version, strict=True)


def test_a_broken_object_is_caught() -> None:
    # The check above must be able to fail: a misspelt field is rejected in strict mode.
    ds = find(render("base"), "DaemonSet")
    bad = yaml.safe_load(yaml.safe_dump(ds))
    bad["spec"]["template"]["spec"]["containers"][0]["volumeMount"] = []
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, K8S_VERSIONS[-1], strict=True)


def test_csidriver_matches_the_plugin() -> None:
    drv = find(render("base"), "CSIDriver")
    assert drv["metadata"]["name"] == DRIVER_NAME
    spec = drv["spec"]
    assert spec["attachRequired"] is False
    assert spec["podInfoOnMount"] is True
    assert sorted(spec["volumeLifecycleModes"]) == ["Ephemeral", "Persistent"]
    assert spec["requiresRepublish"] is True  # remounts, and token rotation


def test_daemonset_wiring() -> None:
    docs = render("base")
    ds = find(docs, "DaemonSet", "gitxet-csi-node")
    pod = ds["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    plugin = container(ds, "gitxet-csi")
    registrar = container(ds, "node-driver-registrar")
    probe = container(ds, "liveness-probe")

    # the plugin serves where the sidecars look, and kubelet finds it on the host
    env = {e["name"]: e for e in plugin["env"]}
    endpoint = env["CSI_ENDPOINT"]["value"]
    assert endpoint == "unix:///csi/csi.sock"
    assert "--endpoint=$(CSI_ENDPOINT)" in plugin["args"]
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert plugin["args"][0] == "csi" and "--node-id=$(NODE_NAME)" in plugin["args"]
    for c in (plugin, registrar, probe):
        mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
        assert mounts["socket-dir"] == "/csi", c["name"]
        assert "--csi-address=/csi/csi.sock" in c.get("args", []) or c is plugin
    host_socket = volumes["socket-dir"]["hostPath"]["path"] + "/csi.sock"
    assert f"--kubelet-registration-path={host_socket}" in registrar["args"]
    assert DRIVER_NAME in host_socket
    assert volumes["registration-dir"]["hostPath"]["path"] == "/var/lib/kubelet/plugins_registry"

    # mounts reach kubelet: bidirectional propagation into the pods dir, privileged, /dev/fuse
    mounts = {m["name"]: m for m in plugin["volumeMounts"]}
    assert mounts["pods-mount-dir"]["mountPath"] == "/var/lib/kubelet/pods"
    assert mounts["pods-mount-dir"]["mountPropagation"] == "Bidirectional"
    assert volumes["pods-mount-dir"]["hostPath"]["path"] == "/var/lib/kubelet/pods"
    assert plugin["securityContext"]["privileged"] is True
    assert volumes["fuse-device"]["hostPath"] == {"path": "/dev/fuse", "type": "CharDevice"}
    state_arg = next(a for a in plugin["args"] if a.startswith("--state-dir="))
    assert mounts["state-dir"]["mountPath"] == state_arg.split("=", 1)[1]

    # the liveness probe hits the livenessprobe sidecar's port
    port = next(a for a in probe["args"] if a.startswith("--health-port=")).split("=")[1]
    ports = {p["name"]: p["containerPort"] for p in plugin["ports"]}
    assert ports[plugin["livenessProbe"]["httpGet"]["port"]] == int(port)

    # the base image tag is this release
    assert plugin["image"] == f"gitxet-csi:{gitxet.__version__}"


def test_service_account_can_read_nothing() -> None:
    for name in ("base", "overlays/dev", "overlays/prod"):
        docs = render(name)
        sa = find(docs, "ServiceAccount", "gitxet-csi-node")
        assert sa["automountServiceAccountToken"] is False
        ds = find(docs, "DaemonSet", "gitxet-csi-node")
        assert ds["spec"]["template"]["spec"]["serviceAccountName"] == "gitxet-csi-node"
        kinds = {d["kind"] for d in docs}
        assert not kinds & {"ClusterRoleBinding", "RoleBinding", "ClusterRole", "Role"}


def test_overlays_change_what_they_say() -> None:
    dev = container(find(render("overlays/dev"), "DaemonSet"), "gitxet-csi")
    assert dev["image"] == "gitxet-csi:dev"
    assert "--log-level=debug" in dev["args"] and "--log-level=info" not in dev["args"]
    prod = container(find(render("overlays/prod"), "DaemonSet"), "gitxet-csi")
    assert re.fullmatch(r"registry\.example\.com/gitxet/gitxet-csi:[0-9.]+", prod["image"])
    assert prod["resources"]["limits"]["memory"]
    assert "--endpoint=$(CSI_ENDPOINT)" in prod["args"]  # the patch kept the wiring
    # the dev overlay brings the examples along; prod does not
    assert any(d["kind"] == "Pod" for d in render("overlays/dev"))
    assert not any(d["kind"] == "Pod" for d in render("overlays/prod"))


def _csi_sources(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for d in docs:
        if d["kind"] == "PersistentVolume":
            out.append(d["spec"]["csi"])
        if d["kind"] == "Pod":
            out.extend(v["csi"] for v in d["spec"]["volumes"] if "csi" in v)
    return out


def test_examples_use_only_what_the_plugin_accepts() -> None:
    docs = render("examples")
    sources = _csi_sources(docs)
    assert len(sources) == 2  # one inline ephemeral volume, one static PV
    secret = find(docs, "Secret", "dataset-token")
    assert "token" in secret["stringData"]
    for src in sources:
        assert src["driver"] == DRIVER_NAME
        assert src["readOnly"] is True  # a writable publish is refused
        attrs = src["volumeAttributes"]
        assert set(attrs) <= set(ATTRIBUTES) and {"repo", "commit"} <= set(attrs)
        assert src["nodePublishSecretRef"]["name"] == "dataset-token"
    pvc = find(docs, "PersistentVolumeClaim")
    assert pvc["spec"]["accessModes"] == ["ReadOnlyMany"]
    for pod in (d for d in docs if d["kind"] == "Pod"):
        for c in pod["spec"]["containers"]:
            assert all(m.get("readOnly") for m in c["volumeMounts"])


def test_dockerfile_builds_the_plugin_image() -> None:
    text = (DEPLOY / "Dockerfile").read_text()
    assert re.search(r"pip install .*\[mount,csi,server\]", text)  # the tier needs server
    assert re.search(r'ENTRYPOINT \["[^"]*git-xet"\]', text)
    assert "fuse3" in text


def _serve_options() -> set[str]:
    """The options ``git xet serve`` takes (from the CLI itself)."""
    import typer.main

    from gitxet.cli.app import app

    group = typer.main.get_command(app)
    serve = group.commands["serve"]  # type: ignore[attr-defined]
    return {opt for p in serve.params for opt in p.opts if opt.startswith("--")}


def test_cache_tier_wiring() -> None:
    docs = render("cache-tier")
    dep = find(docs, "Deployment", "gitxet-tier")
    svc = find(docs, "Service", "gitxet-tier")
    pod = dep["spec"]["template"]["spec"]
    tier = container(dep, "tier")
    args = tier["args"]
    assert args[0] == "serve"
    opts = dict(a.split("=", 1) for a in args[1:])
    # every option is one the CLI has, and a tier's
    assert set(opts) <= _serve_options()
    assert {"--upstream", "--cache-dir", "--cache-size", "--public-url"} <= set(opts)
    assert "--root" not in opts
    env = {e["name"]: e for e in tier["env"]}
    assert opts["--upstream"] == "$(GITXET_UPSTREAM)" and env["GITXET_UPSTREAM"]["value"]
    # the cache sits on the node's disk and its cap is the storage the pod requests
    mounts = {m["name"]: m["mountPath"] for m in tier["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    cache_vol = next(n for n, path in mounts.items() if path == opts["--cache-dir"])
    assert "emptyDir" in volumes[cache_vol]
    assert opts["--cache-size"] == "$(CACHE_BYTES)"
    ref = env["CACHE_BYTES"]["valueFrom"]["resourceFieldRef"]
    assert ref["resource"] == "requests.ephemeral-storage" and ref["containerName"] == "tier"
    res = tier["resources"]

    def size(q: str) -> int:
        return int(q[:-2]) << {"Mi": 20, "Gi": 30, "Ti": 40}[q[-2:]]

    request = size(res["requests"]["ephemeral-storage"])
    assert request < size(res["limits"]["ephemeral-storage"])
    assert request < size(volumes[cache_vol]["emptyDir"]["sizeLimit"])
    # answers point at this pod (so replicas stay consistent) on the port it serves
    ports = {p["name"]: p["containerPort"] for p in tier["ports"]}
    assert opts["--public-url"] == f"http://$(POD_IP):{ports['cas']}"
    assert opts["--port"] == str(ports["cas"])
    assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    assert opts["--metrics"].endswith(f":{ports['metrics']}")
    assert tier["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "cas"}
    # the Service reaches these pods on that port, and keeps a node on one replica
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= labels.items()
    assert svc["spec"]["ports"][0]["targetPort"] == "cas"
    assert svc["spec"]["sessionAffinity"] == "ClientIP"
    # a tier holds no secret of a client and needs no API access
    assert pod["automountServiceAccountToken"] is False
    assert tier["securityContext"]["readOnlyRootFilesystem"] is True
    assert not {d["kind"] for d in docs} & {"Secret", "Role", "ClusterRole"}
