"""``git xet csi``: run the Kubernetes CSI node plugin on a unix socket."""

from __future__ import annotations

import os
import signal
import sys
import threading
from typing import Annotated

import typer

DEFAULT_ENDPOINT = "unix:///csi/csi.sock"
DEFAULT_STATE_DIR = "/var/lib/gitxet-csi"
DEFAULT_TARGET_ROOT = "/var/lib/kubelet"


def register(app: typer.Typer) -> None:
    """Add ``csi`` to the root app."""
    app.command("csi")(csi_cmd)


def csi_cmd(
    node_id: Annotated[
        str,
        typer.Option(
            "--node-id",
            envvar="CSI_NODE_ID",
            help="This node's name as Kubernetes knows it (spec.nodeName).",
        ),
    ],
    endpoint: Annotated[
        str,
        typer.Option(envvar="CSI_ENDPOINT", help="Unix socket to serve on (unix:///path)."),
    ] = DEFAULT_ENDPOINT,
    state_dir: Annotated[
        str,
        typer.Option(
            "--state-dir", help="Mount records, daemon logs and the node-wide chunk cache."
        ),
    ] = DEFAULT_STATE_DIR,
    max_volumes_per_node: Annotated[
        int, typer.Option(min=0, help="Volumes this node accepts (0: no limit).")
    ] = 0,
    mount_timeout: Annotated[
        float, typer.Option(min=1.0, help="Seconds a mount may take to become ready.")
    ] = 60.0,
    log_level: Annotated[str, typer.Option(help="debug, info, warning or error.")] = "info",
    target_root: Annotated[
        str,
        typer.Option(
            "--target-root",
            help="Publish only to target paths below this directory (kubelet's root "
            "directory; '/': anywhere).",
        ),
    ] = DEFAULT_TARGET_ROOT,
) -> None:
    """Serve the CSI Identity and Node services: pods mount dataset commits read-only.

    Volume attributes: repo, commit (required), subdir, cacheSize, prefetch, cas (a cache
    tier to read data through); the token comes
    from the volume's nodePublishSecretRef (key: token). Mounts run as their own processes
    and share one chunk cache; a restarted plugin adopts them. See
    docs/operations/kubernetes.md.
    """
    import logging

    from gitxet.cli._errors import require

    require("csi")
    import gitxet
    from gitxet.plugins.csi.identity import IdentityServicer
    from gitxet.plugins.csi.node import NodeConfig, NodeService, NodeServicer
    from gitxet.plugins.csi.server import CsiServer
    from gitxet.plugins.mounter import SubprocessMounter
    from gitxet.settings import TOKEN_ENV, TOKEN_FILE_ENV
    from gitxet.util.statelock import lock_state_dir

    level = getattr(logging, log_level.upper(), None)
    if not isinstance(level, int):
        raise typer.BadParameter(f"unknown log level {log_level!r}", param_hint="--log-level")
    logging.basicConfig(
        level=level, stream=sys.stderr, format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )
    log = logging.getLogger("gitxet.plugins.csi")
    state = os.path.abspath(state_dir)
    lock_fd = lock_state_dir(state, lock_name="csi.lock", owner="CSI plugin")
    # Mount daemons inherit PATH/HOME but never a token of ours: each volume's token goes
    # to its own daemon only.
    env = {k: v for k, v in os.environ.items() if k not in (TOKEN_ENV, TOKEN_FILE_ENV)}
    from gitxet.cli._env import plugin_resolver

    mounter = SubprocessMounter(os.path.join(state, "mounter"), env=env)
    # the resolver mirrors git metadata into the cache the daemons use (the node cache)
    mounter.set_resolver(plugin_resolver(mounter.cache_dir))
    node = NodeService(
        mounter,
        os.path.join(state, "csi"),
        NodeConfig(
            node_id=node_id,
            max_volumes_per_node=max_volumes_per_node,
            mount_timeout=mount_timeout,
            target_root=None
            if os.path.abspath(target_root) == "/"
            else os.path.abspath(target_root),
        ),
    )
    identity = IdentityServicer(gitxet.__version__, lambda: node.ready)
    server = CsiServer(endpoint, identity, NodeServicer(node))
    stopping = threading.Event()

    def stop(*_: object) -> None:
        stopping.set()

    for s in (signal.SIGTERM, signal.SIGINT):
        signal.signal(s, stop)
    server.start()
    # Serve first (the registrar and the liveness probe connect at once; Probe says "not
    # ready" meanwhile), then re-adopt the mounts of the previous run.
    threading.Thread(target=node.recover, name="csi-recover", daemon=True).start()
    try:
        while not stopping.wait(3600):
            pass
    finally:
        log.info("stopping; mounts keep serving")
        server.stop()
        os.close(lock_fd)
