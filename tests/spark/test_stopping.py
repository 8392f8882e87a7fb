"""``stop_gracefully`` waits for the running micro-batch and stops the query between two.

The real thing, with Spark and a micro-batch caught running, is in test_streaming.py (slow):
a plain ``query.stop()`` there loses the batch, ``stop_gracefully`` commits it. Here a
stand-in with a StreamingQuery's ``isActive``, ``status`` and ``stop()`` runs a "batch" on a
thread, so that the waiting and the timeout are checked in milliseconds.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from aqueduct_spark.datasource import stop_gracefully


class Query:
    """A query whose trigger is active for ``batch`` seconds after it starts."""

    def __init__(self, batch: float) -> None:
        self.active = True
        self.stopped_during_batch: bool | None = None
        self.running = threading.Event()
        self.running.set()
        threading.Timer(batch, self.running.clear).start()

    @property
    def isActive(self) -> bool:
        return self.active

    @property
    def status(self) -> dict[str, Any]:
        return {"message": "Processing new data", "isTriggerActive": self.running.is_set()}

    def stop(self) -> None:
        self.stopped_during_batch = self.running.is_set()
        self.active = False


def test_it_waits_for_the_running_batch_then_stops() -> None:
    q = Query(batch=0.3)
    started = time.monotonic()
    assert stop_gracefully(q, timeout=10, poll=0.01)
    assert q.stopped_during_batch is False and not q.isActive
    assert time.monotonic() - started >= 0.3


def test_a_batch_longer_than_the_timeout_is_cancelled_as_stop_cancels_it() -> None:
    q = Query(batch=5)
    assert not stop_gracefully(q, timeout=0.1, poll=0.01)
    assert q.stopped_during_batch is True and not q.isActive


def test_a_query_that_ended_is_left_alone() -> None:
    q = Query(batch=0)
    q.active = False
    assert stop_gracefully(q, timeout=1)
    assert q.stopped_during_batch is None
