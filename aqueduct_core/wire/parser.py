"""Frame-sequence parsers for streams (incremental) and datagrams (whole), profile §1.2.

Both enforce the grammar ``sequence := prelude* [ROUTE_TO routed*]`` (G3). A datagram may hold
only VERSION, ROUTE_TO and MESSAGE. Any malformed input raises
:class:`~aqueduct_core.errors.RemoteProtocolError` and nothing else.

The stream parser takes chunks of any size. A MESSAGE whose payload has not fully arrived is
gathered by appending each piece to one ``bytearray``, which is handed out as the payload: one
copy per byte, whatever the chunk size, and the chunks may be views of a receive buffer the
transport reuses (transport-tuning.md). The buffer grows with what arrived (Python
over-allocates an eighth; the C library moves large blocks by remapping pages, not copying),
so a peer that announces megabytes and sends a few bytes makes us hold a few bytes: this
measured as fast as one buffer of the announced size, which also pays to zero it. A payload
that arrived in one piece is ``bytes``.
"""

from __future__ import annotations

from aqueduct_core.errors import RemoteProtocolError
from aqueduct_core.wire.frames import (
    DATAGRAM_TYPES,
    PRELUDE_TYPES,
    TAG_MESSAGE,
    Frame,
    Message,
    MessageHead,
    RouteTo,
    Version,
    frame_name,
    pull_frame,
    pull_message_head,
)
from aqueduct_core.wire.primitives import DEFAULT_LIMITS, Truncated, WireLimits

_Chunk = bytes | bytearray | memoryview


class _Grammar:
    """Tracks one frame sequence's position in the grammar."""

    __slots__ = ("count", "route", "version_first")

    def __init__(self) -> None:
        self.route: int | None = None
        self.version_first = False
        self.count = 0

    def check(self, frame: Frame | MessageHead) -> None:
        kind = type(frame)
        if self.count == 0:
            self.version_first = kind is Version
        self.count += 1
        if kind in PRELUDE_TYPES:
            if self.route is not None:
                raise RemoteProtocolError(f"{frame_name(kind)} after ROUTE_TO")
        elif isinstance(frame, RouteTo):
            if self.route is not None:
                raise RemoteProtocolError("a second ROUTE_TO in one frame sequence")
            self.route = frame.chanid
        elif self.route is None:
            raise RemoteProtocolError(f"{frame_name(kind)} with no ROUTE_TO before it")


class StreamParser:
    """Incremental parser for the frame sequence on one QUIC unidirectional stream.

    ``feed`` returns every frame completed by the new bytes, in order. ``route`` and
    ``version_first`` describe the sequence so far. Set ``flow_control`` once the extension is
    negotiated (tag 12 becomes legal).
    """

    def __init__(self, limits: WireLimits = DEFAULT_LIMITS, flow_control: bool = False) -> None:
        self.limits = limits
        self.flow_control = flow_control
        self._grammar = _Grammar()
        self._buf = b""
        self.head: MessageHead | None = None
        """The MESSAGE whose payload is being gathered (read-only outside this class)."""
        self._payload = bytearray()
        """The payload gathered so far of the MESSAGE in ``head``."""
        self._need = 0

    @property
    def route(self) -> int | None:
        return self._grammar.route

    @property
    def version_first(self) -> bool:
        return self._grammar.version_first

    @property
    def frame_count(self) -> int:
        return self._grammar.count

    @property
    def fragment_bytes(self) -> int:
        """Bytes of an incomplete frame head held (a MESSAGE payload being gathered is not
        counted here: see ``head``)."""
        return len(self._buf)

    @property
    def mid_frame(self) -> bool:
        """True when bytes of an incomplete frame are buffered."""
        return bool(self._buf) or self.head is not None

    def absorb(self, data: _Chunk) -> bool:
        """Take ``data`` if it is all payload of the MESSAGE being gathered and does not
        complete it (the common case for a large message: most packets). Returns False,
        taking nothing, otherwise; then :meth:`feed` must be called."""
        n = len(data)
        if self.head is None or n >= self._need:
            return False
        self._put(data, n)
        return True

    def _put(self, data: _Chunk, n: int) -> None:
        """Append ``n`` bytes of payload (all of ``data``)."""
        self._payload += data
        self._need -= n

    def feed(self, data: _Chunk) -> list[Frame]:
        if self.absorb(data):
            return []
        frames: list[Frame] = []
        view = memoryview(data)
        head = self.head
        if head is not None:
            take = min(self._need, len(view))
            self._put(view[:take], take)
            if self._need:
                return frames
            payload = self._payload
            self.head, self._payload = None, bytearray()
            # The grammar was checked when the head arrived.
            frames.append(Message(head.num, head.headers, head.attachments, payload))
            view = view[take:]
        if self._buf:
            view = memoryview(self._buf + view)
        pos = 0
        end = len(view)
        limits = self.limits
        while pos < end:
            try:
                if view[pos] == TAG_MESSAGE:
                    head, ppos = pull_message_head(view, pos + 1, limits)
                    stop = ppos + head.payload_len
                    if stop <= end:
                        frame: Frame = Message(
                            head.num, head.headers, head.attachments, bytes(view[ppos:stop])
                        )
                        pos = stop
                    else:
                        # Payload incomplete: gather it from later chunks without rebuffering.
                        self.head = head
                        self._payload = bytearray(view[ppos:end])
                        self._need = stop - end
                        self._buf = b""
                        # Check placement now, not after megabytes of payload have arrived.
                        self._grammar.check(head)
                        return frames
                else:
                    frame, pos = pull_frame(view, pos, limits, self.flow_control)
            except Truncated:
                break
            self._grammar.check(frame)
            frames.append(frame)
        self._buf = bytes(view[pos:end])
        return frames

    def reset(self) -> None:
        """The stream was reset: drop any partially received frame (§2.1)."""
        self._buf = b""
        self.head = None
        self._payload = bytearray()
        self._need = 0

    def finish(self) -> None:
        """The stream ended cleanly. Ending mid-frame is a protocol error (case 35)."""
        if self.mid_frame:
            raise RemoteProtocolError("stream ended in the middle of a frame")


def parse_datagram(
    data: _Chunk, limits: WireLimits = DEFAULT_LIMITS, flow_control: bool = False
) -> tuple[list[Frame], bool]:
    """Parse one datagram. Returns its frames and whether it began with VERSION."""
    view = memoryview(data)
    grammar = _Grammar()
    frames: list[Frame] = []
    pos = 0
    while pos < len(view):
        try:
            frame, pos = pull_frame(view, pos, limits, flow_control)
        except Truncated:
            raise RemoteProtocolError("datagram ends in the middle of a frame") from None
        if not isinstance(frame, DATAGRAM_TYPES):
            raise RemoteProtocolError(f"{frame_name(type(frame))} is not allowed in a datagram")
        grammar.check(frame)
        frames.append(frame)
    return frames, grammar.version_first
