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


def test_byte_progress_logs_a_line_every_few_seconds_off_a_terminal(
    capsys: pytest.CaptureFixture[str],
) -> None:
    import time

    seen = ""
    with byte_progress("fetching", 1000, every=0.05) as bar:
        bar(250)
        bar.expect(2000)  # a lower layer learned the real total
        deadline = time.monotonic() + 10
        while "git-xet: fetching: 250 B of 2.0 KiB (12%)" not in seen:
            assert time.monotonic() < deadline, seen
            time.sleep(0.01)  # polling the captured output for the logger's line
            seen += capsys.readouterr().err
        bar(5000)  # more than the total: the total grows, never passes
        assert bar.total == bar.done == 5250
    assert capsys.readouterr().out == ""


def test_byte_progress_line_has_the_total() -> None:
    from gitxet.cli._progress import Bar

    bar = Bar(4 << 20)
    bar(1 << 20)
    assert bar.line("uploading") == "git-xet: uploading: 1.0 MiB of 4.0 MiB (25%)"
    assert Bar(None).line("x") == "git-xet: x: 0 B"
