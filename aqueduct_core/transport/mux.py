"""Aqueduct over TCP: the stream multiplexer, sans-IO.

Theory of operation
===================

The engine speaks QUIC's vocabulary: unidirectional streams (client ids 2 mod 4, server ids
3 mod 4) that it writes, finishes and resets, plus unreliable datagrams. Over one TLS/TCP
connection this module supplies the same vocabulary, in the spirit of minmux and bpmux
(``shared/spec/003``, ``004``): every byte on the wire is a *frame* with a 6-byte header
(type, flags, body length) and the frames of many streams interleave. The wire format is
specified in ``docs/protocol-profile.md`` ("Aqueduct over TCP"); this is its implementation,
with no sockets, no event loop and no clock (time is an argument, as in the engine).

*Receiving.* :meth:`MuxConnection.receive_data` takes whatever bytes TCP delivered and returns
events. STREAM payload is never buffered here: each piece is returned as a memoryview of the
caller's buffer (valid until the caller reuses it; the engine copies what it keeps), so a
large message costs no copy in the multiplexer. Control frames are gathered whole (they are
small, and bounded by ``max_frame_size``). Every rule a peer can break raises
:class:`MuxProtocolError` (a :class:`RemoteProtocolError` with the close code): any input
either parses or raises that error (the h11 fuzz invariant), and the error has already queued
a CLOSE frame for the peer.

*Credit.* Each stream has its own window of bytes (minmux's GiveCredit): a sender may have at
most the receiver's window outstanding on a stream. Because the transport hands every payload
byte to the engine at once (as the QUIC adapter does), the receiver treats parsed bytes as
consumed and, once at most half of the initial window remains on a stream, grants what brings
it back to the initial window; ``auto_credit=False`` leaves granting
to :meth:`grant` (tests use it to stall one stream and watch the others flow). Sending more
than the credit is a LIMIT_VIOLATION. Credit is per stream only: the connection-wide limit is
TCP's own window, so a stalled stream never holds back another beyond TCP's ordering.

*Sending.* Writes are queued per stream as memoryviews (no copies) and leave in chunks of at
most ``chunk_size`` bytes, streams taking turns (round robin), so one large message does not
hold back the others for longer than one chunk. :meth:`data_to_send` returns a list of
buffers for ``writelines``: control frames first, then datagrams, then stream chunks.
A stream's first frame leaves in the order the streams were opened (the receiver requires
increasing ids), and at most ``max_streams`` of the peer's setting are open at once; further
streams wait, in order. Datagrams wait in a queue of at most ``datagram_queue`` bytes; when it
is full the oldest are dropped, which is what "unreliable" means here: the engine already
declares and nacks datagrams that never arrive.

*Liveness.* A PING is sent ``ping_interval`` (at most a third of the idle timeout) after the
previous one, or when the previous one is answered if that is later; a PING unanswered for the
idle timeout, or nothing at all received for the idle timeout, closes the connection with code
:data:`IDLE_TIMEOUT`. The first catches a peer that keeps sending but stopped reading. Until
the peer's SETTINGS arrive, ``settings_deadline`` bounds the wait (code HANDSHAKE_TIMEOUT).

*Closing.* :meth:`close` discards queued data (as QUIC does), queues CLOSE with a code and a
reason, and ends the connection; after CLOSE has been handed out, the transport closes TCP.
"""

from __future__ import annotations

import os
from collections import deque

from aqueduct_core.errors import CloseCode, LocalProtocolError
from aqueduct_core.transport.mux_wire import (
    FLAG_ACK,
    FLAG_FIN,
    HEADER,
    HEADER_SIZE,
    IDLE_TIMEOUT,
    MAX_REASON,
    MAX_VARINT,
    STREAM_HEAD,
    TWO_U64,
    U64,
    ConnectionClosed,
    DatagramReceived,
    FrameType,
    MuxEvent,
    MuxProtocolError,
    MuxSettings,
    PeerReady,
    PeerSettings,
    Setting,
    StreamData,
    StreamReset,
    check_header,
    encode_close,
    encode_frame,
    encode_settings,
    parse_settings,
    protocol_error,
)
from aqueduct_core.transport.mux_wire import TcpSettings as TcpSettings  # for transport.config
from aqueduct_core.wire.frames import Payload

# -- state --------------------------------------------------------------------------------


