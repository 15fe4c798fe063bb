"""A hostile gitxet repository, built as an attacker would (issue 12).

Tree objects are written byte for byte (what ``git hash-object -t tree --literally`` does),
so they hold what git itself never writes: ``.git`` directories and their look-alikes with
a ``config`` whose ``core.fsmonitor`` runs a command, ``..``, ``.`` and absolute names,
names with ``/``, duplicate names, a symlink whose target is ``link_size`` bytes (1 GiB of
one byte packs to about 1 MB), and a directory whose tree object is garbage. Every file an
attacker would want written is a gitxet *pointer* whose data is in the repository's store,
so ``git xet checkout`` would write the attacker's bytes.

Branches of :attr:`Hostile.work`:

* ``hostile``: everything above, plus ``data/big.bin`` and ``ok.txt`` that must still read;
* ``hostile-names``: the bad names only (no huge link, no broken tree: clone tests);
* ``hostile-hfs``: ``.g\\u200cit/config`` (which git on Linux checks out, as HFS+ is not
  in play there) next to ``data/big.bin`` and ``ok.txt``;
* ``main``: the ordinary commit the pointer files came from.
"""

from __future__ import annotations

import hashlib
import os
import random
import subprocess
import zlib
from dataclasses import dataclass
from pathlib import Path

DOTGIT_NAMES = [".git", ".GIT", ".Git", ".git.", ".git ", "git~1", "GIT~1", ".g\u200cit"]
HFS_NAME = ".g\u200cit"


@dataclass
class Hostile:
    """What a test needs to know about the hostile repository."""

    work: Path  # the repository holding every branch and the pointer files' data
    outside: Path  # a directory no operation may touch
    marker: Path  # created if git ever runs the hostile config's fsmonitor
    absolute: Path  # the absolute name's target (inside ``outside``)
    big: bytes  # data/big.bin
    ok: bytes  # ok.txt
    dup: bytes  # the first dup.txt (the one shown)
    evil_config: bytes  # the .git/config an attacker wants written
    link_size: int
    link_blob: str  # object id of the huge symlink target

    def snapshot_outside(self) -> dict[str, bytes]:
        """Everything under the test's directory that is not a repository, by path."""
        base = self.outside.parent
        out: dict[str, bytes] = {}
        for root, dirs, files in os.walk(base):
            dirs[:] = [d for d in dirs if d not in (".git",) and not d.endswith(".git")]
            for name in files:
                p = Path(root) / name
                if not p.is_symlink():
                    out[str(p.relative_to(base))] = p.read_bytes()
        return out


