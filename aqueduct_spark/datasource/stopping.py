"""Stopping a streaming query between micro-batches.

``query.stop()`` cancels the micro-batch that is running, if one is: Spark kills its tasks,
aborts its write and logs that at ERROR from its own classes (``WriteToDataSourceV2Exec:
... is aborting``, ``Utils: Aborting task`` with a ``TaskKilledException``,
``DataWritingSparkTask: Aborting commit for partition ...``), although the stop was normal
and ``query.exception()`` is None. Nothing of that batch is committed; a restart from the
checkpoint runs it again, exactly once. Structured Streaming has no graceful stop of its own
(DStreams' ``stopGracefully`` has no successor), so :func:`stop_gracefully` waits for the
running micro-batch to end and stops the query between two.
"""

from __future__ import annotations

import time
from typing import Any


def stop_gracefully(query: Any, timeout: float = 60.0, poll: float = 0.05) -> bool:
    """Stop ``query`` (a PySpark ``StreamingQuery``, of any source and sink) once no
    micro-batch runs: the one running is finished and committed first. Returns True if it
    stopped between batches, False if a batch still ran after ``timeout`` seconds and was
    cancelled as ``query.stop()`` cancels it. A trigger that starts in the few milliseconds
    between the check and the stop is cancelled too (it then reads nothing, or is replayed)."""
    deadline = time.monotonic() + timeout
    while query.isActive:
        if not query.status["isTriggerActive"]:
            query.stop()
            return True
        if time.monotonic() >= deadline:
            query.stop()
            return False
        time.sleep(poll)
    return True