class _SendStream:
    __slots__ = ("credit", "fin", "in_ring", "queue", "queued", "sid")

    def __init__(self, sid: int) -> None:
        self.sid = sid
        self.queue: deque[memoryview] = deque()
        self.queued = 0
        self.credit = 0
        self.fin = False
        self.in_ring = False

    @property
    def eligible(self) -> bool:
        """It has something it may send now (a FIN alone needs no credit)."""
        return bool((self.queued and self.credit) or (self.fin and not self.queued))


class _RecvStream:
    __slots__ = ("limit", "received")

    def __init__(self, limit: int) -> None:
        self.received = 0
        self.limit = limit


_HEAD, _STREAM_ID, _BODY = 0, 1, 2


class MuxConnection:
    """One end of a multiplexed TCP connection (``client``: we opened the connection)."""

    def __init__(
        self,
        client: bool,
        settings: MuxSettings | None = None,
        *,
        now: float = 0.0,
        auto_credit: bool = True,
        settings_deadline: float | None = None,
        handshake_timeout: float | None = None,
    ) -> None:
        self.client = client
        self.settings = s = settings or MuxSettings()
        self.auto_credit = auto_credit
        self.settings_deadline = settings_deadline
        """The peer's SETTINGS must arrive by then (the handshake timeout after TCP
        connected); else CLOSE with HANDSHAKE_TIMEOUT."""
        self._handshake_timeout = handshake_timeout
        self.peer: PeerSettings | None = None
        self.closed = False
        self.close_code: int | None = None
        self.datagrams_dropped = 0
        """Outgoing datagrams dropped because the queue was full (or too large for the peer)."""
        self._own_parity = 2 if client else 3
        self._peer_parity = 3 if client else 2
        # receive state
        self._stage = _HEAD
        self._need = HEADER_SIZE
        self._acc = bytearray()
        self._ftype = 0
        self._flags = 0
        self._length = 0
        self._sid = 0
        self._body_left = 0
        self._fin = False
        self._recv: dict[int, _RecvStream] = {}
        self._peer_highest = -1
        self._credit_due: dict[int, int] = {}
        # send state
        self._send: dict[int, _SendStream] = {}
        self._created_highest = -1
        self._wire_highest = -1
        self._open = 0
        self._waiting: deque[_SendStream] = deque()
        self._ring: deque[_SendStream] = deque()
        self._urgent: list[bytes | memoryview] = []
        self._datagrams: deque[bytes] = deque()
        self._datagram_bytes = 0
        self._pong: bytes | None = None
        self.buffered = 0
        """Bytes of stream data and datagrams queued here, not yet handed out."""
        self.close_sent = False
        # liveness
        self._last_rx = now
        self._ping_at = now
        self._ping_out: bytes | None = None
        self._urgent.append(
            encode_settings(
                {
                    Setting.MAX_FRAME_SIZE: s.max_frame_size,
                    Setting.INITIAL_STREAM_CREDIT: s.initial_stream_credit,
                    Setting.MAX_STREAMS: s.max_streams,
                    Setting.MAX_DATAGRAM: s.max_datagram,
                    Setting.IDLE_TIMEOUT_MS: int(s.idle_timeout * 1000),
                }
            )
        )

    # == receiving =========================================================================

    def receive_data(self, data: Payload, now: float) -> list[MuxEvent]:
        """Parse bytes from TCP. Raises MuxProtocolError (CLOSE already queued) on a
        violation; returns [] once closed."""
        if self.closed:
            return []
        self._last_rx = now
        events: list[MuxEvent] = []
        try:
            self._parse(memoryview(data).cast("B"), events)
        except MuxProtocolError as exc:
            self.close(int(exc.code), str(exc))
            raise
        return events

    def _parse(self, view: memoryview, events: list[MuxEvent]) -> None:
        pos, end = 0, len(view)
        while pos < end and not self.closed:
            left = self._body_left
            if left:
                take = min(left, end - pos)
                self._body_left = left = left - take
                events.append(StreamData(self._sid, view[pos : pos + take], self._fin and not left))
                pos += take
                continue
            need = self._need
            acc = self._acc
            if not acc and end - pos >= need:
                chunk = view[pos : pos + need]
                pos += need
            else:
                take = min(need - len(acc), end - pos)
                acc += view[pos : pos + take]
                pos += take
                if len(acc) < need:
                    return
                chunk = memoryview(bytes(acc))
                acc.clear()
            self._on_chunk(chunk, events)

    def _on_chunk(self, chunk: memoryview, events: list[MuxEvent]) -> None:
        stage = self._stage
        if stage == _HEAD:
            ftype, flags, length = HEADER.unpack(chunk)
            self._header(ftype, flags, length, events)
        elif stage == _STREAM_ID:
            self._stream_header(U64.unpack(chunk)[0], events)
        else:
            self._stage, self._need = _HEAD, HEADER_SIZE
            self._control(self._ftype, self._flags, chunk, events)

    def _header(self, ftype: int, flags: int, length: int, events: list[MuxEvent]) -> None:
        check_header(ftype, flags, length, self.settings, self.peer is not None)
        self._ftype, self._flags, self._length = ftype, flags, length
        if ftype == FrameType.STREAM:
            self._stage, self._need = _STREAM_ID, 8
        elif length == 0:
            self._control(ftype, flags, memoryview(b""), events)
        else:
            self._stage, self._need = _BODY, length

    def _stream_header(self, sid: int, events: list[MuxEvent]) -> None:
        self._stage, self._need = _HEAD, HEADER_SIZE
        n = self._length - 8
        fin = bool(self._flags & FLAG_FIN)
        rs = self._peer_stream(sid, "STREAM")
        if n > rs.limit - rs.received:
            raise protocol_error(
                CloseCode.LIMIT_VIOLATION,
                f"stream {sid} exceeded its credit ({n} bytes, {rs.limit - rs.received} left)",
            )
        rs.received += n
        if fin:
            del self._recv[sid]
            self._credit_due.pop(sid, None)
        elif self.auto_credit:
            window = self.settings.initial_stream_credit
            if rs.limit - rs.received <= window // 2:
                self._grant(sid, rs, rs.received + window - rs.limit)
        self._sid, self._fin = sid, fin
        if n:
            self._body_left = n
        else:
            events.append(StreamData(sid, b"", fin))

    def _peer_stream(self, sid: int, what: str) -> _RecvStream:
        rs = self._recv.get(sid)
        if rs is not None:
            return rs
        if sid % 4 != self._peer_parity or sid > MAX_VARINT:
            raise protocol_error(
                CloseCode.PROTOCOL_VIOLATION, f"{what} on stream {sid}, not the peer's"
            )
        if sid <= self._peer_highest:
            raise protocol_error(
                CloseCode.PROTOCOL_VIOLATION, f"{what} on stream {sid}, already ended"
            )
        if len(self._recv) >= self.settings.max_streams:
            raise protocol_error(
                CloseCode.LIMIT_VIOLATION,
                f"more than {self.settings.max_streams} streams open at once",
            )
        self._peer_highest = sid
        rs = self._recv[sid] = _RecvStream(self.settings.initial_stream_credit)
        return rs

    def _control(self, ftype: int, flags: int, body: memoryview, events: list[MuxEvent]) -> None:
        if ftype == FrameType.CREDIT:
            sid, inc = TWO_U64.unpack(body)
            self._on_credit(sid, inc)
        elif ftype == FrameType.DATAGRAM:
            events.append(DatagramReceived(bytes(body)))
        elif ftype == FrameType.PING:
            if flags & FLAG_ACK:
                if self._ping_out is not None and body == self._ping_out:
                    self._ping_out = None
            else:
                self._pong = bytes(body)  # only the latest PING is answered
        elif ftype == FrameType.RESET:
            sid, code = TWO_U64.unpack(body)
            self._peer_stream(sid, "RESET")
            del self._recv[sid]
            self._credit_due.pop(sid, None)
            events.append(StreamReset(sid, code))
        elif ftype == FrameType.SETTINGS:
            self._on_settings(body, events)
        elif ftype == FrameType.CLOSE:
            code = U64.unpack(body[:8])[0]
            reason = bytes(body[8 : 8 + MAX_REASON]).decode("utf-8", "replace")
            self._end()
            self.close_code = code
            events.append(ConnectionClosed(code, reason, True))

    def _on_settings(self, body: memoryview, events: list[MuxEvent]) -> None:
        self.peer = parse_settings(body)
        events.append(PeerReady(self.peer))
        self._open_waiting()

    def _on_credit(self, sid: int, inc: int) -> None:
        if sid % 4 != self._own_parity or sid > self._wire_highest:
            raise protocol_error(
                CloseCode.PROTOCOL_VIOLATION, f"CREDIT for stream {sid}, never opened"
            )
        if inc == 0:
            raise protocol_error(CloseCode.PROTOCOL_VIOLATION, "CREDIT of 0")
        s = self._send.get(sid)
        if s is None:
            return  # the stream ended (or was reset) while the CREDIT was on its way
        s.credit += inc
        if s.credit > MAX_VARINT:
            raise protocol_error(CloseCode.LIMIT_VIOLATION, f"credit of stream {sid} above 2^62")
        self._activate(s)

    # == credit ============================================================================

    def grant(self, stream_id: int, amount: int) -> None:
        """Allow the peer ``amount`` more bytes on its stream ``stream_id`` (auto_credit off)."""
        rs = self._recv.get(stream_id)
        if rs is not None and amount > 0 and not self.closed:
            self._grant(stream_id, rs, amount)

    def _grant(self, sid: int, rs: _RecvStream, amount: int) -> None:
        rs.limit += amount
        self._credit_due[sid] = self._credit_due.get(sid, 0) + amount

    # == sending ===========================================================================

    def write(self, stream_id: int, data: Payload, fin: bool = False) -> None:
        """Queue ``data`` on our stream ``stream_id`` (opened by its first write; ids must
        increase). A write to a stream that already ended is dropped, as QUIC drops it."""
        if self.closed:
            return
        s = self._send.get(stream_id)
        if s is None:
            if stream_id % 4 != self._own_parity:
                raise LocalProtocolError(f"stream {stream_id} is not ours to open")
            if stream_id <= self._created_highest:
                return  # finished or reset already: a late write
            self._created_highest = stream_id
            s = self._send[stream_id] = _SendStream(stream_id)
            self._waiting.append(s)
        elif s.fin:
            return
        n = len(data)
        if n:
            s.queue.append(data if type(data) is memoryview else memoryview(data))
            s.queued += n
            self.buffered += n
        s.fin = fin
        if self._waiting:
            self._open_waiting()
        self._activate(s)  # an open stream flows while others wait for a slot

    def reset(self, stream_id: int, code: int = 0) -> None:
        """Abandon our stream: queued data is discarded and RESET sent if it was opened."""
        s = self._send.pop(stream_id, None)
        if s is None or self.closed:
            return
        self.buffered -= s.queued
        s.queue.clear()
        s.queued = 0
        if s in self._waiting:
            self._waiting.remove(s)
            return
        self._urgent.append(encode_frame(FrameType.RESET, 0, TWO_U64.pack(stream_id, code)))
        self._open -= 1
        self._open_waiting()

    def send_datagram(self, data: bytes) -> bool:
        """Queue a datagram; False if the peer does not take one this large (dropped).
        The oldest queued datagrams are dropped to keep the queue within its bound."""
        peer = self.peer
        n = len(data)
        if self.closed or peer is None or n > peer.max_datagram or n > self.settings.datagram_queue:
            self.datagrams_dropped += 1
            return False
        limit = self.settings.datagram_queue
        while self._datagram_bytes + n > limit:
            old = self._datagrams.popleft()
            self._datagram_bytes -= len(old)
            self.buffered -= len(old)
            self.datagrams_dropped += 1
        self._datagrams.append(data)
        self._datagram_bytes += n
        self.buffered += n
        return True

    def close(self, code: int = 0, reason: str = "") -> None:
        """End the connection: queued data is discarded and CLOSE queued."""
        if self.closed:
            return
        self._end()
        self.close_code = code
        self._urgent = [encode_close(code, reason)]

    def _end(self) -> None:
        self.closed = True
        self._send.clear()
        self._waiting.clear()
        self._ring.clear()
        self._datagrams.clear()
        self._datagram_bytes = 0
        self.buffered = 0
        self._urgent = []
        self._credit_due.clear()
        self._pong = None

    def _open_waiting(self) -> None:
        peer = self.peer
        if peer is None or self.closed:
            return
        waiting = self._waiting
        while waiting and self._open < peer.max_streams:
            s = waiting.popleft()
            self._open += 1
            self._wire_highest = s.sid
            s.credit = peer.initial_stream_credit
            # The first frame leaves now, in opening order (the peer requires increasing ids).
            self._chunk(s, self._urgent)
            self._activate(s)

    def _chunk(self, s: _SendStream, out: list[bytes | memoryview]) -> int:
        """Append one STREAM frame of ``s`` to ``out``; returns its payload size."""
        peer = self.peer
        assert peer is not None
        n = min(s.queued, s.credit, self.settings.chunk_size, peer.max_frame_size - 8)
        queue = s.queue
        views: list[memoryview] = []
        left = n
        while left:
            view = queue[0]
            if len(view) <= left:
                queue.popleft()
                views.append(view)
                left -= len(view)
            else:
                views.append(view[:left])
                queue[0] = view[left:]
                left = 0
        s.queued -= n
        s.credit -= n
        self.buffered -= n
        fin = s.fin and not s.queued
        out.append(STREAM_HEAD.pack(FrameType.STREAM, FLAG_FIN if fin else 0, n + 8, s.sid))
        out.extend(views)
        if fin:
            del self._send[s.sid]
            self._open -= 1  # a waiting stream may open: data_to_send sees to it
        return n

    def data_to_send(self, max_bytes: int = 1 << 20) -> list[bytes | memoryview]:
        """Buffers to write, in order (for ``writelines``): about ``max_bytes`` of stream
        data at most, all pending control frames and datagrams."""
        out = self._urgent
        self._urgent = []
        if self.closed:
            if out:
                self.close_sent = True
            return out
        if self._credit_due:
            for sid, inc in self._credit_due.items():
                out.append(encode_frame(FrameType.CREDIT, 0, TWO_U64.pack(sid, inc)))
            self._credit_due.clear()
        if self._pong is not None:
            out.append(encode_frame(FrameType.PING, FLAG_ACK, self._pong))
            self._pong = None
        if self._datagrams:
            for d in self._datagrams:
                out.append(HEADER.pack(FrameType.DATAGRAM, 0, len(d)))
                out.append(d)
            self.buffered -= self._datagram_bytes
            self._datagrams.clear()
            self._datagram_bytes = 0
        ring = self._ring
        budget = max_bytes
        while ring and budget > 0:
            s = ring.popleft()
            s.in_ring = False
            if s.sid not in self._send or not s.eligible:
                continue
            budget -= self._chunk(s, out)
            self._activate(s)
        if self._waiting:
            self._open_waiting()
            out.extend(self._urgent)
            self._urgent = []
        return out

    def _activate(self, s: _SendStream) -> None:
        """Let ``s`` take turns if it has something to send (streams not yet opened wait)."""
        if not s.in_ring and s.sid <= self._wire_highest and s.sid in self._send and s.eligible:
            s.in_ring = True
            self._ring.append(s)

    @property
    def has_data(self) -> bool:
        """Whether :meth:`data_to_send` would return something."""
        return bool(self._urgent or self._credit_due or self._pong or self._datagrams or self._ring)

    # == timers ============================================================================

    def _idle_timeout(self) -> float:
        own = self.settings.idle_timeout
        peer = self.peer.idle_timeout if self.peer is not None else None
        return min(own, peer) if peer else own

    def _ping_interval(self, idle: float) -> float:
        return min(self.settings.ping_interval, idle / 3)

    def next_timer(self) -> float | None:
        """When :meth:`handle_timer` has work next: the SETTINGS deadline, the idle timeout,
        or the next PING (due an interval after the previous one was sent, once that one
        was answered). It moves earlier when a PING is answered: re-arm after receiving."""
        if self.closed:
            return None
        idle = self._idle_timeout()
        when = self._last_rx + idle
        if self.peer is None and self.settings_deadline is not None:
            when = min(when, self.settings_deadline)
        if self._ping_out is not None:
            return min(when, self._ping_at + idle)
        return min(when, self._ping_at + self._ping_interval(idle))

    def handle_timer(self, now: float) -> list[MuxEvent]:
        if self.closed:
            return []
        deadline = self.settings_deadline
        if self.peer is None and deadline is not None and now >= deadline:
            limit = f" ({self._handshake_timeout:g} s)" if self._handshake_timeout else ""
            reason = f"no SETTINGS from the peer within the handshake timeout{limit}"
            self.close(CloseCode.HANDSHAKE_TIMEOUT, reason)
            return [ConnectionClosed(CloseCode.HANDSHAKE_TIMEOUT, reason, False)]
        idle = self._idle_timeout()
        reason = ""
        if now >= self._last_rx + idle:
            reason = f"nothing received from the peer for {idle:g} s"
        elif self._ping_out is not None and now >= self._ping_at + idle:
            reason = f"the peer left a PING unanswered for {idle:g} s (it stopped reading?)"
        if reason:
            self.close(IDLE_TIMEOUT, reason)
            return [ConnectionClosed(IDLE_TIMEOUT, reason, False)]
        if self._ping_out is None and now >= self._ping_at + self._ping_interval(idle):
            self._ping_out = os.urandom(8)
            self._ping_at = now
            self._urgent.append(encode_frame(FrameType.PING, 0, self._ping_out))
        return []
