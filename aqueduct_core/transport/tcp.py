"""Aqueduct over TLS 1.3 over TCP: the asyncio glue between a socket, the multiplexer
(:mod:`.mux`) and the unchanged engine.

One :class:`TcpProtocol` per connection, client or server. Bytes are received with
``BufferedProtocol`` into one reused buffer (the TLS layer decrypts straight into it); the
multiplexer hands stream payload out as views of that buffer and the engine copies what it
keeps, so a payload byte is copied once on the way in. On the way out, engine payloads stay
memoryviews until ``writelines`` hands them to TLS, which encrypts them (the one copy TLS
needs). Nagle is off: the multiplexer already sends whole frames, and control frames (acks,
credit) must not wait for a delayed ACK.

Writes stop when the event loop holds ``write_high_water`` unsent bytes (``pause_writing``)
and resume when it drained; everything waiting in the multiplexer plus the loop's buffer is
reported to the engine, whose senders pause above ``TransportConfig.send_budget``: memory
stays bounded when a peer reads slowly, and a peer that stops reading entirely is closed by
the multiplexer's heartbeat after the idle timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import socket
import ssl
from collections.abc import Callable
from dataclasses import replace
from typing import Any, cast

from aqueduct_core.api.connection import Connection
from aqueduct_core.engine import (
    CloseConnection,
    Command,
    ResetStream,
    SendDatagram,
    WriteStream,
)
from aqueduct_core.engine import (
    Connection as Engine,
)
from aqueduct_core.errors import CloseCode
from aqueduct_core.transport.config import TransportConfig
from aqueduct_core.transport.mux import MuxConnection
from aqueduct_core.transport.mux_wire import (
    ALPN,
    ConnectionClosed,
    DatagramReceived,
    MuxEvent,
    MuxProtocolError,
    PeerReady,
    StreamData,
    StreamReset,
    TcpSettings,
)
from aqueduct_core.transport.tls import (
    ClientTLS,
    PinMismatch,
    ServerTLS,
    normalize_fingerprint,
    warn_insecure,
)

log = logging.getLogger("aqueduct.transport")

SMALL = 4096
"""Adjacent buffers below this size are joined before TLS (one record, not one each)."""
CLOSE_GRACE = 2.0
"""Seconds a closing connection waits for the peer's half of the TLS close, at most."""


def client_context(tls: ClientTLS, host: str) -> ssl.SSLContext:
    """TLS 1.3 only, ALPN ``aqueduct-tcp``; verification as on QUIC (CA file, pin or none).

    With a pin (or ``insecure``) no CA is consulted, so the system's CA store is not loaded:
    parsing it cost 20-170 ms of CPU per connection here, paid by every Spark task."""
    if tls.fingerprint is not None or tls.insecure:
        if tls.insecure:
            warn_insecure(host)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE  # the pin is checked after the handshake
    else:
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
        if tls.cafile is not None or tls.cadata is not None:
            ctx.load_verify_locations(cafile=tls.cafile, cadata=tls.cadata)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.set_alpn_protocols([ALPN])
    return ctx


def server_context(tls: ServerTLS) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.set_alpn_protocols([ALPN])
    ctx.load_cert_chain(tls.certfile, tls.keyfile)
    return ctx


