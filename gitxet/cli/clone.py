"""``git xet clone``: git clones the metadata, then the data is written, with the fixed
costs of an HTTP clone out of the way of the data.

* **No credential round trip.** For a gitxet server and a token from ``GITXET_TOKEN`` (or a
  token file), git gets the token as an ``Authorization`` header for that one URL, passed
  through git's ``GIT_CONFIG_*`` environment of the ``git clone`` process only (never its
  arguments, never a config file). git otherwise asks anonymously, is answered 401, and
  starts the credential helper (a second interpreter) to learn the same token.
* **The data side is ready when git is done.** While ``git clone`` runs, a thread
  discovers the server's CAS, opens the node cache and imports the reading code.
"""

from __future__ import annotations

import base64
import gc
import os
import sys
import threading
from typing import Any

from gitxet.cli import hot
from gitxet.util.shown import shown


def _same_url(a: str, b: str) -> bool:
    return a.rstrip("/") == b.rstrip("/")


def auth_env(url: str, token: str, environ: dict[str, str]) -> dict[str, str]:
    """git's ``GIT_CONFIG_*`` variables that send ``token`` (HTTP basic, as git's
    credential helper would) with every request to ``url``, with redirects refused (the
    header must never follow one to another host); the variables already in ``environ``
    are kept. Empty when ``environ`` holds a malformed ``GIT_CONFIG_COUNT``."""
    from gitxet.settings import TOKEN_USERNAME

    try:
        n = int(environ.get("GIT_CONFIG_COUNT") or "0")
    except ValueError:
        return {}
    if n < 0:
        return {}
    basic = base64.b64encode(f"{TOKEN_USERNAME}:{token}".encode()).decode("ascii")
    pairs = [
        (f"http.{url}.extraHeader", f"Authorization: Basic {basic}"),
        (f"http.{url}.followRedirects", "false"),
    ]
    out = {"GIT_CONFIG_COUNT": str(n + len(pairs))}
    for i, (key, value) in enumerate(pairs, start=n):
        out[f"GIT_CONFIG_KEY_{i}"] = key
        out[f"GIT_CONFIG_VALUE_{i}"] = value
    return out


_CHECKOUT_MODULES = (
    "gitxet.data.remote_source",
    "gitxet.data.reconstruct",
    "gitxet.repo.materialize",
    "gitxet.repo.content",
)


class _Prepared:
    """The CAS side of an http(s) ``url``, made ready on a thread from the start of the
    clone: the imports of the HTTP and reading code (while the server is probed and git
    clones), then, once :meth:`decide` says it is a gitxet server, the discovery of its CAS
    and the node cache. :meth:`take` hands the remote over once; :attr:`access` is set
    after :meth:`join` (None if that failed)."""

    def __init__(self, url: str, settings: Any) -> None:
        self.url = url
        self.access: Any = None
        self._settings = settings
        self._remote: Any = None
        self._gitxet = False
        self._decided = threading.Event()
        self._taken = False
        self._thread = threading.Thread(target=self._build, name="gitxet-clone-prep", daemon=True)
        self._thread.start()

    def decide(self, gitxet: bool) -> None:
        """Say whether the server is a gitxet server (its CAS is then opened)."""
        self._gitxet = gitxet
        self._decided.set()

    def _build(self) -> None:
        try:
            import importlib

            from gitxet.dataset import HttpAccess

            for name in _CHECKOUT_MODULES:  # what the checkout imports, while git works
                importlib.import_module(name)
            self.access = HttpAccess.from_settings(self._settings)
            self._decided.wait()
            if self._gitxet:
                self._remote = self.access.remote_factory(self.url)
        except Exception:  # built again where it is used, and failing there
            self._remote = None

    def join(self) -> None:
        """Wait until the thread is done."""
        self._thread.join()

    def take(self, url: str) -> Any:
        """The remote built for ``url`` (once), else None."""
        if self._taken or not _same_url(url, self.url):
            return None
        self._thread.join()
        self._taken = True
        return self._remote

    def close(self) -> None:
        """Close the remote if nobody took it (and end the thread, decided or not)."""
        if not self._decided.is_set():
            self.decide(False)
        if self._taken:
            return
        self._taken = True
        self._thread.join()
        close = getattr(self._remote, "close", None)
        if close is not None:
            close()


