"""Plumbing commands: ``hash``."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Annotated

import typer

from gitxet.cli import _errors, _json


def register(app: typer.Typer) -> None:
    app.command("hash")(hash_cmd)
    app.command("dedup")(dedup_cmd)


def hash_cmd(
    paths: Annotated[list[Path], typer.Argument(help="Files to hash ('-' for stdin).")],
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per file.")] = False,
) -> None:
    """Print the Xet file hash of each file, like sha256sum (identical to hf_xet's)."""
    import sys

    from gitxet.chunking.pipeline import digest_stream
    from gitxet.hashing import to_hex

    failed = 0
    with ThreadPoolExecutor(3, thread_name_prefix="gitxet-hash") as ex:
        for p in paths:
            try:
                if str(p) == "-":
                    d = digest_stream(sys.stdin.buffer, ex)
                else:
                    if os.path.isdir(p):
                        raise IsADirectoryError(21, "Is a directory", str(p))
                    with open(p, "rb") as f:
                        d = digest_stream(f, ex)
            except OSError as e:
                msg, code = _errors.describe(e)
                typer.echo(f"git-xet: {msg}", err=True)
                failed = failed or code
                continue
            if as_json:
                _json.emit(
                    "hash",
                    {"path": str(p), "hash": to_hex(d.hash), "size": d.size, "chunks": d.chunks},
                )
            else:
                typer.echo(f"{to_hex(d.hash)}  {p}")
    if failed:
        raise typer.Exit(failed)


def dedup_cmd(
    paths: Annotated[list[Path], typer.Argument(help="Files to analyse together.")],
) -> None:
    """Show how much the given files would deduplicate (nothing is stored)."""
    from gitxet.chunking.pipeline import ChunkStream

    seen: dict[bytes, int] = {}
    total = 0
    with ThreadPoolExecutor(3, thread_name_prefix="gitxet-dedup") as ex:
        for p in paths:
            with open(p, "rb") as f:
                cs = ChunkStream(f, executor=ex)
                for block in cs:
                    for h, c in zip(block.hashes, block.chunks, strict=True):
                        seen[h] = len(c)
                total += cs.size
    unique = sum(seen.values())
    pct = 100.0 * unique / total if total else 100.0
    typer.echo(
        f"{len(paths)} files, {total:,} bytes, {len(seen):,} unique chunks, "
        f"{unique:,} unique bytes ({pct:.1f}% of the input)"
    )
