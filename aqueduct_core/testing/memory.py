"""An in-memory transport: two :class:`~aqueduct_core.api.Connection` objects in one event
loop, joined without QUIC or sockets. For fast unit tests of code built on Aqueduct::

    async with memory_pair() as (client, server):
        tx, rx = channel()
        await client.entrypoint.send({"reply": tx})
        request = await server.entrypoint_receiver.recv()

Everything crosses as the same frames QUIC would carry; only the packets are missing.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from aqueduct_core.api.channel import Receiver
from aqueduct_core.api.codec import Codec
from aqueduct_core.api.connection import Connection, builtin_codecs
from aqueduct_core.api.setup import HeadersHook, client_engine, server_engine
from aqueduct_core.engine import (
    CloseConnection,
    Command,
    EngineConfig,
    ResetStream,
    SendDatagram,
    WriteStream,
)
from aqueduct_core.wire.chanid import ENTRYPOINT


class _MemoryDriver:
    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.peer: Connection | None = None
        self._loop = asyncio.get_running_loop()

    def execute(self, commands: list[Command]) -> None:
        peer = self.peer
        if peer is None:
            return
        for cmd in commands:
            self._loop.call_soon(_deliver, peer, cmd)

    def abort(self) -> None:
        self.peer = None


def _deliver(peer: Connection, cmd: Command) -> None:
    engine, now = peer.engine, peer._now()
    if isinstance(cmd, WriteStream):
        engine.stream_data(cmd.stream_id, bytes(cmd.data), cmd.fin, now)
    elif isinstance(cmd, ResetStream):
        engine.stream_reset(cmd.stream_id, now)
    elif isinstance(cmd, SendDatagram):
        engine.datagram_received(cmd.data, now)
    elif isinstance(cmd, CloseConnection):
        engine.connection_lost(now, cmd.code, cmd.reason)
    peer._flush()


class MemoryPair:
    def __init__(self, client: Connection, server: Connection) -> None:
        self.client = client
        self.server = server
        rx = Receiver[object](None)
        rx._bind(server, ENTRYPOINT)
        self.entrypoint_receiver = rx
        """The server's receiver of the entrypoint channel."""

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter((self.client, self.server))


@asynccontextmanager
async def memory_pair(
    *,
    client_headers: object = (),
    server_headers: HeadersHook | None = None,
    config: EngineConfig | None = None,
    codecs: dict[str, Codec] | None = None,
    max_datagram: int = 1200,
) -> AsyncIterator[MemoryPair]:
    """A connected client and server in this event loop; both closed on exit."""
    codecs = codecs or builtin_codecs()
    client = Connection(client_engine(config, client_headers, codecs), codecs)
    server = Connection(server_engine(config, server_headers, codecs), codecs)
    client.transport = server.transport = "memory"
    cd, sd = _MemoryDriver(client), _MemoryDriver(server)
    cd.peer, sd.peer = server, client
    client.attach_driver(cd)
    server.attach_driver(sd)
    client.engine.handshake_done(client._now(), max_datagram=max_datagram)
    server.engine.handshake_done(server._now(), max_datagram=max_datagram)
    client._flush()
    server._flush()
    await client.wait_ready()
    await server.wait_ready()
    pair = MemoryPair(client, server)
    try:
        yield pair
    finally:
        pair.entrypoint_receiver.close()
        await client.close()
        await server.wait_closed()
