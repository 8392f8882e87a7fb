"""The QUIC adapter: the only code that drives a QUIC library.

One protocol class per backend maps QUIC events into the engine (every stream and datagram is
drained into it at once, so QUIC flow control never waits for the application) and engine
commands into QUIC. Large writes are handed to the library a slice at a time (at most
``stream_high_water`` bytes per stream, no copies: memoryview slices) because aioquic re-copies
its whole unacknowledged buffer on every ACK; the rest waits here and is topped up whenever
the library transmits. Senders in the engine pause while more than ``send_budget`` bytes wait.

Per packet, the adapter does as little as it can: the QUIC events of one datagram (or timer)
reach the engine with one clock reading, and the engine's outputs are drained once after the
batch, and only when an event did more than extend a MESSAGE payload (most packets of a large
message); the library transmits after every batch anyway, so commands executed inside one
schedule no transmit of their own.

Stream ids come from the engine in QUIC order. A stream is opened in the library only within
the peer's stream limit and strictly in increasing order (aioquic refuses a lower, unused id
once a higher one was used; qh3 raises beyond the limit instead of queueing).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import importlib
import logging
from collections import deque
from collections.abc import Callable
from typing import Any

from aqueduct_core.api.connection import Connection
from aqueduct_core.engine import (
    CloseConnection,
    Command,
    ResetStream,
    SendDatagram,
    WriteStream,
)
from aqueduct_core.errors import CloseCode
from aqueduct_core.transport.backends import Backend, apply_aioquic
from aqueduct_core.transport.config import (
    AIOQUIC_MAX_PACKET,
    QH3_MAX_PACKET,
    TransportConfig,
    is_loopback,
    zero_rtt_enabled,
)
from aqueduct_core.transport.pmtu import (
    BASE_PACKET,
    BlackHoleDetector,
    packet_size_for_route,
    peer_ip,
    set_aioquic_packet_size,
    size_qh3_configuration,
)
from aqueduct_core.transport.reset import is_reset, peer_tokens
from aqueduct_core.transport.tls import PinMismatch

log = logging.getLogger("aqueduct.transport")

DATAGRAM_HEADROOM = 40
"""Bytes kept free in a packet around a DATAGRAM frame (measured overhead: 30-32)."""
TINY_WRITE = 4096
"""Writes up to this size (frame heads, control frames) go to the library at once, whatever
the stream's backlog; larger ones only within ``stream_high_water``."""

_classes: dict[str, type] = {}


STATELESS_RESET = "the server no longer knows this connection (stateless reset: it restarted)"


def protocol_class(backend: Backend) -> type:
    """The adapter protocol class for ``backend`` (built once per backend)."""
    cls = _classes.get(backend.name)
    if cls is None:
        cls = _classes[backend.name] = _build(backend)
    return cls


