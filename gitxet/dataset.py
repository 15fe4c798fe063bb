"""Where a repository's data is, and the one way to open a repository's commit for reading.

Two jobs, one idea ("where is this repository's data"):

* :class:`Remotes` turns a git remote (a name or a URL) into the CAS that holds its data,
  for every kind of remote, and decides which remotes to ask, in which order, when the
  local store lacks a file. The filter (smudge), ``git xet checkout``/``fetch``/``pull``
  and the mounts all go through it.
* :func:`open_dataset` / :func:`open_commit` resolve (repository location, revision, subdir,
  access settings) to an opened :class:`~gitxet.vfs.model.CommitFS`: the one resolver used
  by ``git xet mount``/``nfs-serve``/``warmup``, the Docker and CSI plugins and ``xet://``
  paths. A location is a work tree, a bare repository, a path or ``file://`` URL (data: the
  repository's own store, then its remotes in search order) or an ``http(s)`` URL (git
  metadata mirrored into the cache, data from the server through the shared chunk cache).

Remote kinds:

* a local path or ``file://`` URL: the CAS embedded in the remote (``<remote>/xet``, or
  ``<remote>/.git/xet`` for a repository with a work tree), read where it lies;
* ``http(s)``: a CAS server (``<url>/info/xet`` names it), reached through the factory the
  caller gives (the CLI's: tokens and the shared chunk cache);
* anything else (ssh, ``host:path``): no CAS gitxet can reach.

Search order (git passes the smudge filter nothing about remotes, but, when it knows them,
the ref and commit being checked out):

1. the remote named explicitly (``git xet fetch upstream``, ``git xet pull upstream``);
2. the remote of the ref being checked out (``refs/remotes/upstream/...``, or the remote
   configured for the branch ``refs/heads/x``);
3. the remotes whose remote-tracking refs contain the commit (the current branch's remote
   and the default remote first among them);
4. the current branch's remote (``branch.<name>.remote``), then the default remote
   (``xet.remote``, else ``origin``, else the only remote);
5. every other configured remote, in git's order (git-lfs calls this ``searchall``).

Data is content-addressed and verified on read, so the order only decides how many remotes
are asked before one has it, never what is served.
"""

from __future__ import annotations

import atexit
import logging
import os
import re
import shutil
import stat
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gitxet.data.reconstruct import ChunkCache, ChunkSource, Layout, Segment
from gitxet.data.sources import LayeredSource, describe_files
from gitxet.data.transfer import CASRemote, LocalDirRemote, TransferSummary, fetch_files
from gitxet.errors import (
    ConfigError,
    DataUnavailableError,
    FileNotFoundInCASError,
    FormatError,
    GitError,
    GitObjectNotFoundError,
    GitxetError,
    NotFoundError,
    StoreError,
    XorbNotFoundError,
)
from gitxet.formats.shard import FileInfo
from gitxet.git import process
from gitxet.hashing import to_hex
from gitxet.settings import (
    DEFAULT_CACHE_BYTES,
    DEFAULT_PREFETCH_BYTES,
    TOKEN_ENV,
    TOKEN_FILE_ENV,
    Settings,
    child_env,
    redact,
    strip_credentials,
    url_token,
)
from gitxet.store.cas import LocalCAS
from gitxet.util import forks  # noqa: F401  (a fork waits for other threads' imports)
from gitxet.util.procs import in_use, proc_stat, runs

if TYPE_CHECKING:  # imported when a commit is opened: the filter never needs the model
    from gitxet.vfs.model import CommitFS

log = logging.getLogger(__name__)

Progress = Callable[[int], None]
RemoteFactory = Callable[[str], CASRemote]


def local_path(url: str) -> str | None:
    """The absolute path a path/``file://`` remote names, or None for other URLs."""
    if url.startswith("file://"):
        path = urllib.parse.unquote(urllib.parse.urlparse(url).path)
    elif "://" in url or (":" in url.split("/")[0] and not os.path.exists(url)):
        return None  # http(s)://, ssh://, scp-like host:path
    else:
        path = url
    return os.path.abspath(os.path.expanduser(path))


def cas_root(url: str) -> str | None:
    """Where the embedded CAS of a path/``file://`` remote lives, or None for other URLs."""
    path = local_path(url)
    if path is None:
        return None
    git_dir = process.work_tree_git_dir(path)  # a work tree: .git, or a linked one's
    if git_dir is not None:
        return os.path.join(process.common_git_dir(git_dir), "xet")  # one store for all
    return os.path.join(path, "xet")


