"""The CSI Identity service: who this plugin is, what it offers, whether it is ready.

The plugin is node-only: it advertises no plugin capability. ``CONTROLLER_SERVICE`` would
make a CO call CreateVolume/ControllerPublishVolume, which have nothing to do for a dataset
commit (volumes are declared, not provisioned, and nothing attaches);
``VOLUME_ACCESSIBILITY_CONSTRAINTS`` would need topology, but every node can reach every
repository; volume expansion makes no sense for a read-only commit.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from gitxet.plugins.csi import csi_pb2, csi_pb2_grpc, rpc
from gitxet.plugins.csi.volumes import CsiRequestError

DRIVER_NAME = "xet.gitxet.dev"
# CSI: at most 63 characters, alphanumerics at both ends, dashes and dots between.
_NAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9.-]{0,61}[A-Za-z0-9])?")


class IdentityServicer(csi_pb2_grpc.IdentityServicer):
    """GetPluginInfo, GetPluginCapabilities and Probe.

    ``probe`` says whether the plugin is ready (``False`` while it is still re-adopting its
    mounts after a restart); it raises :class:`CsiRequestError` when the plugin is unhealthy,
    which answers Probe with that error so the liveness sidecar restarts the container.
    """

    def __init__(
        self,
        version: str,
        probe: Callable[[], bool],
        *,
        name: str = DRIVER_NAME,
        manifest: Mapping[str, str] | None = None,
    ) -> None:
        if not _NAME.fullmatch(name):
            raise ValueError(f"{name!r} is not a valid CSI driver name")
        if not version:
            raise ValueError("the plugin version is required")
        self.name = name
        self.version = version
        self.manifest = dict(manifest or {})
        self._probe = probe

    def GetPluginInfo(self, request: Any, context: Any) -> Any:
        return rpc.handle(
            "GetPluginInfo",
            request,
            context,
            lambda: csi_pb2.GetPluginInfoResponse(
                name=self.name, vendor_version=self.version, manifest=self.manifest
            ),
        )

    def GetPluginCapabilities(self, request: Any, context: Any) -> Any:
        return rpc.handle(
            "GetPluginCapabilities",
            request,
            context,
            csi_pb2.GetPluginCapabilitiesResponse,
        )

    def Probe(self, request: Any, context: Any) -> Any:
        def answer() -> Any:
            try:
                ready = self._probe()
            except CsiRequestError:
                raise
            except Exception as exc:
                raise CsiRequestError("FAILED_PRECONDITION", f"unhealthy: {exc}") from exc
            return csi_pb2.ProbeResponse(ready={"value": bool(ready)})

        return rpc.handle("Probe", request, context, answer)
