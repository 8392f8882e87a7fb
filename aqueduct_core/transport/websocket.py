"""Aqueduct over WebSocket, profile §9: the multiplexer of Aqueduct over TCP (§7) inside the
binary messages of one WebSocket (RFC 6455), for browsers where UDP is blocked.

The TLS/TCP connection is the TCP transport's (``tcp.py``), the HTTP upgrade and the WebSocket
framing are the ``websockets`` library's sans-IO protocol, and the frames inside are the
multiplexer's (``mux.py``), unchanged: :class:`WsMux` *is* a :class:`MuxConnection` whose
bytes go through a WebSocket. Until the upgrade completes only HTTP crosses (the mux's first
SETTINGS waits); each outgoing mux frame then travels as one binary message, and a received
message must hold whole frames (one or more), checked as the bytes pass, without holding a
message: a frame cut by a message's end is a PROTOCOL_VIOLATION.

A server picks WebSocket per connection by ALPN (``http/1.1``, which browsers offer for a
``wss://`` URL, beside ``aqueduct-tcp``). A request that is not the upgrade at the configured
path is answered (by ``responder`` if given: the console's static files; else 404 or the
library's 426) and the connection closed after the answer. The request head is bounded
(``WebSettings.max_http_bytes``), and the handshake deadline that bounds TLS and SETTINGS on
TCP bounds the upgrade too.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from websockets.client import ClientProtocol
from websockets.datastructures import Headers
from websockets.frames import Frame, Opcode
from websockets.http11 import Request, Response
from websockets.protocol import State
from websockets.server import ServerProtocol
from websockets.uri import parse_uri

from aqueduct_core.errors import CloseCode
from aqueduct_core.transport.mux import MuxConnection
from aqueduct_core.transport.mux_wire import (
    HEADER_SIZE,
    MIN_FRAME_SIZE,
    ConnectionClosed,
    MuxEvent,
    MuxProtocolError,
    MuxSettings,
    protocol_error,
)
from aqueduct_core.transport.web_config import WS_SUBPROTOCOL, WebSettings
from aqueduct_core.wire.frames import Payload

log = logging.getLogger("aqueduct.transport")
_ws_log = logging.getLogger("aqueduct.transport.websocket")
"""The library's own records ("connection open" at INFO for every connection): warnings only."""
_ws_log.setLevel(logging.WARNING)

Responder = Callable[[Request, bool], Response | None]
"""Sees every HTTP request on a web port first (the console's: its files, and refusals of a
``Host`` or ``Origin`` it does not serve, upgrade or not), told whether it came over TLS;
None: not its own (the upgrade at the path goes on; anything else is 404)."""


def http_response(
    status: int,
    body: bytes,
    content_type: str = "text/plain; charset=utf-8",
    headers: dict[str, str] | None = None,
) -> Response:
    """A complete HTTP/1.1 answer after which the connection closes."""
    from http import HTTPStatus

    fields = Headers(
        {
            "Content-Type": content_type,
            "Content-Length": str(len(body)),
            "Connection": "close",
            "Cache-Control": "no-store",
            "X-Content-Type-Options": "nosniff",
            **(headers or {}),
        }
    )
    return Response(status, HTTPStatus(status).phrase, fields, body)


