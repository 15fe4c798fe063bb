"""History migration: rewrite commits so large files become gitxet pointers.

This is the use case behind ``git xet migrate`` (the counterpart of ``git lfs migrate
import``). The history of the chosen refs is streamed through
``git fast-export --no-data | <rewrite> | git fast-import --force``:

* ``--no-data`` makes fast-export name blobs by object id instead of sending them, so the
  rewriter sees every file change with its path and reads only the blobs it may convert,
  one at a time, from ``git cat-file`` (memory stays flat whatever the history size).
* A selected path whose blob is a git-lfs pointer is replaced by the content of the LFS
  object (read from the local LFS store and checked against the pointer's SHA-256 and size)
  cleaned exactly as ``git add`` would clean it; a plain blob is cleaned the same way, so
  blobs at or above the threshold become Xet pointers and smaller ones stay as they are.
* The top-level ``.gitattributes`` of every rewritten commit gets gitxet's tracking lines
  appended (existing lines are kept; later lines win in gitattributes, so ours take over
  the selected paths, including those that ``filter=lfs`` lines named), and its
  ``.xetconfig`` holds the threshold the migration used: the rules travel with every
  commit, so a clone of any of them cleans files as the migration did.

fast-import moves the refs only when the stream ended with ``done``; when anything fails,
fast-import is killed first, so a failed migration leaves every ref where it was. The old
commits stay reachable through the reflog (``git reflog show <branch>``).

Conversions are cached by blob id, so a blob that appears in many commits is ingested once.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import re
import subprocess
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, NamedTuple

from gitxet.errors import (
    ConfigError,
    DirtyWorkTreeError,
    GitError,
    IntegrityError,
    LfsObjectMissingError,
    PointerFormatError,
)
from gitxet.formats.pointer import MAX_POINTER_SIZE
from gitxet.git import process
from gitxet.git.attributes import PathSelector
from gitxet.git.xetconfig import XETCONFIG, is_never_pointer
from gitxet.repo.repository import XetRepo

__all__ = [
    "LFS_VERSION_LINES",
    "LfsPointer",
    "MigrateOptions",
    "MigrateResult",
    "PathSelector",
    "Survey",
    "check_clean",
    "lfs_evidence",
    "migrate",
    "parse_lfs_pointer",
    "survey",
]

Progress = Callable[[int], None]

#: The first lines a git-lfs pointer may start with (the current one and the pre-1.0 one).
LFS_VERSION_LINES = (
    b"version https://git-lfs.github.com/spec/v1\n",
    b"version https://hawser.github.com/spec/v1\n",
)
#: git-lfs never writes pointers of this size or more, so bigger blobs are never read.
LFS_MAX_POINTER_SIZE = 1024
#: Refuse a ``.gitattributes`` blob bigger than this (it is read into memory).
MAX_ATTRIBUTES_SIZE = 4 << 20
#: Longest command line accepted from fast-export (paths, identities).
MAX_LINE = 1 << 20

_LFS_KEY = re.compile(rb"[a-z0-9.-]+")
_LFS_OID = re.compile(rb"sha256:([0-9a-f]{64})")
_LFS_SIZE = re.compile(rb"0|[1-9][0-9]{0,18}")
_TOP_LEVEL = (
    b"commit ",
    b"reset ",
    b"tag ",
    b"blob",
    b"progress ",
    b"checkpoint",
    b"done",
    b"feature ",
    b"option ",
)


# ---- git-lfs pointers --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LfsPointer:
    """A parsed git-lfs pointer: the object's SHA-256 (hex) and size."""

    oid: str
    size: int