#: the variables that send git's (and httpx's) plain-http requests through a proxy
_PROXY_VARIABLES = ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY")


def _fast_auth(src: str, settings: Any) -> tuple[dict[str, str], bool]:
    """(extra environment for ``git clone``, whether ``src`` is a gitxet server)."""
    if not src.startswith(("http://", "https://")):
        return {}, False
    from gitxet.settings import url_token

    if url_token(src) is not None:
        return {}, False  # git has the credentials already, and so does the CAS side
    from gitxet.remote.probe import plain_http_probe

    # plain http with no proxy: asked with the standard library (httpx loads meanwhile)
    proxied = any(os.environ.get(name) for name in _PROXY_VARIABLES)
    found = None if proxied else plain_http_probe(src)
    if found is None:
        from gitxet.remote.client import is_gitxet_server

        found = is_gitxet_server(src)
    if not found:
        return {}, False
    if (
        settings.token is None
        and settings.token_file is None
        and settings.env_token_for(src) is None
    ):
        return {}, True  # a keyring token: git's credential helper finds it
    return auth_env(src, settings.token_for(src), dict(os.environ)), True


def run(
    src: str,
    directory: str | None = None,
    *,
    lazy: bool = False,
    branch: str | None = None,
    cas_url: str | None = None,
    depth: int | None = None,
    quiet: bool = False,
) -> int:
    """Clone ``src`` and materialize its large files (leave pointers with ``lazy``); only
    the last ``depth`` commits when given; nothing but errors said with ``quiet``. Returns
    the exit status (git's own failures: 1, or 128 + a signal).

    Raises:
        NotFoundError: ``src`` is neither a URL nor an existing path.
    """
    from gitxet.errors import NotFoundError

    if not looks_remote(src) and not os.path.exists(src):
        raise NotFoundError(f"no repository at {src}")
    if cas_url is not None:
        from gitxet.settings import CAS_URL_ENV, check_cas_url

        # this process and the filters git runs for the clone read through the tier
        os.environ[CAS_URL_ENV] = check_cas_url(cas_url)
    from gitxet.settings import Settings, lazy_default

    settings = Settings.load()
    lazy_default()  # malformed: said before git clones, not once it is done
    target = directory or clone_dir_name(src)
    if not lazy and unfinished(target, src):
        if not quiet:
            print(f"git-xet: finishing the interrupted clone in {shown(target)}", file=sys.stderr)
        return finish(target, settings, None, resuming=True, quiet=quiet)
    http = src.startswith(("http://", "https://"))
    prepared = _Prepared(src, settings) if http and not lazy else None
    try:
        env, gitxet_server = _fast_auth(src, settings)
        if prepared is not None:
            prepared.decide(gitxet_server)
        return _clone(src, directory, lazy, branch, env, settings, prepared, depth, quiet)
    finally:
        if prepared is not None:
            prepared.close()


def _clone(
    src: str,
    directory: str | None,
    lazy: bool,
    branch: str | None,
    env: dict[str, str],
    settings: Any,
    prepared: _Prepared | None,
    depth: int | None = None,
    quiet: bool = False,
) -> int:
    program = hot.program()
    args = [
        "clone",
        "--config", f"filter.xet.process={program} filter-process",
        "--config", "filter.xet.required=true",
        "--config", f"filter.xet.clean={program} clean -- %f",
        "--config", f"filter.xet.smudge={program} smudge -- %f",
    ]  # fmt: skip
    if lazy:
        args += ["--config", "xet.lazy=true"]
    else:
        # fetch every file's data in one parallel batch, then check out from the local store;
        # until that is done the clone is marked unfinished (a killed one is resumed)
        args += ["--no-checkout", "--config", f"{UNFINISHED}=true"]
    if branch:
        args += ["--branch", branch]
    if depth is not None:
        args += ["--depth", str(depth)]
    if quiet:
        args.append("--quiet")
    args += ["--", src]
    if directory:
        args.append(directory)
    code = hot.run_git(args, env=env)
    if code:
        return code
    target = directory or clone_dir_name(src)
    from gitxet.git import hooks

    hooks.install_hooks(target, names=("pre-push",), program=program, on_conflict="chain")
    if lazy:
        return 0
    return finish(target, settings, prepared, resuming=False, quiet=quiet)