def chunk_source_of(remote: CASRemote) -> ChunkSource | None:
    """The remote's chunk source when it is a CAS server (reads go there, cached), else None."""
    make = getattr(remote, "chunk_source", None)
    return make() if make is not None else None  # type: ignore[no-any-return]


class Remotes:
    """The git remotes of one repository, their CASes, and the order to search them.

    ``factory`` builds the CAS of an http(s) remote (None: such remotes are unreachable).
    Opened remotes and computed orders are kept for the life of the object (one git
    command, one mount); it is safe to use from several threads.
    """

    def __init__(self, cwd: str, factory: RemoteFactory | None = None) -> None:
        self.cwd = cwd
        self.factory = factory
        self._lock = threading.Lock()
        self._names: list[str] | None = None
        self._urls: dict[str, str] = {}
        self._opened: dict[str, CASRemote] = {}
        self._orders: dict[tuple[str | None, str | None, str | None], list[str]] = {}

    def close(self) -> None:
        """Close the connections of the remotes opened so far (at the end of their use)."""
        with self._lock:
            opened, self._opened = list(self._opened.values()), {}
        for remote in opened:
            close = getattr(remote, "close", None)
            if close is not None:
                close()

    def names(self) -> list[str]:
        """Configured remotes, in git's order."""
        if self._names is None:
            self._names = process.list_remotes(self.cwd)
        return self._names

    def url(self, name_or_url: str) -> str:
        """The fetch URL of a remote name; anything else is taken as a URL already."""
        found = self._urls.get(name_or_url)
        if found is None:
            got = process.remote_url(self.cwd, name_or_url) if name_or_url in self.names() else None
            found = got if got is not None else name_or_url
            self._urls[name_or_url] = found
        return found

    def require(self, name_or_url: str) -> str:
        """``name_or_url`` if it is a configured remote, a URL or an existing path.

        Raises:
            NotFoundError: none of these (the message lists the configured remotes).
        """
        if name_or_url in self.names() or "://" in name_or_url:
            return name_or_url
        if not name_or_url.startswith("-") and os.path.exists(name_or_url):
            return name_or_url
        known = ", ".join(self.names()) or "none configured"
        raise NotFoundError(f"no remote named {name_or_url!r} (remotes: {known})")

    def describe(self, name_or_url: str) -> str:
        """``"upstream /srv/data.git"``: a remote as messages name it (no credentials)."""
        url = strip_credentials(self.url(name_or_url))
        return url if url == name_or_url else f"{name_or_url} {url}"

    def default(self) -> str | None:
        """``xet.remote``, else ``origin``, else the only remote."""
        configured = process.config_get(self.cwd, "xet.remote")
        if configured:
            return configured
        names = self.names()
        if "origin" in names:
            return "origin"
        return names[0] if len(names) == 1 else None

    def is_server(self, name_or_url: str) -> bool:
        """Whether the remote's data is behind a network (anything but a path remote)."""
        return cas_root(self.url(name_or_url)) is None

    def open(self, name_or_url: str | None = None) -> CASRemote:
        """The CAS of a git remote (name or URL; None: the default remote).

        Raises:
            ConfigError: no such remote, a path remote that does not exist, or a remote
                with no CAS gitxet can reach.
        """
        name = name_or_url or self.default()
        if name is None:
            raise ConfigError("no git remote to get data from (add one, or set xet.remote)")
        url = self.url(name)
        with self._lock:
            remote = self._opened.get(url)
            if remote is not None:
                return remote
            root = cas_root(url)
            if root is not None:
                base = os.path.dirname(root)
                if base.endswith("/.git"):
                    base = os.path.dirname(base)
                if not os.path.isdir(base):
                    raise ConfigError(
                        f"remote {name!r} is not reachable: {strip_credentials(url)} does not exist"
                    )
                remote = LocalDirRemote(root)
            elif self.factory is not None and url.startswith(("http://", "https://")):
                remote = self.factory(url)
            else:
                shown = strip_credentials(url)
                raise ConfigError(f"remote {name!r} ({shown}) has no CAS gitxet can reach")
            self._opened[url] = remote
            return remote

    # ---- search order --------------------------------------------------------------------

    def search_order(
        self, first: str | None = None, *, ref: str | None = None, commit: str | None = None
    ) -> list[str]:
        """Remotes to ask for data, best first (see the module docstring for the rules).

        ``first`` may be a remote name or a URL; ``ref`` is the ref being checked out
        (``refs/remotes/upstream/main``, ``refs/heads/main``), ``commit`` its commit.
        """
        key = (first, ref, commit)
        with self._lock:
            cached = self._orders.get(key)
        if cached is not None:
            return list(cached)
        names = self.names()
        order: list[str] = []

        def add(name: str | None) -> None:
            if name and name not in order and (name in names or name == first):
                order.append(name)

        add(first)
        if ref:
            add(self._remote_of_ref(ref))
        usual = [self._branch_remote(process.current_branch(self.cwd)), self.default()]
        if commit and len(names) > 1:
            holders = self._remotes_containing(commit)
            for name in usual:
                if name in holders:
                    add(name)
            for name in holders:
                add(name)
        for name in usual:
            add(name)
        for name in names:
            add(name)
        with self._lock:
            self._orders[key] = order
        return list(order)

    def _branch_remote(self, branch: str | None) -> str | None:
        if not branch:
            return None
        name = process.config_get(self.cwd, f"branch.{branch}.remote")
        return name if name and name != "." else None

    def _remote_of(self, tracking_ref: str) -> str | None:
        """The remote of ``refs/remotes/<remote>/<branch>`` (remote names may hold '/')."""
        best: str | None = None
        for name in self.names():
            if tracking_ref.startswith(f"refs/remotes/{name}/") and len(name) > len(best or ""):
                best = name
        return best

    def _remote_of_ref(self, ref: str) -> str | None:
        if ref.startswith("refs/remotes/"):
            return self._remote_of(ref)
        if ref.startswith("refs/heads/"):
            return self._branch_remote(ref.removeprefix("refs/heads/"))
        return None

    def _remotes_containing(self, commit: str) -> list[str]:
        if commit.startswith("-"):
            return []
        try:
            refs = process.remote_refs_containing(self.cwd, commit)
        except GitError:
            return []
        found: list[str] = []
        for ref in refs:
            name = self._remote_of(ref)
            if name is not None and name not in found:
                found.append(name)
        return found