def parse_lfs_pointer(data: bytes) -> LfsPointer | None:
    """The git-lfs pointer ``data`` encodes, or None when it is not one at all.

    Raises:
        PointerFormatError: ``data`` starts like an LFS pointer but is damaged, or it uses
            an LFS extension (content transformed by another program) gitxet cannot undo.
    """
    if len(data) >= LFS_MAX_POINTER_SIZE or not data.startswith(LFS_VERSION_LINES):
        return None

    def bad(reason: str) -> PointerFormatError:
        return PointerFormatError("git-lfs pointer", reason)

    if not data.endswith(b"\n"):
        raise bad("does not end with a newline")
    fields: dict[bytes, bytes] = {}
    previous = b""
    for number, line in enumerate(data[:-1].split(b"\n")[1:], start=2):
        key, sep, value = line.partition(b" ")
        if not sep or not _LFS_KEY.fullmatch(key) or not value:
            raise bad(f"line {number} is not 'key value': {line[:80]!r}")
        if key in fields:
            raise bad(f"key {key.decode()!r} appears twice")
        if key.startswith(b"ext-"):
            raise bad(f"uses the LFS extension {key.decode()!r}, which gitxet cannot undo")
        if key <= previous and key != b"oid":
            # the spec sorts keys after "oid"; only "oid" may come first out of order
            raise bad(f"key {key.decode()!r} is out of order")
        previous = key if key != b"oid" else previous
        fields[key] = value
    oid = _LFS_OID.fullmatch(fields.get(b"oid", b""))
    if oid is None:
        raise bad("no valid 'oid sha256:<64 hex>' line")
    size = fields.get(b"size", b"")
    if not _LFS_SIZE.fullmatch(size):
        raise bad(f"invalid size {size[:40]!r}")
    return LfsPointer(oid.group(1).decode("ascii"), int(size))


# ---- path patterns -------------------------------------------------------------------------


_LFS_ATTRIBUTE = re.compile(rb"(?:^|[ \t])filter=lfs(?:[ \t]|$)")


def _lfs_attribute_line(data: bytes) -> str | None:
    for line in data.splitlines():
        if not line.lstrip().startswith(b"#") and _LFS_ATTRIBUTE.search(line):
            return line.strip().decode("utf-8", "replace")[:120]
    return None


def lfs_evidence(cwd: str) -> str | None:
    """Why the repository at ``cwd`` uses git-lfs, or None: a ``filter=lfs`` line in a
    ``.gitattributes`` (work tree, index or HEAD) or a git-lfs pointer in HEAD."""
    root = Path(cwd)
    staged = process.run_git(
        ["ls-files", "-z", "--", ".gitattributes", "*/.gitattributes"], cwd=cwd
    )
    for rel in {b".gitattributes", *staged.split(b"\0")} - {b""}:
        path = os.fsdecode(rel)
        try:
            data = (root / path).read_bytes()[:MAX_ATTRIBUTES_SIZE]
        except OSError:
            continue
        line = _lfs_attribute_line(data)
        if line is not None:
            return f"{path}: {line!r}"
    try:
        process.rev_parse(cwd, "HEAD")
    except GitError:
        return None  # no commit yet
    small = [
        e
        for e in process.iter_ls_tree(cwd, "HEAD")
        if e.type == "blob"
        and e.size is not None
        and e.size < (MAX_ATTRIBUTES_SIZE if e.path.endswith(b".gitattributes") else 1024)
    ]
    with process.CatFile(cwd) as cf:
        for e in small:
            _, data = cf.read(e.oid)
            path = os.fsdecode(e.path)
            if e.path.endswith(b".gitattributes"):
                line = _lfs_attribute_line(data)
                if line is not None:
                    return f"{path} in HEAD: {line!r}"
            elif data.startswith(LFS_VERSION_LINES):
                return f"{path} in HEAD is a git-lfs pointer"
    return None


# ---- fast-export paths -------------------------------------------------------------------

_C_ESCAPES = {
    ord("a"): 7,
    ord("b"): 8,
    ord("t"): 9,
    ord("n"): 10,
    ord("v"): 11,
    ord("f"): 12,
    ord("r"): 13,
    ord('"'): 34,
    ord("\\"): 92,
}


