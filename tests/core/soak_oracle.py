"""An independent reader of the wire, for the soak test's predictions.

:class:`WireTap` parses every frame each engine *writes* (before the simulated network drops
anything) and works out, the way a reader of profile §2.9 would, the fate of every message
that carried attachments: acked (ACK_RELIABLE, or an ack run of ACK_NACK_UNRELIABLE) or nacked
(a nack run, or CLOSE_RECEIVER / FORGET_CHANNEL while still unacked, G17 and G28). From that it
predicts which channels are lost: X is lost iff the message carrying it was nacked, or never
numbered at all, or its parent channel is lost. It shares no code with the engine's lineage.
"""

from __future__ import annotations

from collections import defaultdict

from aqueduct_core.engine.events import Command, SendDatagram, WriteStream
from aqueduct_core.wire import ranges as wr
from aqueduct_core.wire.chanid import ENTRYPOINT, Side, sender_of
from aqueduct_core.wire.frames import (
    AckNackUnreliable,
    AckReliable,
    CloseReceiver,
    ForgetChannel,
    Message,
    RouteTo,
)
from aqueduct_core.wire.parser import StreamParser, parse_datagram
from aqueduct_core.wire.primitives import WireLimits

MsgKey = tuple[int, bool, int]  # (channel, unreliable space?, number)

_LIMITS = WireLimits(max_payload_bytes=1 << 30)


class WireTap:
    def __init__(self) -> None:
        self._parsers: dict[tuple[Side, int], StreamParser] = {}
        self.carried_by: dict[int, MsgKey] = {}
        """attachment chanid -> the message that carried it."""
        self.sent: dict[int, list[MsgKey]] = defaultdict(list)
        self.acked: set[MsgKey] = set()
        self.nacked: set[MsgKey] = set()
        self._rel_acked: dict[int, set[int]] = defaultdict(set)
        self._rel_base: dict[int, int] = defaultdict(int)
        self._unrel_cursor: dict[int, int] = defaultdict(int)
        self.closed: set[int] = set()

    def __call__(self, side: Side, cmd: Command) -> None:
        if isinstance(cmd, WriteStream):
            parser = self._parsers.get((side, cmd.stream_id))
            if parser is None:
                parser = self._parsers[(side, cmd.stream_id)] = StreamParser(_LIMITS, True)
            for frame in parser.feed(bytes(cmd.data)):
                self._frame(side, parser.route, frame, False)
            if cmd.fin:
                del self._parsers[(side, cmd.stream_id)]
        elif isinstance(cmd, SendDatagram):
            frames, _ = parse_datagram(cmd.data, _LIMITS, True)
            route = None
            for frame in frames:
                if isinstance(frame, RouteTo):
                    route = frame.chanid
                self._frame(side, route, frame, True)

    def _frame(self, side: Side, route: int | None, frame: object, datagram: bool) -> None:
        if route is None or isinstance(frame, RouteTo):
            return
        if isinstance(frame, Message):
            key = (route, datagram, frame.num)
            self.sent[route].append(key)
            for att in frame.attachments:
                self.carried_by[att.chanid] = key
        elif isinstance(frame, AckReliable):
            base = self._rel_base[route]
            acked = self._rel_acked[route]
            for start, stop in wr.ack_reliable_runs(base, frame.ranges):
                for n in range(start, stop):
                    acked.add(n)
                    self.acked.add((route, False, n))
            while base in acked:
                base += 1
            self._rel_base[route] = base
        elif isinstance(frame, AckNackUnreliable):
            cursor = self._unrel_cursor[route]
            for start, stop, ack in wr.ack_nack_runs(cursor, frame.ranges):
                for n in range(start, stop):
                    (self.acked if ack else self.nacked).add((route, True, n))
            self._unrel_cursor[route] = cursor + sum(frame.ranges)
        elif isinstance(frame, CloseReceiver) or (
            isinstance(frame, ForgetChannel) and sender_of(route) is not side
        ):
            # CLOSE_RECEIVER nacks what is unacked; so does FORGET sent to a sender (G28).
            self.closed.add(route)

    def fate(self, key: MsgKey) -> bool | None:
        """True = acked, False = nacked, None = undecided."""
        if key in self.acked:
            return True
        if key in self.nacked or key[0] in self.closed:
            return False
        return None

    def lost(self, chanid: int) -> bool:
        """The profile's prediction: lost iff the carrying message was nacked (or never
        numbered), or the parent is lost. The entrypoint is accessible."""
        seen: set[int] = set()
        while chanid != ENTRYPOINT:
            if chanid in seen:
                raise AssertionError(f"attachment cycle at {chanid}")
            seen.add(chanid)
            key = self.carried_by.get(chanid)
            if key is None or self.fate(key) is False:
                return True
            chanid = key[0]
        return False

    def accessible(self, chanid: int) -> bool:
        while chanid != ENTRYPOINT:
            key = self.carried_by.get(chanid)
            if key is None or self.fate(key) is not True:
                return False
            chanid = key[0]
        return True
