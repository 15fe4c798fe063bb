"""Assemble the server from a :class:`ServerConfig` and run it on uvicorn.

Layout of ``--root``::

    repos/<name>.git     bare git repositories (served by ``git http-backend``)
    tokens.json          token records (hashed), see ``gitxet.server.auth``
    cas/                 CAS objects when no ``--storage`` URL is given
    locks/

:func:`serve` runs in the foreground and stops gracefully on SIGINT/SIGTERM: the socket
stops accepting, in-flight requests get ``graceful_timeout`` seconds to finish.
:class:`BackgroundServer` runs the same server in a thread (tests, embedding).
uvicorn's own access log is off: ours (``gitxet.server.access``) leaves out query strings,
which hold URL signatures. Logging is configured by the caller (the CLI).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Self

import uvicorn
from starlette.types import ASGIApp

from gitxet.errors import ConfigError
from gitxet.server.app import AppState, create_app
from gitxet.server.auth import TokenStore
from gitxet.server.backends import Backend, open_backend
from gitxet.server.githttp import GitHttpBackend, create_repo, repos_dir
from gitxet.server.index import CasIndex
from gitxet.server.limits import Limits, protocol_class
from gitxet.server.service import CasService
from gitxet.server.signing import UrlSigner, load_or_create_key

if TYPE_CHECKING:
    from gitxet.server.metrics import ServerMetrics
    from gitxet.server.tierapp import TierState

__all__ = [
    "BackgroundServer",
    "BackgroundTier",
    "Limits",
    "ServerConfig",
    "TierConfig",
    "build_state",
    "build_tier_state",
    "create_repo",
    "repos_dir",
    "serve",
    "serve_tier",
]

log = logging.getLogger("gitxet.server")

#: Default CAS body limit: a full xorb (64 MiB plus headers) with room to spare.
DEFAULT_MAX_BODY = 96 << 20


@dataclass
class ServerConfig:
    """Everything ``git xet serve`` takes."""

    root: str
    host: str = "127.0.0.1"
    port: int = 8080
    storage: str | None = None
    max_body: int = DEFAULT_MAX_BODY
    max_git_body: int = 2 << 30
    public_url: str | None = None
    url_ttl: int = 3600
    graceful_timeout: float = 30.0
    git_env: Mapping[str, str] = field(default_factory=dict)
    limits: Limits = field(default_factory=Limits)
    metrics: str | None = None  # HOST:PORT of the Prometheus endpoint, or None


def build_state(cfg: ServerConfig, backend: Backend | None = None) -> AppState:
    """Open storage, index it, load the signing key and the token file."""
    os.makedirs(cfg.root, exist_ok=True)
    backend = backend or open_backend(cfg.storage, cfg.root)
    swept = backend.remove_stale_temps()
    if swept:
        log.info("removed %d temp file(s) left by killed writers", swept)
    index = CasIndex(backend)
    index.refresh(force=True)
    return AppState(
        service=CasService(backend, index),
        tokens=TokenStore(cfg.root),
        signer=UrlSigner(load_or_create_key(backend), ttl=cfg.url_ttl),
        git=GitHttpBackend(repos_dir(cfg.root), env=cfg.git_env, max_body=cfg.max_git_body),
        max_body=cfg.max_body,
        public_url=cfg.public_url.rstrip("/") if cfg.public_url else None,
        metrics=_metrics(),
    )


@dataclass
class TierConfig:
    """Everything ``git xet serve --upstream`` takes (a read-through cache tier)."""

    upstream: str
    cache_dir: str
    cache_bytes: int
    host: str = "127.0.0.1"
    port: int = 8080
    public_url: str | None = None
    url_ttl: int = 3600
    graceful_timeout: float = 30.0
    limits: Limits = field(default_factory=Limits)
    metrics: str | None = None  # ADDR of a Prometheus endpoint, or None


def build_tier_state(cfg: TierConfig) -> TierState:
    """Open the tier's cache and signing key; nothing is asked of the origin yet."""
    from gitxet.server.tier import TierService, tier_signer
    from gitxet.server.tierapp import TierState

    if not cfg.upstream.startswith(("http://", "https://")):
        raise ConfigError(f"--upstream must be an http(s) URL, not {cfg.upstream!r}")
    os.makedirs(cfg.cache_dir, exist_ok=True)
    tier = TierService(cfg.upstream, cfg.cache_dir, cfg.cache_bytes)
    metrics = _metrics()
    if metrics is not None:
        from gitxet.server.tier import register_tier_metrics

        register_tier_metrics(metrics.registry, tier)
    return TierState(
        tier=tier,
        signer=tier_signer(cfg.cache_dir, cfg.url_ttl),
        public_url=cfg.public_url.rstrip("/") if cfg.public_url else None,
        metrics=metrics,
    )


def _metrics() -> ServerMetrics | None:
    try:
        from gitxet.server.metrics import ServerMetrics
    except ImportError:  # prometheus_client missing: counting is off, --metrics fails
        return None
    return ServerMetrics()


def _serve_metrics(cfg: ServerConfig | TierConfig, state: AppState | TierState) -> Any:
    """Start the metrics endpoint when ``cfg.metrics`` asks for one."""
    if not cfg.metrics:
        return None
    if state.metrics is None:
        raise ConfigError("--metrics needs prometheus_client (pip install 'gitxet[server]')")
    return state.metrics.serve(cfg.metrics)


