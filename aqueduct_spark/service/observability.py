"""What the service tells its operator: structured logs, one access line per request, and
Prometheus metrics (served with a health check by :mod:`.health`).

Logs go through the standard library's :mod:`logging`, with one of two formatters
(:func:`configure_logging`): ``text``, the usual ``time LEVEL logger: message`` followed by
``key=value`` fields, or ``json``, one object per line. Fields travel in a record's
``fields`` attribute (``log.info("request", extra={"fields": {...}})``), so every library
that logs through :mod:`logging` shows up in the same stream and format.

The access line is logged by :meth:`Observer.observe`, which wraps each request's task: the
request's counts live in a context variable of that task, so the code serving a request adds
to them with :func:`note` without passing anything around. Connection tokens are never
looked at here, so they cannot reach a log line.
"""

from __future__ import annotations

import contextvars
import json
import logging
import re
import sys
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    disable_created_metrics,
)
from prometheus_client.core import CounterMetricFamily, Metric

from aqueduct_core.api import Connection
from aqueduct_spark import protocol as P

ACCESS = logging.getLogger("aqueduct.access")
log = logging.getLogger("aqueduct.service")

LOG_FORMATS = ("text", "json")
LOG_LEVELS = ("debug", "info", "warning", "error")
LOUD_OUTCOMES = frozenset({"internal", "unauthenticated", "permission_denied"})
"""Outcomes whose access line is a warning: the service failed, or refused a client."""

# -- log formatting -----------------------------------------------------------------------


def _timestamp(record: logging.LogRecord) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + (
        f".{int(record.msecs):03d}Z"
    )


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    fields = getattr(record, "fields", None)
    tags = getattr(record, "tags", None)
    fields = fields if isinstance(fields, dict) else {}
    return {**tags, **fields} if isinstance(tags, dict) else fields


class _Tags(logging.Filter):
    """Fields every record of this process carries (``worker`` with ``--workers``)."""

    def __init__(self, tags: dict[str, Any]) -> None:
        super().__init__()
        self.tags = tags

    def filter(self, record: logging.LogRecord) -> bool:
        record.tags = self.tags
        return True


_BARE = re.compile(r'[^\s"=\\]+')
"""A value written without quotes: no space, quote, equals sign or backslash."""


def _logfmt(value: Any) -> str:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    if _BARE.fullmatch(text) and text.isprintable():
        return text
    return json.dumps(text)


class TextFormatter(logging.Formatter):
    """``2026-11-25T19:40:00.123Z INFO aqueduct.access: request peer=... op=write ...``"""

    def format(self, record: logging.LogRecord) -> str:
        line = f"{_timestamp(record)} {record.levelname} {record.name}: {record.getMessage()}"
        extra = " ".join(f"{k}={_logfmt(v)}" for k, v in _fields(record).items())
        if extra:
            line += " " + extra
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``ts``, ``level``, ``logger``, ``msg``, then the fields."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": _timestamp(record),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in _fields(record).items():
            out.setdefault(key, value)
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def configure_logging(level: str = "info", fmt: str = "text", worker: int | None = None) -> None:
    """Send every log record to stderr at ``level`` and above, formatted as ``fmt``
    (``text`` or ``json``); replaces whatever logging was set up before. ``worker``: this
    process's number among ``--workers``, a field of every record."""
    if fmt not in LOG_FORMATS:
        raise ValueError(f"log format must be one of {', '.join(LOG_FORMATS)}, not {fmt!r}")
    if level.lower() not in LOG_LEVELS:
        raise ValueError(f"log level must be one of {', '.join(LOG_LEVELS)}, not {level!r}")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    if worker is not None:
        handler.addFilter(_Tags({"worker": worker}))
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
    logging.getLogger("quic").setLevel(max(logging.WARNING, logging.getLogger().level))


def peer_text(peer: tuple[Any, ...] | None) -> str:
    """``127.0.0.1:50123``, ``[::1]:50123``, or ``-`` when the transport gave no address."""
    if not peer:
        return "-"
    host, port = str(peer[0]), peer[1] if len(peer) > 1 else None
    if ":" in host:
        host = f"[{host}]"
    return host if port is None else f"{host}:{port}"


