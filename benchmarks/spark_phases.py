"""Where a small Spark query's fixed cost goes (issue 28 item 5): the aqueduct and Flight data
sources as subclasses that time each hook Spark calls (``schema``, ``partitions``, the writer's
set-up, ``read``, ``write``, ``commit``) and, for aqueduct, each connection the client opens,
in whichever Python process Spark runs them. Each timing is a line appended to the file named
by ``AQUEDUCT_PHASES`` (``pid phase seconds``); :func:`summary` sums them per phase.

``bench_realpath_spark --phases`` runs its paths through these (formats ``aqphases`` and
``flphases``) and prints the summary after the run.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from pyspark.sql.datasource import DataSourceArrowWriter
from pyspark.sql.types import StructType

from aqueduct_spark.datasource.source import AqueductDataSource
from benchmarks.spark_sources import FlightBench

T = TypeVar("T")
STARTED = time.perf_counter()


def note(phase: str, seconds: float) -> None:
    target = os.environ.get("AQUEDUCT_PHASES")
    if target:
        with open(target, "a") as f:
            f.write(f"{os.getpid()} {phase} {seconds:.6f}\n")


def timed(phase: str, fn: Callable[..., T]) -> Callable[..., T]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kw: Any) -> T:
        start = time.perf_counter()
        try:
            return fn(*args, **kw)
        finally:
            note(phase, time.perf_counter() - start)

    return wrapper


def timed_iter(phase: str, items: Iterator[T]) -> Iterator[T]:
    """Times ``items`` to its end, and its first item on its own (``phase.first``)."""
    start = time.perf_counter()
    first = True
    for item in items:
        if first:
            note(phase + ".first", time.perf_counter() - start)
            first = False
        yield item
    note(phase, time.perf_counter() - start)


def _patch_connections() -> None:
    """Time every connection the dataset client opens (handshakes, both transports)."""
    from aqueduct_spark.client import session

    if getattr(session.open_connection, "_phases", False):
        return
    opening = session.open_connection

    async def open_connection(*args: Any, **kw: Any) -> Any:
        start = time.perf_counter()
        conn = await opening(*args, **kw)
        note(f"aq.connect.{conn.transport}", time.perf_counter() - start)
        return conn

    open_connection._phases = True  # type: ignore[attr-defined]
    session.open_connection = open_connection  # type: ignore[assignment]


class _Reader:
    def __init__(self, inner: Any, prefix: str) -> None:
        self.inner, self.prefix = inner, prefix

    def partitions(self) -> Any:
        return timed(self.prefix + ".partitions", self.inner.partitions)()

    def read(self, partition: Any) -> Iterator[Any]:
        return timed_iter(self.prefix + ".read", iter(self.inner.read(partition)))


class AqPhases(AqueductDataSource):
    @classmethod
    def name(cls) -> str:
        return "aqphases"

    def schema(self) -> StructType:
        _patch_connections()
        return timed("aq.schema", super().schema)()

    def reader(self, schema: StructType) -> Any:
        from pyspark.sql.datasource import DataSourceReader

        _patch_connections()
        inner = super().reader(schema)

        class Reader(_Reader, DataSourceReader):
            pass

        return Reader(inner, "aq")

    def writer(self, schema: StructType, overwrite: bool) -> Any:
        _patch_connections()
        w = timed("aq.writer", super().writer)(schema, overwrite)
        return _PhasedWriter(w, "aq")


class FlPhases(FlightBench):
    @classmethod
    def name(cls) -> str:
        return "flphases"

    def schema(self) -> StructType:
        return timed("fl.schema", super().schema)()

    def reader(self, schema: StructType) -> Any:
        from pyspark.sql.datasource import DataSourceReader

        inner = super().reader(schema)

        class Reader(_Reader, DataSourceReader):
            pass

        return Reader(inner, "fl")

    def writer(self, schema: StructType, overwrite: bool) -> Any:
        w = timed("fl.writer", super().writer)(schema, overwrite)
        return _PhasedWriter(w, "fl")


class _PhasedWriter(DataSourceArrowWriter):
    def __init__(self, inner: Any, prefix: str) -> None:
        self.inner, self.prefix = inner, prefix

    def write(self, iterator: Iterator[Any]) -> Any:
        if self.prefix == "aq":
            _patch_connections()
        return timed(self.prefix + ".write", self.inner.write)(iterator)

    def commit(self, messages: Any) -> None:
        if self.prefix == "aq":
            _patch_connections()
        timed(self.prefix + ".commit", self.inner.commit)(messages)

    def abort(self, messages: Any) -> None:
        self.inner.abort(messages)


def summary(path: Path) -> dict[str, tuple[int, float]]:
    """Per phase: how many timings and their total seconds."""
    out: dict[str, tuple[int, float]] = {}
    if not path.exists():
        return out
    for line in path.read_text().splitlines():
        _, phase, seconds = line.split()
        n, total = out.get(phase, (0, 0.0))
        out[phase] = (n + 1, total + float(seconds))
    return out