def _uvicorn_config(app: ASGIApp, cfg: ServerConfig | TierConfig) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        host=cfg.host,
        port=cfg.port,
        access_log=False,
        log_config=None,
        timeout_graceful_shutdown=int(cfg.graceful_timeout),
        timeout_keep_alive=cfg.limits.keep_alive_timeout,
        http=protocol_class(cfg.limits),
        ws="none",
        server_header=False,
        proxy_headers=False,
        lifespan="off",
    )


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise ConfigError(f"cannot listen on {host}:{port}: {e.strerror}") from None
    sock.listen(1024)
    sock.set_inheritable(True)
    return sock


def _check_fd_limit(limits: Limits) -> None:
    """Warn when the open-file limit cannot hold ``max_connections`` (the CLI raised it)."""
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = limits.max_connections * 2 + 256  # a request may hold a few more (git, files)
    if soft != resource.RLIM_INFINITY and soft < want:
        log.warning(
            "open-file limit %d is low for --max-connections %d (want %d): raise it (ulimit -n)",
            soft,
            limits.max_connections,
            want,
        )


def _own_url(sock: socket.socket) -> str:
    """How processes on this machine reach the bound socket (for the pre-receive hook)."""
    host, port = sock.getsockname()[:2]
    if host in ("0.0.0.0", ""):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    return _http_url(host, port)


def _http_url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _listen(cfg: ServerConfig, state: AppState) -> socket.socket:
    sock = _bind(cfg.host, cfg.port)
    state.git.check_receives_with(_own_url(sock), state.internal_token)
    return sock


def serve(cfg: ServerConfig, state: AppState | None = None) -> None:
    """Run in the foreground until SIGINT/SIGTERM (graceful shutdown)."""
    state = state or build_state(cfg)
    _check_fd_limit(cfg.limits)
    sock = _listen(cfg, state)
    _run(create_app(state), cfg, sock, state, state.service.backend.close)


def serve_tier(cfg: TierConfig, state: TierState | None = None) -> None:
    """Run a cache tier in the foreground until SIGINT/SIGTERM (graceful shutdown)."""
    from gitxet.server.tierapp import create_tier_app

    state = state or build_tier_state(cfg)
    _check_fd_limit(cfg.limits)
    sock = _bind(cfg.host, cfg.port)
    _run(create_tier_app(state), cfg, sock, state, state.tier.close)


def _run(
    app: ASGIApp,
    cfg: ServerConfig | TierConfig,
    sock: socket.socket,
    state: AppState | TierState,
    close: Callable[[], None],
) -> None:
    endpoint = _serve_metrics(cfg, state)
    server = uvicorn.Server(_uvicorn_config(app, cfg))
    # The bound ports: with port 0 they are known only now (uvicorn says nothing of it).
    if endpoint is not None:
        log.info("metrics on %s/metrics", _http_url(*endpoint.server_address[:2]))
    log.info("listening on %s", _http_url(*sock.getsockname()[:2]))
    try:
        server.run(sockets=[sock])
    finally:
        if endpoint is not None:
            endpoint.shutdown()
            endpoint.server_close()
        sock.close()
        close()


class _Background:
    """An app on a background thread; ``port=0`` picks a free port. For tests."""

    def __init__(
        self,
        app: ASGIApp,
        cfg: ServerConfig | TierConfig,
        sock: socket.socket,
        state: AppState | TierState,
        close: Callable[[], None],
    ) -> None:
        self.sock = sock
        self._close = close
        self.metrics_endpoint = _serve_metrics(cfg, state)
        host, port = self.sock.getsockname()[:2]
        self.url = f"http://{host}:{port}"
        self.port = int(port)
        self.server = uvicorn.Server(_uvicorn_config(app, cfg))
        # A thread cannot install signal handlers; uvicorn skips them off the main thread.
        self.thread = threading.Thread(
            target=self.server.run,
            kwargs={"sockets": [self.sock]},
            daemon=True,
            name="gitxet-serve",
        )

    def start(self, timeout: float = 10.0) -> Self:
        """Start and wait until it accepts connections."""
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("server did not start")
            time.sleep(0.01)
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Ask for a graceful stop and wait for it."""
        self.server.should_exit = True
        self.thread.join(timeout)
        if self.metrics_endpoint is not None:
            self.metrics_endpoint.shutdown()
            self.metrics_endpoint.server_close()
        with contextlib.suppress(OSError):
            self.sock.close()
        self._close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class BackgroundServer(_Background):
    """The server on a background thread; ``port=0`` picks a free port. For tests."""

    def __init__(self, cfg: ServerConfig, state: AppState | None = None) -> None:
        self.state = state or build_state(cfg)
        sock = _listen(cfg, self.state)
        app = create_app(self.state)
        super().__init__(app, cfg, sock, self.state, self.state.service.backend.close)


class BackgroundTier(_Background):
    """A cache tier on a background thread; ``port=0`` picks a free port. For tests."""

    def __init__(self, cfg: TierConfig, state: TierState | None = None) -> None:
        from gitxet.server.tierapp import create_tier_app

        self.state = state or build_tier_state(cfg)
        sock = _bind(cfg.host, cfg.port)
        super().__init__(create_tier_app(self.state), cfg, sock, self.state, self.state.tier.close)
