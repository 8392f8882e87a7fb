"""A scripted peer: one real engine under test, the other side played by hand with raw frames.

:class:`SimNetwork <aqueduct_core.testing.simnet.SimNetwork>` joins two honest engines. Many
conformance cases need a peer that misbehaves, or that does something at an exact moment
(a frame split at a chosen byte, a stream reset mid-frame, an ack for a number never sent).
:class:`ScriptedPeer` owns one :class:`~aqueduct_core.engine.Connection`, the *side under
test*, and lets a test act as the other side:

- inject stream data with chosen stream ids, chunking and FIN, stream resets and datagrams,
  either as raw bytes or as :mod:`aqueduct_core.wire` frames;
- complete the Aqueduct handshake (VERSION, ACK_VERSION, CONNECTION_HEADERS) by raw frames;
- advance virtual time, firing the engine's timers in order;
- read back everything the engine wrote, decoded into frames per stream (:class:`WireLog`),
  the close code of a ``CloseConnection`` command, and the application events. Both are
  collected whenever they are read, so they include what direct calls on ``peer.conn``
  (``send``, ``close_receiver``...) produced.

The engine's output is parsed with the strict wire parser, so a test also notices if the
engine ever writes a malformed or ungrammatical sequence. :class:`NetworkLog` does the same
decoding for both engines of a ``SimNetwork``. Typical use::

    peer = ScriptedPeer(Side.SERVER)          # the engine under test is a server
    peer.handshake()                          # we play the client
    peer.routed(ENTRYPOINT, Message(0, payload=b"hi"))
    assert peer.conn.recv(ENTRYPOINT, now=peer.now).payload == b"hi"
    peer.advance(0.05)                        # the ack delay
    assert peer.wire.of_type(AckReliable) == [AckReliable((0, 1))]
    peer.routed(ENTRYPOINT, Message(0))       # a duplicate reliable number
    assert peer.close_code == CloseCode.PROTOCOL_VIOLATION
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

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
from aqueduct_core.engine.flow import FLOW_HEADER, encode_window
from aqueduct_core.testing.simnet import SimNetwork
from aqueduct_core.wire.chanid import Side
from aqueduct_core.wire.frames import (
    AckVersion,
    ConnectionHeaders,
    Frame,
    RouteTo,
    Version,
    encode_frames,
)
from aqueduct_core.wire.parser import StreamParser, parse_datagram
from aqueduct_core.wire.primitives import Headers, WireLimits

F = TypeVar("F")

_LIMITS = WireLimits(max_payload_bytes=1 << 40, max_header_bytes=1 << 30, max_list_bytes=1 << 30)
"""Decoding limits for what an engine wrote: generous, the engine chose the sizes."""

Data = bytes | bytearray | memoryview | Sequence[Frame]
"""Raw bytes, or frames to encode in order."""


def _encode(data: Data) -> bytes:
    if isinstance(data, bytes | bytearray | memoryview):
        return bytes(data)
    return encode_frames(*data)


# -- decoding what an engine wrote ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Sent:
    """One frame an engine wrote, in the order it was written."""

    time: float
    stream_id: int | None
    """The stream it went on, or None for a datagram."""
    route: int | None
    """The chanid of the sequence's ROUTE_TO: None for prelude frames; a ROUTE_TO frame
    counts as routed to its own chanid."""
    frame: Frame


@dataclass(slots=True)
class StreamRecord:
    """Everything an engine wrote on one of its unidirectional streams."""

    stream_id: int
    opened_at: float
    frames: list[Frame] = field(default_factory=list)
    fin: bool = False
    reset: bool = False
    route: int | None = None

    @property
    def routed(self) -> list[Frame]:
        """The frames after the ROUTE_TO (empty if there is none)."""
        for i, frame in enumerate(self.frames):
            if isinstance(frame, RouteTo):
                return self.frames[i + 1 :]
        return []

    @property
    def first(self) -> Frame | None:
        return self.frames[0] if self.frames else None


@dataclass(slots=True)
class DatagramRecord:
    time: float
    frames: list[Frame]

    @property
    def route(self) -> int | None:
        for frame in self.frames:
            if isinstance(frame, RouteTo):
                return frame.chanid
        return None


class WireLog:
    """Decodes the transport commands of one engine into frames per stream.

    Feed it every command with :meth:`record`. Stream bytes are parsed incrementally with the
    strict parser (any grammar or encoding error raises, which in a test means the engine
    wrote something invalid).
    """

    def __init__(self) -> None:
        self.streams: dict[int, StreamRecord] = {}
        """Per stream id, in the order the streams were opened."""
        self.datagrams: list[DatagramRecord] = []
        self.resets: list[int] = []
        """Stream ids the engine reset, in order."""
        self.closes: list[CloseConnection] = []
        self.log: list[Sent] = []
        """Every frame, in the order written."""
        self._parsers: dict[int, StreamParser] = {}

    def record(self, cmd: Command, now: float = 0.0) -> None:
        if isinstance(cmd, WriteStream):
            sid = cmd.stream_id
            rec = self.streams.get(sid)
            if rec is None:
                rec = self.streams[sid] = StreamRecord(sid, now)
                self._parsers[sid] = StreamParser(_LIMITS, flow_control=True)
            parser = self._parsers[sid]
            for frame in parser.feed(bytes(cmd.data)):
                if isinstance(frame, RouteTo):
                    rec.route = frame.chanid
                rec.frames.append(frame)
                self.log.append(Sent(now, sid, rec.route, frame))
            if cmd.fin:
                parser.finish()
                rec.fin = True
        elif isinstance(cmd, SendDatagram):
            frames, _ = parse_datagram(cmd.data, _LIMITS, True)
            dgram = DatagramRecord(now, frames)
            self.datagrams.append(dgram)
            route = None
            for frame in frames:
                if isinstance(frame, RouteTo):
                    route = frame.chanid
                self.log.append(Sent(now, None, route, frame))
        elif isinstance(cmd, ResetStream):
            self.resets.append(cmd.stream_id)
            rec = self.streams.get(cmd.stream_id)
            if rec is not None:
                rec.reset = True
        elif isinstance(cmd, CloseConnection):
            self.closes.append(cmd)

    # -- queries ----------------------------------------------------------------------

    def of_type(self, kind: type[F], route: int | None = None) -> list[F]:
        """Every frame of type ``kind`` written so far (routed to ``route`` if given)."""
        return [
            s.frame
            for s in self.log
            if isinstance(s.frame, kind) and (route is None or s.route == route)
        ]

    def sent(self, kind: type[Frame] | None = None, route: int | None = None) -> list[Sent]:
        """Every :class:`Sent` record matching the frame type and the route."""
        return [
            s
            for s in self.log
            if (kind is None or isinstance(s.frame, kind)) and (route is None or s.route == route)
        ]

    def streams_to(self, chanid: int) -> list[StreamRecord]:
        """The streams whose sequence is routed to ``chanid``."""
        return [rec for rec in self.streams.values() if rec.route == chanid]

    def datagrams_to(self, chanid: int) -> list[DatagramRecord]:
        return [d for d in self.datagrams if d.route == chanid]

    @property
    def close_code(self) -> int | None:
        """The code of the first CloseConnection command, or None."""
        return self.closes[0].code if self.closes else None


class NetworkLog:
    """A :class:`WireLog` for each engine of a :class:`SimNetwork`, fed by its observer.

    ``log = NetworkLog.watch(net)`` installs itself; ``log[Side.CLIENT]`` is what the client
    engine wrote (before the network dropped anything), ``log[Side.SERVER]`` the server's.
    """

    def __init__(self, clock: Callable[[], float] | None = None) -> None:
        self.client = WireLog()
        self.server = WireLog()
        self.clock = clock

    @classmethod
    def watch(cls, net: SimNetwork) -> NetworkLog:
        log = cls(lambda: net.now)
        net.observer = log
        return log

    def __getitem__(self, side: Side) -> WireLog:
        return self.client if side is Side.CLIENT else self.server

    def __call__(self, side: Side, cmd: Command) -> None:
        self[side].record(cmd, self.clock() if self.clock is not None else 0.0)


# -- the scripted peer -------------------------------------------------------------------


class ScriptedPeer:
    """One engine under test (``side``) and a hand-played peer. See the module docstring.

    Every injection method feeds the engine, then collects what it produced into
    :attr:`wire` and :attr:`events`. Injections never raise for protocol violations: the
    engine must turn them into a ``CloseConnection`` command (read :attr:`close_code`).
    """

    def __init__(
        self,
        side: Side,
        config: EngineConfig | None = None,
        *,
        headers: Iterable[tuple[bytes, bytes]] = (),
        server_headers: Callable[[Headers], Iterable[tuple[bytes, bytes]]] | None = None,
    ) -> None:
        self.side = side
        """The side of the engine under test; the scripted peer plays ``side.peer``."""
        self.conn = Connection(side, config, headers=headers, server_headers=server_headers)
        self.now = 0.0
        self._wire = WireLog()
        self._events: list[Event] = []
        self._event_mark = 0
        self.started = False
        self._next_stream = 3 if side is Side.CLIENT else 2

    # -- time and collection ----------------------------------------------------------

    @property
    def wire(self) -> WireLog:
        """Everything the engine under test wrote so far, decoded (collected on access, so
        it includes what direct calls on :attr:`conn` produced)."""
        self.collect()
        return self._wire

    @property
    def events(self) -> list[Event]:
        """Every application event the engine produced so far, in order."""
        self.collect()
        return self._events

    def collect(self) -> None:
        """Move the engine's commands into :attr:`wire` and its events into :attr:`events`."""
        for cmd in self.conn.commands():
            self._wire.record(cmd, self.now)
        self._events.extend(self.conn.events())

    def advance(self, seconds: float) -> None:
        """Let ``seconds`` of virtual time pass, firing due engine timers in order."""
        self.advance_to(self.now + seconds)

    def advance_to(self, when: float) -> None:
        while True:
            t = self.conn.next_timer()
            if t is None or t > when:
                break
            self.now = max(self.now, t)
            self.conn.handle_timer(self.now)
            self.collect()
        self.now = max(self.now, when)

    def new_events(self) -> list[Event]:
        """The events produced since the previous call."""
        out = self.events[self._event_mark :]
        self._event_mark = len(self._events)
        return out

    @property
    def close_code(self) -> int | None:
        """The code the engine closed the connection with, or None if it did not."""
        return self.wire.close_code

    @property
    def got_ack_version(self) -> bool:
        """Whether the engine has sent us ACK_VERSION (we may then omit VERSION)."""
        return any(isinstance(s.frame, AckVersion) for s in self.wire.log)

    # -- the QUIC and Aqueduct handshakes ---------------------------------------------

    def start(self, *, datagrams: bool = True, max_datagram: int | None = None) -> None:
        """The QUIC handshake completed (the engine's ``handshake_done``)."""
        self.started = True
        self.conn.handshake_done(self.now, datagrams=datagrams, max_datagram=max_datagram)
        self.collect()

    def handshake(
        self, headers: Iterable[tuple[bytes, bytes]] = (), *, flow_window: int | None = None
    ) -> None:
        """Complete the Aqueduct handshake by raw frames, playing the peer honestly.

        ``headers`` are our CONNECTION_HEADERS; ``flow_window`` advertises a flow-control
        window (profile §3.4), which turns the extension on if the engine advertises too.
        """
        if not self.started:
            self.start()
        ours: Headers = tuple(headers)
        if flow_window is not None:
            ours = (*ours, (FLOW_HEADER, encode_window(flow_window)))
        if self.side is Side.SERVER:
            # We are the client: VERSION + headers; the server answers VERSION, ACK_VERSION,
            # CONNECTION_HEADERS; we acknowledge its VERSION.
            self.stream([Version(), ConnectionHeaders(ours)])
            self.stream([AckVersion()] if self.got_ack_version else [Version(), AckVersion()])
        else:
            self.stream([Version(), AckVersion(), ConnectionHeaders(ours)])

    # -- injection --------------------------------------------------------------------

    def open_stream(self) -> int:
        """A fresh stream id of the peer's side (QUIC numbering)."""
        sid = self._next_stream
        self._next_stream += 4
        return sid

    def stream(
        self,
        data: Data,
        *,
        stream_id: int | None = None,
        fin: bool = True,
        chunk: int | None = None,
    ) -> int:
        """Send ``data`` on a stream (a fresh one unless ``stream_id``), in pieces of
        ``chunk`` bytes if given, FIN with the last piece if ``fin``. Returns the id."""
        sid = self.open_stream() if stream_id is None else stream_id
        raw = _encode(data)
        size = chunk if chunk is not None and chunk > 0 else max(len(raw), 1)
        pieces = [raw[i : i + size] for i in range(0, len(raw), size)] or [b""]
        for i, piece in enumerate(pieces):
            self.conn.stream_data(sid, piece, fin and i == len(pieces) - 1, self.now)
            self.collect()
        return sid

    def prefix(self, version: bool | None = None) -> list[Frame]:
        """VERSION if a sequence from us must start with it now (profile §2.2 rule 1)."""
        if version is None:
            version = not self.got_ack_version
        return [Version()] if version else []

    def routed(
        self,
        chanid: int,
        *frames: Frame,
        stream_id: int | None = None,
        fin: bool = True,
        chunk: int | None = None,
        version: bool | None = None,
    ) -> int:
        """Send ``[VERSION] ROUTE_TO(chanid) frames...`` on a fresh stream. VERSION is added
        while the engine has not acked ours, unless ``version`` says otherwise."""
        seq = [*self.prefix(version), RouteTo(chanid), *frames]
        return self.stream(seq, stream_id=stream_id, fin=fin, chunk=chunk)

    def datagram(self, data: Data) -> None:
        self.conn.datagram_received(_encode(data), self.now)
        self.collect()

    def routed_datagram(self, chanid: int, *frames: Frame, version: bool | None = None) -> None:
        """Send ``[VERSION] ROUTE_TO(chanid) frames...`` in one datagram."""
        self.datagram([*self.prefix(version), RouteTo(chanid), *frames])

    def reset(self, stream_id: int) -> None:
        """The peer reset ``stream_id`` (RESET_STREAM)."""
        self.conn.stream_reset(stream_id, self.now)
        self.collect()

    def connection_lost(self, code: int | None = None, reason: str = "") -> None:
        self.conn.connection_lost(self.now, code, reason)
        self.collect()


__all__ = [
    "DatagramRecord",
    "NetworkLog",
    "ScriptedPeer",
    "Sent",
    "StreamRecord",
    "WireLog",
]