def _build(backend: Backend) -> type:
    ev = backend.events
    stream_data_received = ev.StreamDataReceived
    is_aioquic = backend.name == "aioquic"
    base: Any = backend.QuicConnectionProtocol
    # What a library raises when asked to write on a stream or connection that is gone.
    lib_errors = (ValueError, RuntimeError, backend.QuicConnectionError)
    zero_rtt_epoch = importlib.import_module(f"{backend.name}.tls").Epoch.ZERO_RTT

    class AqueductProtocol(base):  # type: ignore[misc]
        """One QUIC connection carrying one Aqueduct connection."""

        # Set by the library's QuicConnectionProtocol.__init__:
        _quic: Any
        _loop: asyncio.AbstractEventLoop
        _transport: Any
        _timer: asyncio.TimerHandle | None
        _timer_at: float | None

        def __init__(
            self,
            quic: Any,
            stream_handler: Any = None,
            *,
            config: TransportConfig,
            make_connection: Callable[[], Connection],
            pin: str | None = None,
            pacing: bool = True,
            defer: bool = False,
        ) -> None:
            if is_aioquic:
                apply_aioquic(quic, pacing)
            super().__init__(quic, stream_handler)
            self.config = config
            self.pin = pin
            self.pin_error: PinMismatch | None = None
            self.reset_code = 0
            """RESET_STREAM's code (the engine's are meaningless; WebTransport maps them)."""
            self._make_connection = make_connection
            self.conn: Connection = None  # type: ignore[assignment]
            self.engine: Any = None
            self._pending: dict[int, deque[tuple[memoryview, bool]]] = {}
            self._pending_bytes = 0
            self._waiting: deque[tuple[int, Command]] = deque()
            """Commands for streams the peer's stream limit does not let us open yet."""
            self._opened = -1
            self._fed: set[int] = set()
            """Streams whose bytes may still be in the library (their backlog is reported)."""
            self._soon: asyncio.Handle | None = None
            self._terminated = False
            self._now: float | None = None
            """The time of the batch of QUIC events being processed (None outside one):
            a transmit follows every batch, so commands need no transmit of their own."""
            self._dirty = False
            """The batch gave the engine more than payload bytes: drain its outputs."""
            self.zero_rtt: bool | None = None
            """Client: None without 0-RTT, True when the server accepted it, False if not."""
            self._sized = False
            self._path_size: int | None = None
            """The packet size the path probes found (client: its search; pmtu.py)."""
            self._black_hole: BlackHoleDetector | None = None
            if not defer:
                self.start_connection()

        def start_connection(self) -> Connection:
            """Make the Aqueduct connection this QUIC connection carries (at once, unless
            a subclass deferred it until the ALPN is known: webtransport.py)."""
            self.conn = self._make_connection()
            self.conn.attach_driver(self)
            self.engine = self.conn.engine
            if not self.is_client_side and zero_rtt_enabled(self.config):
                # Profile §2.11: stream input before the handshake completes is 0-RTT data
                # TLS accepted; the engine takes it at once, the application holds what is
                # not safe to replay until Connection.wait_confirmed().
                self.engine.early_data(self._loop.time())
            return self.conn

        # -- engine commands (the Driver protocol) --------------------------------------

        def execute(self, commands: list[Command]) -> None:
            for cmd in commands:
                kind = type(cmd)
                if kind is WriteStream or kind is ResetStream:
                    sid = cmd.stream_id  # type: ignore[union-attr]
                    if self._waiting or (sid > self._opened and not self._may_open(sid)):
                        self._waiting.append((sid, cmd))
                    else:
                        self._apply(sid, cmd)
                elif kind is SendDatagram:
                    self._datagram(cmd.data)  # type: ignore[union-attr, arg-type]
                elif kind is CloseConnection:
                    self._quic.close(error_code=cmd.code, reason_phrase=cmd.reason)  # type: ignore[union-attr]
            if self._now is None:
                self._transmit_soon()

        def abort(self) -> None:
            """The engine ended: send the close now (sendto hands it to the kernel at once),
            then drop the socket. Only a client owns its socket; a server's serves others."""
            self._terminated = True
            if self._soon is not None:
                self._soon.cancel()
                self._soon = None
            self.transmit()
            if self.is_client_side and self._transport is not None:
                self._transport.close()

        def _apply(self, sid: int, cmd: Command) -> None:
            if self._terminated:
                return  # the connection is closing: nothing more goes out
            if sid > self._opened:
                self._opened = sid
            if type(cmd) is ResetStream:
                dropped = self._pending.pop(sid, None)
                if dropped:
                    self._pending_bytes -= sum(len(view) for view, _ in dropped)
                with contextlib.suppress(*lib_errors):
                    self._quic.reset_stream(sid, self.reset_code)  # raises once acked
                return
            data, fin = cmd.data, cmd.fin  # type: ignore[union-attr]
            queue = self._pending.get(sid)
            if queue is None and (
                len(data) <= TINY_WRITE
                or len(data) <= self.config.stream_high_water - self._backlog(sid)
            ):
                # Counting what the library still holds of the stream: a message no larger
                # than the high water used to go in whole, up to the whole send budget.
                self._send(sid, data, fin)
                return
            if queue is None:
                queue = self._pending[sid] = deque()
            queue.append((memoryview(data), fin))
            self._pending_bytes += len(data)
            self._feed(sid)

        def _send(self, sid: int, data: Any, fin: bool) -> None:
            try:
                self._quic.send_stream_data(sid, data, end_stream=fin)
            except lib_errors as exc:
                # The stream was reset by us (a late write after cancel) or the peer
                # stopped it: the engine no longer needs the data.
                log.debug("write on stream %d dropped: %s", sid, exc)
            self._fed.add(sid)

        def _feed(self, sid: int) -> int:
            """Hand the library up to ``stream_high_water`` bytes of stream ``sid``; returns
            what the library then holds of it."""
            queue = self._pending.get(sid)
            held = self._backlog(sid)
            room = self.config.stream_high_water - held
            while queue and room > 0:
                view, fin = queue[0]
                if len(view) <= room:
                    queue.popleft()
                    self._send(sid, view, fin)
                    sent = len(view)
                else:
                    queue[0] = (view[room:], fin)
                    self._send(sid, view[:room], False)
                    sent = room
                room -= sent
                held += sent
                self._pending_bytes -= sent
            if queue is not None and not queue:
                del self._pending[sid]
            return held

        def _backlog(self, sid: int) -> int:
            quic = self._quic
            if is_aioquic:
                stream = quic._streams.get(sid)
                if stream is None:
                    return 0
                sender = stream.sender
                return int(sender._buffer_stop - sender._buffer_start)
            return int(quic.get_send_buffer_size(sid))

        def _may_open(self, sid: int) -> bool:
            if self._terminated:
                return True  # _apply drops it: let the queue drain
            quic = self._quic
            if is_aioquic:
                limit = quic._remote_max_streams_uni
            else:
                core = quic._core
                limit = core.stream_limits[1] if core is not None else 0
            return bool(sid // 4 < limit)

        def max_datagram_payload(self) -> int:
            quic = self._quic
            peer = quic._remote_max_datagram_frame_size
            if peer is None:
                return 0
            packet = quic._configuration.max_datagram_size
            if not is_aioquic and quic._tls is not None:
                params = quic._tls.remote_transport_parameters
                if params is not None and params.max_udp_payload_size:
                    packet = min(packet, params.max_udp_payload_size)
            return int(max(0, min(packet - DATAGRAM_HEADROOM, peer - 5)))

        def _datagram(self, data: bytes) -> None:
            if self._terminated:
                return
            if len(data) > self.max_datagram_payload():
                # Never hand an oversized datagram to the library: it would block every
                # later datagram (aioquic) or wedge the connection (qh3). It counts as lost.
                log.warning("datagram of %d bytes exceeds the path limit; dropped", len(data))
                return
            with contextlib.suppress(*lib_errors):
                self._quic.send_datagram_frame(bytes(data))

        def _transmit_soon(self) -> None:
            if self._soon is None:
                self._soon = self._loop.call_soon(self._transmit_now)

        def _transmit_now(self) -> None:
            self._soon = None
            if self._transport is not None and not self._transport.is_closing():
                self.transmit()

        @property
        def is_client_side(self) -> bool:
            return bool(self._quic._configuration.is_client)

        # -- the library's side ---------------------------------------------------------

        def transmit(self) -> None:
            if self._terminated:
                self._pending.clear()
                self._waiting.clear()
                self._pending_bytes = 0
            while self._waiting and self._may_open(self._waiting[0][0]):
                sid, cmd = self._waiting.popleft()
                self._apply(sid, cmd)
            held = 0
            if self._pending:
                for sid in list(self._pending):
                    held += self._feed(sid)
            # UdpTransport (udp.py): the packets of one transmit leave in GSO runs.
            cork = getattr(self._transport, "cork", None)
            if cork is not None:
                cork()
            try:
                super().transmit()
            except backend.QuicConnectionError as exc:
                # qh3's datagrams_to_send can raise mid-handshake; re-arm the timer
                # that transmit() would have armed after sending.
                log.debug("transmit: %s", exc)
                timer_at = self._quic.get_timer()
                if self._timer is not None and self._timer_at != timer_at:
                    self._timer.cancel()
                    self._timer = None
                if self._timer is None and timer_at is not None:
                    self._timer = self._loop.call_at(timer_at, self._handle_timer)
                self._timer_at = timer_at
            finally:
                if cork is not None:
                    self._transport.uncork()
            self._report_backlog(held)

        def _report_backlog(self, held: int = 0) -> None:
            """Tell the engine how many bytes wait to be sent (senders pause above
            ``send_budget``; ``Connection.memory()`` shows them). ``held``: what the library
            held, before this transmit, of the streams the adapter still queues for."""
            engine = self.engine
            fed = self._fed
            if not fed and not self._pending_bytes and not engine.tx_backlog:
                return  # nothing was written since the backlog was last reported empty
            library = 0
            if self._pending_bytes:
                # Mid-transfer: the adapter's own queue dominates, and asking the library
                # on every packet costs as much as feeding it (qh3: a call into the core).
                # ``held`` is an upper bound of what the library holds of those streams.
                library = held
            elif not is_aioquic:
                # qh3 totals every stream's unsent bytes in one call.
                library = int(self._quic.get_send_buffer_size())
                if not library:
                    fed.clear()
            elif fed:
                drained = []
                for sid in fed:
                    n = self._backlog(sid)
                    if n:
                        library += n
                    elif sid not in self._pending:
                        drained.append(sid)
                if drained:
                    fed.difference_update(drained)
            if engine.set_transport_backlog(self._pending_bytes + library, self.config.send_budget):
                self.conn._flush()

        # -- packet size from the path (pmtu.py) -----------------------------------------

        def connect(self, addr: Any, *args: Any, **kwargs: Any) -> None:
            self._size_for_path(addr)
            super().connect(addr, *args, **kwargs)

        def datagram_received(self, data: Any, addr: Any) -> None:
            if not self._sized:
                self._size_for_path(addr)  # a server's first packet from this client
            if is_aioquic and self._reset_by_peer(data, self._reset_tokens()):
                return
            super().datagram_received(data, addr)

        async def find_packet_size(self, addr: Any) -> None:
            """Client, before ``connect``: probe the path to ``addr`` for its packet size
            (pmtu.py, step 3); without an answer the route's size stands."""
            ip = peer_ip(addr)
            probe = getattr(self._transport, "probe_path", None)
            if self.config.packet_size is not None or ip is None or is_loopback(ip) or not probe:
                return
            limit = AIOQUIC_MAX_PACKET if is_aioquic else QH3_MAX_PACKET
            start = packet_size_for_route(ip, limit) or BASE_PACKET
            found = await probe(addr, start, limit)
            if found is None:
                log.info(
                    "no answer to path probes from %s: packet size %d (the route's)", ip, start
                )
            self._path_size = found

        def _reset_tokens(self) -> list[bytes]:
            """aioquic client: the server's reset tokens (none to check on a server)."""
            return peer_tokens(self._quic) if self.is_client_side else []

        def _reset_by_peer(self, data: bytes, tokens: list[bytes]) -> bool:
            """aioquic: a stateless reset from the server (``reset.py``; qh3 notices its own)
            ends the connection at once."""
            if not tokens or not is_reset(data, tokens):
                return False
            quic = self._quic
            quic._close_event = ev.ConnectionTerminated(
                error_code=0, frame_type=None, reason_phrase=STATELESS_RESET
            )
            quic._close_end()
            self._process_events()
            return True

        def _size_for_path(self, addr: Any) -> None:
            self._sized = True
            self.conn.peer = tuple(addr) if addr else None  # once: the first address seen
            ip = peer_ip(addr)
            if self.config.packet_size is not None or ip is None or is_loopback(ip):
                return  # the operator's size, or loopback's largest, stands
            limit = AIOQUIC_MAX_PACKET if is_aioquic else QH3_MAX_PACKET
            # Probed by the client (its own search, or the result it told this server).
            size = self._path_size
            if size is None and not self.is_client_side:
                size = getattr(self._transport, "path_sizes", {}).get(addr)
            size = min(size, limit) if size else packet_size_for_route(ip, limit)
            if size is None:
                return
            if is_aioquic:
                set_aioquic_packet_size(self._quic, size)
                self._black_hole = BlackHoleDetector(ip, size, limit)
            elif self._quic._core is None:
                self._quic._configuration = size_qh3_configuration(self._quic._configuration, size)

        def _handle_timer(self) -> None:
            super()._handle_timer()
            if self._black_hole is not None:
                size = self._black_hole.check(self._quic._loss._pto_count, self._loop.time())
                if size is not None:
                    log.info("packet size on this path: now %d bytes (black-hole check)", size)
                    set_aioquic_packet_size(self._quic, size)

        def datagrams_received(self, datagrams: list[bytes], addr: Any) -> None:
            """A burst read by UdpTransport: processed, then one transmit (qh3's own
            method does the same with one call into its core)."""
            if not is_aioquic:
                super().datagrams_received(datagrams, addr)
                return
            if not self._sized:
                self._size_for_path(addr)
            quic, now = self._quic, self._loop.time()
            tokens = self._reset_tokens()  # once per burst, not per packet
            for data in datagrams:
                if self._reset_by_peer(data, tokens):
                    return
                quic.receive_datagram(data, addr, now=now)
            self._process_events()
            self.transmit()

        def _process_events(self) -> None:
            """Every batch of QUIC events (a datagram, a timer) reaches the engine with one
            clock reading and is followed by one flush; the library transmits after it."""
            self._now = self._loop.time()
            self._dirty = False
            try:
                super()._process_events()
                if self._dirty:
                    self._update_rtt()
                    self.conn._flush()
            finally:
                self._now = None

        def quic_event_received(self, event: Any) -> None:
            engine = self.engine
            now = self._now
            batched = now is not None
            if now is None:
                now = self._loop.time()
            kind = type(event)
            if kind is stream_data_received:
                if event.stream_id % 4 < 2 and not self._terminated:
                    # Aqueduct uses unidirectional streams only (profile 1.2).
                    engine.close(now, CloseCode.PROTOCOL_VIOLATION, "bidirectional stream")
                elif not engine.stream_data(event.stream_id, event.data, event.end_stream, now):
                    return  # payload only: the engine has nothing new to say
            elif kind is ev.DatagramFrameReceived:
                engine.datagram_received(event.data, now)
            elif kind is ev.StreamReset:
                engine.stream_reset(event.stream_id, now)
            elif kind is ev.HandshakeCompleted:
                self._handshake_completed(now, event)
            elif kind is ev.ConnectionTerminated:
                reason = event.reason_phrase or ""
                if event.frame_type is not None and not reason:
                    reason = f"QUIC transport error {event.error_code}"
                engine.connection_lost(now, event.error_code, reason)
                self._terminated = True
            elif kind is ev.StopSendingReceived:
                self._apply(event.stream_id, ResetStream(event.stream_id))
            else:
                return
            self._dirty = True
            if not batched:
                self._update_rtt()
                self.conn._flush()

        def connect_early(self, addr: Any) -> None:
            """``connect``, with the engine's 0-RTT data in the same first datagram as the
            ClientHello: the server reads both before it answers, so its headers leave with
            its handshake flight; sent a moment later, qh3's pacer (which counts every
            packet as ``max_datagram_size``) holds them for tens of milliseconds."""
            quic = self._quic
            library_connect = quic.connect

            def connect_then_early(addr: Any, now: float) -> None:
                library_connect(addr, now=now)
                self.start_early_data()

            quic.connect = connect_then_early
            try:
                self.connect(addr)
            finally:
                del quic.connect

        def start_early_data(self) -> bool:
            """Client, once ``connect`` set keys up: if a session ticket put 0-RTT keys in
            place, the engine sends VERSION and its connection headers now, in 0-RTT (§2.11).

            If the server rejects 0-RTT, both libraries send those STREAM frames again in
            1-RTT packets on the same streams (the server never saw the 0-RTT ones), and
            DATAGRAM frames are not sent again (tests/core/test_zero_rtt.py, case 71); so
            the adapter keeps no copies of its own and remaps no stream ids."""
            quic = self._quic
            if is_aioquic:
                early = quic._cryptos[zero_rtt_epoch].send.is_valid()
            else:
                early = bool(quic._early_data_attempted)
            if early:
                self.zero_rtt = True
                self.engine.early_data(self._loop.time())
                self.conn._flush()
            return bool(early)

        def _handshake_completed(self, now: float, event: Any) -> None:
            if self.zero_rtt and not event.early_data_accepted:
                self.zero_rtt = False
                log.debug("the server rejected 0-RTT: its stream data goes again in 1-RTT")
            if not self.pin_holds(event):
                self.engine.close(now, CloseCode.PROTOCOL_VIOLATION, "certificate pin mismatch")
                return
            self.engine.handshake_done(
                now,
                datagrams=self._quic._remote_max_datagram_frame_size is not None,
                max_datagram=self.max_datagram_payload(),
            )

        def pin_holds(self, event: Any) -> bool:
            """aioquic: the pinned fingerprint matches (qh3 checks it itself). A resumed
            session has no certificate: its ticket came from a connection whose certificate
            matched the pin (tickets are kept per pin, tls.ClientSessions)."""
            if self.pin is None or not is_aioquic or event.session_resumed:
                return True
            from cryptography.hazmat.primitives.serialization import Encoding

            cert = self._quic.tls._peer_certificate
            got = hashlib.sha256(cert.public_bytes(Encoding.DER)).hexdigest()
            if got != self.pin:
                self.pin_error = PinMismatch(
                    f"the server's certificate has fingerprint {got}, not the pinned {self.pin}; "
                    "use the fingerprint the service printed when it started"
                )
            return got == self.pin

        def _update_rtt(self) -> None:
            quic = self._quic
            if is_aioquic:
                rtt = quic._loss._rtt_smoothed
            else:
                rtt = quic._core.smoothed_rtt if quic._core is not None else None
            if rtt:
                self.engine.update_rtt(rtt)

        def connection_lost(self, exc: Exception | None) -> None:
            super().connection_lost(exc)
            if not self._terminated:
                self._terminated = True
                self.engine.connection_lost(self._loop.time(), None, "the UDP socket closed")
                self.conn._flush()

    AqueductProtocol.__name__ = f"AqueductProtocol[{backend.name}]"
    return AqueductProtocol