def _unquote_path(token: bytes) -> bytes:
    """A path as fast-export writes it (bare, or C-quoted) -> the raw path bytes."""
    if not token.startswith(b'"'):
        return token
    if len(token) < 2 or not token.endswith(b'"'):
        raise GitError(f"fast-export: badly quoted path {token[:200]!r}")
    body = token[1:-1]
    out = bytearray()
    i = 0
    while i < len(body):
        c = body[i]
        if c != 0x5C:
            out.append(c)
            i += 1
            continue
        nxt = body[i + 1 : i + 2]
        if nxt and nxt[0] in _C_ESCAPES:
            out.append(_C_ESCAPES[nxt[0]])
            i += 2
        elif len(body) >= i + 4 and all(48 <= d <= 55 for d in body[i + 1 : i + 4]):
            out.append(int(body[i + 1 : i + 4], 8) & 0xFF)
            i += 4
        else:
            raise GitError(f"fast-export: bad escape in path {token[:200]!r}")
    return bytes(out)


# ---- the migration -------------------------------------------------------------------------


@dataclass(frozen=True)
class MigrateOptions:
    """What to migrate.

    ``refs`` are branch or tag names (default: the current branch); ``everything`` takes
    every local branch and tag. ``threshold`` overrides ``xet.threshold`` for this run.
    """

    refs: Sequence[str] = ()
    everything: bool = False
    include: Sequence[str] = ()
    exclude: Sequence[str] = ()
    threshold: int | None = None


@dataclass
class MigrateResult:
    """What a migration did. File counts are of distinct blobs, not of paths or commits."""

    refs: list[str] = field(default_factory=list)
    commits: int = 0
    lfs_files: int = 0
    plain_files: int = 0
    bytes_converted: int = 0
    new_bytes: int = 0
    reused_bytes: int = 0
    lfs_left: int = 0  # LFS pointers at paths the selection left out (they stay LFS)
    checked_out: bool = False


def check_clean(repo: XetRepo) -> None:
    """Refuse to rewrite history under uncommitted changes to tracked files.

    Raises:
        DirtyWorkTreeError: ``git status`` shows changes (the first few paths are named).
    """
    if repo.worktree is None:
        return
    out = process.run_git(["status", "--porcelain", "-z", "--untracked-files=no"], repo.cwd)
    records = [r for r in out.split(b"\0") if r]
    if records:
        paths = [os.fsdecode(r[3:]) for r in records if len(r) > 3]
        raise DirtyWorkTreeError(paths[:5], len(records))


def _resolve_refs(repo: XetRepo, options: MigrateOptions) -> list[str]:
    if options.everything:
        if options.refs:
            raise ConfigError("give refs or --everything, not both")
        out = process.run_git(
            ["for-each-ref", "--format=%(refname)", "refs/heads", "refs/tags"], repo.cwd
        )
        found = out.decode("utf-8", "surrogateescape").split()
        if not found:
            raise GitError("nothing to migrate: the repository has no branches or tags")
        return found
    if not options.refs:
        r = process.run_git(["symbolic-ref", "-q", "HEAD"], repo.cwd, check=False).strip()
        if not r:
            raise ConfigError("HEAD is detached: name the branches to migrate, or --everything")
        head = r.decode("utf-8", "surrogateescape")
        if process.run_git(["rev-parse", "-q", "--verify", head], repo.cwd, check=False) == b"":
            raise GitError(f"nothing to migrate: {head} has no commits yet")
        return [head]
    refs: list[str] = []
    for name in options.refs:
        if not name or name.startswith("-"):
            raise ConfigError(f"invalid ref {name!r}")
        full = process.run_git(
            ["rev-parse", "--symbolic-full-name", "--end-of-options", name], repo.cwd, check=False
        ).strip()
        text = full.decode("utf-8", "surrogateescape")
        if not text.startswith(("refs/heads/", "refs/tags/")) or "\n" in text:
            raise ConfigError(f"{name!r} is not a branch or tag of this repository")
        if text not in refs:
            refs.append(text)
    return refs


