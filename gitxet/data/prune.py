"""Which shards and xorbs of a local store can go, given the files that must stay.

``git xet prune`` decides *which files* to keep (the repository's current checkout, recent
refs, unpushed commits, mounted commits: :meth:`gitxet.repo.repository.XetRepo.files_to_keep`); this
module turns that into whole objects: a shard stays when it describes a kept file, and
every xorb a kept shard names (in a file's terms or in its xorb section) stays with it, so
the store never holds a shard that points at a missing xorb. Objects written in the last
``grace`` seconds always stay: another git command may be storing a file whose shard is
not written yet.
"""

from __future__ import annotations

import os
import time
from collections.abc import Collection
from dataclasses import dataclass, field

from gitxet.errors import FormatError
from gitxet.formats import shard as shardfmt
from gitxet.store.cas import LocalCAS

__all__ = ["PrunePlan", "apply_prune", "plan_prune"]


@dataclass(frozen=True, slots=True)
class PrunePlan:
    """What a prune removes and keeps."""

    shards: tuple[str, ...]  # shard names to remove
    xorbs: tuple[bytes, ...]  # xorb hashes to remove
    size: int  # bytes on disk, of both
    files: frozenset[bytes] = field(default_factory=frozenset)  # files only they describe
    kept_shards: int = 0
    kept_xorbs: int = 0
    kept_bytes: int = 0


def _young(path: str, cutoff: float) -> bool:
    try:
        return os.stat(path).st_mtime >= cutoff
    except FileNotFoundError:
        return False


def plan_prune(cas: LocalCAS, keep: Collection[bytes], grace: float = 3600.0) -> PrunePlan:
    """The shards describing none of the files ``keep`` and the xorbs no kept shard names,
    leaving out anything written less than ``grace`` seconds ago. A shard that cannot be
    parsed stays (``fsck`` reports it)."""
    cutoff = time.time() - grace
    keep_set = set(keep)
    kept_xorbs: set[bytes] = set()
    removed: list[str] = []
    gone_files: set[bytes] = set()
    kept_files: set[bytes] = set()
    kept_shard_bytes = removed_bytes = 0
    kept_shards = 0
    for name in cas.shard_names():
        path = cas.shard_path(name)
        try:
            shard = shardfmt.parse_shard(cas.shard_bytes(name))
        except (FormatError, OSError):
            kept_shards += 1
            continue
        hashes = {f.file_hash for f in shard.files}
        size = os.path.getsize(path)
        if hashes & keep_set or _young(path, cutoff):
            kept_shards += 1
            kept_shard_bytes += size
            kept_files |= hashes
            kept_xorbs.update(t.xorb_hash for f in shard.files for t in f.terms)
            kept_xorbs.update(x.xorb_hash for x in shard.xorbs)
        else:
            removed.append(name)
            removed_bytes += size
            gone_files |= hashes
    xorbs: list[bytes] = []
    kept_xorb_count = 0
    kept_bytes = kept_shard_bytes
    for h in cas.xorb_hashes():
        path = cas.xorb_path(h)
        size = os.path.getsize(path)
        if h in kept_xorbs or _young(path, cutoff):
            kept_xorb_count += 1
            kept_bytes += size
        else:
            xorbs.append(h)
            removed_bytes += size
    return PrunePlan(
        tuple(removed),
        tuple(xorbs),
        removed_bytes,
        frozenset(gone_files - kept_files),
        kept_shards,
        kept_xorb_count,
        kept_bytes,
    )


def apply_prune(cas: LocalCAS, plan: PrunePlan) -> None:
    """Re-index the store without the plan's shards, remove them, then its xorbs (in that
    order: the index never names a missing shard, nor a kept shard a missing xorb)."""
    cas.remove_objects(plan.shards, plan.xorbs)
