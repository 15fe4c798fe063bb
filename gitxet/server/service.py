"""The CAS use cases behind the HTTP routes: store xorbs and shards, answer reads.

Everything here is blocking and protocol-neutral (no Starlette): the app runs it in worker
threads and maps its typed errors to status codes. Rules enforced:

* a xorb is stored only if its chunks Merkle-hash to the name it was uploaded under; it is
  stored with a footer (chunk hashes and offsets) so reads never decode it again;
* a shard is registered only if every xorb it names is stored, its CAS blocks agree with
  those xorbs, every term lies inside its xorb with the right length, every verification
  hash is right, and each file's chunks hash to the file hash. Nothing is stored otherwise;
* a file's SHA-256 metadata in a shard is not checked (that would mean reading all of the
  file's data at upload): it is ignored, and never served (``file_shard`` leaves it out).
"""

from __future__ import annotations

import itertools
import secrets
import time
from collections.abc import Callable

from gitxet.errors import (
    FileNotFoundInCASError,
    FormatError,
    IntegrityError,
    RangeNotSatisfiableError,
    RequestRejectedError,
    XorbNotFoundError,
)
from gitxet.formats import shard as shardfmt
from gitxet.formats import xorb as xorbfmt
from gitxet.hashing import ZERO_HASH, chunk_hash, file_hash, to_hex, verification_hash
from gitxet.remote.protocol import FetchInfo, Reconstruction, Term
from gitxet.server.backends import Backend
from gitxet.server.index import CasIndex, log_key, shard_key, xorb_key
from gitxet.store.cas import XorbLayout

__all__ = ["CasService"]

#: How long a global-dedup answer stays usable by the client.
DEDUP_SHARD_TTL = 7 * 24 * 3600


