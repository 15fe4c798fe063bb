"""``git xet migrate export``: rewrite history so Xet pointers become plain git blobs again
(the counterpart of ``git lfs migrate export``; the way back from ``migrate import``).

The history of the chosen refs goes through ``git fast-export --no-data | <rewrite> | git
fast-import --force`` as for an import. A selected path whose blob is an Xet pointer gets
the file's content instead: reconstructed from the local store or any remote (every chunk
verified), written into git's object database with ``git hash-object -w --stdin`` as it
streams (memory stays flat), and named by its new id. The top-level ``.gitattributes`` of
every rewritten commit loses its ``filter=xet`` lines (the file goes when nothing else is
left) and ``.xetconfig`` is removed, so the result needs no gitxet at all. With -I/-X the
rules stay for the pointers left, and lines taking the exported paths out of the filter are
appended (as an import appends its own). As for an
import, refs move only when the whole stream went through, and the old commits stay in
the reflog.
"""

from __future__ import annotations

import os
import subprocess
from typing import IO

from gitxet.errors import GitError
from gitxet.formats.pointer import MAX_POINTER_SIZE, Pointer
from gitxet.git import process
from gitxet.git.attributes import PathSelector
from gitxet.git.attributes import _quote_pattern as _quote
from gitxet.git.xetconfig import XETCONFIG
from gitxet.migrate import (
    MAX_ATTRIBUTES_SIZE,
    MAX_LINE,
    MigrateOptions,
    MigrateResult,
    Progress,
    StreamRewriter,
    _copy_data,
    _resolve_refs,
    _write_inline,
    check_clean,
    rewrite_history,
    with_block,
)
from gitxet.repo.pointers import try_pointer
from gitxet.repo.repository import XetRepo

__all__ = ["export"]

_OURS = (b"filter=xet", b"!filter !diff !merge")  # lines import and export append
_OUR_COMMENT = b"# git xet migrate"


def plain_attributes(old: bytes) -> bytes:
    """``.gitattributes`` without gitxet's lines (``filter=xet``, the ``!filter`` lines
    and comments migrate wrote); other lines stay as they are."""
    lines = old.splitlines(keepends=True)
    kept = [
        ln
        for ln in lines
        if not any(mark in ln for mark in _OURS) and not ln.startswith(_OUR_COMMENT)
    ]
    return b"".join(kept)


def export_block(selector: PathSelector) -> bytes:
    """The lines a partial export appends to ``.gitattributes``: its paths leave the filter,
    the ones it left out (``--exclude``) stay in it."""
    plain = "!filter !diff !merge"
    xet = "filter=xet diff=xet merge=xet -text"
    lines = ["# git xet migrate export: these paths are plain files again"]
    lines += [f"{_quote(p)} {plain}" for p in selector.include or ["*"]]
    lines += [f"{_quote(p)} {xet}" for p in selector.exclude]
    return ("\n".join(lines) + "\n").encode()


class _Exporter(StreamRewriter):
    def setup(self) -> None:
        selector = self.selector
        self.blobs: dict[str, str | None] = {}  # pointer blob id -> content blob id (None: keep)
        # only a whole export drops the rules: with -I/-X the other pointers still need them
        self.whole = not (selector.include or selector.exclude)
        self.block = export_block(selector)
        self.attributes: dict[str, bytes] = {}

    def content_blob(self, oid: str, path: bytes) -> str | None:
        """The id of the plain blob replacing pointer blob ``oid``; None: not a pointer."""
        if oid in self.blobs:
            return self.blobs[oid]
        info = self.cat.info(oid)
        ptr: Pointer | None = None
        if info.type == "blob" and info.size <= MAX_POINTER_SIZE:
            _, data = self.cat.read(oid, max_size=MAX_POINTER_SIZE)
            ptr = try_pointer(data)
        if ptr is None:
            self.blobs[oid] = None
            return None
        proc = subprocess.Popen(
            ["git", "hash-object", "-w", "--no-filters", "--stdin"],
            cwd=self.repo.cwd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert proc.stdin is not None
        try:
            self.repo.write_content(ptr, proc.stdin, path=os.fsdecode(path))  # type: ignore[arg-type]
        except BaseException:
            proc.kill()
            proc.communicate()
            raise
        out, err = proc.communicate()
        if proc.returncode != 0:
            raise GitError(f"cannot store {os.fsdecode(path)}: {err.decode(errors='replace')}")
        new = out.decode("ascii").strip()
        self.blobs[oid] = new
        self.result.plain_files += 1
        self.result.bytes_converted += ptr.size
        if self.progress is not None:
            self.progress(ptr.size)
        return new

    def attributes_for(self, oid: str) -> bytes:
        """A whole export drops gitxet's lines; a partial one appends lines that take the
        exported paths out of the filter (later lines win), so they stay plain."""
        if oid not in self.attributes:
            _, old = self.cat.read(oid, max_size=MAX_ATTRIBUTES_SIZE)
            new = plain_attributes(old) if self.whole else with_block(old, self.block)
            self.attributes[oid] = new
        return self.attributes[oid]

    def run(self, src: IO[bytes], dst: IO[bytes]) -> None:
        while True:
            line = src.readline(MAX_LINE)
            if not line:
                break
            if not line.endswith(b"\n"):
                raise GitError(f"fast-export: line too long or cut off: {line[:200]!r}")
            if line.startswith(b"data "):
                _copy_data(line, src, dst)
            elif line.startswith(b"M "):
                self._filemodify(line, dst)
            elif line.startswith(b"commit "):
                self.result.commits += 1
                dst.write(line)
            else:
                dst.write(line)

    def _filemodify(self, line: bytes, dst: IO[bytes]) -> None:
        fm = self.split_filemodify(line)
        if fm is None:
            dst.write(line)
            return
        mode, oid, token, path = fm
        if path == XETCONFIG.encode() and self.whole:
            dst.write(b"D " + token + b"\n")
            return
        if path == b".gitattributes":
            new = self.attributes_for(oid)
            if new.strip():
                _write_inline(dst, mode, token, new)
            else:
                dst.write(b"D " + token + b"\n")
            return
        plain = self.content_blob(oid, path) if self.selector.selects(path) else None
        if plain is None:
            dst.write(line)
        else:
            dst.write(b"M " + mode + b" " + plain.encode("ascii") + b" " + token + b"\n")


def export(
    repo: XetRepo, options: MigrateOptions, progress: Progress | None = None
) -> MigrateResult:
    """Rewrite the history of ``options``' refs so Xet pointers at selected paths become
    the files' content again (``plain_files``: how many distinct pointers were expanded).

    Raises:
        DirtyWorkTreeError: uncommitted changes to tracked files.
        DataUnavailableError: a file's data is neither here nor on any remote.
        GitError: git failed (nothing was changed then).
    """
    check_clean(repo)
    selector = PathSelector(options.include, options.exclude)
    refs = _resolve_refs(repo, options)
    result = MigrateResult(refs=refs)

    def rewrite(cat: process.CatFile, src: IO[bytes], dst: IO[bytes]) -> None:
        _Exporter(repo, selector, cat, result, progress).run(src, dst)

    if rewrite_history(repo, refs, options.everything, rewrite):
        # the files are plain blobs now: check them out without the filter's help
        process.run_git(["-c", "xet.lazy=false", "reset", "--hard", "-q", "HEAD"], repo.cwd)
        result.checked_out = True
    return result
