"""Where a small Spark query's fixed cost goes (issue 28 item 5): the aqueduct and Flight data
sources as subclasses that time each hook Spark calls (``schema``, ``partitions``, the writer's
set-up, ``read``, ``write``, ``commit``) and, for aqueduct, each connection the client opens,
in whichever Python process Spark runs them. Each timing is a line appended to the file named
by ``AQUEDUCT_PHASES`` (``pid phase seconds``); :func:`summary` sums them per phase.

``bench_realpath_spark --phases`` runs its paths through these (formats ``aqphases`` and
``flphases``) and prints the summary after the run.

With ``AQUEDUCT_TIMELINE`` naming a file, the aqueduct source also appends one JSON line per
event, in wall-clock time (``time.time()``, comparable across processes): ``schema`` and
``plan`` on the driver's planner processes, one ``task`` per read task (its partition, its
process's age when it began, when its first batch came, when it ended, its bytes, and the
endpoint each of its scans leased), one ``connect`` per connection; for a write (both
sources), ``writer`` (the driver's set-up), one ``write`` per task (when its first and last
batch came from Spark) and ``commit``; ``bench_realpath_spark --phases`` adds one ``query``
per timed query. A write task's seconds after Spark's last batch (finishing the upload, the
server staging it and answering) are also timed on their own (``write.tail``), and before
its first (``write.first``). :func:`timeline` turns
the events of one read into its shape: when planning ran, each task's interval and host,
each host's busy time and idle gaps, and the tail after the last byte
(``bench_scale --timeline``).
"""

from __future__ import annotations

import functools
import itertools
import json
import os
import threading
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


def _started() -> float:
    """This process's start, wall-clock (``/proc``): a task in a process seconds old ran in
    a Python worker Spark had just started."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        boot = next(
            float(line.split()[1])
            for line in Path("/proc/stat").read_text().splitlines()
            if line.startswith("btime ")
        )
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, StopIteration, ValueError, IndexError):
        return time.time()


PROCESS_START = _started()
_leases: list[tuple[float, int, int | None]] = []
"""Leases taken in this process (time, endpoint, bytes): the hosts a task's scans went to."""
_leases_lock = threading.Lock()


def event(kind: str, **fields: Any) -> None:
    """One timeline event (see the module's docstring), if ``AQUEDUCT_TIMELINE`` is set."""
    target = os.environ.get("AQUEDUCT_TIMELINE")
    if target:
        line = {"kind": kind, "pid": os.getpid(), "age": time.time() - PROCESS_START, **fields}
        with open(target, "a") as f:
            f.write(json.dumps(line) + "\n")


def _patch_leases() -> None:
    """Record which endpoint each scan of this process leases (``Spread.lease``)."""
    from aqueduct_spark.client import spread

    if getattr(spread.Spread.lease, "_timeline", False):
        return
    leasing = spread.Spread.lease

    def lease(self: Any, index: int, size: int | None = None) -> Any:
        with _leases_lock:
            _leases.append((time.time(), index, size))
        return leasing(self, index, size)

    lease._timeline = True  # type: ignore[attr-defined]
    spread.Spread.lease = lease  # type: ignore[method-assign]


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
        start, at = time.perf_counter(), time.time()
        conn = await opening(*args, **kw)
        note(f"aq.connect.{conn.transport}", time.perf_counter() - start)
        event("connect", start=at, end=time.time(), transport=conn.transport)
        return conn

    open_connection._phases = True  # type: ignore[attr-defined]
    session.open_connection = open_connection  # type: ignore[assignment]


class _Reader:
    def __init__(self, inner: Any, prefix: str) -> None:
        self.inner, self.prefix = inner, prefix

    def partitions(self) -> Any:
        start = time.time()
        parts = timed(self.prefix + ".partitions", self.inner.partitions)()
        homes = [getattr(p, "endpoint", None) for p in parts]
        sizes = [sum(s.get("bytes") or 0 for s in getattr(p, "splits", ())) for p in parts]
        event("plan", start=start, end=time.time(), homes=homes, sizes=sizes)
        return parts

    def read(self, partition: Any) -> Iterator[Any]:
        if self.prefix == "aq":
            _patch_connections()
            _patch_leases()
            return _timeline_task(timed_iter("aq.read", iter(self.inner.read(partition))))
        return timed_iter(self.prefix + ".read", iter(self.inner.read(partition)))


