"""Frame-sequence parsers for streams (incremental) and datagrams (whole), profile §1.2.

Both enforce the grammar ``sequence := prelude* [ROUTE_TO routed*]`` (G3). A datagram may hold
only VERSION, ROUTE_TO and MESSAGE. Any malformed input raises
:class:`~aqueduct_core.errors.RemoteProtocolError` and nothing else.

The stream parser takes chunks of any size. A MESSAGE whose payload has not fully arrived is
gathered by appending each piece to one ``bytearray``, which is handed out as the payload: one
copy per byte, whatever the chunk size, and the chunks may be views of a receive buffer the
transport reuses (transport-tuning.md). The buffer grows with what arrived (Python
over-allocates an eighth; the C library moves large blocks by remapping pages, not copying),
so a peer that announces megabytes and sends a few bytes makes us hold a few bytes. A payload
that arrived in one piece is ``bytes``.

Once the engine has charged a gathering MESSAGE's whole length to what it granted (the
channel's flow-control window, ``Dispatch._charge``), it may hand the parser a buffer of
that length (:meth:`StreamParser.gather_into`, from ``EngineConfig.payload_buffers``): the
rest of the payload is then copied straight into it and that buffer's owner object is the
payload. A pool of such buffers saves the page faults and the freeing of a fresh buffer per
message, which cost a receiver more than the copy itself.
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
    Payload,
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
        self._target: memoryview | None = None
        """Where the rest of the payload goes, if the engine gave a buffer (``gather_into``)."""
        self._owner: object = None
        """What the payload is handed out as when it was gathered into ``_target``."""
        self._at = 0

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
        target = self._target
        if target is None:
            self._payload += data
        else:
            at = self._at
            target[at : at + n] = data
            self._at = at + n
        self._need -= n

    def gather_into(self, target: memoryview, owner: object) -> None:
        """Gather the rest of the MESSAGE in ``head`` into ``target`` (writable, exactly its
        payload length) and hand ``owner`` out as its payload: what arrived so far is copied
        there first. ``owner`` must keep ``target``'s memory alive and unused by anyone else
        (the parser holds both until the message is complete or dropped)."""
        head = self.head
        if head is None or self._target is not None or len(target) != head.payload_len:
            raise ValueError("gather_into: no MESSAGE is being gathered, or a wrong size")
        got = len(self._payload)
        target[:got] = self._payload
        self._payload = bytearray()
        self._target, self._owner, self._at = target, owner, got

    def _done_payload(self) -> Payload | object:
        """The gathered payload, handed out; the parser forgets it."""
        if self._target is not None:
            payload, self._owner = self._owner, None
            self._target.release()
            self._target = None
        else:
            payload = self._payload
        self._payload = bytearray()
        return payload

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
            payload = self._done_payload()
            self.head = None
            # The grammar was checked when the head arrived.
            frames.append(Message(head.num, head.headers, head.attachments, payload))  # type: ignore[arg-type]
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
        self._done_payload()
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