def _lfs_objects_dir(repo: XetRepo) -> Path:
    storage = process.config_get(repo.cwd, "lfs.storage")
    base = Path(storage) if storage else Path("lfs")
    if not base.is_absolute():
        base = repo.git_dir / base
    return base / "objects"


class FileModify(NamedTuple):
    """One ``M <mode> <oid> <path>`` line of fast-export's stream, split."""

    mode: bytes
    oid: str
    token: bytes  # the path as the stream wrote it (maybe quoted): written back as it is
    path: bytes


def with_block(old: bytes, block: bytes) -> bytes:
    """``old`` (a ``.gitattributes``) with ``block`` appended, unless it already ends so."""
    if old.endswith(block):
        return old
    return old + (b"\n" if old and not old.endswith(b"\n") else b"") + block


class StreamRewriter:
    """What the import and the export rewriters share: their inputs, and the split of a
    filemodify line. A subclass sets up its own state in :meth:`setup`."""

    def __init__(
        self,
        repo: XetRepo,
        selector: PathSelector,
        cat: process.CatFile,
        result: MigrateResult,
        progress: Progress | None,
    ) -> None:
        self.repo = repo
        self.selector = selector
        self.cat = cat
        self.result = result
        self.progress = progress
        self.setup()

    def setup(self) -> None:
        """Called at the end of ``__init__``."""

    @staticmethod
    def split_filemodify(line: bytes) -> FileModify | None:
        """The parts of ``M <mode> <oid> <path>``; None for a mode that is no regular file
        (symlinks, submodules: never content a migration converts)."""
        parts = line[:-1].split(b" ", 3)
        if len(parts) != 4:
            raise GitError(f"fast-export: malformed filemodify {line[:200]!r}")
        _, mode, ref, token = parts
        if mode not in (b"100644", b"100755", b"644", b"755"):
            return None
        return FileModify(mode, ref.decode("ascii", "replace"), token, _unquote_path(token))


