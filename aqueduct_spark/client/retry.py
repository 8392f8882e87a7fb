"""The one retry policy of the client, used by every loop that tries again: requests,
scans (which resume), and subscriptions (which reconnect for as long as they run).

A :class:`RetryPolicy` says how many attempts, the first backoff (doubled each time, capped,
times a random factor between 1 and 2 so clients that failed together do not come back
together), how long to keep honouring the service's ``retry_after``, and whether failures
other than connection failures are retried. :class:`Retrying` applies it to one operation:
``delay(exc)`` is the pause before the next attempt, or None to give up and raise ``exc``.
What can heal is decided by :func:`~aqueduct_spark.client.failures.classify` alone.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass, replace

from aqueduct_spark.client.config import ClientConfig
from aqueduct_spark.client.failures import Kind, classify, retry_after


@dataclass(frozen=True)
class RetryPolicy:
    retries: int | None = 3
    """Attempts after the first when a connection fails; None: no limit."""
    backoff: float = 0.2
    """First pause in seconds; it doubles after each failure."""
    max_backoff: float = math.inf
    """The doubling stops here (before the random factor)."""
    patience: float = 60.0
    """Seconds to keep waiting as the service's ``retry_after`` asks."""
    retry_other: bool = False
    """Retry failures that are neither permanent nor connection failures (a service answer
    such as ``DatasetNotFound``), and a service that stayed unreachable for the whole
    ``connect_timeout``: for watchers, which wait for things to change."""

    @classmethod
    def of(cls, config: ClientConfig) -> RetryPolicy:
        """Requests and scans: ``config.retries`` attempts, ``config.retry_backoff`` first,
        and the request ``timeout`` as patience."""
        return cls(config.retries, config.retry_backoff, patience=config.timeout)

    def watching(self) -> RetryPolicy:
        """For a subscription: for ever, at most ~10 s apart, whatever the service said
        (unless it cannot heal)."""
        return replace(self, retries=None, max_backoff=10.0, retry_other=True)


class Retrying:
    """The attempts of one operation under a policy."""

    def __init__(self, policy: RetryPolicy) -> None:
        self.policy = policy
        self.failures = 0
        self._refused_until: float | None = None

    def delay(self, exc: BaseException) -> float | None:
        """Seconds to pause before trying again after ``exc``; None: do not retry."""
        kind = classify(exc)
        if kind is Kind.WAIT:
            after = retry_after(exc)
            assert after is not None
            now = time.monotonic()
            if self._refused_until is None:
                self._refused_until = now + self.policy.patience
            if now + after > self._refused_until:
                return None
            return after * (1 + random.random())
        if kind is Kind.PERMANENT or (
            kind in (Kind.OTHER, Kind.UNREACHABLE) and not self.policy.retry_other
        ):
            return None
        retries = self.policy.retries
        if retries is not None and self.failures >= retries:
            return None
        return self.backoff()

    def backoff(self) -> float:
        """Count a failure and return the pause before the next attempt."""
        base = min(self.policy.backoff * 2.0 ** min(self.failures, 60), self.policy.max_backoff)
        self.failures += 1
        return base * (1 + random.random())

    def reset(self) -> None:
        """The operation made progress: the next failure starts from the first backoff."""
        self.failures = 0
        self._refused_until = None
