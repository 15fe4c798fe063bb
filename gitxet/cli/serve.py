"""Server-side commands (``serve``, ``token``, ``repo create``) and the client's ``login``.

Heavy imports (starlette, uvicorn, boto3, httpx) happen inside the commands so that the
filter process and shell completion stay fast. Tokens are printed only by ``token create``
(alone on stdout, for ``TOKEN=$(git xet token create ...)``) and never logged.
"""

from __future__ import annotations

import os
import sys
import urllib.parse
from typing import TYPE_CHECKING, Annotated

import typer

from gitxet.errors import ConfigError
from gitxet.settings import DEFAULT_CACHE_SIZE, TOKEN_ENV, server_key, strip_credentials

if TYPE_CHECKING:
    from gitxet.server.limits import Limits


def _check_root(root: str | None) -> str | None:
    """``--root``: a directory, or a path where one can be made (not a file)."""
    if root is not None and os.path.exists(root) and not os.path.isdir(root):
        raise typer.BadParameter(f"{root} is not a directory")
    return root


RootOpt = Annotated[
    str,
    typer.Option(
        "--root", callback=_check_root, help="Server data directory (repos, tokens, local CAS)."
    ),
]


def register(app: typer.Typer) -> None:
    """Add ``serve``, ``token``, ``repo`` and ``login`` to the root app."""
    app.command("serve")(serve_cmd)
    app.command("login")(login_cmd)
    token_app = typer.Typer(help="Manage the server's access tokens.", no_args_is_help=True)
    token_app.command("create")(token_create_cmd)
    token_app.command("list")(token_list_cmd)
    token_app.command("revoke")(token_revoke_cmd)
    app.add_typer(token_app, name="token")
    repo_app = typer.Typer(help="Manage the server's git repositories.", no_args_is_help=True)
    repo_app.command("create")(repo_create_cmd)
    app.add_typer(repo_app, name="repo")


def _size(text: str) -> int:
    """``96M``, ``2G``, ``1048576`` -> bytes (the one grammar: ``settings.parse_size``)."""
    from gitxet.errors import ConfigError
    from gitxet.settings import parse_size

    try:
        return parse_size(text)
    except ConfigError as e:
        raise typer.BadParameter(str(e)) from None


