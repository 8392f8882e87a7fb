"""The dataset service: answers dataset-protocol requests over Aqueduct, stores in Delta Lake.

Each connection's requests run concurrently, each in its own task, up to ``max_requests``
at once; blocking Delta Lake and Parquet work runs in worker threads shared fairly between
connections, and a closed connection's work is cancelled at once (``admission``). Scans
send batches as the transport accepts them (a small sender queue plus per-channel flow
control), so a slow reader holds at most a few batches in this process, never whole files.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from dataclasses import field as dataclass_field
from functools import partial
from typing import Any

from aqueduct_core.api import Connection, OneshotSender, Receiver, Sender
from aqueduct_core.api.channel import Handle, _SendEnd
from aqueduct_core.api.codec import CborCodec, Codec, Detach, RawCodec
from aqueduct_core.errors import (
    AqueductError,
    ChannelError,
    DecodeError,
    EndOfChannel,
    RemoteProtocolError,
)
from aqueduct_core.transport import Server, ServerTLS, TransportConfig, serve
from aqueduct_spark import protocol as P
from aqueduct_spark.protocol import parquet as PQ
from aqueduct_spark.service import binding, split_files
from aqueduct_spark.service.access import AccessPolicy, Grant, authorize, scan_splits
from aqueduct_spark.service.admission import (
    DEFAULT_THREADS,
    REQUEST_WINDOW,
    FairPool,
    Session,
    engine_config,
)
from aqueduct_spark.service.batch_limits import reader_limit
from aqueduct_spark.service.changes import scan_change
from aqueduct_spark.service.maintenance import Maintenance, MaintenanceConfig
from aqueduct_spark.service.observability import Observer, committed, failed, note
from aqueduct_spark.service.operations import COMMITTING, Operations, field
from aqueduct_spark.service.resume import Skip, skip_rows
from aqueduct_spark.service.scan import Item
from aqueduct_spark.service.scan_codec import ConnectionCodecs, as_target, encoded
from aqueduct_spark.service.store import Store
from aqueduct_spark.service.transactions import StagingConfig, Transactions
from aqueduct_spark.service.watch import LogWatch
from aqueduct_spark.service.write_buffers import WRITE_BUFFER_BYTES, WriteBudget, stage_messages

log = logging.getLogger("aqueduct.service")

SCAN_QUEUE = 2
"""Batches a scan may queue ahead of the reader (on top of the flow-control window)."""
SCAN_RETRY_AFTER = 0.5
"""Seconds a client refused a scan (too many open) is told to wait before trying again."""


@dataclass(frozen=True)
class ServiceConfig:
    root: str
    """Directory (or object-store URI) holding one Delta table per dataset."""
    token: str | None = None
    """A bearer token with read-write rights on every dataset (``--token``)."""
    access: AccessPolicy = dataclass_field(default_factory=AccessPolicy)
    """More tokens, each with its rights (``[[tokens]]`` of ``--config``). With neither
    ``token`` nor grants here: no authentication."""
    storage_options: dict[str, str] | None = None
    batch_rows: int = 65536
    """Rows per Arrow batch in scans (about 100k rows suits Spark best)."""
    split_bytes: int = 128 * 1024 * 1024
    """Target size of one scan split (one Spark task)."""
    max_batch_bytes: int = P.MAX_BATCH_BYTES
    """Largest data message (one encoded Arrow batch) a write may send (``--max-batch-bytes``);
    a compressed one counts at the size it declares it decompresses to. The connections
    accept messages this large."""
    poll_interval: float = 0.5
    """The longest a dataset with subscribers goes unchecked for commits made elsewhere
    (checked every 50 ms right after a change, less often the longer it stays quiet)."""
    heartbeat: float = 2.0
    """A subscription hearing nothing new for this long gets the latest version again: it
    keeps the connection from going idle, and lets the client notice a service that died."""
    max_requests: int = 64
    """Requests of one connection served at once (scans, writes and subscriptions count until
    they end); further requests wait unread in the connection."""
    max_scans: int = 16
    """Scans one connection may have open; one more is refused with UNAVAILABLE and a
    ``retry_after`` detail (the Python client waits and retries)."""
    request_window: int = REQUEST_WINDOW
    """Bytes of requests one connection may send ahead of those being served (the
    entrypoint's flow-control window; ``--request-window``). Requests beyond it wait in the
    client, so a burst costs the service nothing until it reads them; a client that sends
    more anyway is disconnected (code 3)."""
    max_write_buffer_bytes: int = WRITE_BUFFER_BYTES
    """Bytes of write data the process holds decoded at once, over all writes
    (``--max-write-buffer-bytes``; at least twice ``max_batch_bytes``). A data message
    beyond it waits, unread, and its client with it (``write_buffers``)."""
    threads: int = DEFAULT_THREADS
    """Worker threads for Delta Lake and Parquet calls, taken in turn by the connections;
    one connection runs at most a quarter of them (at least one) at once."""
    maintenance: MaintenanceConfig = dataclass_field(default_factory=MaintenanceConfig)
    """Checkpoints, log cleanup, compaction and vacuum after commits (off unless enabled)."""
    staging: StagingConfig = dataclass_field(default_factory=StagingConfig)
    """Quotas on staged, uncommitted data and the lifetime of idle write transactions."""
    compression: P.Compression = P.AUTO
    """Scans whose reader leaves the codec to the service (its ``auto``): ``auto`` (compress
    when the network, not the CPU, is the limit), ``none``, or a fixed codec
    (``--compression``). A reader's fixed setting is always honoured."""
    pass_parquet: bool = True
    """Send row groups that need nothing done to them as stored Parquet to readers that offer
    to decode it (``--no-pass-parquet``: always decode here and send Arrow)."""

    def __post_init__(self) -> None:
        for name in ("max_requests", "max_scans", "request_window", "threads"):
            if getattr(self, name) < 1:
                raise ValueError(
                    f"ServiceConfig.{name} must be at least 1, got {getattr(self, name)}"
                )
        if self.max_write_buffer_bytes < 2 * self.max_batch_bytes:
            raise ValueError(
                f"max_write_buffer_bytes ({self.max_write_buffer_bytes}) must be at least twice "
                f"max_batch_bytes ({self.max_batch_bytes}), so that a message of the largest "
                "size always fits beside what writes keep: raise --max-write-buffer-bytes or "
                "lower --max-batch-bytes"
            )


def _answer_for(exc: BaseException) -> P.DatasetError:
    """The error a failed request is answered with: a dataset error as raised (the store
    raises them too); a payload that did not decode is invalid; a channel that ended under
    the request leaves the service unavailable to it; anything else is internal (and logged)."""
    if isinstance(exc, P.DatasetError):
        return exc
    if isinstance(exc, DecodeError):
        return P.InvalidRequest(str(exc))
    if isinstance(exc, ChannelError):  # the client cancelled, went away, or was cut off
        return P.Unavailable(f"the request's channel ended: {exc}")
    log.exception("request failed", exc_info=exc)
    return P.InternalError(f"the service failed unexpectedly ({exc or 'no detail'})")


def _end_handles(value: Any) -> None:
    """End every channel handle inside a request that the handler did not end itself."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
        elif isinstance(item, Handle) and item.is_networked:
            if isinstance(item, _SendEnd):
                item.cancel()
            elif isinstance(item, Receiver):
                item.close()


@dataclass
class _Malformed:
    """A request whose payload did not decode, with every channel it carried."""

    error: str
    handles: list[Handle]

    def as_request(self) -> dict[str, Any]:
        """Where to answer: its first oneshot sender and its first sender, if any."""
        req: dict[str, Any] = {"handles": self.handles}
        for h in self.handles:
            if isinstance(h, OneshotSender):
                req.setdefault("reply", h)
            elif isinstance(h, Sender):
                req.setdefault("out", h)
        return req


class _RequestCodec(CborCodec):
    """CBOR, except that a request that does not decode is answered, not fatal.

    The core codec raises, the message's channels are closed and the connection is lost.
    Here the payload becomes a :class:`_Malformed` holding the message's channels, so the
    service answers ``INVALID_REQUEST`` on the request's own reply channel and the
    connection serves on. Attachment indexes are dense, so every channel the message
    carried is found by asking for indexes until one does not exist.
    """

    def decode(self, payload: bytes | bytearray | memoryview, detach: Detach) -> Any:
        taken: dict[int, Handle] = {}

        def keep(index: int) -> Any:
            taken[index] = handle = detach(index)
            return handle

        try:
            return super().decode(payload, keep)
        except Exception as exc:  # any payload either decodes or is answered as invalid
            index = 0
            while True:
                if index not in taken:
                    try:
                        taken[index] = detach(index)
                    except RemoteProtocolError:
                        break  # past the last attachment
                index += 1
            return _Malformed(str(exc), list(taken.values()))


REPLAY_SAFE = frozenset(
    {"ping", "status", "list", "describe", "plan", "scan", "offsets", "changes", "feed"}
    | {"subscribe"}
)
"""Requests the service acts on before the QUIC handshake completes (they only read);
every other one (create, drop, begin, write, commit, abort, and the maintenance requests)
waits for it (profile §2.11)."""


class DatasetService:
    """Serves the dataset protocol from a :class:`Store`."""

    def __init__(self, config: ServiceConfig) -> None:
        self.config = config
        self.store = Store(config.root, config.storage_options)
        self._subscribers: dict[str, set[_Subscriber]] = {}
        self._poller: asyncio.Task[None] | None = None
        self.access = AccessPolicy.of(config.token, config.access.grants)
        self._pool = FairPool(config.threads)
        self.transactions = Transactions(
            self.store, config.staging, self._pool, per_token=self.access.requires_token
        )
        """Staging quotas and the lifetime of idle write transactions."""
        self.compression = ConnectionCodecs(config.compression)
        ops = Operations(self.store, config.split_bytes, config.max_batch_bytes, self.transactions)
        ops.codecs = self.compression.accepted()
        self._ops, self._finish = ops.by_op, ops.finish
        self.maintenance = Maintenance(self.store, config.maintenance, self._pool)
        self.observer = Observer({*self._ops, "ping", "status", "scan", "write", "subscribe"})
        """Access lines and metrics (``observability``; served by ``health.start_http``)."""
        self.transport: TransportConfig | None = None
        """What its connections use, once started (the console's port uses it too)."""
        self.transactions.observe(self.observer.metrics.registry)
        self.write_budget = WriteBudget(config.max_write_buffer_bytes)
        """Memory for the decoded data of all writes (``write_buffers``)."""
        self.write_budget.observe(self.observer.metrics.registry)

    # -- connection handling ----------------------------------------------------------

    def server_headers(self, client: Any) -> list[tuple[bytes, bytes]]:
        return [(P.H_VERSION, str(P.PROTOCOL_VERSION).encode())]

    def codecs(self) -> dict[str, Codec]:
        """The connection codecs: CBOR requests that answer malformed input, raw data."""
        return {"cbor": _RequestCodec((Handle,)), "raw": RawCodec()}

    async def handle(self, conn: Connection, entry: Receiver[Any]) -> None:
        try:
            grant: Grant | P.Unauthenticated = self.access.authenticate(conn.peer_header(P.H_TOKEN))
        except P.Unauthenticated as refused:
            grant = refused
        self.observer.connection_opened(conn, grant.name if isinstance(grant, Grant) else None)
        session = Session(self.config.max_requests, self.config.max_scans)
        reading = asyncio.ensure_future(self._read_requests(entry, session, grant, conn))
        closed = asyncio.ensure_future(conn.wait_ended())  # not the socket's close
        try:
            await asyncio.wait([reading, closed], return_when=asyncio.FIRST_COMPLETED)
            if not closed.done():
                # The client finished its entrypoint: what it asked for runs to its end,
                # unless the connection closes first.
                idle = asyncio.ensure_future(session.idle())
                await asyncio.wait([idle, closed], return_when=asyncio.FIRST_COMPLETED)
                idle.cancel()
        finally:
            # Whatever ended the connection, its work ends now: requests waiting for a
            # thread never start, and no reply is computed for a client that is gone.
            reading.cancel()
            closed.cancel()
            self._pool.forget(session)
            await session.cancel()
            await asyncio.gather(reading, return_exceptions=True)
            self.transactions.connection_closed(conn)
            self.observer.connection_closed(conn)

    async def _read_requests(
        self,
        entry: Receiver[Any],
        session: Session,
        grant: Grant | P.Unauthenticated,
        conn: Connection,
    ) -> None:
        """Start serving each request, while fewer than ``max_requests`` are in flight."""
        while True:
            await session.slots.acquire()
            try:
                request = await entry.recv()
            except (EndOfChannel, ChannelError):
                session.slots.release()
                return  # the client finished its entrypoint, or went away
            except DecodeError as exc:  # the codec answers these; this is a backstop
                session.slots.release()
                log.warning("dropped a request that did not decode: %s", exc)
                continue
            serve = partial(self._request, request, grant, session, conn)
            session.start(self.observer.observe(request, conn, serve))

    async def _request(
        self,
        req: Any,
        grant: Grant | P.Unauthenticated,
        session: Session,
        conn: Connection | None = None,
    ) -> None:
        try:
            if isinstance(req, _Malformed):
                error = req.error
                req = req.as_request()
                raise P.InvalidRequest(
                    f"the request could not be decoded ({error}); send a CBOR map with a "
                    "string 'op'"
                )
            if not isinstance(req, dict) or not isinstance(req.get("op"), str):
                raise P.InvalidRequest("a request is a map with a string 'op'")
            op = req["op"]
            grant = authorize(grant, req, self.observer.operations)
            if op not in REPLAY_SAFE and conn is not None:
                # Profile §2.11: a request may have come in 0-RTT, which an attacker can
                # replay; only reads run before the handshake proves the client is live.
                await conn.wait_confirmed()
            if op == "ping":  # a round trip that proves the connection alive
                self._reply(req, P.ok({}))
            elif op == "status":  # staging, and activity as far as the token may see it
                seen = self.observer.activity(grant.name, grant.datasets == ("*",), conn)
                self._reply(req, P.ok({**self.transactions.status(grant, conn), **seen}))
            elif op == "scan":
                await self._scan(req, session, conn)
            elif op == "write":
                await self._write(req, session, grant, conn)
            elif op == "subscribe":
                await self._subscribe(req, session)
            else:  # one of the one-reply requests (authorize refused unknown operations)
                result = await self._pool.run(session, self._ops[op], req)
                if op == "list":  # only the datasets this token may read
                    result["datasets"] = [
                        d for d in result["datasets"] if grant.may_read(d["name"])
                    ]
                self._reply(req, P.ok(result))
                if op in COMMITTING and result.get("committed"):
                    committed()
                    self._notify(req["dataset"], result["version"])
                    self.maintenance.after_commit(req["dataset"], result["version"])
                if op == "commit" and result.get("finishing"):  # its clean-up, once answered
                    await self._pool.run(session, self._finish, req, result)
        except Exception as exc:  # every failure becomes an answer, never a dead connection
            await self._fail(req, _answer_for(exc))
        finally:
            _end_handles(req)

    def _reply(self, req: Any, reply: dict[str, Any]) -> None:
        target = req.get("reply") if isinstance(req, dict) else None
        if isinstance(target, OneshotSender) and target.is_networked:
            with contextlib.suppress(AqueductError):
                target.send(reply)

    async def _fail(self, req: Any, error: P.DatasetError) -> None:
        failed(error)  # the outcome of the access line
        if isinstance(req, dict) and isinstance(req.get("out"), Sender):
            out: Sender = req["out"]
            # The error travels as the channel's last message, then the channel is finished.
            # Not cancelled: CANCEL drops unsent messages and resets the stream, which could
            # destroy the very message that says what went wrong.
            with contextlib.suppress(AqueductError, TimeoutError):
                await asyncio.wait_for(out.send(b"", headers=[P.error_header(error)]), 10)
                out.finish()
        self._reply(req, P.fail(error))

    # -- push notifications -----------------------------------------------------------

    def _notify(self, dataset: str, version: int) -> None:
        for sub in self._subscribers.get(dataset, ()):
            sub.offer(version)

    async def _subscribe(self, req: dict[str, Any], session: Session) -> None:
        """Push the newest version of a dataset whenever the subscriber has room for it:
        demand-driven, coalescing (a slow subscriber gets the latest, never a backlog)."""
        out = field(req, "out", Sender)
        name = field(req, "dataset", str)
        latest = await self._pool.run(session, self.store.latest_version, name)
        out.ordered(maxsize=1)
        sub = _Subscriber(latest)
        self._subscribers.setdefault(name, set()).add(sub)
        if self._poller is None:
            self._poller = asyncio.get_running_loop().create_task(self._poll())
        beat = self.config.heartbeat
        try:
            sent = -1
            while True:
                try:
                    version = await asyncio.wait_for(sub.next_after(sent), beat)
                except TimeoutError:
                    version = sub.latest  # nothing new: a heartbeat keeps the channel alive
                await out.send({"version": version, "heartbeat": beat})
                sent = version
        except AqueductError:
            pass  # the subscriber went away
        finally:
            subs = self._subscribers.get(name)
            if subs is not None:
                subs.discard(sub)
                if not subs:
                    del self._subscribers[name]

    async def _poll(self) -> None:
        """Commits by other service processes (or any Delta writer) are found by watching
        each subscribed dataset's log: one adaptive poll per dataset (:mod:`.watch`)."""
        try:
            run = partial(self._pool.run, self)
            watch = LogWatch(self.store, run, self._notify, slow=self.config.poll_interval)
            await watch.watch(lambda: list(self._subscribers))
        finally:
            self._poller = None

    # -- streaming operations ---------------------------------------------------------

    async def _scan(self, req: dict[str, Any], session: Session, conn: Connection | None) -> None:
        out = field(req, "out", Sender)
        if session.scans >= session.max_scans:
            raise P.Unavailable(
                f"this connection has {session.scans} scans open, the most the service allows "
                f"(--max-scans {session.max_scans}); read or close the open scans, or retry "
                f"this one in {SCAN_RETRY_AFTER} s",
                {"retry_after": SCAN_RETRY_AFTER},
            )
        session.scans += 1
        try:
            await self._stream_scan(req, out, session, conn)
        finally:
            session.scans -= 1

    async def _stream_scan(
        self, req: dict[str, Any], out: Sender, session: Session, conn: Connection | None
    ) -> None:
        # "splits" (a plan's task, several scanned as one) or "split" (one: the first form):
        # the very splits whose dataset authorize checked
        raws, many = scan_splits(req)
        columns = field(req, "columns", list, None)
        expression = binding.Condition.from_wire(req.get("filters"))

        wanted = P.find_header(out.headers, P.H_SCHEMA)
        target = P.schema_from_bytes(wanted) if wanted else None
        batch_rows = field(req, "batch_rows", int, None) or self.config.batch_rows
        limit = reader_limit(req)
        skip = Skip(skip_rows(req))  # a resumed scan: rows the reader has (service.resume)
        note(skipped=skip.asked)
        out.ordered(maxsize=SCAN_QUEUE)

        # a reader that decodes Parquet gets row groups that need nothing done as stored
        passing = self.config.pass_parquet and PQ.PARQUET in PQ.offered_formats(out.headers)
        codec = self.compression.for_scan(out, conn, passing)

        def scan_one(raw: dict[str, Any]) -> Iterator[Item]:
            if "change_type" in raw:  # a split of the change feed (service.changes)
                return skip.drop(scan_change(self.store, raw, columns, batch_rows))
            split = P.Split.from_dict(raw)
            return self.store.scan(split, columns, expression, batch_rows, skip, passing)

        def scan_all() -> Iterator[Item]:
            # only files the log shows: no staged file, whatever path a split names
            split_files.check(self.store, raws[0]["dataset"], raws)
            if not many:
                return scan_one(raws[0])
            if any("change_type" in raw for raw in raws):
                return itertools.chain.from_iterable(scan_one(raw) for raw in raws)
            # a task of plain splits: checked together, small batches merged
            return self.store.scan(
                [P.Split.from_dict(raw) for raw in raws],
                columns=columns,
                filter=expression,
                batch_rows=batch_rows,
                skip=skip,
                passing=passing,
            )

        messages = encoded(as_target(scan_all(), target, batch_rows), codec, limit, batch_rows)
        seq = 0
        while True:
            item, work = await self._pool.run(session, _timed_next, messages)
            if item is None:
                break
            await out.send(
                item.payload,
                headers=[P.batch_header(item.rows, seq, skip.confirm(seq)), *item.headers],
            )
            nbytes = len(item.payload)
            note(rows=item.rows, nbytes=nbytes, direction="out", arrow=item.arrow, codec=item.codec)
            codec.sent(conn, item, work)
            seq += 1
        out.finish()

    async def _write(
        self, req: dict[str, Any], session: Session, grant: Grant, conn: Connection | None
    ) -> None:
        data = field(req, "data", Receiver)
        name = field(req, "dataset", str)
        txn = field(req, "txn", str)
        task = field(req, "task", str)
        schema_bytes = P.find_header(data.headers, P.H_SCHEMA)
        if schema_bytes is None:
            raise P.InvalidRequest("a write channel needs the Arrow schema in its headers")
        schema = P.schema_from_bytes(schema_bytes)
        partition_by = field(req, "partition_by", list, [])
        stage = self.transactions.stage  # quotas, and the transaction's liveness record
        writer = await self._pool.run(
            session, stage, name, txn, task, schema, partition_by, grant, conn
        )
        run = partial(self._pool.run, session)
        limit = self.config.max_batch_bytes
        rows, staged = await stage_messages(data, writer, schema, limit, self.write_budget, run)
        note(staged=sum(f.size for f in staged))
        self._reply(
            req,
            P.ok(
                {
                    "staged": [f.to_dict() for f in staged],
                    "rows": rows,
                    "bytes": sum(f.size for f in staged),
                }
            ),
        )


class _Subscriber:
    """The newest version known for one subscription, and a way to wait for a newer one."""

    def __init__(self, latest: int) -> None:
        self.latest = latest
        self._changed = asyncio.Event()

    def offer(self, version: int) -> None:
        if version > self.latest:
            self.latest = version
            self._changed.set()

    async def next_after(self, sent: int) -> int:
        while self.latest <= sent:
            self._changed.clear()
            await self._changed.wait()
        return self.latest


def _timed_next(items: Iterator[Any]) -> tuple[Any, float]:
    """The next item (None at the end) and the seconds this thread took to make it."""
    start = time.perf_counter()
    item = next(items, None)
    return item, time.perf_counter() - start


async def start(
    config: ServiceConfig,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    tls: ServerTLS | None = None,
    transport: TransportConfig | None = None,
    reuse_port: bool = False,
) -> tuple[DatasetService, Server]:
    """Start a dataset service; returns it and the Aqueduct server it runs on. Clients must
    take part in flow control (the service's memory bounds rest on it), whatever
    ``transport.engine`` says, and get ``config.request_window`` of credit on the
    entrypoint."""
    transport = transport or TransportConfig()
    engine = engine_config(transport.engine, config.request_window, config.max_batch_bytes)
    transport = replace(transport, engine=engine)
    service = DatasetService(config)
    service.transport = transport  # what its connections use (the console's port too)
    service.transactions.start()
    server = await serve(
        service.handle,
        host,
        port,
        tls=tls,
        headers=service.server_headers,
        config=transport,
        codecs=service.codecs(),
        reuse_port=reuse_port,
    )
    return service, server