class CasService:
    """Xorb and shard storage plus reconstruction over a backend and its index."""

    def __init__(self, backend: Backend, index: CasIndex | None = None) -> None:
        self.backend = backend
        self.index = index or CasIndex(backend)

    # ---- xorbs ----------------------------------------------------------------------------

    def put_xorb(self, xorb_hash: bytes, data: bytes) -> bool:
        """Verify and store an uploaded xorb (footer optional); ``False`` if already stored.

        Raises:
            RequestRejectedError: not a xorb, or it hashes to something else.
        """
        if self.index.has_xorb(xorb_hash):
            return False
        hx = to_hex(xorb_hash)
        try:
            body, _ = xorbfmt.split_footer(data)
            parsed = xorbfmt.verify_xorb(body, xorb_hash, keep_chunks=False)
        except FormatError as e:
            raise RequestRejectedError(f"xorb {hx}", str(e)) from None
        except IntegrityError as e:
            raise RequestRejectedError(f"xorb {hx}", f"hash mismatch: {e.detail}") from None
        ends: list[int] = []
        total = 0
        for size in parsed.chunk_sizes:
            total += size
            ends.append(total)
        footer = xorbfmt.build_footer(xorb_hash, parsed.chunk_hashes, parsed.byte_offsets[1:], ends)
        self.backend.put(xorb_key(xorb_hash), bytes(body) + footer)
        self.index.add_xorb(
            xorb_hash,
            XorbLayout(
                xorb_hash, tuple(parsed.chunk_hashes), tuple(parsed.byte_offsets), (0, *ends)
            ),
        )
        return True

    def has_xorb(self, xorb_hash: bytes) -> bool:
        """Whether the xorb is stored."""
        return self.index.has_xorb(xorb_hash)

    def layout(self, xorb_hash: bytes) -> XorbLayout:
        """Chunk layout of a stored xorb (see :meth:`CasIndex.layout`)."""
        return self.index.layout(xorb_hash)

    def read_xorb_range(
        self, xorb_hash: bytes, start: int, end: int | None
    ) -> tuple[bytes, int, int]:
        """Serialized bytes ``[start, end]`` of a xorb's body (never its footer).

        Returns ``(data, start, end)`` with ``end`` clamped to the body.

        Raises:
            XorbNotFoundError: not stored.
            RangeNotSatisfiableError: ``start`` at or past the end of the body.
        """
        lay = self.layout(xorb_hash)
        size = lay.body_size
        if start >= size:
            raise RangeNotSatisfiableError(f"xorb {to_hex(xorb_hash)}", size)
        last = size - 1 if end is None else min(end, size - 1)
        data = self.backend.get_range(xorb_key(xorb_hash), start, last - start + 1)
        if len(data) != last - start + 1:
            raise IntegrityError("xorb", to_hex(xorb_hash), "stored object is truncated")
        return data, start, last

    # ---- shards ---------------------------------------------------------------------------

    def put_shard(self, data: bytes) -> bool:
        """Validate and register an upload shard; ``False`` if this exact shard was known.

        Raises:
            RequestRejectedError: malformed, a missing xorb, or anything that fails to verify.
        """
        try:
            shard = shardfmt.parse_shard(data)
        except FormatError as e:
            raise RequestRejectedError("shard", str(e)) from None
        if shard.footer is not None and shard.footer.protected:
            raise RequestRejectedError("shard", "a dedup (HMAC-keyed) shard cannot be registered")
        firsts = self._validate(shard)
        name = to_hex(chunk_hash(data))
        key = shard_key(name)
        created = self.backend.put(key, bytes(data), if_absent=True)
        if created:
            # After the shard itself: a replica that sees the marker can read the shard.
            self.backend.put(log_key(name), b"")
        self.index.register(name, shard, firsts)
        return created

    def _layout_for(self, xorb_hash: bytes, what: str) -> XorbLayout:
        try:
            return self.index.layout(xorb_hash)
        except XorbNotFoundError:
            raise RequestRejectedError(
                what, f"references xorb {to_hex(xorb_hash)}, which is not stored"
            ) from None

    def _validate(self, shard: shardfmt.Shard) -> dict[bytes, bytes]:
        """Check everything (see the module docstring); returns {first chunk: xorb} per file."""
        firsts: dict[bytes, bytes] = {}
        for x in shard.xorbs:
            hx = to_hex(x.xorb_hash)
            lay = self._layout_for(x.xorb_hash, f"shard xorb block {hx}")
            sizes = [b - a for a, b in itertools.pairwise(lay.data_offsets)]
            if (
                [c.hash for c in x.chunks] != list(lay.chunk_hashes)
                or [c.size for c in x.chunks] != sizes
                or [c.byte_start for c in x.chunks] != list(lay.data_offsets[:-1])
            ):
                raise RequestRejectedError(
                    f"shard xorb block {hx}", "chunk list differs from the stored xorb"
                )
        for f in shard.files:
            fx = to_hex(f.file_hash)
            what = f"shard file {fx}"
            if not f.terms:
                if f.file_hash != ZERO_HASH:
                    raise RequestRejectedError(what, "no terms, but not the empty-file hash")
                continue
            entries: list[tuple[bytes, int]] = []
            for i, t in enumerate(f.terms):
                lay = self._layout_for(t.xorb_hash, what)
                if t.chunk_end > lay.num_chunks:
                    raise RequestRejectedError(
                        what,
                        f"term {i} ends at chunk {t.chunk_end}, past the xorb's {lay.num_chunks}",
                    )
                offs = lay.data_offsets
                if offs[t.chunk_end] - offs[t.chunk_start] != t.unpacked_bytes:
                    raise RequestRejectedError(what, f"term {i} length differs from its chunks")
                hashes = lay.chunk_hashes[t.chunk_start : t.chunk_end]
                if f.verification is not None and verification_hash(hashes) != f.verification[i]:
                    raise RequestRejectedError(what, f"term {i} has a wrong verification hash")
                entries.extend(
                    (h, offs[k + 1] - offs[k])
                    for k, h in zip(range(t.chunk_start, t.chunk_end), hashes, strict=True)
                )
            if file_hash(entries) != f.file_hash:
                raise RequestRejectedError(what, "its chunks do not hash to the file hash")
            firsts[entries[0][0]] = f.terms[0].xorb_hash
        return firsts

    # ---- reads ----------------------------------------------------------------------------

    def file_info(self, file_hash_: bytes) -> shardfmt.FileInfo:
        """The stored reconstruction of a file.

        Raises:
            FileNotFoundInCASError: unknown file.
        """
        if file_hash_ == ZERO_HASH:
            return shardfmt.FileInfo(ZERO_HASH, [])
        info = self.index.file_info(file_hash_)
        if info is None:
            raise FileNotFoundInCASError(to_hex(file_hash_))
        return info

    def missing_files(self, file_hashes: list[bytes]) -> list[bytes]:
        """The files of ``file_hashes`` no stored shard describes (the empty file is known).

        Misses wait for one index refresh, as a single :meth:`file_info` miss does, so a
        file registered through another replica counts as present.
        """
        started = time.monotonic()
        missing = [h for h in file_hashes if h != ZERO_HASH and not self.index.has_file(h)]
        if missing:
            self.index.refresh(since=started)
            missing = [h for h in missing if not self.index.has_file(h)]
        return missing

    def file_blocks(self, file_hashes: list[bytes]) -> bytes:
        """A stored-form shard with the blocks of the files of ``file_hashes`` that a stored
        shard describes, and no xorb blocks (``POST /v1/file-shards``); unknown files are
        left out. Misses wait for one index refresh, as in :meth:`missing_files`."""
        unknown = set(self.missing_files(list(dict.fromkeys(file_hashes))))
        files: list[shardfmt.FileInfo] = []
        for h in dict.fromkeys(file_hashes):
            if h in unknown:
                continue
            info = self.file_info(h) if h == ZERO_HASH else self.index.file_info(h)
            if info is not None:  # (a shard removed since: left out, as unknown)
                # without the SHA-256 metadata, as in file_shard
                files.append(shardfmt.FileInfo(info.file_hash, info.terms, info.verification))
        return shardfmt.serialize_stored_shard(shardfmt.Shard(files, []))

    def reconstruct(
        self,
        file_hash_: bytes,
        byte_range: tuple[int, int | None] | None,
        url_for: Callable[[str], str],
    ) -> Reconstruction:
        """Terms and fetch entries for a file, or for bytes ``[a, b]`` of it (inclusive).

        A range is clamped to the file; terms are trimmed to the chunks that overlap it and
        ``offset_into_first_range`` says how much of the first kept chunk to skip. Fetch
        entries cover the union of each xorb's term ranges, merged where they touch, so a
        xorb range is fetched once. ``url_for(xorb_hex)`` builds the signed data URL.

        Raises:
            FileNotFoundInCASError: unknown file.
            RangeNotSatisfiableError: the range starts at or past the end of the file.
        """
        info = self.file_info(file_hash_)
        size = info.size
        if byte_range is None:
            a, b = 0, size - 1
        else:
            a, b_opt = byte_range
            if a >= size:
                raise RangeNotSatisfiableError(f"file {to_hex(file_hash_)}", size)
            b = size - 1 if b_opt is None else min(b_opt, size - 1)
        terms: list[Term] = []
        layouts: dict[bytes, XorbLayout] = {}
        offset_first = 0
        pos = 0
        for t in info.terms:
            t_start, pos = pos, pos + t.unpacked_bytes
            if pos <= a:
                continue
            if t_start > b:
                break
            lay = layouts.get(t.xorb_hash) or self.layout(t.xorb_hash)
            layouts[t.xorb_hash] = lay
            offs = lay.data_offsets
            if t.chunk_end > lay.num_chunks:
                raise IntegrityError("shard", to_hex(file_hash_), "a term lies outside its xorb")
            base = t_start - offs[t.chunk_start]  # file offset of the xorb's byte 0
            cs, ce = t.chunk_start, t.chunk_end
            while base + offs[cs + 1] <= a:  # drop chunks wholly before a
                cs += 1
            while base + offs[ce - 1] > b:  # drop chunks wholly after b
                ce -= 1
            if not terms:
                offset_first = a - (base + offs[cs]) if a > base + offs[cs] else 0
            terms.append(Term(to_hex(t.xorb_hash), cs, ce, offs[ce] - offs[cs]))
        fetch: dict[str, list[FetchInfo]] = {}
        spans: dict[str, list[tuple[int, int]]] = {}
        for term in terms:
            spans.setdefault(term.xorb_hex, []).append((term.chunk_start, term.chunk_end))
        by_hex = {to_hex(k): v for k, v in layouts.items()}
        for hx, ranges in spans.items():
            lay = by_hex[hx]
            url = url_for(hx)
            merged: list[list[int]] = []
            for s, e in sorted(ranges):
                if merged and s <= merged[-1][1]:
                    merged[-1][1] = max(merged[-1][1], e)
                else:
                    merged.append([s, e])
            fetch[hx] = [
                FetchInfo(s, e, url, lay.byte_offsets[s], lay.byte_offsets[e] - 1)
                for s, e in merged
            ]
        return Reconstruction(terms, fetch, offset_first)

    def dedup_shard(self, chunk_hash_: bytes, now: int | None = None) -> bytes | None:
        """A §5.6 global-dedup answer for an eligible chunk, or ``None`` if unknown.

        A fresh random HMAC key is used per answer: clients match on the keyed hashes, and
        a client that has never seen the chunk learns nothing about the xorb's others.
        """
        xh = self.index.xorb_for_chunk(chunk_hash_)
        if xh is None:
            return None
        lay = self.layout(xh)
        offs = lay.data_offsets
        info = shardfmt.XorbInfo.from_chunks(
            xh,
            lay.chunk_hashes,
            [b - a for a, b in itertools.pairwise(offs)],
            lay.body_size,
        )
        created = int(time.time()) if now is None else now
        return shardfmt.dedup_response_shard(
            [info], secrets.token_bytes(32), created, created + DEDUP_SHARD_TTL
        )

    def file_shard(self, file_hash_: bytes, *, with_xorbs: bool = True) -> bytes:
        """A stored-form shard with the file's block and (``with_xorbs``) the CAS blocks of
        its xorbs.

        Raises:
            FileNotFoundInCASError: unknown file.
        """
        info = self.file_info(file_hash_)
        xorbs: dict[bytes, shardfmt.XorbInfo] = {}
        for t in info.terms if with_xorbs else ():
            if t.xorb_hash not in xorbs:
                lay = self.layout(t.xorb_hash)
                offs = lay.data_offsets
                xorbs[t.xorb_hash] = shardfmt.XorbInfo.from_chunks(
                    t.xorb_hash,
                    lay.chunk_hashes,
                    [b - a for a, b in itertools.pairwise(offs)],
                    lay.body_size,
                )
        # Without the SHA-256 metadata: it is the first uploader's unchecked claim (the
        # server verifies files by their Xet hash only), so it is never handed out.
        bare = shardfmt.FileInfo(info.file_hash, info.terms, info.verification)
        return shardfmt.serialize_stored_shard(shardfmt.Shard([bare], list(xorbs.values())))
