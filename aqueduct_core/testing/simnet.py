"""A client and a server engine connected by a simulated QUIC network.

:class:`SimNetwork` turns each engine's transport commands into deliveries to the other
engine, in virtual time, with seeded randomness:

- stream data is reliable and ordered *within* a stream (as QUIC guarantees), but each stream
  gets its own random delay, and "lost" stream packets only arrive late (QUIC retransmits), so
  frames on different streams are reordered;
- stream data is split into random chunk sizes, so parsers see every kind of boundary;
- datagrams are lost with probability ``loss`` and delayed like stream data (so they reorder
  too); with probability ``duplicate`` they are delivered twice. QUIC itself discards duplicate
  packets, so a duplicate at the Aqueduct layer means a faulty peer: use it to test that the
  engine treats a duplicate pending unreliable number as a violation (profile case 31);
- a reset abandons the stream's undelivered data; a close reaches the peer after one delay.

Everything is deterministic for a given seed. Typical use::

    net = SimNetwork(seed=7, loss=0.2)
    net.handshake()
    net.client.send(ENTRYPOINT, b"hi", now=net.now)
    net.run()                      # until nothing is in flight and no timer is due
    msg = net.server.recv(ENTRYPOINT, now=net.now)
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from aqueduct_core.engine.config import EngineConfig
from aqueduct_core.engine.connection import Connection
from aqueduct_core.engine.events import (
    CloseConnection,
    Command,
    Event,
    ResetStream,
    SendDatagram,
    WriteStream,
)
from aqueduct_core.wire.chanid import Side
from aqueduct_core.wire.primitives import Headers


@dataclass
class _StreamState:
    last_arrival: float = 0.0
    reset: bool = False
    fin_delivered: bool = False


@dataclass
class Link:
    """One direction of the simulated network, and what crossed it."""

    streams: dict[int, _StreamState] = field(default_factory=dict)
    datagrams_sent: int = 0
    datagrams_lost: int = 0
    bytes_sent: int = 0


class SimNetwork:
    """Two engines joined by a seeded, lossy, reordering network. See the module docstring."""

    def __init__(
        self,
        *,
        seed: int = 0,
        loss: float = 0.0,
        duplicate: float = 0.0,
        delay: tuple[float, float] = (0.001, 0.01),
        stream_loss: float = 0.0,
        retransmit_delay: float = 0.05,
        max_chunk: int = 1400,
        max_datagram: int = 1200,
        client_config: EngineConfig | None = None,
        server_config: EngineConfig | None = None,
        client_headers: Headers = (),
        server_headers: Callable[[Headers], Headers] | None = None,
        observer: Callable[[Side, Command], None] | None = None,
    ) -> None:
        self.rng = random.Random(seed)
        self.observer = observer
        """Called with (sending side, command) for every command, before loss is applied."""
        self.loss = loss
        self.duplicate = duplicate
        self.delay = delay
        self.stream_loss = stream_loss
        self.retransmit_delay = retransmit_delay
        self.max_chunk = max_chunk
        self.max_datagram = max_datagram
        self.now = 0.0
        self.client = Connection(Side.CLIENT, client_config, headers=client_headers)
        self.server = Connection(Side.SERVER, server_config, server_headers=server_headers)
        self.client_events: list[Event] = []
        self.server_events: list[Event] = []
        self.links = {Side.CLIENT: Link(), Side.SERVER: Link()}
        """``links[side]`` is the direction *from* ``side``."""
        self._queue: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self._closed = False

    # -- driving ----------------------------------------------------------------------

    def handshake(self) -> None:
        """Complete the QUIC handshake on both sides and run until the Aqueduct handshake
        (VERSION, ACK_VERSION, CONNECTION_HEADERS) settles."""
        self.client.handshake_done(self.now, max_datagram=self.max_datagram)
        self.server.handshake_done(self.now, max_datagram=self.max_datagram)
        self.run()

    def engine(self, side: Side) -> Connection:
        return self.client if side is Side.CLIENT else self.server

    def run(self, until: float | None = None, max_steps: int = 10_000_000) -> None:
        """Deliver packets and fire timers in time order until nothing is in flight and no
        timer is due (quiescence), or until virtual time ``until``."""
        for _ in range(max_steps):
            self.flush()
            when = self._next_time()
            if when is None or (until is not None and when > until):
                if until is not None:
                    self.now = max(self.now, until)
                return
            self.now = max(self.now, when)
            if self._queue and self._queue[0][0] <= when:
                heapq.heappop(self._queue)[2]()
            else:
                for conn in (self.client, self.server):
                    t = conn.next_timer()
                    if t is not None and t <= self.now:
                        conn.handle_timer(self.now)
        raise RuntimeError("the simulation did not settle (livelock?)")

    def advance(self, seconds: float) -> None:
        """Run for ``seconds`` of virtual time."""
        self.run(until=self.now + seconds)

    @property
    def idle(self) -> bool:
        self.flush()
        return self._next_time() is None

    def flush(self) -> None:
        """Move commands and events out of both engines (applications call engine methods
        between ``run`` calls; this picks up what they produced)."""
        for side, conn in ((Side.CLIENT, self.client), (Side.SERVER, self.server)):
            for cmd in conn.commands():
                self._transmit(side, cmd)
            (self.client_events if side is Side.CLIENT else self.server_events).extend(
                conn.events()
            )

    def _next_time(self) -> float | None:
        times = [t for t in (self.client.next_timer(), self.server.next_timer()) if t is not None]
        if self._queue:
            times.append(self._queue[0][0])
        return min(times) if times else None

    # -- the network ------------------------------------------------------------------

    def _at(self, when: float, action: Callable[[], None]) -> None:
        heapq.heappush(self._queue, (when, next(self._seq), action))

    def _latency(self) -> float:
        return self.rng.uniform(*self.delay)

    def _transmit(self, side: Side, cmd: Command) -> None:
        if self._closed:
            return
        if self.observer is not None:
            self.observer(side, cmd)
        link = self.links[side]
        peer = self.engine(side.peer)
        if isinstance(cmd, WriteStream):
            self._write(link, peer, cmd)
        elif isinstance(cmd, SendDatagram):
            link.datagrams_sent += 1
            link.bytes_sent += len(cmd.data)
            if self.rng.random() < self.loss:
                link.datagrams_lost += 1
                return
            copies = 2 if self.rng.random() < self.duplicate else 1
            data = bytes(cmd.data)
            for _ in range(copies):
                self._at(self.now + self._latency(), lambda: peer.datagram_received(data, self.now))
        elif isinstance(cmd, ResetStream):
            st = link.streams.setdefault(cmd.stream_id, _StreamState())
            if st.reset or st.fin_delivered:
                return
            st.reset = True
            sid = cmd.stream_id
            arrival = max(st.last_arrival, self.now) + self._latency()
            self._at(arrival, lambda: peer.stream_reset(sid, self.now))
        elif isinstance(cmd, CloseConnection):
            code, reason = cmd.code, cmd.reason
            self._closed = True
            self._queue.clear()
            self._at(
                self.now + self._latency(), lambda: peer.connection_lost(self.now, code, reason)
            )

    def _write(self, link: Link, peer: Connection, cmd: WriteStream) -> None:
        st = link.streams.setdefault(cmd.stream_id, _StreamState())
        if st.reset:
            return
        data = bytes(cmd.data)
        link.bytes_sent += len(data)
        pieces = []
        pos = 0
        while pos < len(data):
            size = self.rng.randint(1, self.max_chunk) if self.max_chunk > 1 else 1
            pieces.append(data[pos : pos + size])
            pos += size
        if not pieces:
            pieces = [b""]
        sid = cmd.stream_id
        for i, piece in enumerate(pieces):
            fin = cmd.fin and i == len(pieces) - 1
            arrival = self.now + self._latency()
            if self.stream_loss and self.rng.random() < self.stream_loss:
                arrival += self.retransmit_delay
            arrival = max(arrival, st.last_arrival)
            st.last_arrival = arrival
            self._at(arrival, self._deliver(st, peer, sid, piece, fin))

    def _deliver(
        self, st: _StreamState, peer: Connection, sid: int, piece: bytes, fin: bool
    ) -> Callable[[], None]:
        def deliver() -> None:
            if st.reset:
                return
            if fin:
                st.fin_delivered = True
            peer.stream_data(sid, piece, fin, self.now)

        return deliver
