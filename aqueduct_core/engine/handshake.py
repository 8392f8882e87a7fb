"""The Aqueduct handshake: VERSION, ACK_VERSION and CONNECTION_HEADERS (§2.2, §2.3, §2.11).

The layer of :class:`~aqueduct_core.engine.Connection` that starts when QUIC says so (its
handshake completed, or 0-RTT keys are in place) and ends when the peer's CONNECTION_HEADERS
arrive. Until then nothing is acted on: input that comes before the start is held (§2.11),
and bytes that come before the peer's headers are capped (G26). Flow control (§3.4) is
negotiated here, by the ``aqueduct-flow`` header of both sides.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from aqueduct_core.engine.channels import ChannelTables
from aqueduct_core.engine.config import EngineConfig
from aqueduct_core.engine.endpoint import Endpoint
from aqueduct_core.engine.events import HeadersReceived
from aqueduct_core.engine.flow import (
    ENTRY_WINDOW_HEADER,
    FLOW_HEADER,
    encode_window,
    parse_window,
)
from aqueduct_core.engine.receiver import ReceiverSM
from aqueduct_core.errors import CloseCode, RemoteProtocolError
from aqueduct_core.wire.chanid import ENTRYPOINT, Side
from aqueduct_core.wire.frames import (
    AckVersion,
    ConnectionHeaders,
    Version,
    encode_frame,
    push_frame,
)
from aqueduct_core.wire.primitives import Headers, check_headers

HeaderPairs = Iterable[tuple[bytes, bytes]]
ServerHeaders = Callable[[Headers], HeaderPairs]
"""A server's connection headers, chosen from the client's (raise to refuse the client)."""


class Handshake(ChannelTables):
    """Handshake state of one connection."""

    def __init__(
        self,
        side: Side,
        config: EngineConfig | None,
        headers: HeaderPairs,
        server_headers: ServerHeaders | None,
    ) -> None:
        super().__init__(side, config)
        self._own_headers = check_headers(headers, "connection headers")
        self._server_headers = server_headers
        self._handshake_complete = False
        self._early: list[Callable[[], object]] = []
        """Input that arrived before the start, replayed by :meth:`_start`."""
        self._early_bytes = 0
        self.sent_ack_version = False
        self._need_ack_version = False
        self._sent_headers = False
        self.peer_headers: Headers | None = None

    # == transport inputs ==================================================================

    def handshake_done(
        self, now: float, *, datagrams: bool = True, max_datagram: int | None = None
    ) -> None:
        """The QUIC handshake completed. ``max_datagram`` is the largest DATAGRAM payload."""
        if self.closed or self._handshake_complete:
            return
        self.now = now
        self._handshake_complete = True
        if max_datagram is not None:
            self.max_datagram = max_datagram
        if not datagrams:
            self._fail(RemoteProtocolError("the peer does not support QUIC datagrams (RFC 9221)"))
            return
        self._start()

    def early_data(self, now: float) -> None:
        """0-RTT keys are in place before the handshake completes (profile §2.11).

        Client: VERSION and CONNECTION_HEADERS go out now and the application may send, as
        after :meth:`handshake_done`. Server: stream and datagram input is processed at once
        instead of being held until :meth:`handshake_done`; the application decides what is
        safe to act on before :attr:`handshake_confirmed`. Rejected 0-RTT is the transport's
        to repair (it resends the stream data on new streams); the engine does not see it."""
        if self.closed or self._handshake_complete or self._early_ok:
            return
        self.now = now
        self._start()

    @property
    def handshake_confirmed(self) -> bool:
        """The QUIC handshake completed: input is no 0-RTT replay (§2.11)."""
        return self._handshake_complete

    @property
    def handshake_complete(self) -> bool:
        return self.peer_headers is not None

    @property
    def own_headers(self) -> Headers:
        """Our connection headers (for a server: once the client's headers were answered)."""
        return self._own_headers

    def _start(self) -> None:
        """Begin the Aqueduct handshake, once: at 0-RTT or at QUIC handshake completion."""
        if self._early_ok:
            self._pump_all()
            return
        self._early_ok = True
        self.schedule(self.config.handshake_timeout, self._handshake_timer)
        if self.side is Side.CLIENT:
            headers = self._with_flow(self._own_headers)
            self.write(
                self.open_stream(),
                self._version_bytes + encode_frame(ConnectionHeaders(headers)),
                True,
            )
            self._sent_headers = True
        early, self._early = self._early, []
        for replay in early:
            replay()
        self._pump_all()

    def _count_early(self, nbytes: int) -> bool:
        """Bytes received before the peer's CONNECTION_HEADERS are capped (G26): they are
        held (or parsed) before we know the peer is one we serve. False once over the cap."""
        if self.peer_headers is not None:
            return True
        self._early_bytes += nbytes
        if self._early_bytes <= self.config.max_early_bytes:
            return True
        self._fail(
            RemoteProtocolError(
                f"more than {self.config.max_early_bytes} bytes arrived before the peer's "
                "CONNECTION_HEADERS",
                CloseCode.LIMIT_VIOLATION,
            )
        )
        return False

    # == handshake frames ==================================================================

    def _with_flow(self, headers: Headers) -> Headers:
        window = self.config.flow_window
        if window is None:
            return headers
        headers = (*headers, (FLOW_HEADER, encode_window(window)))
        entry = self.config.entry_window
        if self.side is Side.SERVER and entry is not None and entry < window:
            headers = (*headers, (ENTRY_WINDOW_HEADER, encode_window(entry)))
        return headers

    def _on_version(self, frame: Version) -> None:
        if frame.version != self.config.version:
            raise RemoteProtocolError(
                f"unsupported Aqueduct version {frame.version!r} (we speak {self.config.version!r})",
                CloseCode.UNSUPPORTED_VERSION,
            )
        if not self.sent_ack_version:
            self.sent_ack_version = True
            self._need_ack_version = True

    def _on_headers(self, frame: ConnectionHeaders) -> None:
        """The peer's CONNECTION_HEADERS: negotiate flow control; a server answers with its
        own and opens the entrypoint. The routed frames that waited for them are the caller's
        to release."""
        if self.peer_headers is not None:
            raise RemoteProtocolError("a second CONNECTION_HEADERS")
        self.peer_headers = frame.headers
        peer_window = parse_window(frame.headers)
        if peer_window is None and self.config.require_flow_control:
            raise RemoteProtocolError(
                "the peer does not take part in flow control (no aqueduct-flow header); "
                "this endpoint requires it: upgrade the peer's Aqueduct library",
                CloseCode.LIMIT_VIOLATION,
            )
        if peer_window is not None and self.config.flow_window is not None:
            self.peer_window = peer_window
            self.own_window = self.config.flow_window
            entry = parse_window(frame.headers, ENTRY_WINDOW_HEADER)
            sender = self.senders.get(ENTRYPOINT)
            if entry is not None and self.side is Side.CLIENT and sender is not None:
                sender.window_cap = entry  # the server's requests ahead: our credit
        else:
            self.peer_window = None
        if self.side is Side.SERVER:
            own = self._own_headers
            if self._server_headers is not None:
                try:
                    own = check_headers(self._server_headers(frame.headers), "server headers")
                except Exception as exc:  # the application refused this client
                    raise RemoteProtocolError(
                        f"connection refused by the server: {exc}", CloseCode.INTERNAL
                    ) from exc
            self._own_headers = self._with_flow(own)
            rm = self.receivers[ENTRYPOINT] = ReceiverSM(self, ENTRYPOINT, False)
            cap = self.config.entry_window
            if self.own_window is not None and cap is not None and cap < self.own_window:
                rm.window_cap = cap
            self.endpoints[ENTRYPOINT] = Endpoint(ENTRYPOINT, False, True, held=True)
        self._events.append(HeadersReceived(frame.headers))

    def _handshake_timer(self) -> None:
        if self.peer_headers is None:
            raise RemoteProtocolError(
                f"no CONNECTION_HEADERS within {self.config.handshake_timeout} s",
                CloseCode.HANDSHAKE_TIMEOUT,
            )

    def _after_input(self) -> None:
        """Send ACK_VERSION and (server) CONNECTION_HEADERS, merged into one stream."""
        if not self._need_ack_version and (self._sent_headers or self.side is Side.CLIENT):
            return  # the handshake's answers went out already
        buf = bytearray()
        if self._need_ack_version:
            self._need_ack_version = False
            buf += _ACK_VERSION_BYTES
        if self.side is Side.SERVER and self.peer_headers is not None and not self._sent_headers:
            self._sent_headers = True
            push_frame(buf, ConnectionHeaders(self._own_headers))
        if buf:
            prefix = b"" if self.got_ack_version else self._version_bytes
            self.write(self.open_stream(), prefix + buf, True)

    def _drop_state(self, detail: str) -> None:
        super()._drop_state(detail)
        self._early.clear()


_ACK_VERSION_BYTES = encode_frame(AckVersion())