UNFINISHED = "xet.cloneUnfinished"
"""git config key of a clone whose files are not all written yet (``git xet clone``, not
``--lazy``): running the clone again, or ``git xet checkout``, finishes it."""


def unfinished(target: str, src: str | None = None) -> bool:
    """Whether ``target`` is a clone (of ``src``, if given) ``git xet clone`` left unfinished."""
    from gitxet.errors import GitxetError
    from gitxet.git import process

    if not os.path.isdir(os.path.join(target, ".git")):
        return False
    try:
        if process.config_get(target, UNFINISHED) != "true":
            return False
        url = process.config_get(target, "remote.origin.url")
    except GitxetError:
        return False
    if src is None:
        return True
    if url is None:
        return False
    if looks_remote(src):
        return _same_url(url, src)
    return os.path.realpath(url) == os.path.realpath(src)  # git keeps a path absolute


def finish(
    target: str, settings: Any, prepared: _Prepared | None, *, resuming: bool, quiet: bool = False
) -> int:
    """Check out a clone made with ``--no-checkout``: write every file of HEAD, the pointer
    files' content straight from the store; a clone killed while doing so is finished by
    calling this again (``resuming``: the files already written are kept). Returns the
    exit status.

    Raises:
        ConfigError: resuming a clone that has no commit (git was killed before it had
            fetched one).
    """
    from gitxet.errors import ConfigError, GitError
    from gitxet.git import hooks, process

    if resuming:  # the clone may have been killed before they were installed
        hooks.install_hooks(target, names=("pre-push",), program=hot.program(), on_conflict="chain")
    try:
        process.rev_parse(target, "HEAD")
    except GitError:
        if resuming:
            raise ConfigError(
                f"{shown(target)} is a clone that was stopped before git had fetched it: "
                "remove it and clone again"
            ) from None
        process.config_unset(target, UNFINISHED)
        return 0  # an empty repository: nothing to check out
    from gitxet.errors import GitxetError, MaterializeError

    try:
        return _check_out(target, settings, prepared, quiet)
    except (OSError, MaterializeError) as exc:  # a full disk: the rest comes on a re-run
        from gitxet.cli._errors import describe

        if isinstance(exc, MaterializeError) and not all(may_pass(why) for _, why in exc.failures):
            raise  # data that cannot be had: said as such (and its exit status)

        raise GitxetError(
            f"{describe(exc)[0]}; the clone in {shown(target)} is not finished: run the same "
            "'git xet clone' again (or 'git xet checkout' in it) to finish it"
        ) from exc


def may_pass(failure: BaseException) -> bool:
    """Whether a file's failure may not happen again: a full disk, a server that did not
    answer or refused the token (its data was not found for that reason). The clone then
    stays unfinished, for the same command to finish; data that is nowhere or corrupt
    does not."""
    from gitxet.errors import DataUnavailableError, RemoteError

    if isinstance(failure, DataUnavailableError):
        return any(isinstance(c, (OSError, RemoteError)) for c in failure.causes)
    return isinstance(failure, (OSError, RemoteError))


