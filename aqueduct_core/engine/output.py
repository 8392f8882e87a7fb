"""What a connection hands out: transport commands, application events and timers.

The bottom layer of :class:`~aqueduct_core.engine.Connection` (see
``aqueduct_core/engine/__init__.py`` for the theory of operation). It numbers our streams,
writes to them, keeps the transport's backlog against its budget (senders pause above it),
and runs the timer heap: time is only ever the ``now`` an input brought. Each layer above adds
its own state and extends :meth:`Output._drop_state`, so that ending the connection
(:meth:`Output._terminate`) drops everything, whoever holds it.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from aqueduct_core.engine.config import EngineConfig
from aqueduct_core.engine.events import (
    CloseConnection,
    Command,
    ConnectionTerminated,
    Event,
    ResetStream,
    SendDatagram,
    SenderReady,
    WriteStream,
)
from aqueduct_core.engine.sender import SenderSM
from aqueduct_core.errors import RemoteProtocolError
from aqueduct_core.wire.chanid import Side
from aqueduct_core.wire.frames import Payload, RouteTo, Version, encode_frame


@dataclass(frozen=True, slots=True)
class FlowStalls:
    """How often this side's senders had to wait, counted once per wait (not per retry), so
    an operator can tell a slow peer from a slow network."""

    credit: int = 0
    """A sender's next message waited for the peer's flow-control credit (§3.4): the peer
    reads more slowly than we send."""
    transport: int = 0
    """A sender paused because the transport held more unsent bytes than its budget
    (``set_transport_backlog``): the network, or the peer's QUIC windows, hold us back."""


class Output:
    """Commands, events, timers and stream writes of one connection."""

    def __init__(self, side: Side, config: EngineConfig | None) -> None:
        self.side = side
        self.config = config = config or EngineConfig()
        self.now = 0.0
        self.closed = False
        self._commands: list[Command] = []
        self._events: deque[Event] = deque()
        self._timers: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self._early_ok = False
        """We may send: the handshake started (at 0-RTT or when QUIC completed)."""
        self.got_ack_version = False
        self._next_stream = 2 if side is Side.CLIENT else 3
        self.open_streams: set[int] = set()
        self.max_datagram = config.max_datagram_size
        self.rtt: float | None = None
        self.tx_backlog = 0
        self.tx_budget: int | None = None
        self._blocked: dict[int, SenderSM] = {}
        self._credit_stalls = 0
        self._transport_stalls = 0
        self._version_bytes = encode_frame(Version(config.version))
        self._route_cache: dict[int, bytes] = {}

    # == outputs ===========================================================================

    def commands(self) -> list[Command]:
        """Take the transport commands produced so far, in order."""
        out, self._commands = self._commands, []
        return out

    def events(self) -> list[Event]:
        """Take the application events produced so far, in order."""
        if not self._events:
            return []
        out = list(self._events)
        self._events.clear()
        return out

    def next_timer(self) -> float | None:
        """When ``handle_timer`` should next be called, or None."""
        return self._timers[0][0] if self._timers else None

    # == used by the state machines ========================================================

    @property
    def can_send_data(self) -> bool:
        return self._early_ok and not self.closed

    def transport_ready(self) -> bool:
        return self.tx_budget is None or self.tx_backlog < self.tx_budget

    def block_sender(self, sm: SenderSM) -> None:
        if sm.chanid not in self._blocked:
            self._transport_stalls += 1
        self._blocked[sm.chanid] = sm

    def credit_stalled(self) -> None:
        self._credit_stalls += 1

    def flow_stalls(self) -> FlowStalls:
        """How often this side's senders waited so far (they count on after the end too)."""
        return FlowStalls(self._credit_stalls, self._transport_stalls)

    def open_stream(self) -> int:
        sid = self._next_stream
        self._next_stream += 4
        self.open_streams.add(sid)
        return sid

    def write(self, stream_id: int, data: Payload, fin: bool = False) -> None:
        self._commands.append(WriteStream(stream_id, data, fin))
        self.tx_backlog += len(data)
        if fin:
            self.open_streams.discard(stream_id)

    def reset(self, stream_id: int) -> None:
        self._commands.append(ResetStream(stream_id))
        self.open_streams.discard(stream_id)

    def send_datagram(self, data: bytes) -> None:
        self._commands.append(SendDatagram(data))
        self.tx_backlog += len(data)

    def seq_prefix(self, chanid: int) -> bytes:
        """What starts a frame sequence routed to ``chanid``: [VERSION] ROUTE_TO (§2.2)."""
        route = self._route_cache.get(chanid)
        if route is None:
            route = encode_frame(RouteTo(chanid))
            if len(self._route_cache) < 4096:
                self._route_cache[chanid] = route
        return route if self.got_ack_version else self._version_bytes + route

    def schedule(self, delay: float, callback: Callable[[], None]) -> None:
        self.schedule_at(self.now + delay, callback)

    def schedule_at(self, when: float, callback: Callable[[], None]) -> None:
        heapq.heappush(self._timers, (when, next(self._seq), callback))

    def _run_timers(self, now: float) -> None:
        """Run every timer due at ``now``, in order, until the connection ends."""
        timers = self._timers
        while timers and timers[0][0] <= now and not self.closed:
            heapq.heappop(timers)[2]()

    def unreliable_deadline(self) -> float:
        cfg = self.config
        rtt = self.rtt if self.rtt is not None else 0.0
        return min(max(2 * rtt, cfg.unreliable_deadline_min), cfg.unreliable_deadline_max)

    def sender_ready(self, chanid: int) -> None:
        self._events.append(SenderReady(chanid))

    # == the end ===========================================================================

    def _fail(self, error: RemoteProtocolError) -> None:
        """A violation by the peer (or a timeout): close with its code, never raise."""
        if self.closed:
            return
        self._commands.append(CloseConnection(int(error.code), str(error)))
        self._terminate(int(error.code), str(error), False, error)

    def _terminate(self, code: int, reason: str, by_peer: bool, error: Exception | None) -> None:
        self.closed = True
        self._drop_state(f"{reason or 'closed'} (close code {code})")
        self._events.append(ConnectionTerminated(code, reason, by_peer, error))

    def _drop_state(self, detail: str) -> None:
        """The connection ended (``detail`` says how): drop this layer's state. Each layer
        above extends it for its own."""
        self._blocked.clear()
        self._timers.clear()
        self.open_streams.clear()
