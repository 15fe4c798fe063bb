"""The one retry helper: bounded attempts, exponential backoff with jitter, ``Retry-After``.

An attempt is a function of its 1-based number. It returns the result, raises
:class:`Retry` carrying the error to give up with (and optionally the server's
``Retry-After``) when the failure is transient, or raises anything else to stop at once::

    def attempt(n: int) -> Response:
        resp = send()
        if resp.status in (502, 503):
            raise Retry(RemoteError(f"HTTP {resp.status}"), after=retry_after(resp))
        return resp

    resp = retry_call(attempt, RetryPolicy(attempts=5))

State an attempt should keep (bytes already received, to resume from) lives in the
caller's closure. Attempts never nest: one policy bounds the total number of tries.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

__all__ = ["Retry", "RetryPolicy", "retry_call"]

T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how long to retry a transient failure."""

    attempts: int = 5
    base_delay: float = 0.5
    max_delay: float = 30.0

    def delay(self, attempt: int, retry_after: float | None = None) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1-based).

        A server's ``Retry-After`` wins (capped at ``max_delay``); otherwise
        ``base_delay * 2**(attempt-1)`` scaled by a random factor in [0.5, 1.5).
        """
        if retry_after is not None:
            return min(max(retry_after, 0.0), self.max_delay)
        d = self.base_delay * 2.0 ** (attempt - 1)
        jitter: float = random.random()
        return min(d * (0.5 + jitter), self.max_delay)


class Retry(Exception):
    """Raised by an attempt: a transient failure; ``error`` is raised if it was the last try."""

    def __init__(self, error: BaseException, *, after: float | None = None) -> None:
        super().__init__(str(error))
        self.error = error
        self.after = after


def retry_call(
    attempt: Callable[[int], T],
    policy: RetryPolicy,
    *,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """Call ``attempt(1)``, ``attempt(2)``, ... until one returns; at most ``policy.attempts``.

    Between tries it sleeps ``policy.delay(n, retry.after)``. When the last try raises
    :class:`Retry`, its ``error`` is raised (without the retry chain as context).
    """
    n = 1
    while True:
        try:
            return attempt(n)
        except Retry as r:
            if n >= policy.attempts:
                raise r.error from None
            sleep(policy.delay(n, r.after))
        n += 1
