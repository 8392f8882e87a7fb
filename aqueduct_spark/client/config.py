"""How to reach and talk to a dataset service: :class:`ClientConfig`.

Its field defaults are the single source of the client's defaults: the Spark options, the
CLI and the docs' table (checked by ``tests/test_docs.py``) read them from here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from typing import Any, cast

from aqueduct_core.transport import ClientTLS, TransportConfig
from aqueduct_core.transport.config import Transport
from aqueduct_spark.protocol.compression import Compression
from aqueduct_spark.protocol.headers import MAX_BATCH_BYTES

CHUNK_BYTES = 8 * 1024 * 1024
"""Batches bigger than this are sent as several slices (Arrow slices are zero-copy)."""
JOIN_BYTES = 4 * 1024 * 1024
"""A write joins consecutive small batches into one data message of about this size (at
most ``chunk_bytes`` and the batch limit). Spark hands a writer batches of 10,000 rows
(``spark.sql.execution.arrow.maxRecordsPerBatch``), ~0.4 MB of the benchmark's table, and
each message costs both ends a fixed amount of Python work (framing, flow control, a
thread hop and a decode at the service) that one of 4 MB spreads over ten times the bytes:
measured between two namespaces (``benchmarks.bench_write_path``), 0.4 MB messages cost
3.9 CPU s/GB on the client's event loop and 3.8 on the service's, 4 MB ones 1.8 and 2.1.
Joining copies the batches once (~0.1 s/GB)."""
JOIN_WAIT = 0.2
"""Seconds a write holds a batch back at most, waiting for more to join it: a slow source's
batches still go out as they come."""


DECODES = ("auto", "service")
"""Where a scan's Parquet may be decoded (:attr:`ClientConfig.decode`)."""


def check_decode(value: str, where: str) -> str:
    """``value`` as a ``decode`` setting, or ValueError naming ``where``."""
    text = str(value).strip().lower()
    if text not in DECODES:
        raise ValueError(
            f"{where} must be auto or service, got {value!r}: auto lets this client decode "
            "the row groups the service can send as stored Parquet; service asks for Arrow only"
        )
    return text


@dataclass(frozen=True)
class ClientConfig:
    """How to reach and talk to a dataset service."""

    url: str
    """``quic://host:port`` (see :func:`~aqueduct_spark.client.urls.parse_url`)."""
    token: str | None = None
    tls: ClientTLS = field(default_factory=ClientTLS)
    transport: TransportConfig = field(default_factory=TransportConfig)
    retries: int = 3
    """Attempts after the first for idempotent requests when the connection is lost."""
    retry_backoff: float = 0.2
    """First backoff in seconds (doubles each attempt, with jitter)."""
    timeout: float = 60.0
    """Seconds to wait for a reply to a request (not for a whole scan or write), and for a
    service this client reached before to be back after it went away (a restart)."""
    connect_timeout: float = 15.0
    """Seconds to spend, at most, opening a connection: every attempt (QUIC and TCP, each
    address of the URL) and the pauses between them. A closed port fails long before (the
    host says so: ``retries`` quick attempts, 1-3 s); this bounds a host that answers
    nothing, which cannot be told from a slow one (an overloaded machine: hence not less)."""
    compression: str = "auto"
    """Arrow IPC body compression on data channels: ``auto`` (compress when the network,
    not the CPU, is the limit: decided per connection from what the transport measures, in
    both directions), ``none``, ``lz4``, ``zstd`` or ``zstd:LEVEL`` (fixed)."""
    decode: str = "auto"
    """Where a scan's Parquet is decoded: ``auto`` (the service sends the row groups it need
    not change as they are stored, and this client decodes them: fewer bytes on the wire
    and no decode at the service; the rest comes as Arrow), or ``service`` (Arrow only)."""
    chunk_bytes: int = CHUNK_BYTES
    join_bytes: int = JOIN_BYTES
    """A write joins consecutive batches smaller than this into one data message of about
    this size (one copy); 0 sends every batch as it comes."""
    max_batch_bytes: int = MAX_BATCH_BYTES
    """Largest data message (one encoded Arrow batch) this client sends or accepts; a
    compressed one counts at the size it declares it decompresses to, checked before it is
    decompressed. Writes split batches below it; a single row above it cannot be written.
    The service has its own limit (``aqueduct serve --max-batch-bytes``): a row must fit
    under both."""

    def __post_init__(self) -> None:
        Compression.parse(self.compression, "ClientConfig.compression")  # ValueError
        object.__setattr__(self, "decode", check_decode(self.decode, "ClientConfig.decode"))
        given: object = self.transport
        if isinstance(given, str):
            # transport="tcp" (or quic, auto): the choice alone, other settings default.
            choice = cast(Transport, given)
            object.__setattr__(self, "transport", TransportConfig(transport=choice))
        engine = self.transport.engine
        if engine.limits.max_payload_bytes < self.max_batch_bytes:
            # The connection must accept the batches this client accepts (scans of them).
            limits = replace(engine.limits, max_payload_bytes=self.max_batch_bytes)
            engine = replace(engine, limits=limits)
        if engine is not self.transport.engine:
            object.__setattr__(self, "transport", replace(self.transport, engine=engine))

    def connection_config(self) -> TransportConfig:
        """What connections are made with: :attr:`transport`, with scans' batches gathered
        into the process's pooled buffers (``aqueduct_spark.protocol.buffers``) unless its
        engine names its own ``payload_buffers``."""
        transport = self.transport
        if transport.engine.payload_buffers is not None:
            return transport
        # imported here: the pool brings the engine's API (asyncio, ssl), which building a
        # config, as Spark's driver does to check options, must not pay for
        from aqueduct_spark.protocol.buffers import POOL

        return replace(
            transport, engine=replace(transport.engine, payload_buffers=POOL.for_channel)
        )

    @classmethod
    def from_environment(cls, url: str | None = None, **fields: Any) -> ClientConfig:
        """``ClientConfig(url, **fields)``, what is not given taken from the environment as
        the CLI and Spark take it: the URL from ``AQUEDUCT_URL``, the token from
        ``AQUEDUCT_TOKEN``, and (when ``tls`` is not given) the fingerprint to pin from
        ``AQUEDUCT_FINGERPRINT``. ``Client(url, **fields)`` is made this way."""
        url = url or os.environ.get("AQUEDUCT_URL") or None
        if url is None:
            raise ValueError(
                "no service address: give the url (Client('quic://host:4433')) or set "
                "AQUEDUCT_URL; aqueduct serve prints both when it starts"
            )
        if fields.get("token") is None and os.environ.get("AQUEDUCT_TOKEN"):
            fields["token"] = os.environ["AQUEDUCT_TOKEN"]
        if fields.get("tls") is None and os.environ.get("AQUEDUCT_FINGERPRINT"):
            fields["tls"] = ClientTLS(fingerprint=os.environ["AQUEDUCT_FINGERPRINT"])
        return cls(url, **fields)