class RemoteLayer:
    """A CAS server remote as a :class:`ChunkSource`, opened on first use.

    A mount of a local repository lists a server remote as a layer behind its own store;
    the server is only contacted (discovery, then the file's shard) when a file is not
    found locally, and a failure to reach it is that layer's miss.
    """

    is_local = False

    def __init__(self, remotes: Remotes, name: str) -> None:
        self.remotes = remotes
        self.name = name
        self._lock = threading.Lock()
        self._source: ChunkSource | None = None

    def _open(self) -> ChunkSource:
        with self._lock:
            if self._source is None:
                src = chunk_source_of(self.remotes.open(self.name))
                if src is None:
                    raise ConfigError(f"remote {self.name!r} offers no readable CAS")
                self._source = src
            return self._source

    def file_info(self, file_hash: bytes) -> FileInfo | None:
        return self._open().file_info(file_hash)

    def describe(self, file_hashes: Sequence[bytes], *, keep: bool = True) -> set[bytes]:
        """Many files' descriptions at once (:func:`~gitxet.data.sources.describe_files`)."""
        return describe_files(self._open(), file_hashes, keep=keep)

    def layout(self, xorb_hash: bytes) -> Layout:
        if self._source is None:  # never opened: it described no file, so knows no xorb
            raise XorbNotFoundError(to_hex(xorb_hash))
        return self._source.layout(xorb_hash)

    def read_chunks(self, xorb_hash: bytes, start: int, end: int) -> list[bytes]:
        return self._open().read_chunks(xorb_hash, start, end)

    # the server source's cache and fetching calls (see data.reconstruct.FetchSource); asked
    # only for xorbs this layer holds, so it is open by then
    initial_window = 8 << 20
    max_window = DEFAULT_PREFETCH_BYTES

    def read_verified_part(self, xorb_hash: bytes, index: int, lo: int, hi: int) -> bytes | None:
        return self._open().read_verified_part(xorb_hash, index, lo, hi)  # type: ignore[attr-defined,no-any-return]

    def read_verified_range(self, xorb_hash: bytes, lo: int, hi: int) -> bytes | None:
        return self._open().read_verified_range(xorb_hash, lo, hi)  # type: ignore[attr-defined,no-any-return]

    def fetch_range(self, xorb_hash: bytes, lo: int, hi: int, *, sequential: bool) -> bytes:
        src = self._open()
        return src.fetch_range(xorb_hash, lo, hi, sequential=sequential)  # type: ignore[attr-defined,no-any-return]

    def prefetch(self, xorb_hash: bytes, lo: int, hi: int) -> None:
        self._open().prefetch(xorb_hash, lo, hi)  # type: ignore[attr-defined]

    def split_range(self, xorb_hash: bytes, lo: int, hi: int) -> list[tuple[int, int]]:
        return self._open().split_range(xorb_hash, lo, hi)  # type: ignore[attr-defined,no-any-return]

    def stream_range(self, xorb_hash: bytes, lo: int, hi: int) -> Future[Segment]:
        return self._open().stream_range(xorb_hash, lo, hi)  # type: ignore[attr-defined,no-any-return]