def _timeline_task(batches: Iterator[Any]) -> Iterator[Any]:
    """``batches`` of one read task, its ``task`` event written at its end."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    start = time.time()
    age = start - PROCESS_START
    first: float | None = None
    rows = size = 0
    with _leases_lock:
        seen = len(_leases)
    for batch in batches:
        if first is None:
            first = time.time()
        rows += batch.num_rows
        size += batch.nbytes
        yield batch
    with _leases_lock:
        hosts = [index for _, index, _ in _leases[seen:]]
    event(
        "task",
        partition=ctx.partitionId() if ctx else None,
        attempt=ctx.attemptNumber() if ctx else None,
        start=start,
        started_age=age,
        first=first,
        end=time.time(),
        rows=rows,
        bytes=size,
        endpoints=hosts,
    )


class AqPhases(AqueductDataSource):
    @classmethod
    def name(cls) -> str:
        return "aqphases"

    def schema(self) -> StructType:
        _patch_connections()
        start = time.time()
        try:
            return timed("aq.schema", super().schema)()
        finally:
            event("schema", start=start, end=time.time())

    def reader(self, schema: StructType) -> Any:
        from pyspark.sql.datasource import DataSourceReader

        _patch_connections()
        inner = super().reader(schema)

        class Reader(_Reader, DataSourceReader):
            pass

        return Reader(inner, "aq")

    def writer(self, schema: StructType, overwrite: bool) -> Any:
        _patch_connections()
        start = time.time()
        w = timed("aq.writer", super().writer)(schema, overwrite)
        event("writer", source="aq", start=start, end=time.time())
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
        start = time.time()
        w = timed("fl.writer", super().writer)(schema, overwrite)
        event("writer", source="fl", start=start, end=time.time())
        return _PhasedWriter(w, "fl")


class _PhasedWriter(DataSourceArrowWriter):
    def __init__(self, inner: Any, prefix: str) -> None:
        self.inner, self.prefix = inner, prefix

    def write(self, iterator: Iterator[Any]) -> Any:
        if self.prefix == "aq":
            _patch_connections()
        start = time.time()
        marks: dict[str, float] = {}

        def batches() -> Iterator[Any]:
            for batch in iterator:
                marks.setdefault("first", time.time())
                yield batch
            marks["last"] = time.time()

        try:
            return timed(self.prefix + ".write", self.inner.write)(batches())
        finally:
            end = time.time()
            # the task's own work after Spark's last batch: finishing the upload, the
            # service staging it and answering
            if "last" in marks:
                note(self.prefix + ".write.tail", end - marks["last"])
            if "first" in marks:
                note(self.prefix + ".write.first", marks["first"] - start)
            event("write", source=self.prefix, start=start, end=end, **marks)

    def commit(self, messages: Any) -> None:
        if self.prefix == "aq":
            _patch_connections()
        start = time.time()
        try:
            timed(self.prefix + ".commit", self.inner.commit)(messages)
        finally:
            event("commit", source=self.prefix, start=start, end=time.time())

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


def read_events(path: Path) -> list[dict[str, Any]]:
    """The timeline events in ``path`` (none if it does not exist)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _union(intervals: list[tuple[float, float]]) -> float:
    """Seconds covered by ``intervals`` (overlaps counted once)."""
    total, reach = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= reach:
            continue
        total += b - max(a, reach)
        reach = b
    return total