class _Rewriter(StreamRewriter):
    """Reads fast-export's stream, writes fast-import's, converting selected blobs."""

    def setup(self) -> None:
        repo, selector = self.repo, self.selector
        self.lfs_dir = _lfs_objects_dir(repo)
        self.block = selector.attributes_block()
        # blob id -> new content (a pointer, or small LFS content) or an LFS oid to re-read
        self.converted: dict[str, bytes | LfsPointer] = {}
        self.kept: set[str] = set()  # selected blob ids that stay as they are (small)
        self.not_lfs: set[str] = set()  # unselected blob ids that are no LFS pointer
        self.attributes: dict[str, bytes] = {}
        self.lfs_left: set[str] = set()
        # every rewritten tree carries the threshold the migration used (.xetconfig), so a
        # clone of any of its commits cleans files as the migration did
        self.xetconfig = f"[xet]\n\tthreshold = {_size_text(repo.threshold)}\n".encode()

    # -- blobs ---------------------------------------------------------------------------

    def _lfs_path(self, ptr: LfsPointer) -> Path:
        return self.lfs_dir / ptr.oid[0:2] / ptr.oid[2:4] / ptr.oid

    def _clean_file(self, src: IO[bytes], path: bytes, expect: LfsPointer | None) -> bytes:
        out, res = self.repo.clean_stream(src, os.fsdecode(path))  # type: ignore[arg-type]
        if res is not None:
            sha, size = res.sha256, res.size
            self.result.bytes_converted += res.size
            self.result.new_bytes += res.new_bytes
            self.result.reused_bytes += res.reused_bytes
            if self.progress is not None:
                self.progress(res.size)
        else:
            sha, size = hashlib.sha256(out).hexdigest(), len(out)
        if expect is not None and (sha != expect.oid or size != expect.size):
            raise IntegrityError(
                "git-lfs object",
                expect.oid,
                f"for {os.fsdecode(path)} has sha256 {sha} and {size} bytes, "
                f"the pointer says {expect.size} bytes",
            )
        return out

    def _from_lfs(self, ptr: LfsPointer, path: bytes) -> bytes:
        if ptr.size == 0:
            return self._clean_file(io.BytesIO(b""), path, ptr)
        try:
            f = open(self._lfs_path(ptr), "rb")  # noqa: SIM115 - closed below
        except FileNotFoundError:
            raise LfsObjectMissingError(ptr.oid, os.fsdecode(path)) from None
        with f:
            return self._clean_file(f, path, ptr)

    def replacement(self, oid: str, path: bytes) -> bytes | None:
        """New content for blob ``oid`` at a selected ``path``, or None to keep it."""
        if oid in self.kept:
            return None
        cached = self.converted.get(oid)
        if isinstance(cached, bytes):
            return cached
        if isinstance(cached, LfsPointer):  # small LFS content: re-read, not kept in memory
            with open(self._lfs_path(cached), "rb") as f:
                return f.read(self.repo.threshold)
        info = self.cat.info(oid)
        if info.type != "blob":
            raise GitError(f"fast-export named {oid} at {path!r} but it is a {info.type}")
        if info.size < LFS_MAX_POINTER_SIZE:
            _, data = self.cat.read(oid, max_size=LFS_MAX_POINTER_SIZE)
            try:
                ptr = parse_lfs_pointer(data)
            except PointerFormatError as exc:
                raise PointerFormatError(exc.what, f"{os.fsdecode(path)}: {exc.reason}") from None
            if ptr is not None:
                new = self._from_lfs(ptr, path)
                self.result.lfs_files += 1
                bulky = len(new) > MAX_POINTER_SIZE
                self.converted[oid] = ptr if bulky else new
                return new
        if info.size < self.repo.threshold:
            self.kept.add(oid)
            return None
        with self.cat.stream(oid) as stream:
            new = self._clean_file(stream, path, None)  # type: ignore[arg-type]
        if len(new) > MAX_POINTER_SIZE:  # cannot happen above the threshold; be safe
            self.kept.add(oid)
            return None
        self.converted[oid] = new
        self.result.plain_files += 1
        return new

    def note_unselected(self, oid: str) -> None:
        """Count LFS pointers the selection leaves alone (reported, not converted)."""
        if oid in self.lfs_left or oid in self.not_lfs:
            return
        info = self.cat.info(oid)
        if info.type == "blob" and info.size < LFS_MAX_POINTER_SIZE:
            _, data = self.cat.read(oid, max_size=LFS_MAX_POINTER_SIZE)
            with contextlib.suppress(PointerFormatError):
                if parse_lfs_pointer(data) is not None:
                    self.lfs_left.add(oid)
                    return
        self.not_lfs.add(oid)

    # -- .gitattributes ------------------------------------------------------------------

    def attributes_for(self, oid: str | None) -> bytes:
        """The top-level ``.gitattributes`` replacing blob ``oid`` (None: there was none)."""
        if oid is None:
            return self.block
        if oid in self.attributes:
            return self.attributes[oid]
        info = self.cat.info(oid)
        if info.size > MAX_ATTRIBUTES_SIZE:
            raise GitError(f".gitattributes blob {oid} has {info.size} bytes, over the limit")
        _, old = self.cat.read(oid, max_size=MAX_ATTRIBUTES_SIZE)
        new = with_block(old, self.block)
        self.attributes[oid] = new
        return new

    # -- the stream ----------------------------------------------------------------------

    def run(self, src: IO[bytes], dst: IO[bytes]) -> None:
        in_commit = False
        has_from = False
        attributes_done = False
        config_done = False

        def finish_commit() -> None:
            nonlocal in_commit
            if in_commit and not has_from and not attributes_done:
                _write_inline(dst, b"100644", b".gitattributes", self.attributes_for(None))
            if in_commit and not has_from and not config_done:
                _write_inline(dst, b"100644", XETCONFIG.encode(), self.xetconfig)
            in_commit = False

        while True:
            line = src.readline(MAX_LINE)
            if not line:
                break
            if not line.endswith(b"\n"):
                raise GitError(f"fast-export: line too long or cut off: {line[:200]!r}")
            if in_commit and (line == b"\n" or line.startswith(_TOP_LEVEL)):
                finish_commit()
                dst.write(line)
                if line != b"\n":
                    in_commit = self._start(line)
                    has_from = attributes_done = config_done = False
                continue
            if line.startswith(b"data "):
                _copy_data(line, src, dst)
                continue
            if not in_commit:
                dst.write(line)
                if line.startswith(b"commit "):
                    in_commit = self._start(line)
                    has_from = attributes_done = config_done = False
                continue
            if line.startswith(b"from "):
                has_from = True
                dst.write(line)
            elif line.startswith(b"M "):
                done = self._filemodify(line, dst)
                attributes_done |= done == ".gitattributes"
                config_done |= done == XETCONFIG
            elif line.startswith(b"D "):
                path = _unquote_path(line[2:-1])
                if path == b".gitattributes":
                    _write_inline(dst, b"100644", line[2:-1], self.attributes_for(None))
                    attributes_done = True
                elif path == XETCONFIG.encode():
                    _write_inline(dst, b"100644", line[2:-1], self.xetconfig)
                    config_done = True
                else:
                    dst.write(line)
            elif line == b"deleteall\n":
                dst.write(line)
                has_from = False  # the tree starts empty again: it needs our attributes
                attributes_done = config_done = False
            elif line.startswith((b"R ", b"C ", b"N ")):
                raise GitError(f"fast-export: unexpected command {line[:200]!r}")
            else:
                dst.write(line)  # mark, author, committer, encoding, merge, original-oid
        finish_commit()

    def _start(self, line: bytes) -> bool:
        if line.startswith(b"commit "):
            self.result.commits += 1
            return True
        return False

    def _filemodify(self, line: bytes, dst: IO[bytes]) -> str | None:
        """Handle ``M <mode> <oid> <path>``; the name of the top-level rules file
        (``.gitattributes``, ``.xetconfig``) it replaced, if it was one."""
        fm = self.split_filemodify(line)
        if fm is None:
            dst.write(line)
            return None
        mode, oid, token, path = fm
        if path == b".gitattributes":
            _write_inline(dst, mode, token, self.attributes_for(oid))
            return ".gitattributes"
        if path == XETCONFIG.encode():
            _write_inline(dst, mode, token, self.xetconfig)
            return XETCONFIG
        if is_never_pointer(os.fsdecode(path)) or not self.selector.selects(path):
            self.note_unselected(oid)
            dst.write(line)
            return None
        new = self.replacement(oid, path)
        if new is None:
            dst.write(line)
        else:
            _write_inline(dst, mode, token, new)
        return None


