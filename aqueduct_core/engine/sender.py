"""The sender state machine (profile §2.5, §2.7 for oneshots, §3.4 for credit).

States: OPEN (may send) -> FINISHING (FINISH sent, waiting for CLOSE_RECEIVER) or CANCELLING
(CANCEL sent, waiting for CLOSE_RECEIVER) -> destroyed. CLOSE_RECEIVER or FORGET_CHANNEL
destroys the machine from any state; its lineage node may live on (§2.9).

Messages the application sends wait in ``queue`` until the channel has credit; the transport
and the message number are chosen only when a message leaves the queue (G13: the transport is
chosen *before* the number, so an oversized unreliable message is numbered in the reliable
space). A message dropped from the queue never had a number, so the channels it carried are
lost locally with no wire traffic (§2.9 item 5).
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from aqueduct_core.engine.config import EngineConfig
from aqueduct_core.engine.lineage import Lineage
from aqueduct_core.engine.rangeset import RangeSet
from aqueduct_core.errors import CloseCode, LocalProtocolError, RemoteProtocolError, WouldBlock
from aqueduct_core.wire import ranges as wr
from aqueduct_core.wire.frames import (
    Attachment,
    CancelSender,
    FinishSender,
    Gather,
    Message,
    OutPayload,
    Payload,
    SentUnreliable,
    cost_of,
    encode_frame,
    joined,
    message_parts,
)
from aqueduct_core.wire.primitives import Headers

SMALL_WRITE = 16 * 1024
"""Payloads up to this size are joined with their frame head into one write; larger ones go
as they are (a :class:`~aqueduct_core.wire.frames.Gather` part by part), never copied."""


class Mode(enum.Enum):
    """How a sender puts messages on the wire (§3.3). The receiver never sees the mode."""

    ORDERED = "ordered"
    """One long-lived stream; messages arrive in order."""
    UNORDERED = "unordered"
    """One stream per message; no head-of-line blocking between messages."""
    UNRELIABLE = "unreliable"
    """One datagram per message (a stream if it does not fit); may be lost."""
    ONESHOT = "oneshot"


class QueuePolicy(enum.Enum):
    """What a send does when ``maxsize`` messages already wait for credit (§3.4 item 2)."""

    UNBOUNDED = "unbounded"
    BLOCK = "block"
    """``send`` raises WouldBlock (the asyncio layer waits for SenderReady)."""
    DROP_OLDEST = "drop_oldest"
    """The oldest waiting message is discarded (unreliable channels)."""


class SendState(enum.Enum):
    OPEN = "open"
    FINISHING = "finishing"
    CANCELLING = "cancelling"
    RECEIVER_GONE = "receiver gone"
    """FORGET arrived for a held sender; waiting for the CLOSE that must follow."""


@dataclass(slots=True)
class Outgoing:
    headers: Headers
    payload: OutPayload
    attachments: tuple[Attachment, ...]
    children: list[int]


class SenderHost(Protocol):
    """What a sender state machine uses of its connection (:class:`~.connection.Connection`
    is the one implementation; the machine never imports it)."""

    @property
    def config(self) -> EngineConfig: ...
    @property
    def lineage(self) -> Lineage: ...
    @property
    def can_send_data(self) -> bool: ...
    @property
    def peer_window(self) -> int | None: ...
    @property
    def max_datagram(self) -> int: ...
    def transport_ready(self) -> bool: ...
    def block_sender(self, sm: SenderSM) -> None: ...
    def credit_stalled(self) -> None: ...
    def sender_ready(self, chanid: int) -> None: ...
    def seq_prefix(self, chanid: int) -> bytes: ...
    def route_sent(self, chanid: int) -> None: ...
    def open_stream(self) -> int: ...
    def write(self, stream_id: int, data: Payload, fin: bool = False) -> None: ...
    def ctrl_write(self, sm: SenderSM, data: bytes, fin: bool = False) -> None: ...
    def reset(self, stream_id: int) -> None: ...
    def send_datagram(self, data: bytes) -> None: ...
    def schedule(self, delay: float, callback: Callable[[], None]) -> None: ...


class SenderSM:
    def __init__(self, conn: SenderHost, chanid: int, oneshot: bool) -> None:
        self.conn = conn
        self.chanid = chanid
        self.oneshot = oneshot
        self.mode = Mode.ONESHOT if oneshot else Mode.ORDERED
        self.state = SendState.OPEN
        self.alive = True
        self.queue: deque[Outgoing] = deque()
        self.policy = QueuePolicy.UNBOUNDED
        self.maxsize = 0
        self.finish_requested = False
        self.next_rel = 0
        self.next_unrel = 0
        self.unflushed_unrel = 0
        self.declared_any = False
        self.flush_armed = False
        self.acked = RangeSet()
        self.acked_base = 0
        self.unrel_cursor = 0
        self.unrel_costs: dict[int, int] = {}
        self.ordered_stream: int | None = None
        self.ctrl_stream: int | None = None
        self.msg_streams: dict[int, int] = {}
        """Reliable message number -> its own stream, until acked (reset on cancel)."""
        self.outstanding = 0
        self.window_cap: int | None = None
        """Credit smaller than the peer's per-channel window: the entrypoint's, when the
        server grants it less (``aqueduct-entry-window``, profile §4)."""
        self.stalled = False
        """A message waits for the peer's credit (counted once per wait, :class:`~.output.FlowStalls`)."""

    # -- application side ---------------------------------------------------------------

    def configure(self, mode: Mode, policy: QueuePolicy, maxsize: int) -> None:
        # Any time is fine: the receiver never sees the mode, so a channel may change it.
        if self.oneshot:
            raise LocalProtocolError("a oneshot sender has no mode to choose")
        if policy is not QueuePolicy.UNBOUNDED and maxsize < 1:
            raise LocalProtocolError("a bounded queue needs maxsize >= 1")
        if policy is QueuePolicy.DROP_OLDEST and mode is not Mode.UNRELIABLE:
            raise LocalProtocolError("drop-oldest queues are for unreliable senders only")
        self.mode, self.policy, self.maxsize = mode, policy, maxsize

    def check_can_send(self) -> None:
        """Raise WouldBlock before anything is minted for a send that cannot be queued."""
        if self.oneshot and (self.next_rel or self.queue):
            raise LocalProtocolError("a oneshot sender sends exactly one message")
        if self.policy is QueuePolicy.BLOCK and len(self.queue) >= self.maxsize:
            raise WouldBlock("the sender's queue is full; wait for room")

    def send(self, out: Outgoing) -> None:
        if self.policy is QueuePolicy.DROP_OLDEST and len(self.queue) >= self.maxsize:
            evicted = self.queue.popleft()
            self.conn.lineage.lose_all(evicted.children)
        self.queue.append(out)
        self.pump()

    def finish(self) -> None:
        self.finish_requested = True
        if not self.queue:
            self._finish_now()

    def cancel(self) -> None:
        """Drop unsent messages, reset message streams, CANCEL on a stream not reset (G15)."""
        if self.state is not SendState.OPEN:
            return
        self._drop_queue()
        self._reset_message_streams()
        self._flush_unreliable()
        self.conn.ctrl_write(self, encode_frame(CancelSender()), fin=True)
        self.state = SendState.CANCELLING

    # -- the pump ----------------------------------------------------------------------

    def pump(self) -> None:
        """Move queued messages to the wire while credit and the transport allow."""
        conn = self.conn
        if not conn.can_send_data:
            return
        window = conn.peer_window
        if window is not None and self.window_cap is not None:
            window = min(window, self.window_cap)
        queue = self.queue
        while queue and self.state is SendState.OPEN:
            if not conn.transport_ready():
                conn.block_sender(self)
                break
            out = queue[0]
            unreliable = False
            if self.mode is Mode.UNRELIABLE:
                head = message_parts(
                    Message(self.next_unrel, out.headers, out.attachments, out.payload)
                )
                size = len(conn.seq_prefix(self.chanid)) + len(head) + len(out.payload)
                unreliable = size <= conn.max_datagram
            num = self.next_unrel if unreliable else self.next_rel
            if not unreliable:
                head = message_parts(Message(num, out.headers, out.attachments, out.payload))
            cost = cost_of(len(head) + len(out.payload), len(out.attachments))
            if window is not None and self.outstanding and self.outstanding + cost > window:
                # the progress rule: a message may always go when nothing is outstanding
                if not self.stalled:
                    self.stalled = True
                    conn.credit_stalled()
                break
            queue.popleft()
            self.stalled = False
            if window is not None:
                self.outstanding += cost
            conn.lineage.numbered(self.chanid, (unreliable, num), out.children)
            if unreliable:
                self.next_unrel += 1
                if window is not None:
                    self.unrel_costs[num] = cost
                conn.send_datagram(conn.seq_prefix(self.chanid) + head + joined(out.payload))
                conn.route_sent(self.chanid)
                self.unflushed_unrel += 1
                if not self.flush_armed:
                    self.flush_armed = True
                    conn.schedule(conn.config.sent_unreliable_delay, self._flush_timer)
            else:
                self.next_rel += 1
                self._write_reliable(num, head, out.payload)
            if self.policy is QueuePolicy.BLOCK and len(queue) == self.maxsize - 1:
                conn.sender_ready(self.chanid)
        if self.finish_requested and not queue and self.state is SendState.OPEN:
            self._finish_now()

    def _write_reliable(self, num: int, head: bytes, payload: OutPayload) -> None:
        conn = self.conn
        if self.mode is Mode.ORDERED:
            sid = self.ordered_stream
            if sid is None:
                sid = self.ordered_stream = conn.open_stream()
                head = conn.seq_prefix(self.chanid) + head
                conn.route_sent(self.chanid)
            fin = False
        else:
            sid = conn.open_stream()
            head = conn.seq_prefix(self.chanid) + head
            conn.route_sent(self.chanid)
            self.msg_streams[num] = sid
            fin = True
        if len(payload) <= SMALL_WRITE:
            conn.write(sid, head + joined(payload), fin)
        elif isinstance(payload, Gather):
            parts = payload.parts
            first = parts[0]
            if len(first) <= SMALL_WRITE:  # an IPC message's metadata rides with the head
                conn.write(sid, head + first)
                parts = parts[1:]
            else:
                conn.write(sid, head)
            last = len(parts) - 1
            for i, part in enumerate(parts):
                conn.write(sid, part, fin and i == last)
        else:
            conn.write(sid, head)
            conn.write(sid, payload, fin)
        if self.oneshot:
            self.state = SendState.FINISHING  # message 0 implies "finished with 1" (§2.7)

    def _flush_timer(self) -> None:
        self.flush_armed = False
        if self.alive and self.state is SendState.OPEN:
            self._flush_unreliable()

    def _flush_unreliable(self) -> None:
        if self.unflushed_unrel:
            self.conn.ctrl_write(self, encode_frame(SentUnreliable(self.unflushed_unrel)))
            self.unflushed_unrel = 0
            self.declared_any = True

    def _finish_now(self) -> None:
        conn = self.conn
        self.state = SendState.FINISHING
        if self.oneshot:
            # Finishing a oneshot that never sent: FINISH_SENDER(0) (§2.7).
            conn.ctrl_write(self, encode_frame(FinishSender(0)), fin=True)
            return
        self._flush_unreliable()
        frame = encode_frame(FinishSender(self.next_rel))
        if self.ordered_stream is not None and not self.declared_any:
            # G15: with no SENT_UNRELIABLE ever sent, FINISH may ride at the tail of the
            # ordered stream.
            conn.write(self.ordered_stream, frame, fin=True)
            self.ordered_stream = None
            if self.ctrl_stream is not None:
                conn.write(self.ctrl_stream, b"", fin=True)
                self.ctrl_stream = None
        else:
            conn.ctrl_write(self, frame, fin=True)
            if self.ordered_stream is not None:
                conn.write(self.ordered_stream, b"", fin=True)
                self.ordered_stream = None

    # -- frames from the receiver ------------------------------------------------------

    def on_ack_reliable(self, ranges: tuple[int, ...]) -> None:
        lineage = self.conn.lineage
        node = lineage.nodes.get(self.chanid)
        for start, stop in wr.ack_reliable_runs(self.acked_base, ranges):
            if stop > self.next_rel:
                raise RemoteProtocolError(f"ACK_RELIABLE acks message {stop - 1}, never sent")
            if self.acked.overlaps(start, stop):
                raise RemoteProtocolError("ACK_RELIABLE acks a message twice")
            self.acked.add_range(start, stop)
            if self.msg_streams:
                for n in range(start, stop):
                    self.msg_streams.pop(n, None)
            if node is not None and node.unacked:
                for n in range(start, stop):
                    lineage.ack(self.chanid, (False, n))
        self.acked_base = self.acked.first_gap(self.acked_base)
        self.acked.discard_below(self.acked_base)

    def on_ack_nack(self, ranges: tuple[int, ...]) -> None:
        total = sum(ranges)
        if self.unrel_cursor + total > self.next_unrel:
            raise RemoteProtocolError("ACK_NACK_UNRELIABLE decides messages never sent")
        lineage = self.conn.lineage
        released = 0
        for start, stop, acked in wr.ack_nack_runs(self.unrel_cursor, ranges):
            for n in range(start, stop):
                cost = self.unrel_costs.pop(n, 0)
                if acked:
                    lineage.ack(self.chanid, (True, n))
                else:
                    released += cost
                    lineage.nack(self.chanid, (True, n))
        self.unrel_cursor += total
        if released:
            self.outstanding -= released
            self.pump()

    def on_dequeued(self, num_bytes: int) -> None:
        if num_bytes > self.outstanding:
            raise RemoteProtocolError(
                f"DEQUEUED reports {num_bytes} bytes but only {self.outstanding} are outstanding",
                CloseCode.LIMIT_VIOLATION,
            )
        self.outstanding -= num_bytes
        self.pump()

    def nack_everything(self) -> None:
        """CLOSE_RECEIVER (and FORGET, G28): every number not yet acked is nacked."""
        lineage = self.conn.lineage
        node = lineage.nodes.get(self.chanid)
        if node is not None:
            for key in list(node.unacked):
                lineage.nack(self.chanid, key)

    def receiver_gone(self) -> None:
        """Stop sending: the receiver is gone; its CLOSE will settle what was sent."""
        self.state = SendState.RECEIVER_GONE
        self._drop_queue()

    # -- teardown ----------------------------------------------------------------------

    def _drop_queue(self) -> None:
        lost: list[int] = []
        for out in self.queue:
            lost.extend(out.children)
        self.queue.clear()
        if lost:
            self.conn.lineage.lose_all(lost)

    def _reset_message_streams(self) -> None:
        conn = self.conn
        if self.ordered_stream is not None:
            conn.reset(self.ordered_stream)
            self.ordered_stream = None
        for sid in self.msg_streams.values():
            conn.reset(sid)
        self.msg_streams.clear()

    def teardown(self, reset_ctrl: bool) -> list[int]:
        """Release streams and the queue when the machine is destroyed. Returns the
        children of unsent messages (lost locally)."""
        self.alive = False
        lost: list[int] = []
        for out in self.queue:
            lost.extend(out.children)
        self.queue.clear()
        self._reset_message_streams()
        if self.ctrl_stream is not None:
            if reset_ctrl:
                self.conn.reset(self.ctrl_stream)
            else:
                self.conn.write(self.ctrl_stream, b"", fin=True)
            self.ctrl_stream = None
        return lost