def timeline(
    events: list[dict[str, Any]],
    start: float,
    end: float,
    names: list[str],
    link_rate: float | None = None,
) -> dict[str, Any]:
    """The shape of one read from its events (times in seconds from ``start``, the read's
    call, to ``end``, its return): planning, each task (host: ``names[endpoint]`` of its last
    lease; the only one with one name), and per host the span from its first task's first
    batch to its last task's end, the seconds it had a task under way (``busy``), and so how
    long it sat idle before the read ended (``idle``: the whole read minus ``busy``).

    ``link`` events (``host``, ``at``, ``tx``: the bytes its cable sent so far, sampled
    while the read ran) give each host's cable: ``link_full`` the seconds its bytes take at
    ``link_rate`` (bytes/s), ``link_from`` and ``link_to`` the first and last sample at half
    that rate or more, and ``link`` its use per column of :func:`render`."""

    def rel(t: float | None) -> float | None:
        return None if t is None else round(t - start, 3)

    out: dict[str, Any] = {"seconds": round(end - start, 3)}
    for kind in ("schema", "plan"):
        found = [e for e in events if e["kind"] == kind]
        if found:
            e = found[-1]
            out[kind] = {
                "start": rel(e["start"]),
                "end": rel(e["end"]),
                "process_age": round(e["age"] - (e["end"] - e["start"]), 2),
            }
            if kind == "plan":
                out[kind]["sizes_mb"] = [round(s / 1e6, 1) for s in e["sizes"]]
                out[kind]["homes"] = e["homes"]
    tasks = []
    for e in sorted((e for e in events if e["kind"] == "task"), key=lambda e: e["start"]):
        host = e["endpoints"][-1] if e["endpoints"] else (0 if len(names) == 1 else None)
        tasks.append(
            {
                "partition": e["partition"],
                "pid": e["pid"],
                "host": names[host] if host is not None and host < len(names) else "?",
                "moved": len(e["endpoints"]) > 1,
                "process_age": round(e["started_age"], 2),
                "start": rel(e["start"]),
                "first": rel(e["first"]),
                "end": rel(e["end"]),
                "mb": round(e["bytes"] / 1e6, 1),
            }
        )
    out["tasks"] = tasks
    out["connects"] = len([e for e in events if e["kind"] == "connect"])
    hosts: dict[str, Any] = {}
    for name in sorted({t["host"] for t in tasks}):
        mine = [t for t in tasks if t["host"] == name]
        spans = [(t["first"] or t["start"], t["end"]) for t in mine]
        busy = _union(spans)
        hosts[name] = {
            "tasks": len(mine),
            "mb": round(sum(t["mb"] for t in mine), 1),
            "first_byte": min(a for a, _ in spans),
            "last_end": max(b for _, b in spans),
            "busy": round(busy, 3),
            "idle": round(out["seconds"] - busy, 3),
        }
    out["hosts"] = hosts
    if link_rate:
        _links(out, events, start, link_rate)
    if tasks:
        out["first_task"] = min(t["start"] for t in tasks)
        out["last_end"] = max(t["end"] for t in tasks)
        out["tail"] = round(out["seconds"] - out["last_end"], 3)
        ends = [h["last_end"] for h in hosts.values() if "last_end" in h]
        out["hosts_end_spread"] = round(max(ends) - min(ends), 3)
    return out


def _links(out: dict[str, Any], events: list[dict[str, Any]], start: float, rate: float) -> None:
    """Each host's cable during the read (see :func:`timeline`), into ``out["hosts"]``."""
    for way, key in (("tx", "link"), ("rx", "link_in")):
        samples: dict[str, list[tuple[float, int]]] = {}
        for e in events:
            if e["kind"] == "link" and way in e:
                samples.setdefault(e["host"], []).append((e["at"] - start, e[way]))
        _strips(out, samples, rate, key)


def _strips(
    out: dict[str, Any], samples: dict[str, list[tuple[float, int]]], rate: float, key: str
) -> None:
    """One direction of each host's cable (``key``: ``link`` what it sent, ``link_in``
    what it received: the files it read from the store, for a read)."""
    width = RENDER_WIDTH
    total = out["seconds"] or 1.0
    for name, seen in samples.items():
        seen.sort()
        sent = [0.0] * width
        busy: list[float] = []
        for (a, x), (b, y) in itertools.pairwise(seen):
            if b <= a:
                continue
            if (y - x) / (b - a) >= rate / 2:
                busy.append(a)
            step = total / width  # the interval's bytes over the columns it covers
            for column in range(max(0, int(a / step)), min(width, int(b / step) + 1)):
                lo, hi = max(a, column * step), min(b, (column + 1) * step)
                if hi > lo:
                    sent[column] += (y - x) * (hi - lo) / (b - a)
        host = out["hosts"].setdefault(name, {})
        full = rate * total / width
        if key == "link_in":
            host[key] = "".join(
                " " if b < full * 0.1 else "-" if b < full * 0.5 else "=" if b < full * 0.9 else "#"
                for b in sent
            )
            continue
        host["link_full"] = round((seen[-1][1] - seen[0][1]) / rate, 2) if seen else 0.0
        host["link_from"] = round(busy[0], 2) if busy else None
        host["link_to"] = round(busy[-1], 2) if busy else None
        host["link"] = "".join(
            " " if b < full * 0.1 else "-" if b < full * 0.5 else "=" if b < full * 0.9 else "#"
            for b in sent
        )


RENDER_WIDTH = 64


