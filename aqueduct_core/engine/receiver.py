"""The receiver state machine (profile §2.6, §2.7 for oneshots, §3.4 for credit).

States (:class:`RecvState`), moved only through :data:`TRANSITIONS`, plain data like h11's::

    OPEN --FINISH_SENDER--> FINISH_PENDING --COMPLETE--> CLOSED
    OPEN --CANCEL_SENDER or APP_CLOSE--> CLOSED <--APP_CLOSE-- FINISH_PENDING
    OPEN or FINISH_PENDING --ABANDON--> ABANDONED

OPEN takes messages and SENT_UNRELIABLE. FINISH_PENDING (FINISH_SENDER seen, or a oneshot's
message 0, which implies "finished with 1", §2.7) still takes the messages FINISH counted,
and waits until every reliable one arrived and every declared unreliable number was decided
(never earlier, case 43). CLOSED: CLOSE_RECEIVER was sent, after the final acks (G17); the
machine is destroyed, the application's endpoint may remain. ABANDONED: destroyed without
CLOSE, because the channel is lost, forgotten, or the connection ended. A frame from the
peer that the table does not allow in the current state is a RemoteProtocolError; the
engine's own inputs (COMPLETE, APP_CLOSE, ABANDON) out of place would be a bug in the engine.

Ack policy: "received means acked" (§2.6). Every received message is acked within the ack
delay, and before CLOSE_RECEIVER (G17), so a message the application dequeued can never be
counted as nacked and its attachments never falsely declared lost. All ack, DEQUEUED and
CLOSE frames of a channel share one control stream, which is what makes the ack bases (G8, G9)
and the DEQUEUED deltas (§3.2 item 5) well defined.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Callable
from typing import Protocol

from aqueduct_core.engine.config import EngineConfig
from aqueduct_core.engine.events import Terminal
from aqueduct_core.engine.rangeset import RangeSet
from aqueduct_core.errors import CloseCode, RemoteProtocolError
from aqueduct_core.wire import ranges as wr
from aqueduct_core.wire.frames import (
    AckNackUnreliable,
    AckReliable,
    CloseReceiver,
    Dequeued,
    Message,
    encode_frame,
    push_frame,
)
from aqueduct_core.wire.primitives import MAX_U64


class RecvState(enum.Enum):
    OPEN = "open"
    FINISH_PENDING = "finish pending"
    """FINISH_SENDER seen: waiting for its messages and for unreliable decisions."""
    CLOSED = "closed"
    """CLOSE_RECEIVER sent (finished, cancelled, or closed by the application)."""
    ABANDONED = "abandoned"
    """Destroyed without CLOSE: lost, forgotten, or the connection ended."""


class RecvInput(enum.Enum):
    """What moves a receiver: frames from the peer, then the engine's own inputs."""

    MESSAGE = "MESSAGE"
    SENT_UNRELIABLE = "SENT_UNRELIABLE"
    FINISH_SENDER = "FINISH_SENDER"
    """Also a oneshot's message 0 (§2.7)."""
    CANCEL_SENDER = "CANCEL_SENDER"
    COMPLETE = "complete"
    """After FINISH: every reliable message arrived and every unreliable number is decided."""
    APP_CLOSE = "application close"
    """The application closed the receiver, or the message carrying it was discarded."""
    ABANDON = "abandon"


_S, _I = RecvState, RecvInput
TRANSITIONS: dict[tuple[RecvState, RecvInput], RecvState] = {
    (_S.OPEN, _I.MESSAGE): _S.OPEN,
    (_S.OPEN, _I.SENT_UNRELIABLE): _S.OPEN,
    (_S.OPEN, _I.FINISH_SENDER): _S.FINISH_PENDING,
    (_S.OPEN, _I.CANCEL_SENDER): _S.CLOSED,
    (_S.OPEN, _I.APP_CLOSE): _S.CLOSED,
    (_S.OPEN, _I.ABANDON): _S.ABANDONED,
    (_S.FINISH_PENDING, _I.MESSAGE): _S.FINISH_PENDING,
    (_S.FINISH_PENDING, _I.COMPLETE): _S.CLOSED,
    (_S.FINISH_PENDING, _I.APP_CLOSE): _S.CLOSED,
    (_S.FINISH_PENDING, _I.ABANDON): _S.ABANDONED,
}
"""Every allowed (state, input) and the state it leads to; any other pair is refused."""