def _size_text(n: int) -> str:
    """``n`` bytes as the size grammar writes it, exactly: ``256k``, ``1m``, ``1000``."""
    for shift, unit in ((30, "g"), (20, "m"), (10, "k")):
        if n and n % (1 << shift) == 0:
            return f"{n >> shift}{unit}"
    return str(n)


def _copy_data(line: bytes, src: IO[bytes], dst: IO[bytes]) -> None:
    """Pass a counted ``data <n>`` block through byte for byte."""
    count = line[5:-1]
    if not count.isdigit():
        raise GitError(f"fast-export: unsupported data header {line[:200]!r}")
    dst.write(line)
    left = int(count)
    while left:
        piece = src.read(min(left, 1 << 20))
        if not piece:
            raise GitError("fast-export: stream ends inside a data block")
        dst.write(piece)
        left -= len(piece)


def _write_inline(dst: IO[bytes], mode: bytes, token: bytes, content: bytes) -> None:
    """``M <mode> inline <path>`` with ``content``; ``token`` is the path as fast-export
    wrote it (bare or C-quoted), which fast-import reads the same way."""
    dst.write(b"M " + mode + b" inline " + token + b"\n")
    dst.write(b"data %d\n" % len(content))
    dst.write(content)
    dst.write(b"\n")


