"""Frames in: parsing each stream and datagram, routing its frames, charging their bytes.

The layer of :class:`~aqueduct_core.engine.Connection` that takes what QUIC delivered. Every
stream and datagram carries one frame sequence, ``prelude* [ROUTE_TO routed*]`` (§1.2, G3):
prelude frames go to the handshake at once (G25); routed frames wait, per sequence and in
order, for the peer's CONNECTION_HEADERS (§2.3), then have their direction checked against
the chanid's bits (cases 25-27) before they reach a sender or receiver state machine.

Memory: a MESSAGE whose payload is still arriving is charged when its head arrives, to its
channel's flow-control window and, where no attached channel's window covers it, to the
connection's cap on loose bytes (``max_pending_bytes``), as are incomplete frame heads held
across streams. Memory grows only with what we granted, never with what a peer announces.
"""

from __future__ import annotations

from aqueduct_core.engine.config import EngineConfig
from aqueduct_core.engine.handshake import Handshake, HeaderPairs, ServerHeaders
from aqueduct_core.engine.receiver import ReceiverSM
from aqueduct_core.engine.sender import SenderSM
from aqueduct_core.errors import CloseCode, RemoteProtocolError
from aqueduct_core.wire.chanid import Side
from aqueduct_core.wire.frames import (
    AckNackUnreliable,
    AckReliable,
    AckVersion,
    CancelSender,
    ConnectionHeaders,
    Dequeued,
    FinishSender,
    ForgetChannel,
    Frame,
    Message,
    MessageHead,
    Payload,
    RouteTo,
    SentUnreliable,
    Version,
    cost_of,
    frame_name,
)
from aqueduct_core.wire.parser import StreamParser, parse_datagram

_SENDER_FRAMES = (Message, SentUnreliable, FinishSender, CancelSender)
GATHER_FROM = 64 * 1024
"""Payloads at least this long are gathered into ``EngineConfig.payload_buffers``' buffers."""


class FrameSequence:
    """One incoming frame sequence (a stream or a datagram) and its routing state."""

    __slots__ = (
        "checked",
        "datagram",
        "fragment",
        "ignore",
        "parser",
        "pending",
        "reserved",
        "reserved_head",
        "route",
    )

    def __init__(self, parser: StreamParser | None) -> None:
        self.parser = parser
        self.datagram = parser is None
        self.route = -1
        self.ignore = False
        self.checked = False
        self.pending: list[Frame] = []
        self.fragment = 0
        """Bytes of an incomplete frame head this stream's parser holds, as last counted."""
        self.reserved_head: MessageHead | None = None
        """The unfinished MESSAGE whose bytes are charged (see ``Dispatch._charge``)."""
        self.reserved: tuple[ReceiverSM | None, int, bool] | None = None
        """(receiver charged, bytes, also counted as loose bytes) for ``reserved_head``."""