# ---- getting data from whichever remote has it ------------------------------------------


@dataclass
class Search:
    """What a search over remotes tried, for the error when nothing had the data."""

    tried: list[tuple[str, str]]
    causes: list[BaseException]

    def failed(self, where: str, exc: BaseException) -> None:
        self.tried.append((where, str(exc)))
        self.causes.append(exc)

    def lacks(self, where: str) -> None:
        self.tried.append((where, "does not have it"))

    def error(
        self, file_hex: str, path: str | None = None, others: int = 0
    ) -> DataUnavailableError:
        return DataUnavailableError(file_hex, self.tried, self.causes, path, others)


def source_with(
    local: LocalCAS, remotes: Remotes, order: Sequence[str], file_hash: bytes, search: Search
) -> ChunkSource | None:
    """A source that can reconstruct ``file_hash``: the local store (after fetching it there
    from a path remote) or a CAS server's chunk source; None when no remote in ``order`` has
    it (``search`` then says what each answered)."""
    for name in order:
        where = remotes.describe(name)
        try:
            remote = remotes.open(name)
            src = chunk_source_of(remote)
            if src is not None:
                if src.file_info(file_hash) is not None:
                    return src
                search.lacks(where)
                continue
            fetch_files(local, remote, [file_hash])
            return local
        except FileNotFoundInCASError:
            search.lacks(where)
        except GitxetError as exc:
            search.failed(where, exc)
    return None


def fetch_from_any(
    local: LocalCAS,
    remotes: Remotes,
    order: Sequence[str],
    file_hashes: Sequence[bytes],
    progress: Progress | None = None,
    paths: dict[str, str] | None = None,
    *,
    warm: bool = False,
    into_store: bool = False,
) -> TransferSummary:
    """Make ``file_hashes`` readable here: copy them into ``local`` from path remotes, or
    (with ``warm``) into the shared node cache from CAS servers, asking the remotes of
    ``order`` in turn for what the earlier ones did not have. Without ``warm`` a server
    that has a file is enough: readers stream its data from there when they need it.
    With ``into_store`` a server's xorbs are copied into ``local`` as a path remote's are
    (what a push to another remote has to send).

    Raises:
        DataUnavailableError: some file is on no remote (naming the remotes tried, and the
            file's path when ``paths`` maps its hex hash to one).
    """
    missing = local.lacking_data(file_hashes)
    search = Search([], [])
    files = xorbs = skipped = shards = moved = 0
    for name in order:
        if not missing:
            break
        where = remotes.describe(name)
        before = len(search.tried)
        try:
            remote = remotes.open(name)
            src = None if into_store else chunk_source_of(remote)
            if src is not None:  # descriptions in batches, not a request per file
                known = describe_files(src, missing, keep=warm)  # (kept: fetch)
                have = [h for h in missing if h in known]
                if have and warm:
                    moved += int(src.warm(have, progress))  # type: ignore[attr-defined]
            else:
                have = _known_files(remote, missing)
                if have:
                    s = _fetch_each(local, remote, have, progress, search, where)
                    gone = set(local.lacking_data(have))
                    have = [h for h in have if h not in gone]
                    xorbs, skipped = xorbs + s.xorbs_sent, skipped + s.xorbs_skipped
                    shards, moved = shards + s.shards_sent, moved + s.bytes_sent
        except GitxetError as exc:
            search.failed(where, exc)
            continue
        if len(have) < len(missing) and len(search.tried) == before:
            search.lacks(where)
        files += len(have)
        got_now = set(have)
        missing = [h for h in missing if h not in got_now]
    if missing:
        hx = to_hex(missing[0])
        raise search.error(hx, (paths or {}).get(hx), len(missing) - 1)
    return TransferSummary(files, xorbs, skipped, shards, moved)