_FROM_PEER = frozenset({_I.MESSAGE, _I.SENT_UNRELIABLE, _I.FINISH_SENDER, _I.CANCEL_SENDER})
_REFUSED = {
    _I.SENT_UNRELIABLE: "SENT_UNRELIABLE after FINISH_SENDER or CANCEL_SENDER",
    _I.FINISH_SENDER: "a second FINISH_SENDER, or FINISH after CANCEL",
    _I.CANCEL_SENDER: "a second CANCEL_SENDER, or CANCEL after FINISH",
}


class ReceiverHost(Protocol):
    """What a receiver state machine uses of its connection (:class:`~.connection.Connection`
    is the one implementation; the machine never imports it)."""

    @property
    def config(self) -> EngineConfig: ...
    @property
    def now(self) -> float: ...
    @property
    def own_window(self) -> int | None: ...
    def unreliable_deadline(self) -> float: ...
    def schedule(self, delay: float, callback: Callable[[], None]) -> None: ...
    def schedule_at(self, when: float, callback: Callable[[], None]) -> None: ...
    def ctrl_write(self, sm: ReceiverSM, data: bytes, fin: bool = False) -> None: ...
    def message_arrived(self, rm: ReceiverSM, frame: Message) -> int: ...
    def receiver_closed(self, rm: ReceiverSM, terminal: Terminal) -> None: ...


