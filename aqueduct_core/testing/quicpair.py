"""A client and server joined over real QUIC on loopback, shaped like
:func:`aqueduct_core.testing.memory.memory_pair` so one test body runs over both."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Literal

from aqueduct_core.api.channel import Receiver
from aqueduct_core.api.connection import Connection
from aqueduct_core.api.setup import HeadersHook
from aqueduct_core.engine import EngineConfig
from aqueduct_core.transport import TransportConfig, connect, serve
from aqueduct_core.transport.config import Backend


class QuicPair:
    def __init__(self, client: Connection, server: Connection, rx: Receiver[Any]) -> None:
        self.client = client
        self.server = server
        self.entrypoint_receiver = rx


@asynccontextmanager
async def quic_pair(
    server_backend: Backend | Literal["tcp"] = "auto",
    client_backend: Backend | Literal["tcp"] = "auto",
    *,
    client_headers: object = (),
    server_headers: HeadersHook | None = None,
    config: EngineConfig | None = None,
    transport: TransportConfig | None = None,
    via: tuple[str, int] | None = None,
) -> AsyncIterator[QuicPair]:
    """Serve on 127.0.0.1:0 and connect to it (through ``via`` = (host, port) of a proxy
    that forwards to the server, when given). Both ends are closed on exit. Over QUIC,
    unless ``transport`` chooses ``tcp`` (Aqueduct over TLS/TCP; the backends then do not
    matter)."""
    base = transport or TransportConfig()
    if "tcp" in (server_backend, client_backend):
        # "tcp" as a backend: the same pair over TLS/TCP, so a test parametrized over
        # backends runs over both transports with one more parameter.
        base = base.with_(transport="tcp")
        server_backend = client_backend = "auto"
    elif base.transport == "auto":
        base = base.with_(transport="quic")
    if config is not None:
        base = base.with_(engine=config)
    accepted: asyncio.Future[tuple[Connection, Receiver[Any]]] = (
        asyncio.get_running_loop().create_future()
    )
    done = asyncio.Event()

    async def handler(conn: Connection, rx: Receiver[Any]) -> None:
        accepted.set_result((conn, rx))
        await done.wait()

    server = await serve(handler, headers=server_headers, config=base.with_(backend=server_backend))
    try:
        host, port = via if via is not None else ("127.0.0.1", server.port)
        client = await connect(
            host,
            port,
            headers=client_headers,
            tls=server.client_tls(),
            config=base.with_(backend=client_backend),
        )
        try:
            server_conn, rx = await asyncio.wait_for(accepted, 10)
            yield QuicPair(client, server_conn, rx)
        finally:
            done.set()
            await client.close()
    finally:
        await server.close()