def _known_files(remote: CASRemote, hashes: list[bytes]) -> list[bytes]:
    """Those of ``hashes`` that ``remote`` describes (an embedded store answers from its
    index, a CAS server in batches, without reading a shard per file)."""
    by_name = getattr(remote, "shard_names_for_files", None)
    if by_name is None:
        absent = getattr(remote, "missing_files", None)
        if absent is not None:  # a CAS server: one presence request per 10,000 files
            gone = absent(hashes)
            return [h for h in hashes if h not in gone]
        return [h for h in hashes if remote.shards_for_file(h)]
    unknown = set(by_name(hashes)[1])
    return [h for h in hashes if h not in unknown]


def _fetch_each(
    local: LocalCAS,
    remote: CASRemote,
    hashes: list[bytes],
    progress: Progress | None,
    search: Search,
    where: str,
) -> TransferSummary:
    """One batch fetch; if it fails (a damaged xorb), file by file, so every file that can
    be had is, and the failure is recorded."""
    try:
        return fetch_files(local, remote, hashes, progress=progress)
    except GitxetError:
        pass
    total = TransferSummary(0, 0, 0, 0, 0)
    for h in hashes:
        try:
            s = fetch_files(local, remote, [h], progress=progress)
        except GitxetError as exc:
            search.failed(where, exc)
            continue
        total = TransferSummary(
            total.files + s.files,
            total.xorbs_sent + s.xorbs_sent,
            total.xorbs_skipped + s.xorbs_skipped,
            total.shards_sent + s.shards_sent,
            total.bytes_sent + s.bytes_sent,
        )
    return total


# ---- opening a repository for reading -----------------------------------------------------


@dataclass(frozen=True, slots=True)
class HttpAccess:
    """How to reach http(s) repositories (and servers that are remotes of local ones): the
    token lookup, the shared local cache and the factory of their CAS."""

    cache_root: str
    token_lookup: Callable[[str], str | None] | None = None
    offline: bool = False
    cache_bytes: int = DEFAULT_CACHE_BYTES
    remote_factory: RemoteFactory | None = None

    @classmethod
    def from_settings(cls, settings: Settings, *, offline: bool = False) -> HttpAccess:
        """Access built from :class:`~gitxet.settings.Settings` (cache, sizes, tokens).

        httpx and the rest are imported on first use: local repositories never pay for them.
        """

        def make(url: str) -> CASRemote:
            from gitxet.data.remote_source import http_remote_factory

            build = http_remote_factory(
                settings.cache_dir if offline else usable_cache_root(settings.cache_dir),
                settings.cache_bytes,
                offline=offline,
                token_lookup=settings.token_for,
                read_ahead=settings.prefetch_bytes,
                cas_url=settings.cas_url,
                rotating=settings.token_file is not None,
                tier_timeout=settings.tier_timeout,
            )
            return build(url)

        return cls(settings.cache_dir, settings.token_for, offline, settings.cache_bytes, make)

    def token_for(self, url: str) -> str | None:
        """The token for ``url`` (the settings' lookup, else the URL's own userinfo)."""
        return self.token_lookup(url) if self.token_lookup is not None else url_token(url)