def serve_cmd(
    root: Annotated[
        str | None,
        typer.Option(
            "--root",
            callback=_check_root,
            help="Server data directory (repos, tokens, local CAS); not with --upstream.",
        ),
    ] = None,
    upstream: Annotated[
        str | None,
        typer.Option(
            help="Run a read-through cache tier in front of this origin CAS URL (no repos, "
            "no tokens, no uploads); clients choose it with --cas-url or GITXET_CAS_URL.",
        ),
    ] = None,
    cache_dir: Annotated[
        str | None,
        typer.Option("--cache-dir", help="With --upstream: where the tier keeps verified ranges."),
    ] = None,
    cache_size: Annotated[
        str, typer.Option("--cache-size", help="With --upstream: cap of the tier's cache (LRU).")
    ] = DEFAULT_CACHE_SIZE,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[
        int, typer.Option(min=0, max=65535, help="Port to listen on (0: any free port).")
    ] = 8080,
    storage: Annotated[
        str | None,
        typer.Option(help="CAS storage: a directory, or s3://bucket/prefix[?endpoint_url=URL]."),
    ] = None,
    max_body: Annotated[
        str, typer.Option("--max-body", help="Largest CAS upload body (xorb, shard).")
    ] = "96M",
    max_git_body: Annotated[
        str, typer.Option("--max-git-body", help="Largest git push body.")
    ] = "2G",
    public_url: Annotated[
        str | None,
        typer.Option(help="Base URL clients reach this server at (behind a load balancer)."),
    ] = None,
    url_ttl: Annotated[
        int, typer.Option(min=1, help="Seconds a signed data URL stays valid.")
    ] = 3600,
    max_header_bytes: Annotated[
        str, typer.Option("--max-header-bytes", help="Largest request line + headers (431).")
    ] = "64K",
    max_headers: Annotated[
        int, typer.Option("--max-headers", help="Most header lines in a request (431).")
    ] = 100,
    header_timeout: Annotated[
        float,
        typer.Option(help="Seconds a client has to send a whole request head (408, closed)."),
    ] = 10.0,
    body_timeout: Annotated[
        float,
        typer.Option(help="Seconds without a byte of a request body before closing."),
    ] = 60.0,
    keep_alive_timeout: Annotated[
        int, typer.Option(help="Seconds an idle kept-alive connection stays open.")
    ] = 30,
    max_connections: Annotated[
        int,
        typer.Option(
            help="Most open connections; over it the least recently active idle one is closed."
        ),
    ] = 1000,
    log_level: Annotated[str, typer.Option(help="debug, info, warning or error.")] = "info",
    metrics: Annotated[
        str | None,
        typer.Option(
            "--metrics",
            metavar="ADDR",
            help="Serve Prometheus metrics (requests by operation: push, clone, CAS calls; "
            "a tier's hits, misses, bytes from the origin and served) at "
            "http://ADDR/metrics, an address of its own (127.0.0.1 if no host).",
        ),
    ] = None,
) -> None:
    """Serve git repositories and the Xet CAS API over HTTP (Ctrl-C stops gracefully).

    With --upstream URL it serves no repositories: it is a read-through cache tier for the
    origin at URL (the same CAS read API; every read is authorised by the origin with the
    client's own token; each range is fetched from the origin once, verified, cached in
    --cache-dir up to --cache-size). See docs/operations/cache-tier.md.
    """
    import logging

    from gitxet.cli._errors import require

    require("server")
    from gitxet.errors import ConfigError
    from gitxet.server.run import Limits, ServerConfig, build_state, serve

    logging.basicConfig(
        level=getattr(logging, log_level.upper(), logging.INFO),
        stream=sys.stderr,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    try:
        limits = Limits(
            max_header_bytes=_size(max_header_bytes),
            max_headers=max_headers,
            header_timeout=header_timeout,
            body_timeout=body_timeout,
            keep_alive_timeout=keep_alive_timeout,
            max_connections=max_connections,
        )
    except ConfigError as e:
        raise typer.BadParameter(str(e)) from None
    if upstream is not None:
        if root is not None or storage is not None:
            raise typer.BadParameter("--upstream serves no repositories: drop --root/--storage")
        _serve_tier(
            upstream, cache_dir, cache_size, host, port, public_url, url_ttl, limits, metrics
        )
        return
    if root is None:
        raise typer.BadParameter("give --root (a server) or --upstream (a cache tier)")
    if cache_dir is not None:
        raise typer.BadParameter("--cache-dir is for a cache tier (--upstream)")
    if cache_size != DEFAULT_CACHE_SIZE:  # a server keeps no cache: never ignore it silently
        raise typer.BadParameter("--cache-size is for a cache tier (--upstream)")
    cfg = ServerConfig(
        root=root,
        host=host,
        port=port,
        storage=storage,
        max_body=_size(max_body),
        max_git_body=_size(max_git_body),
        public_url=public_url,
        url_ttl=url_ttl,
        limits=limits,
        metrics=metrics,
    )
    state = build_state(cfg)
    logging.getLogger("gitxet.server").info(
        "serving %s (storage: %s)",
        os.path.abspath(root),
        state.service.backend.description,
    )
    serve(cfg, state)


def _serve_tier(
    upstream: str,
    cache_dir: str | None,
    cache_size: str,
    host: str,
    port: int,
    public_url: str | None,
    url_ttl: int,
    limits: Limits,
    metrics: str | None,
) -> None:
    import logging

    from gitxet.server.run import TierConfig, build_tier_state, serve_tier
    from gitxet.settings import check_cas_url, strip_credentials

    if cache_dir is None:
        raise typer.BadParameter("a cache tier needs --cache-dir")
    try:
        origin = check_cas_url(upstream)
    except ConfigError as e:
        raise typer.BadParameter(str(e), param_hint="--upstream") from None
    cfg = TierConfig(
        upstream=origin,
        cache_dir=os.path.abspath(cache_dir),
        cache_bytes=_size(cache_size),
        host=host,
        port=port,
        public_url=public_url,
        url_ttl=url_ttl,
        limits=limits,
        metrics=metrics,
    )
    state = build_tier_state(cfg)
    logging.getLogger("gitxet.server").info(
        "cache tier for %s (cache %s, cap %d bytes)",
        strip_credentials(origin),
        cfg.cache_dir,
        cfg.cache_bytes,
    )
    serve_tier(cfg, state)


def token_create_cmd(
    root: RootOpt,
    scope: Annotated[str, typer.Option(help="read or write (write includes read).")] = "read",
    repo: Annotated[str | None, typer.Option(help="Limit git access to this repository.")] = None,
    label: Annotated[str, typer.Option(help="A note shown by 'token list'.")] = "",
) -> None:
    """Create a token and print it alone on stdout (it is shown only once)."""
    from gitxet.server.auth import TokenStore

    token, rec = TokenStore(root).create(scope, repo, label)
    typer.echo(token)
    typer.echo(f"created token {rec.id} ({rec.scope}, repo {rec.repo or '*'})", err=True)


def token_list_cmd(root: RootOpt) -> None:
    """List token ids, scopes and repositories (never the tokens)."""
    import datetime

    from gitxet.server.auth import TokenStore

    for r in TokenStore(root).list():
        when = datetime.datetime.fromtimestamp(r.created, datetime.UTC).strftime("%Y-%m-%d %H:%M")
        typer.echo(f"{r.id}  {r.scope:<5}  {r.repo or '*':<20}  {when}  {r.label}".rstrip())


def token_revoke_cmd(
    root: RootOpt,
    token_id: Annotated[str, typer.Argument(help="Token id as shown by 'token list'.")],
) -> None:
    """Revoke a token by id (running servers notice at once)."""
    from gitxet.server.auth import TokenStore

    if not TokenStore(root).revoke(token_id):
        typer.echo(f"git-xet: no token with id {token_id}", err=True)
        raise typer.Exit(4)
    typer.echo(f"revoked {token_id}", err=True)


def repo_create_cmd(
    root: RootOpt,
    name: Annotated[str, typer.Argument(help="Repository name (served as <name>.git).")],
) -> None:
    """Create an empty bare repository on the server."""
    from gitxet.server.githttp import create_repo

    path = create_repo(root, name)
    typer.echo(path)


def _keyring_key(url: str) -> str:
    """The keyring entry for a server (see ``settings.server_key``), as a usage error."""
    from gitxet.errors import ConfigError

    try:
        return server_key(url)
    except ConfigError as e:
        raise typer.BadParameter(str(e)) from None


def login_cmd(
    url: Annotated[str, typer.Argument(help="A repository URL (http://host:port/name.git).")],
    token_stdin: Annotated[
        bool, typer.Option("--token-stdin", help="Read the token from stdin, not a prompt.")
    ] = False,
) -> None:
    """Check a token against a server and store it in the system keyring."""
    from gitxet.errors import ConfigError
    from gitxet.remote.client import discover
    from gitxet.settings import store_token

    key = _keyring_key(url)
    if urllib.parse.urlsplit(url).path.strip("/") == "":
        # the token is checked through a repository's discovery: the server root has none
        raise typer.BadParameter(
            f"give a repository URL, such as {strip_credentials(url).rstrip('/')}/NAME.git "
            "(the token is checked against it; it is then used for every repository of the "
            "server)"
        )
    if token_stdin:
        token = sys.stdin.readline().strip()
    else:
        token = os.environ.get(TOKEN_ENV) or typer.prompt("Token", hide_input=True)
    if not token:
        raise typer.BadParameter("empty token")
    found = discover(url, token=token)
    try:
        store_token(url, token)
    except ConfigError as e:
        typer.echo(f"git-xet: {e}", err=True)
        typer.echo(f"git-xet: set {TOKEN_ENV} instead", err=True)
        raise typer.Exit(1) from None
    typer.echo(f"logged in to {key} (CAS at {found.cas_url})", err=True)