# -- the metrics --------------------------------------------------------------------------

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class Metrics:
    """The service's Prometheus metrics, in a registry of their own (so that several
    services in one process, as in tests, keep separate counts)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        # The "_created" timestamp series double every counter's lines and tell nothing a
        # process_start_time_seconds does not (the switch is per process: a service's own).
        disable_created_metrics()  # type: ignore[no-untyped-call]
        self.registry = reg = registry or CollectorRegistry()
        ProcessCollector(registry=reg)  # CPU, memory, open files of this process
        self.connections_open = Gauge(
            "aqueduct_connections_open", "Client connections open now.", registry=reg
        )
        self.connections = Counter(
            "aqueduct_connections",
            "Client connections accepted, by transport (quic or tcp).",
            ["transport"],
            registry=reg,
        )
        self.requests = Counter(
            "aqueduct_requests",
            "Requests answered, by operation and outcome (ok, or the error's status code).",
            ["operation", "outcome"],
            registry=reg,
        )
        self.requests_in_flight = Gauge(
            "aqueduct_requests_in_flight", "Requests being served now.", registry=reg
        )
        self.request_seconds = Histogram(
            "aqueduct_request_duration_seconds",
            "Time from a request's arrival to its answer (a scan or write: to its end).",
            ["operation"],
            buckets=LATENCY_BUCKETS,
            registry=reg,
        )
        self.rows = Counter(
            "aqueduct_rows",
            "Rows received in writes (direction=in) and sent in scans (direction=out).",
            ["direction"],
            registry=reg,
        )
        self.bytes = Counter(
            "aqueduct_bytes",
            "Arrow IPC payload bytes received in writes (in) and sent in scans (out).",
            ["direction"],
            registry=reg,
        )
        self.arrow_bytes = Counter(
            "aqueduct_arrow_bytes",
            "Arrow data bytes (uncompressed) received in writes (in) and sent in scans (out); "
            "against aqueduct_bytes, what compression saved.",
            ["direction"],
            registry=reg,
        )
        self.messages = Counter(
            "aqueduct_data_messages",
            "Data messages (Arrow batches) received in writes (in) and sent in scans (out), "
            "by body compression (none, lz4, zstd): what `auto` chose.",
            ["direction", "compression"],
            registry=reg,
        )
        self.commits = Counter(
            "aqueduct_commits",
            "Requests answered with a new version (commit, compact, restore, delete).",
            registry=reg,
        )
        self.commit_seconds = Histogram(
            "aqueduct_commit_duration_seconds",
            "Time to answer a successful commit request (Delta log write included).",
            buckets=LATENCY_BUCKETS,
            registry=reg,
        )
        for direction in ("in", "out"):  # present (as 0) before the first write or scan
            self.rows.labels(direction)
            self.bytes.labels(direction)
            self.arrow_bytes.labels(direction)


# -- requests -----------------------------------------------------------------------------


@dataclass(eq=False)  # kept in sets by identity (an open connection's running requests)
class RequestRecord:
    """What one request did so far; logged as its access line when it ends."""

    observer: Observer
    peer: str
    op: str
    dataset: str | None
    user: str | None = None
    """The name of the connection's token grant (``[[tokens]]`` ``name``), never the token."""
    started: float = field(default_factory=time.monotonic)
    rows: int = 0
    bytes: int = 0
    staged: int | None = None
    """Bytes a write left staged on the store (its files' sizes)."""
    skipped: int = 0
    """Rows a resumed scan was asked to leave out at its start (``skip_rows``)."""
    arrow: int = 0
    """Arrow bytes of those data messages, uncompressed."""
    codecs: dict[str, int] = field(default_factory=dict)
    """Data messages by body compression, in the order first seen."""
    error: P.DatasetError | None = None


_current: contextvars.ContextVar[RequestRecord | None] = contextvars.ContextVar(
    "aqueduct_request", default=None
)


def note(
    *,
    rows: int = 0,
    nbytes: int = 0,
    direction: str = "in",
    staged: int | None = None,
    arrow: int = 0,
    codec: str | None = None,
    skipped: int = 0,
) -> None:
    """Count rows and payload bytes the current request moved (``in``: received from the
    client, ``out``: sent to it), and the bytes a write ``staged``; for one data message
    also its Arrow bytes (uncompressed) and its body compression (``codec``); for a resumed
    scan the rows it ``skipped``. The metrics move at once, the access line at the end.
    Outside a request (no observer) it does nothing."""
    record = _current.get()
    if record is None:
        return
    if staged is not None:
        record.staged = (record.staged or 0) + staged
    record.skipped += skipped
    record.rows += rows
    record.bytes += nbytes
    record.arrow += arrow
    metrics = record.observer.metrics
    if rows:
        metrics.rows.labels(direction).inc(rows)
    if nbytes:
        metrics.bytes.labels(direction).inc(nbytes)
    if arrow:
        metrics.arrow_bytes.labels(direction).inc(arrow)
    if codec is not None:
        record.codecs[codec] = record.codecs.get(codec, 0) + 1
        metrics.messages.labels(direction, codec).inc()