class Dispatch(Handshake):
    """Incoming streams and datagrams of one connection."""

    def __init__(
        self,
        side: Side,
        config: EngineConfig | None,
        headers: HeaderPairs,
        server_headers: ServerHeaders | None,
    ) -> None:
        super().__init__(side, config, headers, server_headers)
        self._waiting: list[FrameSequence] = []
        """Sequences whose routed frames wait for the peer's CONNECTION_HEADERS."""
        self._in: dict[int, FrameSequence] = {}
        self._loose_partial = 0

    # == transport inputs ==================================================================

    def stream_data(self, stream_id: int, data: Payload, fin: bool, now: float) -> bool:
        """Bytes of a stream arrived. Returns False when they only extended the payload of a
        MESSAGE still incomplete (no output, no timer changed: the caller may skip draining
        the outputs), True otherwise."""
        if self.closed:
            return False
        if self.peer_headers is None and not self._count_early(len(data)):
            return True
        if not self._early_ok:
            # §2.11: act on nothing before the handshake completes, unless 0-RTT is on.
            self._early.append(lambda: self._stream_data(stream_id, data, fin, self.now))
            return True
        return self._stream_data(stream_id, data, fin, now)

    def _stream_data(self, stream_id: int, data: Payload, fin: bool, now: float) -> bool:
        if self.closed:
            return False
        self.now = now
        seq = self._in.get(stream_id)
        if (
            seq is not None
            and not fin
            and seq.parser is not None
            and seq.parser.head is seq.reserved_head
            and seq.parser.absorb(data)
        ):
            return False  # more payload of a large MESSAGE, already charged: no frame yet
        try:
            if seq is None:
                seq = self._in[stream_id] = FrameSequence(
                    StreamParser(self.config.limits, self.config.flow_window is not None)
                )
            assert seq.parser is not None
            if data:
                self._process(seq, seq.parser.feed(data))
                if seq.parser.head is not seq.reserved_head:
                    self._charge(seq)
                if seq.parser.fragment_bytes != seq.fragment:
                    self._count_fragment(seq, seq.parser.fragment_bytes)
            if fin:
                del self._in[stream_id]
                seq.parser.finish()
            self._after_input()
        except RemoteProtocolError as exc:
            self._fail(exc)
        return True

    def stream_reset(self, stream_id: int, now: float) -> None:
        """The peer reset a stream: a partial frame is dropped, earlier frames stand."""
        if self.closed:
            return
        if not self._early_ok:
            self._early.append(lambda: self.stream_reset(stream_id, self.now))
            return
        self.now = now
        seq = self._in.pop(stream_id, None)
        if seq is not None:
            self._uncharge(seq)

    def datagram_received(self, data: bytes, now: float) -> None:
        if self.closed:
            return
        if self.peer_headers is None and not self._count_early(len(data)):
            return
        if not self._early_ok:
            self._early.append(lambda: self._datagram_received(data, self.now))
            return
        self._datagram_received(data, now)

    def _datagram_received(self, data: bytes, now: float) -> None:
        if self.closed:
            return
        self.now = now
        try:
            frames, _ = parse_datagram(
                data, self.config.limits, self.config.flow_window is not None
            )
            if frames:
                self._process(FrameSequence(None), frames)
                self._after_input()
        except RemoteProtocolError as exc:
            self._fail(exc)

    # == routing ===========================================================================

    def _process(self, seq: FrameSequence, frames: list[Frame]) -> None:
        for frame in frames:
            if not seq.checked:
                seq.checked = True
                if type(frame) is not Version and not self.sent_ack_version:
                    raise RemoteProtocolError(
                        "a frame sequence without VERSION arrived before we sent ACK_VERSION"
                    )
            kind = type(frame)
            if kind is Version:
                self._on_version(frame)  # type: ignore[arg-type]
            elif kind is AckVersion:
                self.got_ack_version = True
            elif kind is ConnectionHeaders:
                self._on_headers(frame)  # type: ignore[arg-type]
                self._release_waiting()
            elif self.peer_headers is None:
                if not seq.pending:
                    self._waiting.append(seq)
                seq.pending.append(frame)
            else:
                self._routed(seq, frame)

    def _release_waiting(self) -> None:
        """The peer's headers are in: route the frames that waited for them, in order."""
        waiting, self._waiting = self._waiting, []
        for seq in waiting:
            frames, seq.pending = seq.pending, []
            for f in frames:
                self._routed(seq, f)
        self._pump_all()

    def _routed(self, seq: FrameSequence, frame: Frame) -> None:
        kind = type(frame)
        reserved = 0
        if seq.reserved is not None and kind is Message:
            # The unfinished MESSAGE charged by _charge is complete: this is it.
            charged, reserved, loose = seq.reserved
            seq.reserved = None
            if loose:
                self._loose_partial -= reserved
            if charged is None or charged is not self.receivers.get(seq.route):
                if charged is not None:
                    charged.release(reserved)
                reserved = 0
        if kind is RouteTo:
            seq.route = frame.chanid  # type: ignore[union-attr]
            self._resolve(seq, seq.route)
            return
        chanid = seq.route
        we_send = (chanid >> 1) & 1 == self.side
        if kind is ForgetChannel:
            if chanid & 1 == self.side:
                raise RemoteProtocolError("FORGET_CHANNEL for a channel the peer did not create")
        elif kind in _SENDER_FRAMES:
            if we_send:
                raise RemoteProtocolError(f"{frame_name(kind)} routed to a channel we send on")
        elif we_send is False:
            raise RemoteProtocolError(f"{frame_name(kind)} routed to a channel we receive on")
        elif kind is Dequeued and self.own_window is None:
            raise RemoteProtocolError("DEQUEUED (tag 12) without negotiated flow control")
        if kind is ForgetChannel:
            # The creator declares the channel gone. This reaches a retained application
            # object even when the tombstone hides the state machine (§2.8).
            sm = self.senders.get(chanid) if we_send else None
            if sm is not None:
                self._sender_forgotten(sm)
            else:
                self._forgotten(chanid)
            return
        if seq.ignore:
            return
        if we_send:
            sm = self.senders.get(chanid)
            if sm is None:
                self._missing(seq, chanid)
            elif kind is AckReliable:
                sm.on_ack_reliable(frame.ranges)  # type: ignore[union-attr]
            elif kind is AckNackUnreliable:
                sm.on_ack_nack(frame.ranges)  # type: ignore[union-attr]
            elif kind is Dequeued:
                sm.on_dequeued(frame.num_bytes)  # type: ignore[union-attr]
            else:
                self._sender_closed(sm)
            return
        rm = self.receivers.get(chanid)
        if rm is None:
            self._missing(seq, chanid)
        elif kind is Message:
            rm.on_message(frame, seq.datagram, reserved)  # type: ignore[arg-type]
        elif kind is SentUnreliable:
            rm.on_sent_unreliable(frame.count)  # type: ignore[union-attr]
        elif kind is FinishSender:
            rm.on_finish(frame.sent_reliable)  # type: ignore[union-attr]
        else:
            rm.on_cancel()

    def _resolve(self, seq: FrameSequence, chanid: int) -> None:
        """ROUTE_TO: find (or, for remote-created channels, create) the channel state."""
        space = chanid & 7
        we_send = (chanid >> 1) & 1 == self.side
        table: dict[int, SenderSM] | dict[int, ReceiverSM] = (
            self.senders if we_send else self.receivers
        )
        if chanid & 1 == self.side:
            if chanid >> 3 >= self._next_index[space]:
                raise RemoteProtocolError(f"ROUTE_TO names chanid {chanid}, never allocated")
            if chanid not in table:
                self._missing(seq, chanid)
        elif chanid >> 3 in self._tombstones[space]:
            seq.ignore = True  # late frames for a destroyed channel (G19, case 47)
        elif chanid not in table:
            self._create_remote(chanid, attached=False)

    def _missing(self, seq: FrameSequence, chanid: int) -> None:
        """No state for the routed channel: FORGET if we created it, else ignore (§2.8)."""
        seq.ignore = True
        if chanid & 1 == self.side:
            self._forget(chanid)

    # == memory ============================================================================

    def _charge(self, seq: FrameSequence) -> None:
        """A MESSAGE head arrived whose payload is still coming: charge its bytes now, to the
        channel's window and, where no attached channel's window covers them, to the
        connection's cap for unattached bytes. Memory then grows only with what we granted,
        never with a payload length a peer merely announces."""
        parser = seq.parser
        assert parser is not None
        head = parser.head
        if head is None:
            seq.reserved_head = None
            return
        if self.peer_headers is None:
            return  # routes are not resolved yet; the bytes count in _count_early
        seq.reserved_head = head
        cost = cost_of(head.payload_len, len(head.attachments))  # the head's bytes aside
        rm = None if seq.ignore else self.receivers.get(seq.route)
        loose = rm is None or not self.endpoints[rm.chanid].attached
        seq.reserved = (rm, cost, loose)
        if rm is not None:
            rm.reserve(cost)
            if not loose:
                self._gather_buffer(parser, head, rm, cost)
        if loose:
            self._loose_partial += cost
            if self._unattached_bytes + self._loose_partial > self.config.max_pending_bytes:
                raise RemoteProtocolError(
                    "too many bytes of unfinished messages for channels that are not attached",
                    CloseCode.LIMIT_VIOLATION,
                )

    def _gather_buffer(
        self, parser: StreamParser, head: MessageHead, rm: ReceiverSM, cost: int
    ) -> None:
        """A buffer of the payload's whole length for the parser to gather into, from
        ``EngineConfig.payload_buffers``, when the message is large and its whole cost lies
        within the channel's window (granted, not merely announced: a message beyond the
        window, which the progress rule lets through alone, grows with what arrives)."""
        make = self.config.payload_buffers
        window = rm.window()
        if make is None or window is None or cost > window or head.payload_len < GATHER_FROM:
            return
        got = make(head.payload_len, self.endpoints[rm.chanid].headers)
        if got is not None:
            parser.gather_into(*got)

    def _count_fragment(self, seq: FrameSequence, nbytes: int) -> None:
        """Incomplete frame heads (up to the header and list limits each) are held per
        stream; across thousands of streams they count against ``max_pending_bytes``."""
        grew = nbytes > seq.fragment
        self._loose_partial += nbytes - seq.fragment
        seq.fragment = nbytes
        if grew and self._unattached_bytes + self._loose_partial > self.config.max_pending_bytes:
            raise RemoteProtocolError(
                "too many bytes of unfinished frames across streams", CloseCode.LIMIT_VIOLATION
            )

    def _uncharge(self, seq: FrameSequence) -> None:
        """A stream was reset: release what its unfinished frame was charged."""
        self._loose_partial -= seq.fragment
        seq.fragment = 0
        if seq.reserved is None:
            return
        charged, cost, loose = seq.reserved
        seq.reserved = None
        if charged is not None:
            charged.release(cost)
        if loose:
            self._loose_partial -= cost

    def _drop_state(self, detail: str) -> None:
        super()._drop_state(detail)
        self._in.clear()
        self._waiting.clear()
