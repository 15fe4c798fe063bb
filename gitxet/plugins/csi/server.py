"""The CSI gRPC server: Identity and Node services on a unix socket.

kubelet and the sidecars (node-driver-registrar, livenessprobe) talk to the plugin over a
unix socket in a host directory shared with the sidecar containers; CSI plugins never listen
on TCP. A socket file left by a previous run (a crash, a container restart) is replaced; a
socket that still answers belongs to a running plugin and is never taken over.
"""

from __future__ import annotations

import contextlib
import logging
import os
from concurrent import futures

import grpc

from gitxet.errors import ConfigError
from gitxet.plugins.csi import csi_pb2_grpc
from gitxet.plugins.csi.identity import IdentityServicer
from gitxet.plugins.csi.node import NodeServicer
from gitxet.util.statelock import clear_stale_socket

log = logging.getLogger("gitxet.plugins.csi")

_MAX_SOCKET_PATH = 107  # sun_path holds 108 bytes including the terminating NUL


def parse_endpoint(endpoint: str) -> str:
    """The socket path of a CSI endpoint: ``unix:///abs/path``, ``unix:/abs/path`` or a path.

    Raises:
        ConfigError: not a unix endpoint, not absolute, or too long for a socket address.
    """
    path = endpoint
    if endpoint.startswith("unix://"):
        path = endpoint[len("unix://") :]
    elif endpoint.startswith("unix:"):
        path = endpoint[len("unix:") :]
    elif "://" in endpoint:
        raise ConfigError(f"CSI endpoint {endpoint!r}: only unix sockets are supported")
    if not path.startswith("/"):
        raise ConfigError(f"CSI endpoint {endpoint!r}: the socket path must be absolute")
    if len(os.fsencode(path)) > _MAX_SOCKET_PATH:
        raise ConfigError(f"CSI endpoint {endpoint!r}: longer than {_MAX_SOCKET_PATH} bytes")
    return os.path.normpath(path)


class CsiServer:
    """A gRPC server running the Identity and Node services on one unix socket."""

    def __init__(
        self,
        endpoint: str,
        identity: IdentityServicer,
        node: NodeServicer,
        *,
        max_workers: int = 8,
    ) -> None:
        self.socket_path = parse_endpoint(endpoint)
        self.identity = identity
        self.node = node
        self.max_workers = max_workers
        self._server: grpc.Server | None = None

    @property
    def address(self) -> str:
        """The gRPC target string for clients (``unix:///...``)."""
        return "unix://" + self.socket_path

    def start(self) -> None:
        """Bind the socket and start serving (returns at once)."""
        if self._server is not None:
            raise RuntimeError("the CSI server is already started")
        os.makedirs(os.path.dirname(self.socket_path), exist_ok=True)
        clear_stale_socket(self.socket_path)
        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=self.max_workers, thread_name_prefix="csi"),
            # One connection's calls must not starve the others; CSI calls are few and small.
            options=[("grpc.max_receive_message_length", 4 * 1024 * 1024)],
        )
        csi_pb2_grpc.add_IdentityServicer_to_server(self.identity, server)
        csi_pb2_grpc.add_NodeServicer_to_server(self.node, server)
        try:
            bound = server.add_insecure_port(self.address)
        except RuntimeError as exc:
            raise ConfigError(f"cannot listen on {self.socket_path}: {exc}") from None
        if not bound:
            raise ConfigError(f"cannot listen on {self.socket_path}")
        server.start()
        self._server = server
        log.info(
            "CSI plugin %s %s listening on %s",
            self.identity.name,
            self.identity.version,
            self.address,
        )

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the server stops (or ``timeout``); returns whether it stopped."""
        if self._server is None:
            return True
        return bool(self._server.wait_for_termination(timeout))

    def stop(self, grace: float = 5.0) -> None:
        """Stop accepting calls, let running ones finish for ``grace`` seconds, remove the socket.

        Mounts are left alone: they belong to their daemons and outlive the plugin.
        """
        server, self._server = self._server, None
        if server is not None:
            server.stop(grace).wait()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)