def failed(error: P.DatasetError) -> None:
    """The current request is answered with ``error`` (its outcome in the access line)."""
    record = _current.get()
    if record is not None:
        record.error = error


def touched(dataset: str) -> None:
    """The current request works on ``dataset`` (the access line's ``dataset``): set once its
    rights were checked, so a scan shows its splits' dataset, and a refusal the one refused."""
    record = _current.get()
    if record is not None:
        record.dataset = dataset


def committed() -> None:
    """The current commit request made a new version."""
    record = _current.get()
    if record is not None:
        record.observer.metrics.commits.inc()


@dataclass
class _Opened:
    """An open connection's own counts, for its closing log line and ``status``."""

    user: str | None = None
    at: float = field(default_factory=time.monotonic)
    requests: int = 0
    rows: int = 0
    bytes: int = 0
    """Of its requests that ended (those running are in ``live``)."""
    live: set[RequestRecord] = field(default_factory=set)


MAX_LISTED = 100
"""Connections ``status`` lists at most (the busiest; ``connections`` counts them all)."""


def _rate(nbytes: int, age: float) -> int:
    return int(nbytes / age) if age > 0.001 else 0


def _stream(r: RequestRecord, now: float) -> dict[str, Any]:
    age = now - r.started
    return {
        "op": r.op,
        "dataset": r.dataset,
        "age_s": round(age, 1),
        "rows": r.rows,
        "bytes": r.bytes,
        "bytes_per_s": _rate(r.bytes, age),
    }


class _StallCollector:
    """``aqueduct_flow_control_stalls_total``, read from the engines when scraped: the
    engine is sans-IO and only counts; the connections closed so far are kept as a sum."""

    def __init__(self, observer: Observer) -> None:
        self.observer = observer

    def collect(self) -> Iterator[Metric]:
        credit, transport = self.observer.flow_stalls()
        family = CounterMetricFamily(
            "aqueduct_flow_control_stalls",
            "Times a sender of the service waited: for the client's flow-control credit "
            "(kind=credit, a slow reader) or for the transport's backlog to drain "
            "(kind=transport, the network or QUIC windows).",
            labels=["kind"],
        )
        family.add_metric(["credit"], credit)
        family.add_metric(["transport"], transport)
        yield family