@dataclass(frozen=True, slots=True)
class Dataset:
    """A repository opened for reading: where its git objects are and where its data is.

    Data comes from ``server`` for an http(s) repository; for a local one from its own store
    (``store``, when it has one), then from its ``remotes`` in search order.
    """

    git_dir: str
    description: str  # the location as the user gave it, without credentials
    store: ChunkSource | None = None
    remotes: Remotes | None = None
    server: ChunkSource | None = None
    server_remote: CASRemote | None = None  # the CAS ``server`` reads (closed by close())

    def close(self) -> None:
        """At the end of its use: close the connections to its server or remotes (commits
        opened from it cannot fetch afterwards)."""
        close = getattr(self.server_remote, "close", None)
        if close is not None:
            close()
        if self.remotes is not None:
            self.remotes.close()

    def chunk_source(self, commit: str | None = None) -> ChunkSource:
        """One source over every place the data may be (read-only, thread-safe); the
        remotes holding ``commit`` are asked first."""
        if self.server is not None:
            return self.server
        layers: list[ChunkSource] = []
        names: list[str] = []
        if self.store is not None:
            layers.append(self.store)
            names.append("this repository's store")
        # data it lacks comes from its remotes: path remotes read in place, servers through
        # the shared chunk cache (opened on first miss: local data never waits on a network)
        remotes = self.remotes
        if remotes is not None:
            for name in remotes.search_order(commit=commit):
                layer = _layer_of(remotes, name)
                if layer is not None:
                    layers.append(layer)
                    names.append(remotes.describe(name))
        return LayeredSource(layers, names)

    def resolve(self, rev: str) -> str:
        """Full commit id of a branch, tag or (abbreviated) sha.

        Raises:
            NotFoundError: no such revision (or it names no commit).
        """
        if not rev or rev.startswith("-"):
            raise NotFoundError(f"no such revision {rev!r} in {self.description}")
        try:
            return process.rev_parse(self.git_dir, f"{rev}^{{commit}}")
        except GitObjectNotFoundError:
            raise NotFoundError(f"no such revision {rev!r} in {self.description}") from None
        except GitError as exc:  # a tree or blob (its id, 'v1^{tree}'): git's words were
            # "git: v1^{tree}^{commit}: expected commit type, but the object dereferences..."
            found = re.search(r"dereferences to (\w+) type", str(exc))
            if found is None:  # git refused the revision itself ('HEAD:../..')
                said = str(exc).rpartition("fatal: ")[2].strip()
                raise NotFoundError(
                    f"{rev!r} is not a revision of {self.description}: {said}"
                ) from None
            raise NotFoundError(
                f"{rev!r} in {self.description} is a {found.group(1)}, not a commit"
            ) from None

    def check_subdir(self, commit: str, subdir: str) -> None:
        """Raise :class:`NotFoundError` unless ``subdir`` is a directory of ``commit``.

        A cheap check (one git call, no tree walk) for callers that hand the commit on to
        a daemon and want a bad subdir reported first.
        """
        sub = subdir.strip("/")
        if not sub:
            return
        parts = sub.split("/")
        if any(p in ("", ".", "..") for p in parts):
            raise NotFoundError(f"{subdir!r} is not a plain relative path")
        out = process.run_git(
            ["cat-file", "-t", "--end-of-options", f"{commit}:{sub}"], cwd=self.git_dir, check=False
        )
        if out.strip() != b"tree":
            what = "is not a directory" if out.strip() else "does not exist"
            raise NotFoundError(f"{sub!r} {what} in commit {commit[:12]}")

    def open_commit(
        self,
        commit: str,
        subdir: str = "",
        *,
        source: ChunkSource | None = None,
        cache: ChunkCache | None = None,
    ) -> CommitFS:
        """The read-only filesystem of ``commit`` (a full sha; see :meth:`resolve`), rooted at
        ``subdir``. ``source`` wraps or replaces :meth:`chunk_source` (fsspec counts reads);
        ``cache`` shares decoded chunks between commits.

        Raises:
            FileNotFoundError, NotADirectoryError: ``subdir`` is not a directory there.
        """
        from gitxet.vfs.model import CommitFS

        return CommitFS(
            self.git_dir,
            commit,
            source if source is not None else self.chunk_source(commit),
            subdir=os.fsencode(subdir.strip("/")),
            cache=cache,
        )


def _layer_of(remotes: Remotes, name: str) -> ChunkSource | None:
    """A remote as a layer of a mount's source: a path remote's store read in place, a
    server opened on first miss; None when it holds nothing readable (yet)."""
    url = remotes.url(name)
    root = cas_root(url)
    if root is not None:
        return LocalCAS(root) if os.path.isdir(root) else None
    if remotes.factory is not None and url.startswith(("http://", "https://")):
        return RemoteLayer(remotes, name)
    return None


