"""gitxet.cli._progress: byte counts for people, and silence off a terminal."""

from __future__ import annotations

import pytest

from gitxet.cli._progress import byte_progress, human_size


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (0, "0 B"),
        (1023, "1023 B"),
        (1024, "1.0 KiB"),
        (1536, "1.5 KiB"),
        (5 << 20, "5.0 MiB"),
        ((3 << 30) + (1 << 29), "3.5 GiB"),
        (2 << 40, "2.0 TiB"),
        (5 << 50, "5120.0 TiB"),  # no unit past TiB: the number grows instead
    ],
)
def test_human_size(n: int, text: str) -> None:
    assert human_size(n) == text


def test_byte_progress_draws_nothing_off_a_terminal(capsys: pytest.CaptureFixture[str]) -> None:
    with byte_progress("fetching", 100) as advance:
        advance(60)
        advance(40)
    out = capsys.readouterr()
    assert out.out == "" and out.err == ""
