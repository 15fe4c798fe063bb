"""keep_freed_memory: freed multi-MiB buffers are reused, not refaulted from the kernel."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

# A reader's pattern: two 8 MiB buffers alive, then both freed (16 MiB free at the top of
# the heap: glibc's default trim threshold after its dynamic raise), over and over; prints
# the minor page faults of the loop after a warm-up round.
_PROBE = textwrap.dedent(
    """
    import resource, sys
    from gitxet.util.memory import keep_freed_memory
    if sys.argv[1] == "keep":
        assert keep_freed_memory()
    def once():
        a = b"a" * (8 << 20)
        b = b"b" * (8 << 20)
        del a, b
    once()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(16):
        once()
    print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    """
)


def _faults(mode: str) -> int:
    # glibc's own defaults: no malloc tunables inherited from the caller's environment
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "GLIBC_TUNABLES"))}
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, mode],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        env=env,
    )
    return int(out.stdout.split()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc only")
def test_freed_buffers_are_reused() -> None:
    pages = 16 * 2 * (8 << 20) // 4096  # every buffer on fresh pages
    assert _faults("keep") < pages // 8
    # the probe can fail: glibc's defaults give the buffers back and fault them in again
    assert _faults("default") > pages // 2


def test_idempotent() -> None:
    from gitxet.util.memory import keep_freed_memory

    first = keep_freed_memory()
    assert keep_freed_memory() is first


@pytest.mark.parametrize("size", [0, 1, 2, 4096, 3 << 20])
def test_filled_bytes(size: int) -> None:
    from gitxet.util.memory import filled_bytes

    want = bytes(i % 251 for i in range(size))

    def fill(view: memoryview) -> bool:
        assert len(view) == size and not view.readonly
        view[:] = want
        return True

    got = filled_bytes(size, fill)
    assert type(got) is bytes and got == want
    assert hash(got) == hash(want)  # a real bytes object, hashed from its final content
    # an object whose fill did not complete is never returned
    assert filled_bytes(size, lambda view: False) is None
