"""A xorb moving between a client and a real server (uvicorn in a subprocess) is held once
by the client, not twice: a push or fetch runs four of them at once, and each was up to
64 MiB held two or three times (a `git push` of 100,000 small files over HTTP peaked at
532 MB, a push of its clone to a path remote at 595 MB).

Measured with ``tracemalloc`` in this process only (the server is another process); the
xorb's own bytes are allocated before the measure starts."""

from __future__ import annotations

import random
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from gitxet.remote.client import CASClient
from gitxet.server.auth import TokenStore
from gitxet.store.cas import LocalCAS
from tests.helpers.server_env import Upload, build_upload, server_process

pytestmark = pytest.mark.timeout(300)

SIZE = 24 << 20  # incompressible: the body is as large as the data
EXTRA = 4 << 20  # what a transfer may allocate besides the xorb (pieces, chunks, headers)

_T = TypeVar("_T")


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, Upload]]:
    """A server process, a write token and a 24 MiB xorb's upload (not yet sent)."""
    root = tmp_path_factory.mktemp("srv")
    write, _ = TokenStore(str(root)).create("write")
    up = build_upload(random.Random(3).randbytes(SIZE))
    with server_process(str(root), None, str(root / "server.log")) as url:
        yield url, write, up


def _peak_extra(fn: Callable[[], _T]) -> tuple[_T, int]:
    """``fn()`` and the most bytes it had allocated at once beyond what it returns."""
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        out = fn()
        now, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return out, peak - max(before, now)


def test_an_upload_sends_the_xorb_without_copying_it(served: tuple[str, str, Upload]) -> None:
    url, token, up = served
    body = up.xorb.body
    with CASClient(url, token) as client:
        client.has_xorb(up.xorb.hash)  # (the connection and its imports, before the measure)
        inserted, extra = _peak_extra(lambda: client.upload_xorb(up.xorb.hash, body))
        assert inserted
        assert extra < EXTRA, f"{extra >> 20} MiB allocated to send a {len(body) >> 20} MiB xorb"
        client.upload_shard(up.shard)


def test_a_download_into_a_store_holds_the_xorb_once(
    served: tuple[str, str, Upload], tmp_path: Path
) -> None:
    url, token, up = served
    with CASClient(url, token) as client:
        client.upload_xorb(up.xorb.hash, up.xorb.body)  # (stored already: a no-op then)
        local = LocalCAS(str(tmp_path / "store"), durable=False)
        client.has_xorb(up.xorb.hash)

        def fetch() -> bool:
            body = client.download_xorb(up.xorb.hash)  # verified, in an untraced mapping
            return local.put_xorb(up.xorb.hash, body)  # verified again, written

        stored, extra = _peak_extra(fetch)
        assert stored
        assert extra < EXTRA, f"{extra >> 20} MiB allocated to fetch a {SIZE >> 20} MiB xorb"
    assert local.xorb_body(up.xorb.hash) == up.xorb.body
