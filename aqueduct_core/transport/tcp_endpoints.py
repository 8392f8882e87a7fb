"""Opening and accepting Aqueduct over TLS/TCP (and over WebSocket, profile §9): the client's
connect and the server's listener around :class:`~aqueduct_core.transport.tcp.TcpProtocol`."""

from __future__ import annotations

import asyncio
import ipaddress
from collections.abc import Callable
from functools import partial
from typing import Any

from aqueduct_core.api.connection import Connection
from aqueduct_core.transport.config import TransportConfig
from aqueduct_core.transport.mux_wire import ALPN
from aqueduct_core.transport.tcp import TcpProtocol
from aqueduct_core.transport.tls import ClientTLS, ServerTLS, normalize_fingerprint
from aqueduct_core.transport.tls_stream import client_context, server_context
from aqueduct_core.transport.web_config import HTTP1_ALPN
from aqueduct_core.transport.websocket import Responder, WsMux


def pin_of(tls: ClientTLS) -> str | None:
    return normalize_fingerprint(tls.fingerprint) if tls.fingerprint is not None else None


async def connect_tcp(
    host: str,
    port: int,
    *,
    make_connection: Callable[[], Connection],
    tls: ClientTLS,
    config: TransportConfig,
    websocket: bool = False,
) -> Connection:
    """Open TLS/TCP to ``host:port`` and return the Aqueduct connection once its handshake
    completed (``websocket``: inside a WebSocket, profile §9). Raises OSError/ssl.SSLError/
    TimeoutError/ConnectionLost/PinMismatch; the caller words them for the user
    (``dial.connect``)."""
    loop = asyncio.get_running_loop()
    alpn = HTTP1_ALPN if websocket else ALPN
    ctx = client_context(tls, host, alpn)
    protocol: TcpProtocol | None = None
    ws = partial(WsMux, web=config.web, authority=f"{host}:{port}") if websocket else None

    def factory() -> TcpProtocol:
        nonlocal protocol
        protocol = TcpProtocol(
            client=True,
            settings=config.tcp,
            send_budget=config.send_budget,
            make_connection=make_connection,
            ctx=ctx,
            handshake_timeout=config.handshake_timeout,
            server_hostname=tls.server_name or host,
            pin=pin_of(tls),
            idle_timeout=config.idle_timeout,
            websocket=ws,
            alpns=(alpn,),
        )
        return protocol

    # Shielded: a cancelled attempt (the loser of a race) runs on and is aborted once it
    # finishes, so its socket is never left to the garbage collector.
    attempt = asyncio.ensure_future(loop.create_connection(factory, host, port))
    try:
        transport, _ = await asyncio.shield(attempt)
    except asyncio.CancelledError:
        attempt.add_done_callback(_abort_when_done)
        raise
    assert protocol is not None
    try:
        await protocol.tls_done  # TLS, ALPN and the pin; TimeoutError past the deadline
        await asyncio.wait_for(protocol.conn.wait_ready(), config.handshake_timeout)
    except BaseException:
        transport.abort()
        raise
    return protocol.conn


def _abort_when_done(attempt: asyncio.Future[tuple[asyncio.Transport, Any]]) -> None:
    """Close the connection a cancelled attempt opened anyway (or swallow its error)."""
    if attempt.cancelled() or attempt.exception() is not None:
        return
    attempt.result()[0].abort()


class TcpListener:
    """The TCP side of a server: accepted connections and their handshakes."""

    def __init__(self, server: asyncio.Server, protocols: set[TcpProtocol]) -> None:
        self.server = server
        self.protocols = protocols

    def close(self) -> None:
        self.server.close()
        for proto in list(self.protocols):
            transport = proto._transport
            if transport is not None and not proto._closing and not transport.is_closing():
                transport.abort()  # those already closing are sending their CLOSE


async def listen_tcp(
    host: str,
    port: int,
    *,
    tls: ServerTLS,
    make_connection: Callable[[], Connection],
    config: TransportConfig,
    reuse_port: bool = False,
    responder: Responder | None = None,
) -> TcpListener:
    """Listen for Aqueduct over TLS/TCP on ``host:port`` (a port already used by the QUIC
    side is fine: TCP and UDP ports are separate), and over WebSocket there too when
    ``config.web.websocket`` is on (ALPN ``http/1.1`` or none).

    With ``responder`` it is a web port instead (the console's): HTTPS with ALPN
    ``http/1.1`` or none, and plain HTTP from loopback peers (a page from
    ``http://localhost`` is a secure context, and nothing crosses a network in clear);
    ``responder`` answers plain requests, ``/aqueduct`` upgrades to Aqueduct over WebSocket."""
    loop = asyncio.get_running_loop()
    web = config.web.websocket or responder is not None
    # With WebSocket on, a client offering no ALPN is served as HTTP/1.1: browsers offer
    # http/1.1, but WebSocket libraries (Python's websockets among them) offer nothing,
    # and an Aqueduct client over TCP always offers aqueduct-tcp.
    alpns: tuple[str | None, ...] = (ALPN, HTTP1_ALPN, None) if web else (ALPN,)
    plain = None
    if responder is not None:
        alpns, plain = (HTTP1_ALPN, None), is_loopback_peer
    ctx = server_context(tls, alpns)
    protocols: set[TcpProtocol] = set()
    ws = partial(WsMux, web=config.web, responder=responder) if web else None

    def factory() -> TcpProtocol:
        proto = TcpProtocol(
            client=False,
            settings=config.tcp,
            send_budget=config.send_budget,
            make_connection=make_connection,
            ctx=ctx,
            handshake_timeout=config.handshake_timeout,
            idle_timeout=config.idle_timeout,
            on_open=protocols.add,
            on_closed=protocols.discard,
            websocket=ws,
            alpns=alpns,
            plain=plain,
        )
        return proto

    server = await loop.create_server(
        factory,
        host,
        port,
        reuse_address=True,
        reuse_port=reuse_port or None,
        backlog=1024,
    )
    return TcpListener(server, protocols)


def is_loopback_peer(peer: Any) -> bool:
    """Whether a TCP peer address (host, port, ...) is this machine's loopback."""
    try:
        address = ipaddress.ip_address(str(peer[0]).split("%")[0]) if peer else None
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped  # 127.0.0.1 on a dual-stack socket (--host ::)
    return address is not None and address.is_loopback
