"""Aqueduct over TLS 1.3 over TCP: the asyncio glue between a socket, TLS (:mod:`.tls_stream`),
the multiplexer (:mod:`.mux`) and the unchanged engine.

One :class:`TcpProtocol` per connection, client or server, from TCP connect (or accept) on.
It drives TLS itself over memory buffers rather than through asyncio's TLS layer, so that a
refused handshake sends its alert (``protocol_version`` for TLS 1.2, ``no_application_protocol``
for a wrong or missing ALPN) and one deadline covers TLS and the peer's SETTINGS (profile §7,
"Connection"). Ciphertext is received with ``BufferedProtocol`` into one reused buffer and
copied into TLS; TLS decrypts straight into a second reused buffer; the multiplexer hands
stream payload out as views of that one and the engine copies what it keeps, so a payload byte
is copied once on the way in, as with asyncio's TLS. On the way out, engine payloads stay
memoryviews until TLS encrypts them (the one copy TLS needs). Nagle is off: the multiplexer
already sends whole frames, and control frames (acks, credit) must not wait for a delayed ACK.

Writes stop when the event loop holds ``write_high_water`` unsent bytes (``pause_writing``)
and resume when it drained; everything waiting in the multiplexer plus the loop's buffer is
reported to the engine, whose senders pause above ``TransportConfig.send_budget``: memory
stays bounded when a peer reads slowly, and a peer that stops reading entirely is closed by
the multiplexer's heartbeat after the idle timeout.

Closing sends the multiplexer's CLOSE, then TLS close_notify, then a TCP FIN, and reads (and
drops) what the peer still sends until it closes too, at most :data:`CLOSE_GRACE`: closing a
socket with unread bytes would send a reset, which can destroy the CLOSE before the peer
reads it.
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
from functools import partial
from typing import Any, cast

from aqueduct_core.api.connection import Connection
from aqueduct_core.api.path import PathSample
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
from aqueduct_core.transport.tcp_info import tcp_path_sample
from aqueduct_core.transport.tls import (
    PinMismatch,
)
from aqueduct_core.transport.tls_stream import (
    PlainStream,
    TlsStream,
    client_context,
    server_context,
)
from aqueduct_core.transport.web_config import HTTP1_ALPN
from aqueduct_core.wire.frames import coalesce

log = logging.getLogger("aqueduct.transport")

CLOSE_GRACE = 2.0
"""Seconds a closing connection waits for the peer to close its side, at most."""
PLAIN_REFUSED = (
    b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain\r\nContent-Length: 55\r\n"
    b"Connection: close\r\n\r\nthis port speaks HTTPS to other machines: use https://\n"
)
"""The answer to plain HTTP from a peer that may not use it (the token would cross in clear)."""
HANDSHAKE_BUFFER = 16384
"""The receive buffer until TLS completes (a ClientHello fits; a connection that never
completes its handshake costs no more)."""

__all__ = ["TcpProtocol", "client_context", "server_context"]


class TcpProtocol(asyncio.BufferedProtocol):
    """One TLS/TCP connection carrying one Aqueduct connection."""

    def __init__(
        self,
        *,
        client: bool,
        settings: TcpSettings,
        send_budget: int,
        make_connection: Callable[[], Connection],
        ctx: ssl.SSLContext,
        handshake_timeout: float,
        server_hostname: str | None = None,
        pin: str | None = None,
        idle_timeout: float | None = None,
        on_open: Callable[[TcpProtocol], None] | None = None,
        on_closed: Callable[[TcpProtocol], None] | None = None,
        websocket: Callable[..., MuxConnection] | None = None,
        alpns: tuple[str | None, ...] = (ALPN,),
        plain: Callable[[Any], bool] | None = None,
    ) -> None:
        self.client = client
        self.settings = settings
        self.send_budget = send_budget
        self.mux_settings = settings.mux
        if idle_timeout is not None and idle_timeout < settings.mux.idle_timeout:
            self.mux_settings = replace(settings.mux, idle_timeout=idle_timeout)
        self.handshake_timeout = handshake_timeout
        self.pin = pin
        self.peer: Any = None
        self._ctx = ctx
        self._server_hostname = server_hostname
        self._on_open = on_open
        self._on_closed = on_closed
        self._websocket = websocket
        """Makes the multiplexer inside a WebSocket (websocket.py) when ALPN is http/1.1."""
        self._alpns = alpns
        self._plain = plain
        """A server port that also takes plain HTTP (the console's): whether this peer may
        (its address in); TLS or not is told by the first byte."""
        self._loop = asyncio.get_running_loop()
        self._make_connection = make_connection
        self.tls_done: asyncio.Future[None] = self._loop.create_future()
        """Done when TLS completed and was checked (ALPN, pin); its error otherwise."""
        # The Aqueduct connection exists from the end of the TLS handshake on: a peer whose
        # handshake fails never gets one.
        self.conn: Connection = None  # type: ignore[assignment]
        self.engine: Engine = None  # type: ignore[assignment]
        self.mux: MuxConnection = None  # type: ignore[assignment]
        self.tls: TlsStream | None = None
        self._raw = memoryview(bytearray(HANDSHAKE_BUFFER))
        self._buffer = memoryview(b"")
        self._transport: asyncio.Transport | None = None
        self._sock: Any = None
        self._deadline = 0.0
        self._paused = False
        self._soon: asyncio.Handle | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        self._batch = False
        self._closing = False
        self._lost = False
        self.released: asyncio.Future[None] = self._loop.create_future()
        """Done once the socket is closed (``connection_lost``): ``Connection.wait_closed``
        awaits it, so a loop that ends right after ``close()`` leaks no socket."""
        self._linger: asyncio.TimerHandle | None = None

    # -- asyncio ------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass of it
        self._transport = transport
        self._deadline = self._loop.time() + self.handshake_timeout
        self.peer = transport.get_extra_info("peername")
        sock = self._sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        transport.set_write_buffer_limits(high=self.settings.write_high_water)
        if self._plain is None:
            self.tls = self._tls_stream()
        if self._on_open is not None:
            self._on_open(self)
        if self.tls is not None:
            self._handshake()
        self._arm_timer()

    def _tls_stream(self) -> TlsStream:
        return TlsStream(
            self._ctx,
            server_side=not self.client,
            server_hostname=self._server_hostname,
            alpns=self._alpns,
        )

    def _first_byte(self, first: int) -> TlsStream | None:
        """A port that takes plain HTTP too: a TLS record starts with 22 (handshake); any
        other first byte is plain HTTP, served only to peers ``plain`` allows (loopback)."""
        assert self._plain is not None and self._transport is not None
        if first == 0x16:
            return self._tls_stream()
        if self._plain(self.peer):
            return PlainStream()
        self._transport.write(PLAIN_REFUSED)
        self._shutdown()
        return None

    def _handshake(self) -> None:
        """Advance TLS; once it completed (and the pin holds), start the multiplexer."""
        tls = self.tls
        assert tls is not None and self._transport is not None
        try:
            done = tls.handshake()
        except ssl.SSLError as exc:
            log.info("TLS handshake with %s failed: %s", self.peer, exc)
            self._flush_tls()  # the alert
            self._fail_tls(exc)
            return
        self._flush_tls()
        if not done:
            return
        if self.pin is not None:
            der = tls.obj.getpeercert(binary_form=True) or b""
            got = hashlib.sha256(der).hexdigest()
            if got != self.pin:
                tls.close()
                self._flush_tls()
                self._fail_tls(
                    PinMismatch(
                        f"the server's certificate has fingerprint {got}, not the pinned "
                        f"{self.pin}; use the fingerprint the service printed when it started"
                    )
                )
                return
        self._start_mux()

    def _fail_tls(self, exc: BaseException) -> None:
        if not self.tls_done.done():
            self.tls_done.set_exception(exc)
            self.tls_done.exception()  # retrieved: a server has nobody waiting
        self._shutdown()

    def _start_mux(self) -> None:
        now = self._loop.time()
        self._raw = memoryview(bytearray(self.settings.read_buffer))
        self._buffer = memoryview(bytearray(self.settings.read_buffer))
        self.conn = self._make_connection()
        self.conn.transport = "tcp"
        self.conn.attach_driver(self)
        self.conn.peer = tuple(self.peer) if self.peer else None
        self.engine = self.conn.engine
        mux: Callable[..., MuxConnection] = MuxConnection
        alpn = self.tls.obj.selected_alpn_protocol() if self.tls is not None else None
        if self._websocket is not None and alpn in (HTTP1_ALPN, None):  # profile §9
            secure = not isinstance(self.tls, PlainStream)
            mux, self.conn.transport = partial(self._websocket, secure=secure), "websocket"
        self.mux = mux(
            self.client,
            self.mux_settings,
            now=now,
            settings_deadline=self._deadline,
            handshake_timeout=self.handshake_timeout,
        )
        if not self.tls_done.done():
            self.tls_done.set_result(None)
        self._pump()

    def _flush_tls(self) -> None:
        assert self.tls is not None and self._transport is not None
        data = self.tls.outgoing()
        if data and not self._transport.is_closing():
            self._transport.write(data)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._raw

    def buffer_updated(self, nbytes: int) -> None:
        tls = self.tls
        if tls is None and self._plain is not None and not self._closing and nbytes:
            tls = self.tls = self._first_byte(self._raw[0])
        if self._closing or tls is None:
            return  # after our close, the peer's bytes are dropped until it closes too
        tls.receive(self._raw[:nbytes])
        if self.mux is None:
            self._handshake()
            if self.mux is None:
                return
        self._read_plaintext(tls)
        self._pump()
        if self.mux is not None and self.mux.next_timer() != self._timer_at:
            self._arm_timer()  # e.g. a PING answered: the next one is due sooner

    def _read_plaintext(self, tls: TlsStream) -> None:
        now = self._loop.time()
        buf = self._buffer
        mux = self.mux
        self._batch = True
        try:
            while not mux.closed:
                try:
                    n = tls.read_into(buf)
                except ssl.SSLError as exc:  # a forged or corrupted record
                    log.warning("TCP connection from %s closed: TLS error %s", self.peer, exc)
                    self._flush_tls()  # TLS's alert; no CLOSE can follow it
                    self._shutdown()
                    mux.close(CloseCode.PROTOCOL_VIOLATION, "")
                    self.engine.connection_lost(now, None, f"TLS failed: {exc}")
                    self.conn._flush()
                    return
                if n:
                    try:
                        events = mux.receive_data(buf[:n], now)
                    except MuxProtocolError as exc:
                        log.warning("TCP connection from %s closed: %s", self.peer, exc)
                        self.engine.connection_lost(now, int(exc.code), str(exc))
                        self.conn._flush()
                        return
                    if self._dispatch(events, now):
                        self.conn._flush()
                if n < len(buf):
                    break
            if tls.eof and not mux.closed:
                self._shutdown()  # close_notify without CLOSE: lost once TCP closes
        finally:
            self._batch = False

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
        for handle in (self._linger, self._timer, self._soon):
            if handle is not None:
                handle.cancel()
        self._linger = self._timer = self._soon = None
        if not self.tls_done.done():
            lost = exc or ConnectionResetError("the peer closed the connection during TLS")
            self.tls_done.set_exception(lost)
            self.tls_done.exception()
        if self.conn is not None:
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

    def path_sample(self) -> PathSample | None:
        """The kernel's counters of this connection (``TCP_INFO``), for the compression
        policy; None where the platform has none."""
        return None if self._lost else tcp_path_sample(self._sock, self._loop.time())

    def abort(self) -> None:
        """The engine ended: send what the multiplexer holds (its CLOSE), then close.

        The socket outlives the engine by the peer's reply time (our FIN, then the peer's);
        a peer that does not close within :data:`CLOSE_GRACE` is cut off (its CLOSE went
        out before)."""
        self._pump()
        self._shutdown()

    def _shutdown(self) -> None:
        """Our close_notify and FIN; the socket closes when the peer closes its side, or
        after :data:`CLOSE_GRACE`."""
        transport = self._transport
        if self._closing or transport is None or self._lost:
            return
        self._closing = True
        for handle in (self._timer, self._soon):
            if handle is not None:
                handle.cancel()
        self._timer = self._soon = None
        if self.tls is not None:
            self.tls.close()
            self._flush_tls()
        if transport.can_write_eof() and not transport.is_closing():
            transport.write_eof()
        else:
            transport.close()
        self._linger = self._loop.call_later(CLOSE_GRACE, self._cut_off)

    def _cut_off(self) -> None:
        self._linger = None
        if self._transport is not None and not self._lost:
            self._transport.abort()

    # -- output -------------------------------------------------------------------------

    def _pump(self) -> None:
        self._soon = None
        transport = self._transport
        mux = self.mux
        if transport is None or mux is None or self._closing or self._lost:
            return
        tls = self.tls
        assert tls is not None
        if mux.closed:
            # CLOSE is tiny and the last thing we send: it goes even when writes are paused.
            transport.write(tls.encrypt(mux.data_to_send()))
            self._shutdown()
            return
        chunk = self.settings.write_chunk
        while not self._paused and mux.has_data:
            bufs = mux.data_to_send(chunk)
            if bufs:
                transport.write(tls.encrypt(coalesce(bufs)))
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
        when = self._deadline if self.mux is None else self.mux.next_timer()
        self._timer_at = when
        if when is not None and not self._lost and not self._closing:
            self._timer = self._loop.call_at(when, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        if self.mux is None:
            log.info(
                "TCP connection from %s closed: TLS not completed within the handshake "
                "timeout (%g s)",
                self.peer,
                self.handshake_timeout,
            )
            self._fail_tls(TimeoutError(f"TLS took longer than {self.handshake_timeout:g} s"))
            return
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
