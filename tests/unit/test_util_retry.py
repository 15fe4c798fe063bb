"""gitxet.util.retry: bounded attempts, backoff, Retry-After, the final error."""

from __future__ import annotations

import pytest

from gitxet.util.retry import Retry, RetryPolicy, retry_call


def test_returns_the_first_success_after_transient_failures() -> None:
    sleeps: list[float] = []
    seen: list[int] = []

    def attempt(n: int) -> str:
        seen.append(n)
        if n < 3:
            raise Retry(ValueError(f"try {n}"), after=0.25 * n)
        return "ok"

    assert retry_call(attempt, RetryPolicy(attempts=5), sleep=sleeps.append) == "ok"
    assert seen == [1, 2, 3] and sleeps == [0.25, 0.5]  # Retry-After wins over backoff


def test_gives_up_with_the_last_error_after_the_budget() -> None:
    sleeps: list[float] = []

    def attempt(n: int) -> None:
        raise Retry(LookupError(f"failure {n}"))

    with pytest.raises(LookupError, match="failure 3") as ei:
        retry_call(attempt, RetryPolicy(attempts=3, base_delay=1.0), sleep=sleeps.append)
    assert len(sleeps) == 2 and ei.value.__suppress_context__
    # exponential backoff with jitter in [0.5, 1.5)
    assert 0.5 <= sleeps[0] < 1.5 and 1.0 <= sleeps[1] < 3.0


def test_other_errors_stop_at_once() -> None:
    seen: list[int] = []

    def attempt(n: int) -> None:
        seen.append(n)
        raise KeyError("permanent")

    with pytest.raises(KeyError):
        retry_call(attempt, RetryPolicy(attempts=5), sleep=lambda _: None)
    assert seen == [1]


def test_delays_are_capped() -> None:
    policy = RetryPolicy(base_delay=1.0, max_delay=4.0)
    assert all(policy.delay(n) <= 4.0 for n in range(1, 20))
    assert policy.delay(1, retry_after=3600) == 4.0 and policy.delay(1, retry_after=-5) == 0.0