class WsMux(MuxConnection):
    """One end of Aqueduct over WebSocket: the multiplexer behind a WebSocket handshake.

    ``authority`` (client): the ``host:port`` the request names. ``responder`` (server): what
    answers plain HTTP requests."""

    def __init__(
        self,
        client: bool,
        settings: MuxSettings | None = None,
        *,
        web: WebSettings,
        authority: str = "",
        responder: Responder | None = None,
        secure: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(client, settings, **kwargs)
        self.web = web
        self.responder = responder
        self.secure = secure
        """The bytes cross TLS (False: plain HTTP on loopback, the console's port)."""
        self.open = False
        self.answered: int | None = None
        """Server: the HTTP status of a request that was not the upgrade (then closed)."""
        self._out: list[bytes] = []
        self._http_bytes = 0
        self._frame_left = 0
        self._head = bytearray()
        max_size = HEADER_SIZE + self.settings.max_frame_size
        ws: ClientProtocol | ServerProtocol
        if client:
            ws = ClientProtocol(
                parse_uri(f"wss://{authority}{web.path}"),
                subprotocols=[WS_SUBPROTOCOL],  # type: ignore[list-item]
                max_size=max_size,
                logger=_ws_log,
            )
            ws.send_request(ws.connect())
        else:
            # A request without Origin is no browser's: always allowed (None in the list).
            origins: Any = None if web.origins is None else [*web.origins, None]
            ws = ServerProtocol(
                subprotocols=[WS_SUBPROTOCOL],  # type: ignore[list-item]
                origins=origins,
                max_size=max_size,
                logger=_ws_log,
            )
        self.ws = ws
        self._drain()

    # -- receiving --------------------------------------------------------------------

    def receive_data(self, data: Payload, now: float) -> list[MuxEvent]:
        if self.closed:
            return []
        ws = self.ws
        if not self.open and not self.client:
            self._http_bytes += len(data)
            if self._http_bytes > self.web.max_http_bytes:
                log.info("HTTP request head over %d bytes: refused", self.web.max_http_bytes)
                self._answer(http_response(431, b"request head too large\n"))
                return []
        ws.receive_data(bytes(data))
        events: list[MuxEvent] = []
        for event in ws.events_received():
            if isinstance(event, Request):
                self._request(event)
            elif isinstance(event, Response):
                self._response(event, events)
            elif isinstance(event, Frame):
                self._frame(event, now, events)
            if self.closed:
                break
        self._drain()
        if ws.state in (State.CLOSING, State.CLOSED) and not self.closed:
            self._lost(ws.parser_exc)
        return events

    def _frame(self, frame: Frame, now: float, events: list[MuxEvent]) -> None:
        op = frame.opcode
        if op is Opcode.TEXT:
            raise self._violation("a text message (Aqueduct sends binary messages only)")
        if op is not Opcode.BINARY and op is not Opcode.CONT:
            return  # PING (the library answers it), PONG, CLOSE (handled after the loop)
        data = memoryview(frame.data)
        self._count_frames(data)
        if frame.fin and (self._frame_left or self._head):
            raise self._violation("a message ended inside a frame (a message holds whole frames)")
        if frame.fin and not len(data) and op is Opcode.BINARY:
            raise self._violation("an empty message")
        events.extend(super().receive_data(data, now))

    def _count_frames(self, data: memoryview) -> None:
        """Follow the frame lengths through the message, to check where it ends."""
        pos, end = 0, len(data)
        while pos < end:
            if self._frame_left:
                step = min(self._frame_left, end - pos)
                self._frame_left -= step
                pos += step
                continue
            take = min(HEADER_SIZE - len(self._head), end - pos)
            self._head += data[pos : pos + take]
            pos += take
            if len(self._head) == HEADER_SIZE:
                self._frame_left = int.from_bytes(self._head[2:6], "big")
                self._head.clear()

    def _violation(self, what: str) -> MuxProtocolError:
        exc = protocol_error(CloseCode.PROTOCOL_VIOLATION, what)
        self.close(int(exc.code), str(exc))
        return exc

    def _lost(self, exc: BaseException | None) -> None:
        """The WebSocket is closing: the peer's close frame (the connection is then lost,
        as a TCP connection that ends without CLOSE), or a frame the library refused, which
        ends the connection with that reason (its close frame says why: 1009 for a message
        larger than 6 + our MAX_FRAME_SIZE)."""
        self._end()
        if exc is None:
            return
        code = (
            CloseCode.LIMIT_VIOLATION
            if self.ws.close_code == 1009
            else CloseCode.PROTOCOL_VIOLATION
        )
        self.close_code = code
        self._drain()
        raise protocol_error(code, f"WebSocket: {exc}")

    # -- the handshake ----------------------------------------------------------------

    def _request(self, request: Request) -> None:
        ws = self.ws
        assert isinstance(ws, ServerProtocol)
        path = request.path.split("?", 1)[0]
        upgrade = "websocket" in request.headers.get("Upgrade", "").lower()
        answer = self.responder(request, self.secure) if self.responder is not None else None
        if answer is None and path != self.web.path:
            answer = http_response(404, b"not found\n")
        if answer is not None or not upgrade:
            self._answer(answer or ws.accept(request))  # accept: 426, not an upgrade
            return
        offered = request.headers.get_all("Sec-WebSocket-Protocol")
        if not any(WS_SUBPROTOCOL in [p.strip() for p in o.split(",")] for o in offered):
            self._answer(
                http_response(400, f"offer the WebSocket subprotocol {WS_SUBPROTOCOL}\n".encode())
            )
            return
        response = ws.accept(request)
        if response.status_code != 101:
            self._answer(response)
            return
        ws.send_response(response)
        self.open = True

    def _answer(self, response: Response) -> None:
        """Answer a request that opens no WebSocket, then close."""
        self.answered = response.status_code
        if isinstance(self.ws, ServerProtocol) and self.ws.state is State.CONNECTING:
            self.ws.send_response(response)
        self._drain()
        self._end()

    def _response(self, response: Response, events: list[MuxEvent]) -> None:
        if response.status_code != 101 or self.ws.state is not State.OPEN:
            reason = f"the server refused the WebSocket upgrade (HTTP {response.status_code})"
            self._end()
            events.append(ConnectionClosed(CloseCode.PROTOCOL_VIOLATION, reason, False))
            return
        self.open = True

    # -- sending ----------------------------------------------------------------------

    def _drain(self) -> None:
        self._out.extend(b for b in self.ws.data_to_send() if b)

    @property
    def has_data(self) -> bool:
        return bool(self._out) or (self.open and super().has_data)

    def data_to_send(self, max_bytes: int = 1 << 20) -> list[bytes | memoryview]:
        ws = self.ws
        if self.open and ws.state is State.OPEN:
            frame: list[bytes | memoryview] = []
            left = 0
            for buf in super().data_to_send(max_bytes):
                if not left:
                    left = HEADER_SIZE + int.from_bytes(bytes(buf[2:6]), "big")
                frame.append(buf)
                left -= len(buf)
                if not left:
                    ws.send_binary(frame[0] if len(frame) == 1 else b"".join(frame))
                    frame = []
            if self.closed:  # our CLOSE went out, or the peer's arrived: RFC 6455's close
                ws.send_close(1000)  # (then the peer's close, if it sends one, is its answer)
            self._drain()
        out, self._out = self._out, []
        return list(out)


def ws_max_message(settings: MuxSettings | None) -> int:
    """The largest message a peer with these settings accepts (before its SETTINGS: the
    smallest MAX_FRAME_SIZE)."""
    return HEADER_SIZE + (settings.max_frame_size if settings is not None else MIN_FRAME_SIZE)
