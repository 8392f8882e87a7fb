"""How to reach and talk to a dataset service: :class:`ClientConfig`.

Its field defaults are the single source of the client's defaults: the Spark options, the
CLI and the docs' table (checked by ``tests/test_docs.py``) read them from here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import cast

from aqueduct_core.transport import ClientTLS, TransportConfig
from aqueduct_core.transport.config import Transport

CHUNK_BYTES = 8 * 1024 * 1024
"""Batches bigger than this are sent as several slices (Arrow slices are zero-copy)."""


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
    """Seconds to wait for a reply to a request (not for a whole scan or write)."""
    compression: str = "none"
    """IPC body compression for data channels: none (best on loopback), lz4, zstd."""
    chunk_bytes: int = CHUNK_BYTES

    def __post_init__(self) -> None:
        given: object = self.transport
        if isinstance(given, str):
            # transport="tcp" (or quic, auto): the choice alone, other settings default.
            choice = cast(Transport, given)
            object.__setattr__(self, "transport", TransportConfig(transport=choice))
