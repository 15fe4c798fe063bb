"""git's smart HTTP protocol, served by running ``git http-backend`` as a CGI program.

Why ``git http-backend`` and not dulwich's server: it is git's own reference
implementation, so clone, fetch, push, protocol v2, shallow and partial clones, gzip'd
request bodies and server-side hooks behave exactly as with any git host, and it runs in
its own process (no GIL contention with the CAS routes, a crash cannot take the server
down). The cost is one short-lived process per request, a few milliseconds.

This module only translates between ASGI and CGI: the app has already authenticated the
caller and validated the repository name. Request bodies are streamed into the CGI's stdin
while its stdout is streamed back, so a large push never sits in memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import shutil
import sys
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from gitxet.errors import ConfigError, GitError, GitxetError
from gitxet.git.hooks import RECEIVE_CAS_ENV, RECEIVE_HOOK, RECEIVE_TOKEN_ENV, install_hooks
from gitxet.server.auth import valid_repo_name

__all__ = ["SERVICES", "CgiResponse", "GitHttpBackend", "create_repo", "repos_dir"]

log = logging.getLogger("gitxet.server.git")

#: Path suffixes (after ``<name>.git``) that git's smart protocol uses.
SERVICES = ("/info/refs", "/git-upload-pack", "/git-receive-pack")
_READ_CHUNK = 256 * 1024


#: git config for every repository the server hosts, existing or new, given through the
#: environment (``GIT_CONFIG_COUNT``/``KEY``/``VALUE``), so no repository can opt out:
#: receive-pack is on (the app checks write access before a push reaches git), and every
#: pushed object is fsck'd, so trees with ``.git``, ``..``, ``/`` or empty names and other
#: malformed objects are refused before any ref moves.
SERVER_GIT_CONFIG = (
    ("http.receivepack", "true"),
    ("safe.directory", "*"),
    ("receive.fsckObjects", "true"),
    ("transfer.fsckObjects", "true"),
    # partial clones (``git clone --filter=blob:none``): the pointer blobs a later
    # checkout needs are fetched then, through the same authenticated route
    ("uploadpack.allowFilter", "true"),
)
#: Written into a repository's own config when the server creates it, so the same checks
#: hold if it is ever pushed to by other means (ssh, a local path).
REPO_GIT_CONFIG = (("receive.fsckObjects", "true"), ("transfer.fsckObjects", "true"))


def _config_env(pairs: tuple[tuple[str, str], ...]) -> dict[str, str]:
    env = {"GIT_CONFIG_COUNT": str(len(pairs))}
    for i, (key, value) in enumerate(pairs):
        env[f"GIT_CONFIG_KEY_{i}"] = key
        env[f"GIT_CONFIG_VALUE_{i}"] = value
    return env


class BodyTooLargeError(GitError):
    """A request body over the configured limit."""


@dataclass
class CgiResponse:
    """Status, headers and the rest of the CGI output as a byte stream."""

    status: int
    headers: list[tuple[str, str]]
    body: AsyncIterator[bytes]


class GitHttpBackend:
    """Runs ``git http-backend`` for repositories under ``repos_root``."""

    def __init__(
        self,
        repos_root: str,
        *,
        git: str | None = None,
        env: Mapping[str, str] | None = None,
        max_body: int = 2 << 30,
    ) -> None:
        self.repos_root = os.path.abspath(repos_root)
        self.git = git or shutil.which("git") or "git"
        self.max_body = max_body
        # A hermetic environment: no host git config, receive-pack enabled (the app checks
        # write access before a push ever reaches git).
        self.env = {
            "PATH": os.defpath,
            "HOME": self.repos_root,
            "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_CONFIG_GLOBAL": os.devnull,
            "GIT_HTTP_EXPORT_ALL": "1",
            "GIT_PROJECT_ROOT": self.repos_root,
            **_config_env(SERVER_GIT_CONFIG),
            **(env or {}),
        }
        self.hook_program = [sys.executable, "-m", "gitxet"]
        self._hooked: set[str] = set()
        self._hook_warned: set[str] = set()

    def check_receives_with(self, cas_url: str, token: str) -> None:
        """Make pushes run the pre-receive check against this CAS (the server's own)."""
        self.env[RECEIVE_CAS_ENV] = cas_url
        self.env[RECEIVE_TOKEN_ENV] = token

    async def ensure_receive_hook(self, name: str) -> None:
        """Install gitxet's pre-receive hook in repository ``name`` (once per process).

        A user's own pre-receive hook is kept and run first (chained). If it cannot be
        installed, pushes are not checked for dangling pointers; that is logged once.
        """
        if name in self._hooked or RECEIVE_CAS_ENV not in self.env:
            return
        path = self.repo_path(name)
        try:
            # where git, under this server's environment, looks for the repository's hooks
            hooks = Path(
                (await self._git_out("--git-dir", path, "rev-parse", "--git-path", "hooks")).strip()
            )
            await asyncio.to_thread(
                functools.partial(
                    install_hooks,
                    path,
                    (RECEIVE_HOOK,),
                    self.hook_program,
                    "chain",
                    directory=hooks if hooks.is_absolute() else Path(path) / hooks,
                )
            )
        except GitxetError as e:
            if name not in self._hook_warned:
                self._hook_warned.add(name)
                log.warning("pushes to %s are not checked for missing file data: %s", name, e)
            return
        self._hooked.add(name)

    def repo_path(self, name: str) -> str:
        """Directory of repository ``name`` (validated by the caller)."""
        return os.path.join(self.repos_root, f"{name}.git")

    def exists(self, name: str) -> bool:
        """Whether repository ``name`` exists."""
        return os.path.isfile(os.path.join(self.repo_path(name), "HEAD"))

    async def _git(self, *args: str) -> None:
        await self._git_out(*args)

    async def _git_out(self, *args: str) -> str:
        proc = await asyncio.create_subprocess_exec(
            self.git,
            *args,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=self.env,
        )
        out, err = await proc.communicate()
        if proc.returncode != 0:
            first = err.decode("utf-8", "replace").strip().splitlines()[:1]
            raise GitError(f"git {args[0]} failed: {first[0] if first else proc.returncode}")
        return out.decode("utf-8", "surrogateescape")

    async def create(self, name: str, initial_branch: str = "main") -> bool:
        """``git init --bare`` a repository; ``False`` if it already existed."""
        if self.exists(name):
            return False
        os.makedirs(self.repos_root, exist_ok=True)
        path = self.repo_path(name)
        await self._git("init", "-q", "--bare", f"--initial-branch={initial_branch}", path)
        for key, value in REPO_GIT_CONFIG:
            await self._git("--git-dir", path, "config", key, value)
        await self.ensure_receive_hook(name)
        return True

    async def _fix_unborn_head(self, name: str) -> None:
        """After a first push of another branch, point HEAD at a branch that exists.

        Only ever at a branch (``refs/heads/feature/x``, never the directory
        ``refs/heads/feature``): ``main``, else ``master``, else the first in name order.
        """
        path = self.repo_path(name)
        try:
            with open(os.path.join(path, "HEAD"), encoding="utf-8") as f:
                head = f.read().strip()
        except OSError:
            return
        if not head.startswith("ref: "):
            return
        try:
            branches = (
                await self._git_out(
                    "--git-dir", path, "for-each-ref", "--format=%(refname)", "refs/heads"
                )
            ).split()
        except GitError:
            return
        if not branches or head[5:] in branches:
            return
        choice = next(
            (b for b in ("refs/heads/main", "refs/heads/master") if b in branches),
            sorted(branches)[0],
        )
        with contextlib.suppress(GitError):
            await self._git("--git-dir", path, "symbolic-ref", "HEAD", choice)

    async def run(
        self,
        *,
        name: str,
        path_suffix: str,
        method: str,
        query: str,
        headers: Mapping[str, str],
        body: AsyncIterator[bytes],
        remote_user: str,
        remote_addr: str,
    ) -> CgiResponse:
        """Run one CGI request. ``headers`` are lower-cased request headers."""
        env = dict(self.env)
        env.update(
            {
                "GATEWAY_INTERFACE": "CGI/1.1",
                "REQUEST_METHOD": method,
                "PATH_INFO": f"/{name}.git{path_suffix}",
                "QUERY_STRING": query,
                "REMOTE_USER": remote_user,
                "REMOTE_ADDR": remote_addr,
                "SERVER_PROTOCOL": "HTTP/1.1",
            }
        )
        if "content-type" in headers:
            env["CONTENT_TYPE"] = headers["content-type"]
        if "content-length" in headers:
            env["CONTENT_LENGTH"] = headers["content-length"]
        if "content-encoding" in headers:
            env["HTTP_CONTENT_ENCODING"] = headers["content-encoding"]
        if "git-protocol" in headers:
            env["GIT_PROTOCOL"] = headers["git-protocol"]
        proc = await asyncio.create_subprocess_exec(
            self.git,
            "http-backend",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
        )
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        # stdout is pumped into a bounded queue from the start, so git never blocks on a
        # full pipe while we are still feeding it the request body. The whole body is fed
        # before the response starts: the ASGI server may then listen for a disconnect
        # without racing this code for the request's body messages.
        queue: asyncio.Queue[bytes | None] = asyncio.Queue(maxsize=64)

        async def pump() -> None:
            assert proc.stdout is not None
            while True:
                part = await proc.stdout.read(_READ_CHUNK)
                await queue.put(part or None)
                if not part:
                    return

        feeder = asyncio.create_task(self._feed(proc, body))
        pumper = asyncio.create_task(pump())
        errors = asyncio.create_task(proc.stderr.read())

        async def abort() -> None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            feeder.cancel()
            pumper.cancel()

        buf = b""
        try:
            while b"\r\n\r\n" not in buf:
                part = await queue.get()
                if part is None:
                    await abort()
                    err = (await errors).decode("utf-8", "replace").strip()
                    log.warning("git http-backend produced no headers: %s", err[:300])
                    raise GitError("git http-backend failed")
                buf += part
                if len(buf) > 64 * 1024:
                    await abort()
                    raise GitError("git http-backend sent oversized headers")
            await feeder
        except BaseException:
            await abort()
            raise
        raw, _, first = buf.partition(b"\r\n\r\n")
        status, out_headers = _parse_cgi_headers(raw)
        receive = path_suffix == "/git-receive-pack"

        async def stream() -> AsyncIterator[bytes]:
            try:
                if first:
                    yield first
                while (part := await queue.get()) is not None:
                    yield part
                await proc.wait()
                err = (await errors).decode("utf-8", "replace").strip()
                if err:
                    log.info("git http-backend: %s", err[:300])
                if receive and proc.returncode == 0:
                    await self._fix_unborn_head(name)
            finally:
                if proc.returncode is None:
                    await abort()
                pumper.cancel()

        return CgiResponse(status, out_headers, stream())

    async def _feed(self, proc: asyncio.subprocess.Process, body: AsyncIterator[bytes]) -> None:
        assert proc.stdin is not None
        total = 0
        try:
            async for part in body:
                total += len(part)
                if total > self.max_body:
                    raise BodyTooLargeError(f"request body over {self.max_body} bytes")
                proc.stdin.write(part)
                await proc.stdin.drain()
        except (BrokenPipeError, ConnectionResetError):
            pass  # git stopped reading (e.g. it answered an error); its output says why
        except RuntimeError:
            # uvloop's way of saying the same: the pipe's transport closed under the write
            if not proc.stdin.is_closing():
                raise
        except BodyTooLargeError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            raise
        finally:
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                proc.stdin.close()


def _parse_cgi_headers(raw: bytes) -> tuple[int, list[tuple[str, str]]]:
    status = 200
    headers: list[tuple[str, str]] = []
    for line in raw.decode("latin-1").split("\r\n"):
        if not line:
            continue
        name, _, value = line.partition(":")
        value = value.strip()
        if name.lower() == "status":
            code = value.split(" ", 1)[0]
            status = int(code) if len(code) == 3 and code.isascii() and code.isdigit() else 500
        else:
            headers.append((name.strip(), value))
    return status, headers


def repos_dir(root: str) -> str:
    """Where the bare repositories of a server rooted at ``root`` live."""
    return os.path.join(os.path.abspath(root), "repos")


def served_root(git_dir: str) -> str | None:
    """The ``--root`` of the ``git xet serve`` that ``git_dir`` is a repository of
    (``<root>/repos/<name>.git`` next to the server's tokens, locks or CAS), else None: its
    file data is in the server's store, not in the repository."""
    repos = os.path.dirname(os.path.abspath(git_dir))
    root = os.path.dirname(repos)
    if os.path.basename(repos) != "repos" or not git_dir.rstrip("/").endswith(".git"):
        return None
    markers = ("tokens.json", "locks", "cas")
    return root if any(os.path.exists(os.path.join(root, m)) for m in markers) else None


def create_repo(root: str, name: str) -> str:
    """``git init --bare`` a repository under ``root``; returns its path. Needs no web
    framework (``git xet repo create`` works without the server extra).

    Raises:
        ConfigError: invalid name, or it already exists.
    """
    if not valid_repo_name(name):
        raise ConfigError(f"invalid repository name {name!r} (letters, digits, '.', '_', '-')")
    git = GitHttpBackend(repos_dir(root))
    if not asyncio.run(git.create(name)):
        raise ConfigError(f"repository {name} already exists")
    return git.repo_path(name)