def rewrite_history(
    repo: XetRepo,
    refs: Sequence[str],
    everything: bool,
    rewrite: Callable[[process.CatFile, IO[bytes], IO[bytes]], None],
) -> bool:
    """Pipe ``git fast-export`` of ``refs`` (``everything``: all branches and tags)
    through ``rewrite(cat, src, dst)`` into ``git fast-import``; returns whether the work
    tree's HEAD moved (its files then need checking out again).

    Raises:
        GitError: git failed, or fast-import stopped reading (nothing was changed then).
    """
    head_before = process.run_git(["rev-parse", "-q", "--verify", "HEAD"], repo.cwd, check=False)
    export = [
        "fast-export",
        "--no-data",
        "--use-done-feature",
        "--signed-tags=strip",
        "--tag-of-filtered-object=rewrite",
        "--reencode=no",
        # --everything: let git enumerate the refs (a long list would not fit in argv)
        *(["--branches", "--tags"] if everything else refs),
    ]
    with (
        process.CatFile(repo.cwd) as cat,
        _git_pipe(["fast-import", "--force", "--quiet"], repo.cwd, reader=False) as imp,
        _git_pipe(export, repo.cwd, reader=True) as exp,
    ):
        assert exp.stdout is not None and imp.stdin is not None
        try:
            rewrite(cat, exp.stdout, imp.stdin)
        except BrokenPipeError:
            raise GitError("git fast-import stopped reading the rewritten history") from None
    head_after = process.run_git(["rev-parse", "-q", "--verify", "HEAD"], repo.cwd, check=False)
    return bool(repo.worktree is not None and head_after and head_after != head_before)


@contextlib.contextmanager
def _git_pipe(args: Sequence[str], cwd: str, *, reader: bool) -> Iterator[subprocess.Popen[bytes]]:
    """A git process whose stdout (``reader``) or stdin we stream; killed if we fail."""
    with tempfile.TemporaryFile() as err:
        try:
            proc = subprocess.Popen(
                ["git", *args],
                cwd=cwd,
                stdin=subprocess.DEVNULL if reader else subprocess.PIPE,
                stdout=subprocess.PIPE if reader else subprocess.DEVNULL,
                stderr=err,
            )
        except OSError as exc:
            raise GitError(f"cannot run git {args[0]}: {exc}") from exc
        ok = False
        try:
            yield proc
            ok = True
        finally:
            died = proc.poll()  # exited on its own (before we kill it)?
            if not ok and died is None:
                proc.kill()  # fast-import killed before "done" updates no ref
            for pipe in (proc.stdin, proc.stdout):
                if pipe is not None:
                    with contextlib.suppress(OSError):
                        pipe.close()
            rc = proc.wait()
            if rc != 0 and (ok or died is not None):
                # git's own complaint explains more than the broken pipe we saw
                err.seek(0)
                lines = err.read(64 * 1024).decode("utf-8", "replace").strip().splitlines()
                raise GitError(f"git {args[0]} failed ({rc}): {lines[-1] if lines else ''}")


@dataclass
class Survey:
    """What migrating ``refs`` would convert (``git xet migrate info``, ``--dry-run``):
    per file extension, distinct git-lfs pointers and plain blobs at least ``threshold``
    bytes at selected paths. ``lfs_missing`` counts LFS objects the local store lacks (the
    migration would stop at the first)."""

    refs: list[str]
    commits: int
    threshold: int
    extensions: dict[str, list[int]] = field(default_factory=dict)  # lfs n/bytes, plain n/bytes
    lfs_missing: int = 0