def _git_auth_env(token: str | None) -> dict[str, str]:
    """git config through the environment (never argv: tokens stay out of process lists)."""
    import base64

    if not token:
        return {}
    basic = base64.b64encode(f"gitxet:{token}".encode()).decode()
    return {
        "GIT_CONFIG_COUNT": "1",
        "GIT_CONFIG_KEY_0": "http.extraHeader",
        "GIT_CONFIG_VALUE_0": f"Authorization: Basic {basic}",
        "GIT_TERMINAL_PROMPT": "0",
    }


_usable_roots: dict[str, str] = {}
_PRIVATE = "gitxet-cache-"  # + "PID.START-" of the owning process + a random part
#: what versions before the names above made: ``mkdtemp``'s 8 random characters
_OLD_PRIVATE = re.compile(re.escape(_PRIVATE) + r"[a-z0-9_]{8}")
#: an old-style private cache this long unchanged, and in no process's use, is left over
_OLD_PRIVATE_AGE = 3600.0
_usable_lock = threading.Lock()


def usable_cache_root(root: str) -> str:
    """``root`` when this process can write there, else a private temporary cache directory,
    removed at exit (one warning per process and root): a cache directory on a read-only
    filesystem, or one this user cannot write, must not stop reads from the server. (A
    process killed outright leaves its own behind: the next one to need one removes it.)

    Raises:
        StoreError: neither ``root`` nor a temporary directory can be written.
    """
    with _usable_lock:
        usable = _usable_roots.get(root)
        if usable is not None:
            return usable
        try:
            os.makedirs(root, exist_ok=True)
            fd, probe = tempfile.mkstemp(prefix=".gitxet-probe-", dir=root)
            os.close(fd)
            os.unlink(probe)
            usable = root
        except OSError as e:
            why = e.strerror or str(e)
            try:
                usable = _private_cache_dir()
            except OSError as e2:
                raise StoreError(
                    f"the cache directory {root} cannot be written ({why}), nor a temporary "
                    f"one ({e2.strerror or e2})"
                ) from None
            atexit.register(shutil.rmtree, usable, True)
            log.warning(
                "the cache directory %s cannot be written (%s): caching in %s for this "
                "process only (removed when it exits)",
                root,
                why,
                usable,
            )
        _usable_roots[root] = usable
        return usable


def _private_cache_dir() -> str:
    """A new private cache directory in the temporary directory, named after this process,
    once those of this user's processes that are gone (killed before their exit could
    remove them) are removed."""
    tmp = tempfile.gettempdir()
    me = proc_stat(os.getpid())
    if me is None:  # no /proc: no process can tell another's gone
        return tempfile.mkdtemp(prefix=_PRIVATE, dir=tmp)
    try:
        names = os.listdir(tmp)
    except OSError:
        names = []
    for name in names:
        m = re.fullmatch(re.escape(_PRIVATE) + r"([0-9]{1,9})\.([0-9]{1,20})-[^/]+", name)
        path = os.path.join(tmp, name)
        try:
            if m is None:
                # an older version's (no owner in its name): only one unchanged for an hour
                # that no process has open or as its directory
                if _OLD_PRIVATE.fullmatch(name) is None:
                    continue
                st = os.lstat(path)
                if time.time() - st.st_mtime < _OLD_PRIVATE_AGE or in_use(path):
                    continue
            elif runs(int(m[1]), int(m[2])):
                continue
            st = os.lstat(path)
        except (OSError, FormatError):
            continue
        # a world-writable directory: only a real directory of this user's (rmtree itself
        # never follows a link)
        if stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid():
            shutil.rmtree(path, ignore_errors=True)
    return tempfile.mkdtemp(prefix=f"{_PRIVATE}{os.getpid()}.{me[1]}-", dir=tmp)