def _sh(env: dict[str, str], cwd: Path, *args: str) -> str:
    r = subprocess.run(list(args), cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, (args, r.stdout, r.stderr)
    return r.stdout.strip()


def _store(objects: Path, kind: bytes, body: bytes) -> bytes:
    data = kind + b" %d\0" % len(body) + body
    sha = hashlib.sha1(data).digest()
    path = objects / sha.hex()[:2] / sha.hex()[2:]
    path.parent.mkdir(exist_ok=True)
    if not path.exists():
        path.write_bytes(zlib.compress(data, 1))
    return sha


def _store_big_blob(objects: Path, size: int, byte: bytes = b"a") -> bytes:
    """A loose blob of ``size`` copies of ``byte``, streamed (never whole in memory)."""
    header = b"blob %d\0" % size
    h = hashlib.sha1(header)
    z = zlib.compressobj(1)
    tmp = objects / "big-blob.tmp"
    block = byte * (8 << 20)
    with open(tmp, "wb") as f:
        f.write(z.compress(header))
        left = size
        while left:
            piece = block[: min(left, len(block))]
            h.update(piece)
            f.write(z.compress(piece))
            left -= len(piece)
        f.write(z.flush())
    sha = h.digest()
    (objects / sha.hex()[:2]).mkdir(exist_ok=True)
    os.replace(tmp, objects / sha.hex()[:2] / sha.hex()[2:])
    return sha


def _tree(objects: Path, entries: list[tuple[str, bytes | str, bytes]]) -> bytes:
    """A tree of (mode, name, id) entries in git's order (a directory sorts as ``name/``),
    duplicates and all."""

    def key(e: tuple[str, bytes | str, bytes]) -> bytes:
        name = e[1].encode() if isinstance(e[1], str) else e[1]
        return name + (b"/" if e[0] == "40000" else b"")

    body = b""
    for mode, name, sha in sorted(entries, key=key):
        raw = name.encode() if isinstance(name, str) else name
        body += mode.encode() + b" " + raw + b"\0" + sha
    return _store(objects, b"tree", body)


def build(tmp: Path, env: dict[str, str], link_size: int = 1 << 30) -> Hostile:
    """Build the hostile repository under ``tmp`` (see the module docstring)."""
    outside = tmp / "outside"
    outside.mkdir()
    (outside / "victim.txt").write_bytes(b"precious\n")
    marker = tmp / "PWNED"
    absolute = outside / "absolute.bin"
    work = tmp / "work"
    _sh(env, tmp, "git", "init", "-q", str(work))
    _sh(env, work, "git-xet", "init", "--threshold", "1k")
    rnd = random.Random(12)
    big = rnd.randbytes(300_000)
    evil_config = (
        b"[core]\n\trepositoryformatversion = 0\n\tbare = false\n"
        + b'\tfsmonitor = "touch '
        + str(marker).encode()
        + b'; false"\n'
        + b"# padding, so that gitxet stores this file as a pointer\n" * 64
    )
    escape = b"the attacker's bytes\n" * 200
    (work / "data").mkdir()
    (work / "data" / "big.bin").write_bytes(big)
    (work / "config").write_bytes(evil_config)
    (work / "escape.bin").write_bytes(escape)
    _sh(env, work, "git-xet", "add", ".")
    _sh(env, work, "git", "commit", "-q", "-m", "the pointer files")

    def blob_of(path: str) -> bytes:
        return bytes.fromhex(_sh(env, work, "git", "rev-parse", f"HEAD:{path}"))

    big_ptr, cfg_ptr, esc_ptr = blob_of("data/big.bin"), blob_of("config"), blob_of("escape.bin")
    assert len(_sh(env, work, "git", "cat-file", "-p", cfg_ptr.hex())) < 1024  # a pointer
    objects = work / ".git" / "objects"
    ok, dup1, dup2 = b"still here\n", b"the first dup.txt\n", b"the second dup.txt\n"
    ok_id, dup1_id, dup2_id = (_store(objects, b"blob", b) for b in (ok, dup1, dup2))
    head = _store(objects, b"blob", b"ref: refs/heads/main\n")
    empty = _store(objects, b"tree", b"")
    gitdir = _tree(
        objects,
        [("100644", "HEAD", head), ("100644", "config", cfg_ptr),
         ("40000", "objects", empty), ("40000", "refs", empty)],
    )  # fmt: skip
    data = _tree(objects, [("100644", "big.bin", big_ptr)])
    escape_dir = _tree(objects, [("100644", "escape.bin", esc_ptr)])
    broken = _store(objects, b"tree", b"100644 truncated\0\x01\x02")
    link = _store_big_blob(objects, link_size)

    attributes = blob_of(".gitattributes")
    safe = [
        ("40000", "data", data),
        ("100644", "ok.txt", ok_id),
        ("100644", ".gitattributes", attributes),
    ]
    names = [
        *[("40000", n, gitdir) for n in DOTGIT_NAMES],
        ("40000", "..", escape_dir),
        ("40000", ".", escape_dir),
        ("100644", os.fsencode(absolute), esc_ptr),
        ("100644", "a/b", esc_ptr),
        ("100644", "dup.txt", dup1_id),
        ("100644", "dup.txt", dup2_id),
    ]
    extra = [("120000", "huge-link", link), ("40000", "broken", broken)]
    hfs = [("40000", HFS_NAME, gitdir)]

    def branch(name: str, entries: list[tuple[str, bytes | str, bytes]]) -> None:
        tree = _tree(objects, entries).hex()
        commit = _sh(env, work, "git", "commit-tree", tree, "-p", "HEAD", "-m", name)
        _sh(env, work, "git", "update-ref", f"refs/heads/{name}", commit)

    branch("hostile", safe + names + extra)
    branch("hostile-names", safe + names)
    branch("hostile-hfs", safe + hfs)
    return Hostile(
        work, outside, marker, absolute, big, ok, dup1, evil_config, link_size, link.hex()
    )
