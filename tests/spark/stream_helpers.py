"""Helpers shared by the streaming tests, the driver script the fault tests run in a
subprocess, and the latency benchmark."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pyarrow as pa

SCHEMA = pa.schema([("id", pa.int64()), ("s", pa.string())])


def rows(start: int, n: int) -> pa.Table:
    """Rows with ids start .. start+n-1 (ids are the unique key the tests check)."""
    ids = list(range(start, start + n))
    return pa.table({"id": ids, "s": [f"row-{i}" for i in ids]}, schema=SCHEMA)


def ids_of(client: Any, dataset: str) -> list[int]:
    """The sorted ids in a dataset ([] while it does not exist)."""
    from aqueduct_spark import protocol as P

    try:
        table = client.read(dataset, columns=["id"])
    except P.DatasetNotFound:
        return []
    return sorted(table.column("id").to_pylist())


def wait_rows(client: Any, dataset: str, n: int, query: Any = None, timeout: float = 60) -> None:
    """Wait until ``dataset`` holds at least ``n`` rows; fail at once if ``query`` died."""

    def enough() -> bool:
        if query is not None and not query.isActive and query.exception() is not None:
            raise AssertionError(f"the query failed: {query.exception()}")
        return len(ids_of(client, dataset)) >= n

    wait_until(enough, timeout, f"{n} rows in {dataset}", step=0.2)


def wait_until(
    condition: Callable[[], Any], timeout: float, what: str = "condition", step: float = 0.1
) -> Any:
    """Poll ``condition`` until it returns something truthy; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(step)


class Appender:
    """Appends 20-row versions to a dataset in the background, with fresh ids, until
    stopped. Failed appends (the service was down) are retried with new ids; what the
    source holds at the end is read back, not assumed."""

    def __init__(self, client: Any, dataset: str, start: int, pause: float = 0.25) -> None:
        self.client, self.dataset, self.next, self.pause = client, dataset, start, pause
        self.done = threading.Event()
        self.appended = 0
        self.errors: list[BaseException] = []
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.done.wait(self.pause):
            try:
                self.client.append(self.dataset, rows(self.next, 20))
                self.appended += 1
            except Exception as exc:  # the service is down: try again later
                self.errors.append(exc)
            self.next += 20

    def stop(self) -> None:
        self.done.set()
        self.thread.join(120)
