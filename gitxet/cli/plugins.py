"""``git xet docker-plugin``: run the Docker volume plugin on a unix socket."""

from __future__ import annotations

import os
import signal
import sys
import threading
from typing import Annotated

import typer

DEFAULT_SOCKET = "/run/docker/plugins/gitxet.sock"
DEFAULT_STATE_DIR = "/var/lib/gitxet/docker"


def register(app: typer.Typer) -> None:
    """Add ``docker-plugin`` to the root app."""
    app.command("docker-plugin")(docker_plugin_cmd)


def docker_plugin_cmd(
    socket_path: Annotated[
        str,
        typer.Option(
            "--socket", help="Unix socket Docker finds the plugin at (its name is the driver)."
        ),
    ] = DEFAULT_SOCKET,
    state_dir: Annotated[
        str, typer.Option("--state-dir", help="Volume table, mount records, logs, node cache.")
    ] = DEFAULT_STATE_DIR,
    mount_root: Annotated[
        str | None,
        typer.Option(
            "--mount-root",
            help="Where volumes are mounted (default: STATE_DIR/volumes; a managed plugin "
            "uses its propagatedMount).",
        ),
    ] = None,
    mount_timeout: Annotated[
        float, typer.Option(help="Seconds a mount may take to become ready.")
    ] = 60.0,
    log_level: Annotated[str, typer.Option(help="debug, info, warning or error.")] = "info",
    token_dir: Annotated[
        str | None,
        typer.Option(
            "--token-dir",
            help="The directory volumes' token_file options may name files in (no symlinks); "
            "without it token_file is refused.",
        ),
    ] = None,
) -> None:
    """Docker volume plugin: containers mount dataset commits read-only.

    Volume options: repo, commit (pinned at create), subdir, token or token_file (inside
    --token-dir; re-read by the mount when it changes), cache_size, prefetch, cas (a cache
    tier to read data through). Mounts run as their own
    processes and outlive the plugin; a restarted plugin adopts them. See
    docs/operations/docker.md.
    """
    import logging

    from gitxet.plugins.docker_volume import PluginServer, VolumeDriver
    from gitxet.plugins.mounter import SubprocessMounter
    from gitxet.settings import TOKEN_ENV, TOKEN_FILE_ENV
    from gitxet.util.statelock import lock_state_dir

    logging.basicConfig(
        level=getattr(logging, log_level.upper(), logging.INFO),
        stream=sys.stderr,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    log = logging.getLogger("gitxet.plugins.docker")
    state = os.path.abspath(state_dir)
    lock_fd = lock_state_dir(state, owner="plugin")
    # The daemons get this environment (PATH, HOME for git) but never a token of ours: each
    # volume's token is handed to its own daemon only.
    env = {k: v for k, v in os.environ.items() if k not in (TOKEN_ENV, TOKEN_FILE_ENV)}
    from gitxet.cli._env import plugin_resolver

    mounter = SubprocessMounter(os.path.join(state, "mounter"), env=env)
    # the resolver mirrors git metadata into the cache the daemons use (the node cache)
    resolve = plugin_resolver(mounter.cache_dir)
    mounter.set_resolver(resolve)
    driver = VolumeDriver(
        mounter,
        state,
        mount_root or os.path.join(state, "volumes"),
        resolve=resolve,  # Create pins http(s) volumes too, each with its own token
        mount_timeout=mount_timeout,
        token_dir=token_dir,
    )
    server = PluginServer(socket_path, driver)

    def stop(*_: object) -> None:
        # shutdown() waits for serve_forever() to return, so it cannot run on its thread.
        threading.Thread(target=server.shutdown, daemon=True).start()

    for s in (signal.SIGTERM, signal.SIGINT):
        signal.signal(s, stop)

    def recover() -> None:
        failed = driver.recover()
        log.info("recovered mounts (%d failed)", len(failed))

    # Serving starts at once; volumes in use are brought back meanwhile (per-volume locks
    # keep a Mount request and the recovery of the same volume from racing).
    threading.Thread(target=recover, name="gitxet-recover", daemon=True).start()
    log.info(
        "docker volume plugin on %s (%d volumes, mounts under %s)",
        socket_path,
        len(driver.volumes),
        driver.mount_root,
    )
    try:
        server.serve_forever(poll_interval=0.5)
    finally:
        server.server_close()
        os.close(lock_fd)
        log.info("stopped; mounts keep serving until their volumes are unmounted")