def survey(repo: XetRepo, options: MigrateOptions) -> Survey:
    """Look at the history a migration with ``options`` would rewrite; change nothing."""
    from gitxet.formats.pointer import MAX_SIZE_VALUE
    from gitxet.git.catfile import batch_read
    from gitxet.repo.pointers import try_pointer

    threshold = options.threshold if options.threshold is not None else repo.threshold
    selector = PathSelector(options.include, options.exclude)
    refs = _resolve_refs(repo, options)
    count = process.run_git(["rev-list", "--count", *refs], repo.cwd)
    out = Survey(refs, int(count.strip() or 0), threshold)
    lfs_dir = _lfs_objects_dir(repo)

    def add(path: str, column: int, size: int) -> None:
        ext = os.path.splitext(path.rsplit("/", 1)[-1])[1].lower() or "(none)"
        row = out.extensions.setdefault(ext, [0, 0, 0, 0])
        row[column] += 1
        row[column + 1] += size

    small: dict[str, str] = {}
    seen: set[str] = set()
    for blob in process.small_blobs(repo.cwd, refs, max_size=MAX_SIZE_VALUE):
        path = os.fsdecode(blob.path)
        if blob.oid in seen or is_never_pointer(path) or not selector.selects(blob.path):
            continue
        seen.add(blob.oid)
        if blob.size < LFS_MAX_POINTER_SIZE:
            small[blob.oid] = path
        elif blob.size >= threshold:
            add(path, 2, blob.size)
    for oid, info, data in batch_read(repo.cwd, list(small), LFS_MAX_POINTER_SIZE):
        lfs = parse_lfs_pointer(data) if data is not None else None
        if lfs is not None:  # converted whatever its size; a pointer again only if big
            if lfs.size >= threshold:
                add(small[oid], 0, lfs.size)
            out.lfs_missing += not (lfs_dir / lfs.oid[:2] / lfs.oid[2:4] / lfs.oid).is_file()
        elif (
            info is not None
            and data is not None
            and info.size >= threshold
            and try_pointer(data) is None  # an Xet pointer is converted already
        ):
            add(small[oid], 2, info.size)
    return out


def migrate(
    repo: XetRepo, options: MigrateOptions, progress: Progress | None = None
) -> MigrateResult:
    """Rewrite the history of ``options``' refs so large files are gitxet pointers.

    A repository with a work tree must already have the xet filter configured (``git xet
    init`` does it), since the work tree is checked out through it at the end.

    Raises:
        DirtyWorkTreeError: uncommitted changes to tracked files.
        ConfigError: bad refs or patterns, or the xet filter is not configured.
        LfsObjectMissingError: an LFS pointer whose object is not in the local LFS store.
        IntegrityError: an LFS object whose content does not match its pointer.
        GitError: git failed (nothing was changed then).
    """
    check_clean(repo)
    if repo.worktree is not None and not (
        process.config_get(repo.cwd, "filter.xet.process")
        or process.config_get(repo.cwd, "filter.xet.smudge")
    ):
        raise ConfigError("the xet filter is not configured here: run 'git xet init' first")
    if options.threshold is not None:
        repo.threshold = options.threshold
    selector = PathSelector(options.include, options.exclude)
    refs = _resolve_refs(repo, options)
    result = MigrateResult(refs=refs)

    def rewrite(cat: process.CatFile, src: IO[bytes], dst: IO[bytes]) -> None:
        rewriter = _Rewriter(repo, selector, cat, result, progress)
        rewriter.run(src, dst)
        result.lfs_left = len(rewriter.lfs_left)

    if rewrite_history(repo, refs, options.everything, rewrite):
        # index and work tree still hold the old blobs: check the new commit out through
        # the filter, so converted files are materialized and `git status` is clean
        process.run_git(["reset", "--hard", "-q", "HEAD"], repo.cwd)
        result.checked_out = True
    return result