class ReceiverSM:
    def __init__(self, conn: ReceiverHost, chanid: int, oneshot: bool) -> None:
        self.conn = conn
        self.chanid = chanid
        self.oneshot = oneshot
        self.state = RecvState.OPEN
        self.received = RangeSet()
        """Reliable numbers received at or above ``rel_base``."""
        self.rel_base = 0
        """Lowest reliable number not yet acked (the ACK_RELIABLE base, G8)."""
        self.rel_unacked: list[int] = []
        self.unrel_cursor = 0
        """Unreliable numbers below this are decided (the ACK_NACK base, G9)."""
        self.unrel_pending = RangeSet()
        """Unreliable numbers received at or above ``unrel_cursor``, not yet acked."""
        self.unrel_known = 0
        """Unreliable numbers below this are known to have been sent (G14)."""
        self.unrel_declared = 0
        self.deadlines: deque[tuple[float, int]] = deque()
        self.deadline_armed = False
        self.ack_armed = False
        self.finish_count: int | None = None
        self.ctrl_stream: int | None = None
        # flow control (§3.4): bytes received minus bytes reported dequeued
        self.in_flight = 0
        self.unreported = 0
        self.deq_armed = False
        self.window_cap: int | None = None
        """A window smaller than the connection's for this channel: the entrypoint's on a
        server that grants one (``EngineConfig.entry_window``)."""

    # -- the state table ---------------------------------------------------------------

    @property
    def alive(self) -> bool:
        """The machine still runs: not closed, not abandoned."""
        return self.state is _S.OPEN or self.state is _S.FINISH_PENDING

    def _move(self, event: RecvInput) -> None:
        """Take ``event`` through :data:`TRANSITIONS`, or refuse it."""
        new = TRANSITIONS.get((self.state, event))
        if new is None:
            if event in _FROM_PEER:
                raise RemoteProtocolError(
                    _REFUSED.get(event, f"{event.value} in receiver state {self.state.value}")
                )
            raise AssertionError(f"engine bug: {event.value} in receiver state {self.state.value}")
        self.state = new

    def close(self) -> None:
        """The application closed the receiver (or its carrying message was discarded):
        final acks, then CLOSE_RECEIVER (G17)."""
        self._move(_I.APP_CLOSE)
        self.conn.receiver_closed(self, Terminal.CLOSED)

    def abandon(self) -> None:
        """Destroyed without CLOSE (lost, forgotten, connection ended): timers fall silent.
        The control stream, if any, is the connection's to reset."""
        self._move(_I.ABANDON)

    # -- frames from the sender --------------------------------------------------------

    def on_message(self, frame: Message, datagram: bool, reserved: int = 0) -> None:
        """``reserved``: bytes of this message already charged by :meth:`reserve` while its
        payload was arriving."""
        self._move(_I.MESSAGE)
        n = frame.num
        if datagram:
            if self.oneshot:
                raise RemoteProtocolError("a oneshot message arrived in a datagram")
            if n < self.unrel_cursor:
                return  # already decided; a nacked message is never delivered (case 41)
            if n in self.unrel_pending:
                raise RemoteProtocolError(f"duplicate unreliable MESSAGE_NUM {n}")
            if self.finish_count is not None and n >= self.unrel_declared:
                raise RemoteProtocolError("unreliable MESSAGE_NUM beyond the declared total")
            if n == MAX_U64:
                raise RemoteProtocolError("MESSAGE_NUM 2**64-1 is not allowed")
            self._check_gap(n, self.unrel_cursor, "unreliable")
            self.unrel_pending.add(n)
            self._raise_known(n + 1)
        else:
            if n == MAX_U64:
                raise RemoteProtocolError("MESSAGE_NUM 2**64-1 is not allowed")
            if n < self.rel_base or n in self.received:
                raise RemoteProtocolError(f"duplicate reliable MESSAGE_NUM {n}")
            if self.finish_count is not None and n >= self.finish_count:
                raise RemoteProtocolError(f"MESSAGE_NUM {n} is beyond FINISH_SENDER's count")
            if self.oneshot and n != 0:
                raise RemoteProtocolError("a oneshot channel carries only message 0")
            self._check_gap(n, self.rel_base, "reliable")
            self.received.add(n)
            self.rel_unacked.append(n)
        cost = self.conn.message_arrived(self, frame)
        self._charge(cost, already=reserved)
        if self.oneshot:
            self.finish_count = 1  # message 0 implies "finished with 1" (§2.7)
            if self.state is _S.OPEN:
                self._move(_I.FINISH_SENDER)
            self._check_complete()
            return
        if not self.ack_armed:
            self.ack_armed = True
            self.conn.schedule(self.conn.config.ack_delay, self._ack_timer)
        if self.finish_count is not None:
            self._check_complete()

    def on_sent_unreliable(self, count: int) -> None:
        if self.oneshot:
            raise RemoteProtocolError("SENT_UNRELIABLE on a oneshot channel")
        self._move(_I.SENT_UNRELIABLE)
        self.unrel_declared += count
        if self.unrel_declared > MAX_U64:
            raise RemoteProtocolError("SENT_UNRELIABLE total overflows")
        if count:
            self._check_gap(self.unrel_declared - 1, self.unrel_cursor, "unreliable")
        self._raise_known(self.unrel_declared)

    def _check_gap(self, n: int, cursor: int, space: str) -> None:
        """G31: a message number may lie at most ``max_message_gap`` beyond the lowest number
        still undecided, so no peer can make us track (or ack) numbers it never sent."""
        limit = self.conn.config.max_message_gap
        if n - cursor >= limit:
            raise RemoteProtocolError(
                f"{space} MESSAGE_NUM {n} is {n - cursor} beyond the lowest undecided number "
                f"{cursor}; at most {limit} are allowed (G31)",
                CloseCode.LIMIT_VIOLATION,
            )

    def reserve(self, cost: int) -> None:
        """The head of a MESSAGE costing ``cost`` arrived; its payload is still coming.
        Charge the window now, so bytes of unfinished messages are never held beyond what we
        granted (the same progress rule as for a complete message)."""
        self._charge(cost, unfinished=True)

    def _charge(self, cost: int, *, already: int = 0, unfinished: bool = False) -> None:
        """Add a message costing ``cost`` (``already`` of it charged before) to the bytes in
        flight; beyond the window a violation, unless it is the only message (the progress
        rule, §3.4 item 3)."""
        window = self._window()
        if window is None:
            return
        self.in_flight += cost - already
        if self.in_flight > window and self.in_flight != cost:
            if window == self.window_cap:
                setting = self.conn.config.entry_window_setting
                raise RemoteProtocolError(
                    f"the client sent more requests ahead than the server's entrypoint window "
                    f"allows ({self.in_flight} > {window} bytes; {setting}); a client that "
                    "honours the window (the aqueduct-entry-window header) waits instead: "
                    f"upgrade the client's Aqueduct library, or raise {setting}",
                    CloseCode.LIMIT_VIOLATION,
                )
            what = "an unfinished message" if unfinished else "a message"
            raise RemoteProtocolError(
                f"sender exceeded the flow-control window with {what} "
                f"({self.in_flight} > {window})",
                CloseCode.LIMIT_VIOLATION,
            )

    def window(self) -> int | None:
        """The bytes this channel may hold (None: no flow control)."""
        return self._window()

    def _window(self) -> int | None:
        """The bytes this channel may hold (None: no flow control)."""
        window = self.conn.own_window
        cap = self.window_cap
        if window is None or cap is None:
            return window
        return min(window, cap)

    def release(self, cost: int) -> None:
        """An unfinished message charged by :meth:`reserve` was dropped (its stream reset)."""
        if self.conn.own_window is not None:
            self.in_flight -= cost

    def on_finish(self, count: int) -> None:
        self._move(_I.FINISH_SENDER)
        if self.oneshot and count > 1:
            raise RemoteProtocolError("FINISH_SENDER > 1 on a oneshot channel")
        top = self.received.ranges()[-1][1] if self.received else 0
        if max(top, self.rel_base) > count:
            raise RemoteProtocolError("FINISH_SENDER count below a received MESSAGE_NUM")
        if self.unrel_known > self.unrel_declared:
            raise RemoteProtocolError("unreliable messages beyond SENT_UNRELIABLE's total")
        self.finish_count = count
        self._check_complete()

    def on_cancel(self) -> None:
        self._move(_I.CANCEL_SENDER)
        self.conn.receiver_closed(self, Terminal.CANCELLED)

    # -- completion --------------------------------------------------------------------

    def _check_complete(self) -> None:
        if self.state is not _S.FINISH_PENDING:
            return
        count = self.finish_count
        assert count is not None
        if self.received.first_gap(self.rel_base) < count:
            return
        # received numbers will be acked by final_acks: nothing left to wait for
        upto = self.unrel_pending.first_gap(self.unrel_cursor)
        if upto < self.unrel_declared:
            return  # unreliable numbers still missing: never nack early (case 43)
        self._move(_I.COMPLETE)
        self.conn.receiver_closed(self, Terminal.FINISHED)

    # -- unreliable deadlines ----------------------------------------------------------

    def _raise_known(self, upto: int) -> None:
        if upto <= self.unrel_known:
            return
        self.unrel_known = upto
        conn = self.conn
        self.deadlines.append((conn.now + conn.unreliable_deadline(), upto))
        if not self.deadline_armed:
            self.deadline_armed = True
            conn.schedule_at(self.deadlines[0][0], self._deadline_timer)

    def _deadline_timer(self) -> None:
        self.deadline_armed = False
        if not self.alive:
            return
        now = self.conn.now
        upto = self.unrel_cursor
        while self.deadlines and self.deadlines[0][0] <= now:
            upto = max(upto, self.deadlines.popleft()[1])
        buf = bytearray()
        self._push_acks(buf, decide_upto=upto)
        if buf:
            self.conn.ctrl_write(self, bytes(buf))
        if self.deadlines:
            self.deadline_armed = True
            self.conn.schedule_at(self.deadlines[0][0], self._deadline_timer)
        self._check_complete()

    # -- acks --------------------------------------------------------------------------

    def _ack_timer(self) -> None:
        self.ack_armed = False
        if self.alive:
            buf = bytearray()
            self._push_acks(buf)
            if buf:
                self.conn.ctrl_write(self, bytes(buf))

    def _push_acks(self, buf: bytearray, decide_upto: int = 0) -> None:
        """Ack every received message, and decide unreliable numbers below ``decide_upto``
        (missing ones are nacked). A contiguous received prefix is acked early."""
        if self.rel_unacked:
            push_frame(buf, AckReliable(wr.encode_ack_reliable(self.rel_base, self.rel_unacked)))
            self.rel_unacked = []
            self.rel_base = self.received.first_gap(self.rel_base)
            self.received.discard_below(self.rel_base)
        cursor = self.unrel_cursor
        pending = self.unrel_pending
        upto = pending.first_gap(max(cursor, decide_upto))
        if upto > cursor:
            # Work and bytes are per run of received numbers, never per number (G31).
            acked = pending.ranges_within(cursor, upto)
            push_frame(buf, AckNackUnreliable(wr.encode_ack_nack_runs(cursor, upto, acked)))
            pending.discard_below(upto)
            self.unrel_cursor = upto

    def final_acks(self) -> bytes:
        """Acks for everything received, before CLOSE_RECEIVER (G17). Received unreliable
        numbers beyond a gap are acked by deciding the gap (CLOSE nacks it anyway)."""
        buf = bytearray()
        upto = self.unrel_pending.ranges()[-1][1] if self.unrel_pending else 0
        self._push_acks(buf, decide_upto=upto)
        push_frame(buf, CloseReceiver())
        return bytes(buf)

    # -- flow control ------------------------------------------------------------------

    def dequeued(self, cost: int) -> None:
        """The application took ``cost`` bytes (or they were evicted): report them."""
        window = self._window()
        if window is None or not self.alive:
            return
        self.unreported += cost
        if self.unreported * 2 >= window:
            self._report_dequeued()
        elif not self.deq_armed:
            self.deq_armed = True
            self.conn.schedule(self.conn.config.dequeued_delay, self._deq_timer)

    def _deq_timer(self) -> None:
        self.deq_armed = False
        if self.alive and self.unreported:
            self._report_dequeued()

    def _report_dequeued(self) -> None:
        n = self.unreported
        self.unreported = 0
        self.in_flight -= n
        self.conn.ctrl_write(self, encode_frame(Dequeued(n)))