def render(shape: dict[str, Any], width: int = RENDER_WIDTH) -> list[str]:
    """:func:`timeline`'s shape as text: a line per task (``.`` from its start to its first
    batch, ``=`` from there to its end) on a scale of the whole read, then per host."""
    total = shape["seconds"] or 1.0

    def col(t: float) -> int:
        return max(0, min(width - 1, round(t / total * (width - 1))))

    lines = [f"read {total:.2f} s; one column = {total / width:.2f} s"]
    for kind in ("schema", "plan"):
        if kind in shape:
            p = shape[kind]
            lines.append(
                f"  {kind:6} {p['start']:6.2f} -> {p['end']:6.2f} s (its process "
                f"{p['process_age']:.1f} s old)"
            )
    if "plan" in shape:
        lines.append(f"  plan: task MB {shape['plan']['sizes_mb']} homes {shape['plan']['homes']}")
    for t in shape["tasks"]:
        bar = [" "] * width
        first = t["first"] if t["first"] is not None else t["end"]
        for c in range(col(t["start"]), col(first) + 1):
            bar[c] = "."
        for c in range(col(first), col(t["end"]) + 1):
            bar[c] = "="
        moved = "*" if t["moved"] else " "
        lines.append(
            f"  p{t['partition']:>2} {t['host']:>5}{moved}|{''.join(bar)}| "
            f"{t['start']:5.2f} {t['first'] or 0:5.2f} {t['end']:5.2f} s {t['mb']:5.1f} MB "
            f"worker {t['pid']} {t['process_age']:.1f} s old"
        )
    for name, h in shape["hosts"].items():
        if "link" in h:
            lines.append(
                f"  {name:>5} link|{h['link']}| its bytes {h['link_full']:.2f} s at the "
                f"link's rate; at half or more from {h['link_from']} to {h['link_to']} s"
            )
        if "link_in" in h:
            lines.append(f"  {name:>5}   in|{h['link_in']}| what it received")
    for name, h in shape["hosts"].items():
        if "tasks" in h:
            lines.append(
                f"  {name}: {h['tasks']} tasks {h['mb']:.0f} MB, first batch "
                f"{h['first_byte']:.2f} s, last end {h['last_end']:.2f} s, busy "
                f"{h['busy']:.2f} s, idle {h['idle']:.2f} s"
            )
    if "tail" in shape:
        lines.append(
            f"  first task {shape['first_task']:.2f} s, last end {shape['last_end']:.2f} s, "
            f"tail {shape['tail']:.2f} s, hosts' ends spread {shape['hosts_end_spread']:.2f} s, "
            f"{shape['connects']} connections opened"
        )
    return lines


WRITE_STEPS = (
    "query",
    "to_writer",
    "writer",
    "to_tasks",
    "tasks",
    "task_first",
    "task_tail",
    "to_commit",
    "commit",
    "after_commit",
)
"""The parts of one write query (:func:`write_path`), in seconds: the query; Spark's planning
until the writer's set-up starts (``to_writer``) and that set-up (``writer``: aqueduct's
begin); until the first task's ``write`` (``to_tasks``); from there to the last task's end
(``tasks``), with each task's wait for Spark's first batch (``task_first``) and its seconds
after Spark's last (``task_tail``), averaged; the gap to the driver's commit (``to_commit``),
the commit, and the rest of the query (``after_commit``). The ``to_*`` and ``after`` parts
are Spark's own, the same for any Python data source."""


def write_path(
    events: list[dict[str, Any]], source: str, query: dict[str, Any]
) -> dict[str, float]:
    """:data:`WRITE_STEPS` of one write ``query`` (its ``query`` event) through ``source``
    (``aq`` or ``fl``), from the timeline's events; empty if some hook left no event."""
    start, end = query["start"], query["end"]
    mine = [
        e
        for e in events
        if e.get("source") == source and start - 0.001 <= e["start"] <= end + 0.001
    ]
    setup = [e for e in mine if e["kind"] == "writer"]
    tasks = sorted((e for e in mine if e["kind"] == "write"), key=lambda e: e["start"])
    commits = [e for e in mine if e["kind"] == "commit"]
    if not (setup and tasks and commits):
        return {}
    last = max(e["end"] for e in tasks)
    fed = [e for e in tasks if "first" in e and "last" in e]
    return {
        "query": end - start,
        "to_writer": setup[0]["start"] - start,
        "writer": setup[0]["end"] - setup[0]["start"],
        "to_tasks": tasks[0]["start"] - setup[0]["end"],
        "tasks": last - tasks[0]["start"],
        "task_first": sum(e["first"] - e["start"] for e in fed) / max(1, len(fed)),
        "task_tail": sum(e["end"] - e["last"] for e in fed) / max(1, len(fed)),
        "to_commit": commits[0]["start"] - last,
        "commit": commits[0]["end"] - commits[0]["start"],
        "after_commit": end - commits[0]["end"],
    }
