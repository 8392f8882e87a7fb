"""Aqueduct over WebTransport (HTTP/3), profile §8: what a browser speaks to the UDP port.

A WebTransport session is an HTTP/3 extended CONNECT (``:protocol webtransport``) on the
service's UDP port, negotiated per QUIC connection by ALPN (``h3`` beside ``aqueduct``), and
the session carries what a QUIC connection carries for Aqueduct: unidirectional streams and
datagrams. So the engine runs unchanged and this module only maps names:

- each engine stream is a WebTransport unidirectional stream: the QUIC stream starts with
  the stream type ``0x54`` and the session id (the CONNECT stream's id), then the engine's
  bytes. Our streams keep the engine's order, shifted past the three streams HTTP/3 opens
  first (control, QPACK encoder, QPACK decoder): engine stream ``s`` is QUIC stream
  ``s + offset``. The peer's streams reach the engine under their QUIC ids;
- each engine datagram is an HTTP/3 datagram: the quarter session id, then the engine's bytes;
- a stream reset carries the WebTransport form of application code 0 (``0x52e4a40fa8db``);
- the engine's CLOSE is the session's CLOSE_WEBTRANSPORT_SESSION capsule (its code, reason
  at most 1024 bytes) and the end of the CONNECT stream; the peer's capsule (or the CONNECT
  stream ending without one) is the engine's connection lost, with that code and reason.

HTTP/3 itself (SETTINGS, QPACK, request headers, capsules) is the QUIC library's
``H3Connection``; the session's own streams and datagrams bypass it, so their bytes go to
the engine as they arrive, as on native QUIC. One session per QUIC connection (a browser
opens a connection per ``new WebTransport()``). The limits: the CONNECT must be accepted
within the handshake timeout; HTTP/3 bytes other than the session's are capped
(``WebSettings.max_http_bytes``); the QUIC idle timeout applies as always.

Chromium (156) speaks draft-ietf-webtrans-http3-02: it announces and requires
SETTINGS_ENABLE_WEBTRANSPORT (``0x2b603742``) and H3_DATAGRAM (``0x33``), which both
libraries' HTTP/3 send, sends ``sec-webtransport-http3-draft02: 1``, and takes
``sec-webtransport-http3-draft: draft02`` in the answer. A server announcing only the later
drafts' SETTINGS_WT_MAX_SESSIONS is refused by it. qh3 (2.1) cannot serve it: a client with
zero-length connection ids (Chromium's) fails qh3's transport-parameter check, and its native
core's answers never reach the client. So a server with WebTransport runs on aioquic.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import struct
from collections.abc import Callable
from typing import Any, Literal

from aqueduct_core.api.connection import Connection
from aqueduct_core.engine import CloseConnection, Command, ResetStream, SendDatagram, WriteStream
from aqueduct_core.errors import CloseCode
from aqueduct_core.transport.backends import Backend
from aqueduct_core.transport.config import ETHERNET_PACKET, TransportConfig, resolve_backend
from aqueduct_core.transport.pmtu import set_aioquic_packet_size
from aqueduct_core.transport.quic import protocol_class
from aqueduct_core.transport.web_config import H3_ALPN, WebSettings

log = logging.getLogger("aqueduct.transport")

STREAM_TYPE = 0x54
"""Unidirectional stream type of a WebTransport stream (draft-02 §4.1)."""
BIDI_SIGNAL = 0x41
CLOSE_CAPSULE = 0x2843
"""CLOSE_WEBTRANSPORT_SESSION: a 32-bit code, then a UTF-8 reason of at most 1024 bytes."""
MAX_REASON = 1024
RESET_CODE = 0x52E4A40FA8DB
"""WebTransport application error 0 as an HTTP/3 error code (draft-02 §4.3)."""
STREAM_REJECTED = 0x3994BD84
"""WEBTRANSPORT_BUFFERED_STREAM_REJECTED: a stream for a session we do not have."""
H3_NO_ERROR, H3_EXCESSIVE_LOAD, H3_REQUEST_REJECTED = 0x100, 0x107, 0x10B
DRAFT_HEADER = (b"sec-webtransport-http3-draft", b"draft02")
CLOSE_GRACE = 2.0
"""Seconds a server waits, after its session ended, for the client to close QUIC."""

_OURS, _H3, _REFUSED = 1, 2, 3

_classes: dict[str, type] = {}


def webtransport_backend(config: TransportConfig) -> Literal["aioquic"]:
    """The QUIC library of a server that also serves WebTransport: aioquic, since qh3 2.1
    cannot serve Chromium (see the module docstring). A server asked for qh3 explicitly is
    refused; ``auto`` (or ``AQUEDUCT_BACKEND=qh3``) serves the UDP port with aioquic."""
    if config.backend == "qh3":
        raise ValueError(
            "WebTransport needs the aioquic backend: qh3 2.1 cannot serve browsers (it fails "
            "clients with zero-length connection ids, as Chromium's are); use backend "
            "'aioquic' or 'auto', or turn WebTransport off"
        )
    if resolve_backend(config.backend) == "qh3":
        log.info("WebTransport is on: the UDP port is served by aioquic, not qh3")
    return "aioquic"


def webtransport_class(backend: Backend) -> type:
    """The protocol class for WebTransport (and, on a server, native Aqueduct by ALPN)."""
    cls = _classes.get(backend.name)
    if cls is None:
        cls = _classes[backend.name] = _build(backend)
    return cls


def _varints(backend: Backend) -> tuple[Callable[[int], bytes], Any]:
    module: Any = importlib.import_module(
        "aioquic.buffer" if backend.name == "aioquic" else "qh3._hazmat"
    )
    return module.encode_uint_var, module.Buffer


def close_capsule(encode: Callable[[int], bytes], code: int, reason: str) -> bytes:
    """CLOSE_WEBTRANSPORT_SESSION with ``code`` and ``reason`` cut to 1024 bytes (whole
    characters)."""
    text = reason.encode("utf-8")[:MAX_REASON].decode("utf-8", "ignore").encode("utf-8")
    body = struct.pack(">I", code & 0xFFFFFFFF) + text
    return encode(CLOSE_CAPSULE) + encode(len(body)) + body


class CapsuleReader:
    """The capsules of the CONNECT stream, as they arrive in pieces: CLOSE is kept (code
    and reason, at most 1024 bytes of it), every other capsule skipped unread."""

    def __init__(self, buffer_cls: Any) -> None:
        self._buffer_cls = buffer_cls
        self._head = bytearray()
        self._skip = 0
        self._body: bytearray | None = None
        self._left = 0
        self.closed: tuple[int, str] | None = None

    def feed(self, data: bytes) -> None:
        view = memoryview(data)
        while view and self.closed is None:
            if self._skip:
                n = min(self._skip, len(view))
                self._skip -= n
                view = view[n:]
                continue
            if self._body is not None:
                n = min(self._left, len(view))
                self._body += view[:n]
                self._left -= n
                view = view[n:]
                if not self._left:
                    self._close_capsule(bytes(self._body))
                continue
            self._head += view[:16]
            try:
                buf = self._buffer_cls(data=bytes(self._head))
                ctype, length = buf.pull_uint_var(), buf.pull_uint_var()
            except ValueError:  # BufferReadError: the head is not complete yet
                view = view[min(len(view), 16) :]
                continue
            used = buf.tell() - (len(self._head) - min(len(view), 16))
            view = view[used:]
            self._head.clear()
            if ctype == CLOSE_CAPSULE:
                keep = min(length, 4 + MAX_REASON)
                self._body, self._left, self._skip = bytearray(), keep, length - keep
                if not keep:
                    self._close_capsule(b"")
            else:
                self._skip = length

    def _close_capsule(self, body: bytes) -> None:
        self._body = None
        if len(body) < 4:
            self.closed = (CloseCode.PROTOCOL_VIOLATION, "malformed CLOSE_WEBTRANSPORT_SESSION")
            return
        self.closed = (struct.unpack(">I", body[:4])[0], body[4:].decode("utf-8", "replace"))


def _build(backend: Backend) -> type:
    base: Any = protocol_class(backend)
    ev = backend.events
    h3c: Any = importlib.import_module(f"{backend.name}.h3.connection")
    h3e: Any = importlib.import_module(f"{backend.name}.h3.events")
    encode, buffer_cls = _varints(backend)
    is_aioquic = backend.name == "aioquic"

    class WebTransportProtocol(base):  # type: ignore[misc]
        """A QUIC connection that carries a WebTransport session (ALPN ``h3``) or, on a
        server, native Aqueduct (its own ALPN), decided when the ALPN is negotiated."""

        def __init__(
            self,
            quic: Any,
            stream_handler: Any = None,
            *,
            web: WebSettings,
            authority: str = "",
            **kwargs: Any,
        ) -> None:
            super().__init__(quic, stream_handler, defer=True, **kwargs)
            self.web = web
            self.authority = authority
            self.h3: Any = None
            self.session: int | None = None
            """The CONNECT stream's id, once the session is accepted (client: asked)."""
            self.refused: str | None = None
            """Client: why the server refused the session."""
            self.ready: asyncio.Future[None] = self._loop.create_future()
            self._peer_addr: Any = None
            self._offset = 0
            self._highest = -1
            self._stream_head = b""
            self._datagram_head = b""
            self._incoming: dict[int, bytearray | int] = {}
            """Peer uni streams: their first bytes until classified, then _OURS (the
            session's), _H3 (HTTP/3's own) or _REFUSED (for a session we do not have)."""
            self._http_bytes = 0
            self._capsules = CapsuleReader(buffer_cls)
            self._pending_connect: Any = None
            self._timer_handle: asyncio.TimerHandle | None = None
            self._ended = False
            """The session ended (or the connection was refused): no second one."""
            self._quic_gone = False
            if self.is_client_side:
                self.released: asyncio.Future[None] = self._loop.create_future()
                """Done once the socket closed: ``Connection.wait_closed`` awaits it."""
                self._start_h3()

        # -- deciding what this connection is ------------------------------------------

        def quic_event_received(self, event: Any) -> None:
            if self.h3 is None:
                if type(event) is ev.ProtocolNegotiated and not self.is_client_side:
                    if event.alpn_protocol == H3_ALPN:
                        self._start_h3()
                    else:
                        self.start_connection()
                        super()._size_for_path(self._peer_addr)  # deferred until now
                    return
                if self.conn is not None:
                    super().quic_event_received(event)
                return
            self._h3_event(event)

        def _start_h3(self) -> None:
            self.reset_code = RESET_CODE
            self.h3 = h3c.H3Connection(self._quic, enable_webtransport=True)
            if is_aioquic and self._quic._max_datagram_size > ETHERNET_PACKET:
                # Browsers read packets of at most their max_udp_payload_size (1472),
                # whatever the path (aioquic does not cap itself at the peer's).
                set_aioquic_packet_size(self._quic, ETHERNET_PACKET)
            if not self.is_client_side:
                self._timer_handle = self._loop.call_later(
                    self.config.handshake_timeout, self._no_session
                )

        def _size_for_path(self, addr: Any) -> None:
            """A server's first packet: sized once the ALPN says what the connection is."""
            self._peer_addr = addr
            if self.conn is None:
                self._sized = True
                return
            super()._size_for_path(addr)

        # -- HTTP/3 and the session's own streams ---------------------------------------

        def _h3_event(self, event: Any) -> None:
            kind = type(event)
            now = self._now if self._now is not None else self._loop.time()
            if kind is ev.StreamDataReceived:
                sid = event.stream_id
                if sid & 2 and (sid & 1) == self.is_client_side:  # a peer uni stream
                    self._peer_uni(event, now)
                else:
                    self._to_h3(event)
            elif kind is ev.DatagramFrameReceived:
                data = event.data
                head = self._datagram_head
                if self.engine is not None and data[: len(head)] == head:
                    self.engine.datagram_received(data[len(head) :], now)
                    self._dirty = True
            elif kind is ev.StreamReset:
                state = self._incoming.get(event.stream_id)
                if state == _OURS and self.engine is not None:
                    self.engine.stream_reset(event.stream_id, now)
                    self._dirty = True
                elif state != _REFUSED:
                    self._to_h3(event)
            elif kind is ev.StopSendingReceived:
                sid = event.stream_id
                own = 3 if not self.is_client_side else 2
                if self.session is not None and sid % 4 == own and sid >= self._offset + own:
                    self._apply(sid, ResetStream(sid))
                else:
                    self._to_h3(event)
            elif kind is ev.HandshakeCompleted:
                if not self.pin_holds(event):
                    self._quic.close(error_code=H3_NO_ERROR, reason_phrase="pin mismatch")
                    self._fail("certificate pin mismatch")
                elif self._pending_connect is not None:
                    pending, self._pending_connect = self._pending_connect, None
                    self._request(pending, now)
            elif kind is ev.ConnectionTerminated:
                self._terminated = self._quic_gone = True
                self._cancel_timer()
                if self.is_client_side and self._transport is not None:
                    self._loop.call_soon(self._transport.close)
                reason = event.reason_phrase or f"QUIC connection closed ({event.error_code})"
                if self.engine is not None:
                    self.engine.connection_lost(now, None, reason)
                    self._dirty = True
                self._fail(reason)
            if self._dirty and self._now is None:
                self._update_rtt()
                self.conn._flush()

        def _peer_uni(self, event: Any, now: float) -> None:
            """A peer unidirectional stream's bytes: the session's go to the engine, HTTP/3's
            own to the library, those of a session we do not have are refused."""
            sid, data, fin = event.stream_id, event.data, event.end_stream
            state = self._incoming.get(sid)
            if state == _OURS:
                if self.engine is not None and self.engine.stream_data(sid, data, fin, now):
                    self._dirty = True
                return
            if state == _H3:
                self._to_h3(event)
                return
            if state == _REFUSED:
                self._count(len(data))
                return
            prev = bytes(state) if isinstance(state, bytearray) else b""
            head = prev + data[:16]  # the stream type and session id: two varints
            try:
                buf = buffer_cls(data=head)
                stype = buf.pull_uint_var()
                session = buf.pull_uint_var() if stype == STREAM_TYPE else None
            except ValueError:  # the head is not complete yet (it is under 16 bytes)
                if fin:
                    self._incoming[sid] = _REFUSED
                    self._count(len(head))
                else:
                    self._incoming[sid] = bytearray(head)
                return
            if stype != STREAM_TYPE:
                self._incoming[sid] = _H3
                replay = ev.StreamDataReceived(data=prev + data, end_stream=fin, stream_id=sid)
                self._to_h3(replay)
                return
            if session != self.session or self.engine is None:
                self._incoming[sid] = _REFUSED
                self._count(len(head))
                with contextlib.suppress(Exception):
                    self._quic.stop_stream(sid, STREAM_REJECTED)
                return
            self._incoming[sid] = _OURS
            if self.engine.stream_data(sid, memoryview(data)[buf.tell() - len(prev) :], fin, now):
                self._dirty = True

        def _count(self, n: int) -> bool:
            """Count HTTP/3 bytes; False (and the connection closed) past the limit."""
            self._http_bytes += n
            if self._http_bytes <= self.web.max_http_bytes:
                return True
            if not self._ended:
                self._ended = True
                log.warning(
                    "WebTransport connection from %s closed: more than %d bytes of HTTP/3",
                    self._peer_addr,
                    self.web.max_http_bytes,
                )
                self._quic.close(
                    error_code=H3_EXCESSIVE_LOAD,
                    reason_phrase=f"more than {self.web.max_http_bytes} bytes of HTTP/3 "
                    "(WebSettings.max_http_bytes)",
                )
                self._transmit_soon()
            return False

        def _to_h3(self, event: Any) -> None:
            """Hand HTTP/3 what is its own, counting its bytes against the limit."""
            if not self._count(len(getattr(event, "data", b""))):
                return
            for h3_event in self.h3.handle_event(event):
                kind = type(h3_event)
                if kind is h3e.HeadersReceived:
                    if self.is_client_side:
                        self._response(h3_event)
                    elif not self._quic._handshake_complete:
                        self._pending_connect = h3_event  # 0-RTT: answered once confirmed
                    else:
                        self._request(h3_event, self._loop.time())
                elif kind is h3e.DataReceived and h3_event.stream_id == self.session:
                    self._capsules.feed(h3_event.data)
                    if self._capsules.closed is not None or h3_event.stream_ended:
                        self._session_ended(self._capsules.closed)
                elif kind is h3e.WebTransportStreamDataReceived and self.engine is not None:
                    # Aqueduct has no bidirectional streams (profile §1.2).
                    self.engine.close(
                        self._loop.time(), CloseCode.PROTOCOL_VIOLATION, "bidirectional stream"
                    )
                    self._dirty = True
            if self.session is None and self.is_client_side and self._settings_ok():
                self._send_connect()
            self._transmit_soon()

        # -- the CONNECT --------------------------------------------------------------

        def _settings_ok(self) -> bool:
            settings = getattr(self.h3, "_received_settings", None) or {}
            return bool(settings.get(0x2B603742) == 1 and settings.get(0x33) == 1)

        def _send_connect(self) -> None:
            sid = self._quic.get_next_available_stream_id()
            self.session = sid
            headers = [
                (b":method", b"CONNECT"),
                (b":protocol", b"webtransport"),
                (b":scheme", b"https"),
                (b":authority", self.authority.encode()),
                (b":path", self.web.path.encode()),
                (b"sec-webtransport-http3-draft02", b"1"),
            ]
            self.h3.send_headers(sid, headers)

        def _request(self, event: Any, now: float) -> None:
            sid = event.stream_id
            headers = dict(event.headers)
            path = headers.get(b":path", b"").split(b"?", 1)[0].decode("latin-1")
            origin = headers.get(b"origin")
            status = 200
            if headers.get(b":method") != b"CONNECT" or path != self.web.path:
                status = 404
            elif headers.get(b":protocol") != b"webtransport":
                status = 400
            elif (
                self.web.origins is not None
                and origin is not None
                and (origin.decode("latin-1") not in self.web.origins)
            ):
                status = 403
            elif self.session is not None or self._ended:
                status = 429  # one session per QUIC connection
            if status != 200:
                log.info("WebTransport request for %r from %s: %d", path, self._peer_addr, status)
                self.h3.send_headers(sid, [(b":status", str(status).encode())], end_stream=True)
                return
            self.h3.send_headers(sid, [(b":status", b"200"), DRAFT_HEADER])
            self._cancel_timer()
            self._open_session(sid, now)

        def _response(self, event: Any) -> None:
            if event.stream_id != self.session or self.engine is not None:
                return
            status = dict(event.headers).get(b":status", b"")
            if status != b"200":
                self._fail(f"the server refused the WebTransport session (HTTP {status.decode()})")
                self._quic.close(error_code=H3_NO_ERROR, reason_phrase="session refused")
                return
            self._open_session(event.stream_id, self._loop.time())

        def _open_session(self, sid: int, now: float) -> None:
            self.session = sid
            side = 2 if self.is_client_side else 3
            self._offset = self._quic.get_next_available_stream_id(is_unidirectional=True) - side
            self._stream_head = encode(STREAM_TYPE) + encode(sid)
            self._datagram_head = encode(sid // 4)
            conn = self.start_connection()
            conn.transport = "webtransport"
            conn.peer = tuple(self._peer_addr) if self._peer_addr else None
            self.engine.handshake_done(
                now,
                datagrams=self._quic._remote_max_datagram_frame_size is not None,
                max_datagram=max(0, self.max_datagram_payload() - len(self._datagram_head)),
            )
            self._dirty = True
            if not self.ready.done():
                self.ready.set_result(None)

        def _no_session(self) -> None:
            self._timer_handle = None
            if self.session is None and not self._ended:
                self._ended = True
                log.info("WebTransport connection from %s: no session in time", self._peer_addr)
                self._quic.close(
                    error_code=H3_REQUEST_REJECTED,
                    reason_phrase="no WebTransport session within the handshake timeout "
                    f"({self.config.handshake_timeout:g} s)",
                )
                self.transmit()

        def _cancel_timer(self) -> None:
            if self._timer_handle is not None:
                self._timer_handle.cancel()
                self._timer_handle = None

        def _fail(self, reason: str) -> None:
            if self.refused is None:
                self.refused = reason
            if not self.ready.done():
                self.ready.set_exception(ConnectionError(reason))
                self.ready.exception()

        # -- the end of the session ---------------------------------------------------

        def _session_ended(self, closed: tuple[int, str] | None) -> None:
            """The peer closed the session (capsule) or ended its CONNECT stream."""
            if self.engine is not None and not self._ended:
                code, reason = closed or (None, "the WebTransport session ended without CLOSE")
                self.engine.connection_lost(self._loop.time(), code, reason)
                self._dirty = True
            self._end_quic()

        def _end_quic(self) -> None:
            if not self._quic_gone:
                self._quic_gone = True
                self._quic.close(error_code=H3_NO_ERROR, reason_phrase="session closed")
                self.transmit()
            if self.is_client_side and self._transport is not None:
                self._transport.close()  # a client owns its socket

        # -- engine commands (the Driver protocol) --------------------------------------

        def execute(self, commands: list[Command]) -> None:
            if self.h3 is None:
                super().execute(commands)
                return
            out: list[Command] = []
            for cmd in commands:
                kind = type(cmd)
                if kind is WriteStream or kind is ResetStream:
                    sid = cmd.stream_id  # type: ignore[union-attr]
                    qsid = sid + self._offset
                    if sid > self._highest:
                        self._highest = sid
                        if kind is WriteStream:
                            out.append(WriteStream(qsid, self._stream_head))
                    if kind is WriteStream:
                        out.append(WriteStream(qsid, cmd.data, cmd.fin))  # type: ignore[union-attr]
                    else:
                        out.append(ResetStream(qsid))
                elif kind is SendDatagram:
                    out.append(SendDatagram(self._datagram_head + cmd.data))  # type: ignore[union-attr]
                elif kind is CloseConnection and not self._ended and self.session is not None:
                    self._ended = True
                    capsule = close_capsule(encode, cmd.code, cmd.reason)  # type: ignore[union-attr]
                    with contextlib.suppress(Exception):
                        self.h3.send_data(self.session, capsule, end_stream=True)
                    if not self.is_client_side:
                        self._loop.call_later(CLOSE_GRACE, self._end_quic)
            super().execute(out)

        def _report_backlog(self, held: int = 0) -> None:
            if self.engine is not None:
                super()._report_backlog(held)

        def abort(self) -> None:
            if self.h3 is not None and self.is_client_side and not self._quic_gone:
                # Our capsule must arrive (closing QUIC now would discard it): the server
                # closes QUIC once it has it; after CLOSE_GRACE we close it ourselves.
                self._terminated = True
                self.transmit()
                self._loop.call_later(CLOSE_GRACE, self._end_quic)
                return
            super().abort()

        def connection_lost(self, exc: Exception | None) -> None:
            self._cancel_timer()
            self._quic_gone = True
            released = getattr(self, "released", None)
            if released is not None and not released.done():
                released.set_result(None)
            if self.conn is not None:
                super().connection_lost(exc)
            else:
                self._terminated = True
                self._fail("the UDP socket closed")

    WebTransportProtocol.__name__ = f"WebTransportProtocol[{backend.name}]"
    return WebTransportProtocol


def server_protocol_factory(
    backend: Backend,
    config: TransportConfig,
    web: WebSettings,
    make_connection: Callable[[], Connection],
    pacing: bool,
) -> Callable[..., Any]:
    """What a QUIC server makes per connection when it also serves WebTransport."""
    cls = webtransport_class(backend)

    def create(quic: Any, stream_handler: Any = None) -> Any:
        return cls(
            quic,
            stream_handler,
            web=web,
            config=config,
            make_connection=make_connection,
            pacing=pacing,
        )

    return create