def mirror_git_metadata(url: str, access: HttpAccess) -> str:
    """A bare mirror of ``url``'s git objects in the cache (data stays on the server).

    Raises:
        NotFoundError: offline with no mirror yet.
        GitError: the server refused or could not be reached.
    """
    import hashlib
    import subprocess

    token = access.token_for(url)
    clean = strip_credentials(url)
    key = hashlib.sha256(clean.encode()).hexdigest()[:24]
    root = access.cache_root if access.offline else usable_cache_root(access.cache_root)
    path = os.path.join(root, "repos", key + ".git")
    if access.offline:
        if not os.path.isdir(path):
            raise NotFoundError(f"{clean}: not in the cache (offline)")
        return path
    # the token is the one ``access`` chose (or none): git's credential helper must not
    # find another in this process's GITXET_TOKEN (a plugin's own, which its volumes
    # never get)
    env = child_env(_git_auth_env(token), drop=(TOKEN_ENV, TOKEN_FILE_ENV))
    # http(s) only, whatever git's config says (a url.<base>.insteadOf, protocol.allow) and
    # wherever the server redirects: a plugin mirrors on behalf of whoever named the URL
    env["GIT_ALLOW_PROTOCOL"] = "http:https"
    if os.path.isdir(path):
        args = ["git", "--git-dir", path, "fetch", "--quiet", "--prune", "origin"]
    else:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = path + f".tmp-{os.getpid()}"
        args = ["git", "clone", "--quiet", "--mirror", "--", clean, tmp]
    r = subprocess.run(args, env=env, capture_output=True, text=True, timeout=600, check=False)
    if r.returncode != 0:
        lines = [ln for ln in r.stderr.strip().splitlines() if ln.strip()]
        msg = lines[-1] if lines else f"git exited with {r.returncode}"
        if token:
            msg = msg.replace(token, "***")
        raise process.remote_failure(clean, redact(msg))
    if not os.path.isdir(path):
        try:
            os.rename(tmp, path)
        except OSError:  # another process mirrored it meanwhile
            shutil.rmtree(tmp, ignore_errors=True)
    return path


def open_dataset(location: str, access: HttpAccess | None = None) -> Dataset:
    """Open a repository for reading: a work tree, a bare repository, a ``file://`` URL or an
    http(s) URL.

    For local repositories data comes from the repository's own store (``<git dir>/xet``),
    then from its remotes in :meth:`Remotes.search_order` (a path remote's embedded store
    is read where it lives; a server through the shared chunk cache, contacted only for
    what is not local, which needs ``access``). For http(s) the git objects are mirrored
    into ``access.cache_root`` and data comes from the server through the chunk cache.

    Raises:
        NotFoundError: ``location`` is not a git repository gitxet can read.
        GitError, RemoteError: an http(s) server refused or could not be reached.
    """
    shown = strip_credentials(location)
    if location.startswith(("http://", "https://")):
        if access is None or access.remote_factory is None:
            raise NotFoundError(f"{shown}: http(s) repositories need server access settings")
        git_dir = mirror_git_metadata(location, access)
        remote = access.remote_factory(location)
        source = chunk_source_of(remote)
        if source is None:
            raise NotFoundError(f"{shown}: the remote offers no readable CAS")
        return Dataset(git_dir, shown, server=source, server_remote=remote)
    root = cas_root(location)
    if root is None:
        raise NotFoundError(f"{shown}: only local paths, file:// and http(s) URLs can be opened")
    path = os.path.dirname(root)  # the git dir (".git" of a work tree, or the bare repo)
    local = local_path(location)
    if local is not None and process.work_tree_git_dir(local) is not None:
        path = local  # a work tree: its own HEAD (a linked one's is not the main one's)
    if not os.path.isdir(path):
        raise NotFoundError(f"{shown}: no such repository")
    try:
        git_dir = str(process.git_dir(path))
    except GitError:
        raise NotFoundError(f"{shown}: not a git repository") from None
    return Dataset(
        git_dir,
        shown,
        store=LocalCAS(root) if os.path.isdir(root) else None,
        remotes=Remotes(git_dir, access.remote_factory if access is not None else None),
    )


@dataclass(frozen=True, slots=True)
class OpenedCommit:
    """A commit opened by :func:`open_commit`: its dataset, full sha and filesystem."""

    dataset: Dataset
    commit: str
    fs: CommitFS

    def close(self) -> None:
        self.fs.close()


def open_commit(
    location: str, rev: str, subdir: str = "", access: HttpAccess | None = None
) -> OpenedCommit:
    """The one resolver: repository location, revision, subdir, access -> an opened commit.

    Raises:
        NotFoundError: no such repository or revision.
        FileNotFoundError, NotADirectoryError: ``subdir`` is not a directory of the commit.
        GitError, RemoteError: an http(s) server refused or could not be reached.
    """
    ds = open_dataset(location, access)
    sha = ds.resolve(rev)
    return OpenedCommit(ds, sha, ds.open_commit(sha, subdir))
