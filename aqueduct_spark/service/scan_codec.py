"""The codec of each batch a scan sends: the reader's fixed setting, or ``auto`` decided per
connection from what its transport measures (``protocol.compression``).

The send path asks :meth:`ScanCodec.setting` once per batch and reports each message back
(:meth:`ScanCodec.sent`); encoding runs on the service's worker threads (:func:`encoded`),
timed there, so the policy learns what each codec costs on this data. A connection's
``auto`` state lives as long as the connection, shared by its scans: the next scan starts
where the last one left (the path is the same).
"""

from __future__ import annotations

import logging
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from aqueduct_core.api import Connection, Sender
from aqueduct_spark import protocol as P
from aqueduct_spark.protocol import parquet as PQ
from aqueduct_spark.service.batch_limits import payloads_for_reader

log = logging.getLogger("aqueduct.service")


@dataclass(frozen=True, slots=True)
class Encoded:
    """One data message of a scan, and what making it took on the worker thread."""

    payload: Any
    rows: int
    arrow: int
    """Bytes before compression: the batch's Arrow bytes; a row group sent as stored, its
    Parquet bytes as in the file."""
    setting: str
    """How it was encoded: ``none``, ``lz4``, ``zstd:1``, ...; a row group sent as stored:
    ``parquet``, or ``parquet+lz4`` (compressed whole on top)."""
    encode: float
    """Seconds spent encoding (and compressing) it."""
    headers: tuple[tuple[bytes, bytes], ...] = ()
    """Message headers beside the batch header (a row group sent as stored: its ranges)."""

    @property
    def codec(self) -> str:
        """What the access line and metrics count it as: ``none``, ``lz4``, ``zstd``,
        ``parquet``, ``parquet+lz4``, ``parquet+zstd``."""
        return self.setting.partition(":")[0]

    @property
    def compression(self) -> str:
        """The compression the ``auto`` policy chose for it: ``none``, ``lz4`` or ``zstd``."""
        codec = self.codec
        if codec.startswith(PQ.PARQUET):
            codec = codec.removeprefix(PQ.PARQUET).removeprefix("+") or "none"
        return codec


def encoded(
    items: Iterator[pa.RecordBatch | PQ.ParquetPiece],
    codec: ScanCodec,
    limit: int | None,
    batch_rows: int,
) -> Iterator[Encoded]:
    """``items`` as data messages within the reader's ``limit``, each batch encoded as
    ``codec`` says when its turn comes. A row group passed as stored goes as one message,
    compressed whole as :meth:`ScanCodec.pack` decides, unless it, or the bytes its footer
    declares decoded, are over the limit: then it is decoded here and sent as batches like
    any other."""
    for item in items:
        if isinstance(item, PQ.ParquetPiece):
            most = limit if limit is not None else P.MAX_BATCH_BYTES
            if item.nbytes <= most and item.stored <= most:
                start = time.perf_counter()
                chosen, payload, header = codec.pack(item)
                took = time.perf_counter() - start
                label = PQ.PARQUET if chosen == "none" else f"{PQ.PARQUET}+{chosen}"
                yield Encoded(payload, item.rows, item.nbytes, label, took, (header,))
                continue
            batches: Iterator[pa.RecordBatch] = item.batches(batch_rows)
        else:
            batches = iter((item,))
        yield from _encoded(batches, codec.setting, limit)


def _encoded(
    batches: Iterator[pa.RecordBatch], setting: Callable[[], str], limit: int | None
) -> Iterator[Encoded]:
    for batch in batches:
        chosen = setting()
        options = P.write_options(chosen)
        start = time.perf_counter()
        for payload, piece in payloads_for_reader(batch, options, limit):
            took = time.perf_counter() - start
            yield Encoded(payload, piece.num_rows, piece.nbytes, chosen, took)
            start = time.perf_counter()


class ScanCodec:
    """The codec choice of one scan."""

    def __init__(self, fixed: P.Compression, policy: P.AutoCompression | None) -> None:
        self.fixed = str(fixed)
        self.policy = policy
        self._stored_lz4: bool | None = None
        """Whether lz4 shrinks this scan's stored row groups enough (None: not tried yet)."""

    def setting(self) -> str:
        """How to encode the next batch."""
        return self.policy.setting() if self.policy is not None else self.fixed

    def pack(self, piece: PQ.ParquetPiece) -> tuple[str, Any, tuple[bytes, bytes]]:
        """A row group sent as stored, compressed whole: the setting used, the payload and
        its header. As :meth:`setting` says; and under ``auto``, where that is ``none``, with
        lz4 if lz4 shrinks this scan's first stored row group to :data:`STORED_LZ4` or less:
        at that ratio lz4 costs both ends less CPU than TLS and the socket spend on the bytes
        it saves, so it pays on any link (the bench table's snappy pages: 18 MB to 1.4 MB
        per million rows, lz4 at 3 GB/s; taxi trips' pages do not shrink, and go as they
        are)."""
        chosen = self.setting()
        if chosen == "none" and self.policy is not None and self._stored_lz4 is not False:
            payload, header = piece.packed("lz4")
            if self._stored_lz4 is None:
                self._stored_lz4 = len(payload) <= STORED_LZ4 * piece.nbytes
            if self._stored_lz4:
                return "lz4", payload, header
        payload, header = piece.packed(chosen)
        return chosen, payload, header

    def sent(self, conn: Connection | None, item: Encoded, work: float) -> None:
        """``item`` went out; ``work``: the worker thread's seconds for it in all."""
        policy = self.policy
        if policy is None or conn is None:
            return
        now = time.monotonic()
        policy.sent(item.compression, item.arrow, len(item.payload), item.encode, work, now)
        if policy.due(now) and policy.path(conn.path(), now):
            mb = (policy.link or 0) / 1e6
            log.debug(
                "compression for %s now %s (link %.0f MB/s while it was the limit; %s)",
                conn.peer,
                policy.current,
                mb,
                policy.explain(),
            )