class Observer:
    """Counts a service's connections and requests, and logs their access lines."""

    def __init__(
        self, operations: Iterable[str] = (), registry: CollectorRegistry | None = None
    ) -> None:
        self.metrics = Metrics(registry)
        self.operations = frozenset(operations)
        """The service's operations: label values; anything else a client sends is counted
        as ``unknown``, so a client cannot make the metrics grow without bound."""
        self.started = time.monotonic()
        self._live: dict[Connection, _Opened] = {}
        self._closed_stalls = (0, 0)
        self._children: dict[tuple[str, str], tuple[Any, Any]] = {}
        self.metrics.registry.register(_StallCollector(self))

    @property
    def connections_open(self) -> int:
        return len(self._live)

    def flow_stalls(self) -> tuple[int, int]:
        """(credit, transport) stalls of every connection so far, open or closed."""
        credit, transport = self._closed_stalls
        for conn in self._live:
            s = conn.flow_stalls()
            credit += s.credit
            transport += s.transport
        return credit, transport

    def connection_opened(self, conn: Connection, user: str | None = None) -> None:
        """``user``: the name of the token's grant (never the token); None: not known. Its
        log line waits for the connection's first request: a connection that makes none (the
        losing side of a client's QUIC/TCP race, a probe) is logged at DEBUG only."""
        self._live[conn] = _Opened(user)
        self.metrics.connections_open.inc()
        self.metrics.connections.labels(conn.transport).inc()

    def _log_opened(self, conn: Connection, opened: _Opened, level: int = logging.INFO) -> None:
        fields = {
            "peer": peer_text(conn.peer),
            "user": opened.user or "-",
            "transport": conn.transport,
        }
        log.log(level, "connection opened", extra={"fields": fields})

    def activity(self, user: str | None, everything: bool, own: object = None) -> dict[str, Any]:
        """The ``status`` request's view of the service's activity: counts for every token;
        the live connections and their running requests (streams) with their rates (averages
        since they began), all of them for a token that covers every dataset (or on a
        service without tokens), else only those of the same token, never others' peers."""
        now = time.monotonic()
        transports: dict[str, int] = {}
        rows: list[dict[str, Any]] = []
        for conn, opened in list(self._live.items()):
            transports[conn.transport] = transports.get(conn.transport, 0) + 1
            if not everything and (opened.user != user or user is None):
                continue
            live = sorted(opened.live, key=lambda r: r.started)
            total = opened.bytes + sum(r.bytes for r in live)
            age = now - opened.at
            rows.append(
                {
                    "transport": conn.transport,
                    "peer": peer_text(conn.peer),
                    "user": opened.user,
                    "yours": conn is own,
                    "age_s": round(age, 1),
                    "requests": opened.requests,
                    "rows": opened.rows + sum(r.rows for r in live),
                    "bytes": total,
                    "bytes_per_s": _rate(total, age),
                    "streams": [_stream(r, now) for r in live],
                }
            )
        rows.sort(key=lambda c: (not c["yours"], -len(c["streams"]), -int(c["bytes"])))
        return {
            "uptime_s": round(now - self.started, 1),
            "connections": len(self._live),
            "transports": transports,
            "requests_in_flight": sum(len(o.live) for o in self._live.values()),
            "connections_listed": rows[:MAX_LISTED],
        }

    def connection_closed(self, conn: Connection) -> None:
        opened = self._live.pop(conn, None)
        if opened is None:
            return
        s = conn.flow_stalls()
        credit, transport = self._closed_stalls
        self._closed_stalls = (credit + s.credit, transport + s.transport)
        self.metrics.connections_open.dec()
        fields = {
            "peer": peer_text(conn.peer),
            "requests": opened.requests,
            "duration_s": round(time.monotonic() - opened.at, 3),
            "credit_stalls": s.credit,
        }
        level = logging.INFO if opened.requests else logging.DEBUG
        if not opened.requests and log.isEnabledFor(level):
            self._log_opened(conn, opened, level)
        log.log(level, "connection closed", extra={"fields": fields})

    async def observe(
        self, req: Any, conn: Connection | None, serve: Callable[[], Awaitable[None]]
    ) -> None:
        """Serve ``req`` by awaiting ``serve()`` as one observed request: its counts, its
        metrics and its access line. (A factory, not a coroutine: a task cancelled before
        its first step would leave a coroutine argument never awaited.)"""
        op = dataset = None
        if isinstance(req, dict):  # until the rights check says which (touched)
            op, dataset = req.get("op"), req.get("dataset")
        record = RequestRecord(
            self,
            peer_text(conn.peer if conn is not None else None),
            op if isinstance(op, str) else "-",
            dataset if isinstance(dataset, str) else None,
        )
        opened = self._live.get(conn) if conn is not None else None
        if opened is not None:
            if not opened.requests and conn is not None:
                self._log_opened(conn, opened)
            opened.requests += 1
            record.user = opened.user
        token = _current.set(record)
        self.metrics.requests_in_flight.inc()
        if opened is not None:
            opened.live.add(record)
        outcome = "cancelled"  # unless it ends otherwise: its connection closed under it
        try:
            await serve()
            outcome = "ok" if record.error is None else record.error.code.lower()
        finally:
            _current.reset(token)
            self.metrics.requests_in_flight.dec()
            if opened is not None:
                opened.live.discard(record)
                opened.rows += record.rows
                opened.bytes += record.bytes
            self._finish(record, outcome)

    def _finish(self, record: RequestRecord, outcome: str) -> None:
        seconds = time.monotonic() - record.started
        op = record.op if record.op in self.operations else "unknown"
        m = self.metrics
        children = self._children.get((op, outcome))
        if children is None:  # labels() takes a lock and builds a key: once per pair
            children = (m.requests.labels(op, outcome), m.request_seconds.labels(op))
            self._children[op, outcome] = children
        children[0].inc()
        children[1].observe(seconds)
        if op == "commit" and outcome == "ok":
            m.commit_seconds.observe(seconds)
        level = logging.WARNING if outcome in LOUD_OUTCOMES else logging.INFO
        if not ACCESS.isEnabledFor(level):
            return
        fields: dict[str, Any] = {
            "peer": record.peer,
            "user": record.user or "-",
            "op": record.op,
            "dataset": record.dataset or "-",
            "rows": record.rows,
            "bytes": record.bytes,
        }
        if record.codecs:  # a scan or write: what compression did
            fields["arrow_bytes"] = record.arrow
            fields["compression"] = ",".join(f"{c}:{n}" for c, n in record.codecs.items())
        fields |= {
            "duration_ms": round(seconds * 1000, 1),
            "outcome": outcome,
        }
        if record.staged is not None:
            fields["staged_bytes"] = record.staged
        if record.skipped:
            fields["skip_rows"] = record.skipped
        if record.error is not None:
            fields["error"] = record.error.message
        ACCESS.log(level, "request", extra={"fields": fields})