class TcpProtocol(asyncio.BufferedProtocol):
    """One TLS/TCP connection carrying one Aqueduct connection."""

    def __init__(
        self,
        *,
        client: bool,
        settings: TcpSettings,
        send_budget: int,
        make_connection: Callable[[], Connection],
        pin: str | None = None,
        idle_timeout: float | None = None,
        on_open: Callable[[TcpProtocol], None] | None = None,
        on_closed: Callable[[TcpProtocol], None] | None = None,
    ) -> None:
        self.client = client
        self.settings = settings
        self.send_budget = send_budget
        self.mux_settings = settings.mux
        if idle_timeout is not None and idle_timeout < settings.mux.idle_timeout:
            self.mux_settings = replace(settings.mux, idle_timeout=idle_timeout)
        self.pin = pin
        self.pin_error: PinMismatch | None = None
        self.peer: Any = None
        self._on_open = on_open
        self._on_closed = on_closed
        self._loop = asyncio.get_running_loop()
        self._make_connection = make_connection
        # The Aqueduct connection exists from the end of the TLS handshake on: a peer whose
        # handshake fails never gets one (asyncio drops this object, nothing else holds it).
        self.conn: Connection = None  # type: ignore[assignment]
        self.engine: Engine = None  # type: ignore[assignment]
        self.mux: MuxConnection = None  # type: ignore[assignment]
        self._buffer = memoryview(bytearray(settings.read_buffer))
        self._transport: asyncio.Transport | None = None
        self._paused = False
        self._soon: asyncio.Handle | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._batch = False
        self._lost = False
        self.released: asyncio.Future[None] = self._loop.create_future()
        """Done once the socket is closed (``connection_lost``): ``Connection.wait_closed``
        awaits it, so a loop that ends right after ``close()`` leaks no socket."""
        self._linger: asyncio.TimerHandle | None = None

    # -- asyncio ------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.conn = self._make_connection()
        self.conn.transport = "tcp"
        self.conn.attach_driver(self)
        self.engine = self.conn.engine
        self.mux = MuxConnection(self.client, self.mux_settings, now=self._loop.time())
        if self._on_open is not None:
            self._on_open(self)
        transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass of it
        self._transport = transport
        self.peer = transport.get_extra_info("peername")
        self.conn.peer = tuple(self.peer) if self.peer else None
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        transport.set_write_buffer_limits(high=self.settings.write_high_water)
        sslobj = transport.get_extra_info("ssl_object")
        alpn = sslobj.selected_alpn_protocol() if sslobj is not None else None
        if alpn != ALPN:
            self._fail_now(f"the peer did not negotiate ALPN {ALPN!r} (got {alpn!r})")
            return
        if self.pin is not None:
            der = sslobj.getpeercert(binary_form=True) or b""
            got = hashlib.sha256(der).hexdigest()
            if got != self.pin:
                self.pin_error = PinMismatch(
                    f"the server's certificate has fingerprint {got}, not the pinned {self.pin}; "
                    "use the fingerprint the service printed when it started"
                )
                self._fail_now("certificate pin mismatch")
                return
        self._pump()
        self._arm_timer()

    def _fail_now(self, reason: str) -> None:
        log.info("TCP connection from %s refused: %s", self.peer, reason)
        self.mux.close(CloseCode.PROTOCOL_VIOLATION, reason)
        self.engine.connection_lost(self._loop.time(), CloseCode.PROTOCOL_VIOLATION, reason)
        self.conn._flush()
        assert self._transport is not None
        self._transport.abort()

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._buffer

    def buffer_updated(self, nbytes: int) -> None:
        now = self._loop.time()
        self._batch = True
        try:
            try:
                events = self.mux.receive_data(self._buffer[:nbytes], now)
            except MuxProtocolError as exc:
                log.warning("TCP connection from %s closed: %s", self.peer, exc)
                self.engine.connection_lost(now, int(exc.code), str(exc))
                self.conn._flush()
                return
            if self._dispatch(events, now):
                self.conn._flush()
        finally:
            self._batch = False
        self._pump()

    def _dispatch(self, events: list[MuxEvent], now: float) -> bool:
        engine = self.engine
        dirty = False
        for ev in events:
            kind = type(ev)
            if kind is StreamData:
                if engine.stream_data(ev.stream_id, ev.data, ev.fin, now):  # type: ignore[union-attr]
                    dirty = True
                continue
            dirty = True
            if kind is DatagramReceived:
                engine.datagram_received(ev.data, now)  # type: ignore[union-attr, arg-type]
            elif kind is StreamReset:
                engine.stream_reset(ev.stream_id, now)  # type: ignore[union-attr]
            elif kind is PeerReady:
                peer = ev.settings  # type: ignore[union-attr]
                # A peer that takes no datagrams (MAX_DATAGRAM 0) is fine over TCP: every
                # unreliable message then goes on a stream, as one too large would.
                engine.handshake_done(now, datagrams=True, max_datagram=peer.max_datagram)
                self._arm_timer()  # the peer's idle timeout may be shorter than ours
            elif kind is ConnectionClosed:
                engine.connection_lost(now, ev.code, ev.reason)  # type: ignore[union-attr]
        return dirty

    def eof_received(self) -> bool:
        return False  # close our side too

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        self._pump()

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        if not self.released.done():
            self.released.set_result(None)
        if self._linger is not None:
            self._linger.cancel()
            self._linger = None
        if self.conn is None:
            return  # the TLS handshake never completed
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._soon is not None:
            self._soon.cancel()
            self._soon = None
        if not self.mux.closed:
            self.mux.close(CloseCode.INTERNAL, "")
        reason = "the TCP connection closed without CLOSE"
        if exc is not None:
            reason += f" ({exc})"
        self.engine.connection_lost(self._loop.time(), None, reason)
        self.conn._flush()
        if self._on_closed is not None:
            self._on_closed(self)

    # -- engine commands (the Driver protocol) -------------------------------------------

    def execute(self, commands: list[Command]) -> None:
        mux = self.mux
        for cmd in commands:
            kind = type(cmd)
            if kind is WriteStream:
                mux.write(cmd.stream_id, cmd.data, cmd.fin)  # type: ignore[union-attr]
            elif kind is SendDatagram:
                mux.send_datagram(cmd.data)  # type: ignore[union-attr, arg-type]
            elif kind is ResetStream:
                mux.reset(cmd.stream_id)  # type: ignore[union-attr]
            elif kind is CloseConnection:
                mux.close(cmd.code, cmd.reason)  # type: ignore[union-attr]
        if not self._batch and self._soon is None:
            self._soon = self._loop.call_soon(self._pump)

    def abort(self) -> None:
        """The engine ended: send what the multiplexer holds (its CLOSE), then close.

        Closing TLS is a round trip (our close_notify, then the peer's), so the socket
        outlives the engine by the peer's reply time; a peer that does not answer within
        :data:`CLOSE_GRACE` is cut off (its CLOSE went out before)."""
        self._pump()
        transport = self._transport
        if transport is None or self._lost:
            return
        # Never close twice: asyncio's TLS transport forgets its protocol on a second close()
        # and could then not be aborted.
        if not transport.is_closing():
            transport.close()
        if self._linger is None:
            self._linger = self._loop.call_later(CLOSE_GRACE, self._cut_off)

    def _cut_off(self) -> None:
        self._linger = None
        if self._transport is not None and not self._lost:
            self._transport.abort()

    # -- output -------------------------------------------------------------------------

    def _pump(self) -> None:
        self._soon = None
        transport = self._transport
        if transport is None or self._lost or transport.is_closing():
            return
        mux = self.mux
        chunk = self.settings.write_chunk
        if mux.closed:
            # CLOSE is tiny and the last thing we send: it goes even when writes are paused.
            transport.writelines(mux.data_to_send())
            if not transport.is_closing():
                transport.close()
            return
        while not self._paused and mux.has_data:
            bufs = mux.data_to_send(chunk)
            if bufs:
                transport.writelines(_coalesce(bufs))
        if mux.closed:
            self._pump()
            return
        backlog = mux.buffered + transport.get_write_buffer_size()
        if self.engine.set_transport_backlog(backlog, self.send_budget):
            self.conn._flush()
            if mux.has_data and not self._paused and self._soon is None:
                self._soon = self._loop.call_soon(self._pump)

    # -- timers -------------------------------------------------------------------------

    def _arm_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        when = self.mux.next_timer()
        if when is not None and not self._lost:
            self._timer = self._loop.call_at(when, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        now = self._loop.time()
        events = self.mux.handle_timer(now)
        if events:
            for ev in events:
                if isinstance(ev, ConnectionClosed):
                    log.warning("TCP connection to %s closed: %s", self.peer, ev.reason)
            self._dispatch(events, now)
            self.conn._flush()
        self._pump()
        self._arm_timer()


def _coalesce(bufs: list[bytes | memoryview]) -> list[bytes | memoryview]:
    """Join runs of small buffers (frame headers, control frames) so TLS makes one record of
    them; large payload views pass untouched."""
    out: list[bytes | memoryview] = []
    run: list[bytes | memoryview] = []
    for b in bufs:
        if len(b) < SMALL:
            run.append(b)
            continue
        if run:
            out.append(run[0] if len(run) == 1 else b"".join(run))
            run = []
        out.append(b)
    if run:
        out.append(run[0] if len(run) == 1 else b"".join(run))
    return out


def pin_of(tls: ClientTLS) -> str | None:
    return normalize_fingerprint(tls.fingerprint) if tls.fingerprint is not None else None


async def connect_tcp(
    host: str,
    port: int,
    *,
    make_connection: Callable[[], Connection],
    tls: ClientTLS,
    config: TransportConfig,
) -> Connection:
    """Open TLS/TCP to ``host:port`` and return the Aqueduct connection once its handshake
    completed. Raises OSError/ssl.SSLError/TimeoutError/ConnectionLost/PinMismatch; the
    caller words them for the user (``dial.connect``)."""
    loop = asyncio.get_running_loop()
    ctx = client_context(tls, host)
    protocol: TcpProtocol | None = None

    def factory() -> TcpProtocol:
        nonlocal protocol
        protocol = TcpProtocol(
            client=True,
            settings=config.tcp,
            send_budget=config.send_budget,
            make_connection=make_connection,
            pin=pin_of(tls),
            idle_timeout=config.idle_timeout,
        )
        return protocol

    # Shielded: cancelling create_connection during the TLS handshake leaks its socket
    # transport on Python 3.11 (an "unclosed transport" warning and an fd until GC). A
    # cancelled attempt (the loser of a race) runs on and is aborted once it finishes.
    attempt = asyncio.ensure_future(
        loop.create_connection(
            factory,
            host,
            port,
            ssl=ctx,
            server_hostname=tls.server_name or host,
            ssl_handshake_timeout=config.handshake_timeout,
        )
    )
    try:
        transport, _ = await asyncio.shield(attempt)
    except asyncio.CancelledError:
        attempt.add_done_callback(_abort_when_done)
        raise
    assert protocol is not None
    try:
        await asyncio.wait_for(protocol.conn.wait_ready(), config.handshake_timeout)
    except BaseException:
        transport.abort()
        if protocol.pin_error is not None:
            raise protocol.pin_error from None
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
            if transport is not None and not transport.is_closing():
                transport.abort()  # those already closing are sending their CLOSE


async def listen_tcp(
    host: str,
    port: int,
    *,
    tls: ServerTLS,
    make_connection: Callable[[], Connection],
    config: TransportConfig,
    reuse_port: bool = False,
) -> TcpListener:
    """Listen for Aqueduct over TLS/TCP on ``host:port`` (a port already used by the QUIC
    side is fine: TCP and UDP ports are separate)."""
    loop = asyncio.get_running_loop()
    ctx = server_context(tls)
    protocols: set[TcpProtocol] = set()

    def factory() -> TcpProtocol:
        proto = TcpProtocol(
            client=False,
            settings=config.tcp,
            send_budget=config.send_budget,
            make_connection=make_connection,
            idle_timeout=config.idle_timeout,
            on_open=protocols.add,
            on_closed=protocols.discard,
        )
        return proto

    server = await loop.create_server(
        factory,
        host,
        port,
        ssl=ctx,
        ssl_handshake_timeout=config.handshake_timeout,
        reuse_address=True,
        reuse_port=reuse_port or None,
        backlog=1024,
    )
    return TcpListener(server, protocols)