def _check_out(target: str, settings: Any, prepared: _Prepared | None, quiet: bool = False) -> int:
    from gitxet.git import process

    # git writes neither the pointer files' text nor their content: its index is read from
    # HEAD, git writes every other entry, and each pointer file's content is created in
    # place (in parallel, straight from the local store, verified) with its index stat
    # (docs/architecture.md, "Clone")
    # a clone killed after git read the index has already written some files
    resumed = os.path.exists(os.path.join(process.git_dir(target), "index"))
    if not resumed:
        code = hot.run_git(["read-tree", "HEAD"], target)
        if code:
            return code
    access: Any = None
    if prepared is not None:
        prepared.join()
        access = prepared.access
    if access is None:
        from gitxet.dataset import HttpAccess

        access = HttpAccess.from_settings(settings)
    base = access.remote_factory

    def factory(url: str) -> Any:
        found = prepared.take(url) if prepared is not None else None
        return found if found is not None else base(url)

    repo = hot.open_repo(target, remote_factory=factory)
    # everything imported and built so far lives to the end: the cyclic GC need not walk it
    # again at each collection the data phase's allocations trigger (~0.07 s of CPU per GiB)
    gc.freeze()
    try:
        files = repo.checkout_without_pointers(only_missing=resumed)
        total = sum(f.pointer.size for f in files)
        from gitxet.cli._progress import byte_progress
        from gitxet.errors import GitxetError, LocalChangesError, MaterializeError

        try:
            with byte_progress("fetching", total or None, quiet=quiet) as advance:
                repo.ensure_local([f.pointer for f in files], progress=advance)
        except GitxetError:
            pass  # materialize below names each file whose data cannot be had
        try:
            with byte_progress("checking out", total or None, quiet=quiet) as advance:
                repo.materialize(files, progress=advance, absent=not resumed)
        except MaterializeError as exc:  # those files stay pointers, as git would write them
            kept = [p for p, why in exc.failures if not isinstance(why, LocalChangesError)]
            repo.checkout_pointer_text(kept)
            if not any(may_pass(why) for _, why in exc.failures):
                process.config_unset(target, UNFINISHED)  # as done as a checkout would be
            raise
    finally:
        gc.unfreeze()
    process.config_unset(target, UNFINISHED)
    return 0


#: the options of ``git xet clone`` that take a value, and :func:`run`'s keyword for each
_VALUED = {"--branch": "branch", "-b": "branch", "--cas-url": "cas_url", "--depth": "depth"}


def parse_argv(args: list[str]) -> dict[str, Any] | None:
    """``git xet clone``'s arguments as :func:`run`'s keywords, or None for anything but
    the plain forms (``--help``, an unknown or malformed option: the full CLI says it).
    The entry point runs a clone without typer (~0.15 s of imports and parsing)."""
    opts: dict[str, Any] = {}
    positional: list[str] = []
    i = 0
    while i < len(args):
        a = args[i]
        if a == "--":
            positional += args[i + 1 :]
            break
        if a == "--lazy":
            opts["lazy"] = True
        elif a in ("-q", "--quiet"):
            opts["quiet"] = True
        elif a in ("--branch", "-b", "--cas-url", "--depth"):
            if i + 1 >= len(args):
                return None
            opts[_VALUED[a]] = args[i + 1]
            i += 1
        elif a.startswith(("--branch=", "--cas-url=", "--depth=")):
            key, _, value = a.partition("=")
            opts[_VALUED[key]] = value
        elif a.startswith("-") and a != "-":
            return None
        else:
            positional.append(a)
        i += 1
    if not 1 <= len(positional) <= 2:
        return None
    if "depth" in opts:
        if not opts["depth"].isdigit() or int(opts["depth"]) < 1:
            return None  # the full CLI says what is wrong
        opts["depth"] = int(opts["depth"])
    opts["src"] = positional[0]
    opts["directory"] = positional[1] if len(positional) > 1 else None
    return opts


def looks_remote(src: str) -> bool:
    """A URL (``scheme://``) or git's scp-like ``host:path`` rather than a local path."""
    if "://" in src:
        return True
    head, colon, _ = src.partition(":")
    return bool(colon) and "/" not in head and len(head) > 1


def clone_dir_name(src: str) -> str:
    """The directory git clones ``src`` into when none is given."""
    name = src.rstrip("/").rsplit("/", 1)[-1]
    if name.endswith(".git"):
        name = name[:-4]
    return name or "repo"