STORED_LZ4 = 0.25
"""Under ``auto``, a scan's stored row groups go lz4 on any link when lz4 shrinks the first to
this fraction or less (:meth:`ScanCodec.pack`). Measured (bench table, 10M rows, two
namespaces, unshaped): lz4 on top 0.92 s against 1.02 s without, client 3.56 against 3.90
and service 0.51 against 0.72 CPU s/GB."""

PEERS = 256
"""Client hosts whose last ``auto`` state the service keeps for their next connection."""


class ConnectionCodecs:
    """The ``auto`` state of each open connection (dropped with the connection), and of
    the last connection from each of the :data:`PEERS` most recent client hosts: a new
    connection from one starts from what the last one measured while that is fresh (the
    policy's ``revisit``), as a Spark executor's next task reads over the same path.

    Scans whose row groups go as stored Parquet keep a state of their own, apart from the
    scans of Arrow batches: what a codec does to a file's snappy pages says nothing of what
    it does to Arrow buffers (lz4 gains nothing on taxi trips' Parquet and 3.4x on their
    Arrow), and one kind's verdict ruled the other out (a read of Arrow after one of
    Parquet, from the same host at 1 Gbit/s, went uncompressed: 1.00x Flight)."""

    def __init__(self, setting: P.Compression) -> None:
        self.setting = setting
        """The service's own setting (``--compression``) for readers that leave it to us."""
        self._auto: weakref.WeakKeyDictionary[Connection, dict[bool, P.AutoCompression]] = (
            weakref.WeakKeyDictionary()
        )
        self._hosts: OrderedDict[Any, P.AutoCompression] = OrderedDict()

    def _new(self, conn: Connection, codecs: tuple[str, ...], stored: bool) -> P.AutoCompression:
        host = (conn.peer[0], stored) if conn.peer else None
        last = self._hosts.pop(host, None) if host is not None else None
        now = time.monotonic()
        policy = last.seeded(codecs, now) if last is not None else P.AutoCompression(codecs)
        # kept for the host's next connection: without this one's batches in flight
        weakref.finalize(conn, policy.forget_batches)
        if host is not None:
            self._hosts[host] = policy
            while len(self._hosts) > PEERS:
                self._hosts.popitem(last=False)
        return policy

    def for_scan(self, out: Sender, conn: Connection | None, stored: bool = False) -> ScanCodec:
        """The codec choice for a scan whose reader sent ``out``'s headers; ``stored``: its
        row groups go as stored Parquet where they can."""
        fixed, codecs = P.negotiate(
            P.find_header(out.headers, P.H_COMPRESSION),
            P.find_header(out.headers, P.H_CODECS),
            self.setting,
        )
        if not fixed.auto:
            return ScanCodec(fixed, None)
        if conn is None:
            return ScanCodec(P.Compression("none"), None)
        kinds = self._auto.setdefault(conn, {})
        policy = kinds.get(stored)
        if policy is None or tuple(policy.codecs) != codecs:
            policy = kinds[stored] = self._new(conn, codecs, stored)
        return ScanCodec(fixed, policy)

    def accepted(self) -> list[str]:
        """The codecs writers may compress with, as ``begin`` answers (none when the
        service's setting is ``none``: it would rather spend no CPU decompressing)."""
        return [] if self.setting.codec == "none" else list(P.CODECS)


def as_target(
    items: Iterator[pa.RecordBatch | PQ.ParquetPiece], target: pa.Schema | None, batch_rows: int
) -> Iterator[pa.RecordBatch | PQ.ParquetPiece]:
    """``items`` as the reader's schema ``target`` wants them (None: as they are): batches
    cast; a row group passed as stored goes as it is when its columns are the target's
    (the reader decodes it into its own schema), else it is decoded and cast here."""
    for item in items:
        if isinstance(item, PQ.ParquetPiece):
            if target is None or _same_columns(item.schema, target):
                yield item
            else:
                yield from (_cast(batch, target) for batch in item.batches(batch_rows))
        else:
            yield item if target is None or item.schema == target else _cast(item, target)


def _same_columns(schema: pa.Schema, target: pa.Schema) -> bool:
    """Whether rows of ``schema`` are rows of ``target`` (names and types; a reader sets its
    own schema's metadata and nullability on what it decodes)."""
    return schema.names == target.names and all(
        a.type.equals(b.type) for a, b in zip(schema, target, strict=True)
    )


def _cast(batch: pa.RecordBatch, target: pa.Schema) -> pa.RecordBatch:
    try:
        return batch.select(target.names).cast(target)
    except (KeyError, pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise P.SchemaMismatch(
            f"cannot deliver the data as the requested schema: {exc}; ask for types the dataset's columns cast to (aqueduct describe shows them)"
        ) from exc
