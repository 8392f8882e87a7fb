"""Every Aqueduct frame (profile §1.3) and its encoding.

Frames are frozen dataclasses named after the spec (``ROUTE_TO`` -> :class:`RouteTo`).
:func:`encode_frame` gives the bytes of any frame; for MESSAGE, :func:`message_parts` gives the
bytes *before* the payload so a large payload is written out without being copied (issue 2,
item 7). :func:`pull_frame` decodes one frame from complete data.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, TypeAlias

from aqueduct_core.errors import CloseCode, LocalProtocolError, RemoteProtocolError
from aqueduct_core.wire import ranges as _ranges
from aqueduct_core.wire.primitives import (
    DEFAULT_LIMITS,
    Headers,
    Truncated,
    WireLimits,
    pull_headers,
    pull_length,
    pull_varint,
    push_headers,
    push_varbytes,
    push_varint,
)

MAGIC = bytes((239, 80, 95, 166, 96, 15, 64, 142))
HUMAN_TEXT = b"AQUEDUCT"
DEFAULT_VERSION = b"0.0.0-AFTER"
MAX_VERSION_STRING = 255

TAG_VERSION = 239
TAG_ACK_VERSION = 1
TAG_CONNECTION_HEADERS = 2
TAG_ROUTE_TO = 3
TAG_MESSAGE = 4
TAG_SENT_UNRELIABLE = 5
TAG_FINISH_SENDER = 6
TAG_CANCEL_SENDER = 7
TAG_ACK_RELIABLE = 8
TAG_ACK_NACK_UNRELIABLE = 9
TAG_CLOSE_RECEIVER = 10
TAG_FORGET_CHANNEL = 11
TAG_DEQUEUED = 12

Payload: TypeAlias = bytes | bytearray | memoryview


class Gather:
    """A payload in parts, sent part by part and never joined (scatter-gather): an Arrow IPC
    message is its metadata and the record batch's own buffers, and joining them would copy
    every byte once more before the transport copies it anyway. ``len()`` is the payload's
    length in bytes; the parts are read-only views that keep what they view alive.

    Only a sender sees one: the engine writes each part as its own stream write (the
    transports take lists of buffers: TLS encrypts each part where it lies, QUIC copies it
    into its send buffer), and a receiver gathers the bytes into one payload as always."""

    __slots__ = ("nbytes", "parts")

    def __init__(self, parts: Iterable[Any]) -> None:
        views = (memoryview(p).cast("B").toreadonly() for p in parts)
        self.parts: tuple[memoryview, ...] = tuple(v for v in views if len(v))
        self.nbytes = sum(len(v) for v in self.parts)

    def __len__(self) -> int:
        return self.nbytes

    def __bytes__(self) -> bytes:
        """The parts joined (one copy): for small payloads and datagrams only."""
        return b"".join(self.parts)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Gather):
            other = bytes(other)
        if isinstance(other, bytes | bytearray | memoryview):
            return bytes(self) == other
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"<Gather {self.nbytes} bytes in {len(self.parts)} parts>"


OutPayload: TypeAlias = Payload | Gather
"""What a sender may give as a message's payload: bytes, or a :class:`Gather` of parts."""


SMALL_PART = 4096
"""Adjacent buffers below this size are joined by :func:`coalesce`."""


def coalesce(bufs: Iterable[Any]) -> list[Any]:
    """Runs of buffers below :data:`SMALL_PART` bytes (frame headers, control frames, an IPC
    message's metadata and padding) joined into one, so TLS makes one record of them and a
    transport one write; larger buffers pass untouched, never copied."""
    out: list[Any] = []
    run: list[Any] = []
    for b in bufs:
        if len(b) < SMALL_PART:
            run.append(b)
            continue
        if run:
            out.append(run[0] if len(run) == 1 else b"".join(run))
            run = []
        out.append(b)
    if run:
        out.append(run[0] if len(run) == 1 else b"".join(run))
    return out


def joined(payload: OutPayload) -> Payload:
    """``payload`` as one buffer (a :class:`Gather` joined, anything else as it is)."""
    return bytes(payload) if type(payload) is Gather else payload  # type: ignore[return-value]


@dataclass(frozen=True, slots=True)
class Version:
    """VERSION (§2.2.1): magic, ``AQUEDUCT``, varbytes version string. 28 bytes by default."""

    version: bytes = DEFAULT_VERSION


@dataclass(frozen=True, slots=True)
class AckVersion:
    """ACK_VERSION (§2.2.2)."""


@dataclass(frozen=True, slots=True)
class ConnectionHeaders:
    """CONNECTION_HEADERS (§2.2.3), sent exactly once by each side."""

    headers: Headers = ()


@dataclass(frozen=True, slots=True)
class RouteTo:
    """ROUTE_TO (§2.2.4): the following frames of the sequence concern ``chanid``."""

    chanid: int


@dataclass(frozen=True, slots=True)
class Attachment:
    """One entry of MESSAGE.ATTACHMENTS: a channel created by the frame's sender."""

    chanid: int
    headers: Headers = ()


@dataclass(frozen=True, slots=True)
class Message:
    """MESSAGE (§2.2.5)."""

    num: int
    headers: Headers = ()
    attachments: tuple[Attachment, ...] = ()
    payload: OutPayload = b""
    """Bytes as received; a sender's may be a :class:`Gather` of parts."""


@dataclass(frozen=True, slots=True)
class SentUnreliable:
    """SENT_UNRELIABLE (§2.2.6): ``count`` more unreliable messages were sent (G10: raw)."""

    count: int


@dataclass(frozen=True, slots=True)
class FinishSender:
    """FINISH_SENDER (§2.2.7): ``sent_reliable`` = reliable messages ever sent."""

    sent_reliable: int


@dataclass(frozen=True, slots=True)
class CancelSender:
    """CANCEL_SENDER (§2.2.8)."""


@dataclass(frozen=True, slots=True)
class AckReliable:
    """ACK_RELIABLE (§2.2.9): gap/run list from the lowest not-yet-acked number (G8)."""

    ranges: tuple[int, ...] = field(default=())


@dataclass(frozen=True, slots=True)
class AckNackUnreliable:
    """ACK_NACK_UNRELIABLE (§2.2.10) without the CHANNEL field (G5): ack/nack runs."""

    ranges: tuple[int, ...] = field(default=())


@dataclass(frozen=True, slots=True)
class CloseReceiver:
    """CLOSE_RECEIVER (§2.2.11; DROP_RECEIVER in the text, G6)."""


@dataclass(frozen=True, slots=True)
class ForgetChannel:
    """FORGET_CHANNEL (§2.2.12): tag only, routed (G11)."""


@dataclass(frozen=True, slots=True)
class Dequeued:
    """DEQUEUED (tag 12, flow-control extension, profile §3.4)."""

    num_bytes: int


Frame: TypeAlias = (
    Version
    | AckVersion
    | ConnectionHeaders
    | RouteTo
    | Message
    | SentUnreliable
    | FinishSender
    | CancelSender
    | AckReliable
    | AckNackUnreliable
    | CloseReceiver
    | ForgetChannel
    | Dequeued
)

PRELUDE_TYPES = (Version, AckVersion, ConnectionHeaders)
DATAGRAM_TYPES = (Version, RouteTo, Message)


def frame_name(kind: type) -> str:
    """The spec's name of a frame class (``RouteTo`` -> ``ROUTE_TO``; ``MessageHead``, the
    parser's partial ``Message``, -> ``MESSAGE``): what errors call a frame."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", kind.__name__.removesuffix("Head")).upper()


_SIMPLE_TAGS: dict[type, int] = {
    AckVersion: TAG_ACK_VERSION,
    CancelSender: TAG_CANCEL_SENDER,
    CloseReceiver: TAG_CLOSE_RECEIVER,
    ForgetChannel: TAG_FORGET_CHANNEL,
}
_INT_FIELD_TAGS: dict[type, tuple[int, str]] = {
    RouteTo: (TAG_ROUTE_TO, "chanid"),
    SentUnreliable: (TAG_SENT_UNRELIABLE, "count"),
    FinishSender: (TAG_FINISH_SENDER, "sent_reliable"),
    Dequeued: (TAG_DEQUEUED, "num_bytes"),
}


def message_parts(frame: Message) -> bytes:
    """The encoding of ``frame`` up to (not including) the payload bytes.

    ``message_parts(m) + m.payload`` is the whole frame; writing the two pieces separately
    keeps a megabyte payload from being copied into a new buffer.
    """
    buf = bytearray((TAG_MESSAGE,))
    push_varint(buf, frame.num)
    push_headers(buf, frame.headers)
    if frame.attachments:
        inner = bytearray()
        for att in frame.attachments:
            push_varint(inner, att.chanid)
            push_headers(inner, att.headers)
        push_varbytes(buf, inner)
    else:
        buf.append(0)
    push_varint(buf, len(frame.payload))
    return bytes(buf)


MESSAGE_OVERHEAD = 128
"""What every message adds to its flow-control cost: about the objects a receiver keeps for
a queued message, so a window of empty messages is not ~20x the window in memory."""
ATTACHMENT_COST = 4096
"""What each attachment adds to a message's flow-control cost: about the state (sender or
receiver machine, endpoint, lineage) a receiver creates for it. Without it a window of tiny
messages, each attaching a channel, would make the receiver hold ~100x the window."""


def message_cost(frame: Message) -> int:
    """cost(m) of profile §3.2 item 1: encoded MESSAGE length, tag to end of payload, plus
    :data:`MESSAGE_OVERHEAD`, plus :data:`ATTACHMENT_COST` per attachment."""
    return cost_of(len(message_parts(frame)) + len(frame.payload), len(frame.attachments))


def cost_of(encoded: int, attachments: int) -> int:
    """The flow-control cost of a MESSAGE whose encoding (tag to end of payload) is
    ``encoded`` bytes long and which carries ``attachments`` attachments: the one formula
    both sides count with."""
    return encoded + MESSAGE_OVERHEAD + ATTACHMENT_COST * attachments


def push_frame(buf: bytearray, frame: Frame) -> None:
    """Append the encoding of ``frame`` to ``buf``."""
    kind = type(frame)
    tag = _SIMPLE_TAGS.get(kind)
    if tag is not None:
        buf.append(tag)
        return
    int_field = _INT_FIELD_TAGS.get(kind)
    if int_field is not None:
        buf.append(int_field[0])
        push_varint(buf, getattr(frame, int_field[1]))
        return
    if isinstance(frame, Message):
        buf += message_parts(frame)
        buf += joined(frame.payload)
    elif isinstance(frame, Version):
        if len(frame.version) > MAX_VERSION_STRING:
            raise LocalProtocolError("version string too long")
        buf += MAGIC
        buf += HUMAN_TEXT
        push_varbytes(buf, frame.version)
    elif isinstance(frame, ConnectionHeaders):
        buf.append(TAG_CONNECTION_HEADERS)
        push_headers(buf, frame.headers)
    elif isinstance(frame, AckReliable | AckNackUnreliable):
        if isinstance(frame, AckReliable):
            _ranges.check_ack_reliable(frame.ranges, LocalProtocolError)
            buf.append(TAG_ACK_RELIABLE)
        else:
            _ranges.check_ack_nack(frame.ranges, LocalProtocolError)
            buf.append(TAG_ACK_NACK_UNRELIABLE)
        inner = bytearray()
        for value in frame.ranges:
            push_varint(inner, value)
        push_varbytes(buf, inner)
    else:
        raise LocalProtocolError(f"not an Aqueduct frame: {frame!r}")


def encode_frame(frame: Frame) -> bytes:
    buf = bytearray()
    push_frame(buf, frame)
    return bytes(buf)


def encode_frames(*frames: Frame) -> bytes:
    buf = bytearray()
    for frame in frames:
        push_frame(buf, frame)
    return bytes(buf)


# -- decoding ---------------------------------------------------------------------------


def _pull_version(data: memoryview, pos: int) -> tuple[Version, int]:
    end = pos + len(MAGIC) + len(HUMAN_TEXT)
    if end > len(data):
        raise Truncated
    if bytes(data[pos : pos + len(MAGIC)]) != MAGIC:
        raise RemoteProtocolError(
            "VERSION frame has bad magic bytes", CloseCode.UNSUPPORTED_VERSION
        )
    if bytes(data[pos + len(MAGIC) : end]) != HUMAN_TEXT:
        raise RemoteProtocolError(
            "VERSION frame lacks the AQUEDUCT text", CloseCode.UNSUPPORTED_VERSION
        )
    n, pos = pull_varint(data, end)
    if n > MAX_VERSION_STRING:
        raise RemoteProtocolError(
            f"VERSION string of {n} bytes is not a version we speak", CloseCode.UNSUPPORTED_VERSION
        )
    if pos + n > len(data):
        raise Truncated
    return Version(bytes(data[pos : pos + n])), pos + n


def _pull_ranges(data: memoryview, pos: int, limits: WireLimits) -> tuple[tuple[int, ...], int]:
    n, pos = pull_length(data, pos, limits.max_list_bytes, "range list")
    end = pos + n
    if end > len(data):
        raise Truncated
    inner = data[pos:end]
    values = []
    ipos = 0
    try:
        while ipos < n:
            value, ipos = pull_varint(inner, ipos)
            values.append(value)
    except Truncated:
        raise RemoteProtocolError("range varint overruns its list") from None
    return tuple(values), end


def _pull_attachments(
    data: memoryview, pos: int, limits: WireLimits
) -> tuple[tuple[Attachment, ...], int]:
    n, pos = pull_length(data, pos, limits.max_list_bytes, "attachment list")
    end = pos + n
    if end > len(data):
        raise Truncated
    inner = data[pos:end]
    atts = []
    seen = set()
    ipos = 0
    try:
        while ipos < n:
            chanid, ipos = pull_varint(inner, ipos)
            headers, ipos = pull_headers(inner, ipos, limits)
            if chanid in seen:
                raise RemoteProtocolError(f"MESSAGE attaches chanid {chanid} twice")
            seen.add(chanid)
            atts.append(Attachment(chanid, headers))
    except Truncated:
        raise RemoteProtocolError("attachment overruns the attachment list") from None
    return tuple(atts), end


@dataclass(frozen=True, slots=True)
class MessageHead:
    """A MESSAGE decoded up to its payload length (the stream parser gathers the payload)."""

    num: int
    headers: Headers
    attachments: tuple[Attachment, ...]
    payload_len: int


def pull_message_head(data: memoryview, pos: int, limits: WireLimits) -> tuple[MessageHead, int]:
    """Decode a MESSAGE after its tag, stopping after the payload length."""
    num, pos = pull_varint(data, pos)
    headers, pos = pull_headers(data, pos, limits)
    atts, pos = _pull_attachments(data, pos, limits)
    n, pos = pull_length(data, pos, limits.max_payload_bytes, "MESSAGE payload")
    return MessageHead(num, headers, atts, n), pos


def pull_frame(
    data: memoryview,
    pos: int,
    limits: WireLimits = DEFAULT_LIMITS,
    flow_control: bool = False,
) -> tuple[Frame, int]:
    """Decode one complete frame at ``pos``. Raises ``Truncated`` if ``data`` ends early."""
    if pos >= len(data):
        raise Truncated
    tag = data[pos]
    pos += 1
    if tag == TAG_MESSAGE:
        head, pos = pull_message_head(data, pos, limits)
        end = pos + head.payload_len
        if end > len(data):
            raise Truncated
        return Message(head.num, head.headers, head.attachments, bytes(data[pos:end])), end
    if tag == TAG_ROUTE_TO:
        value, pos = pull_varint(data, pos)
        return RouteTo(value), pos
    if tag in (TAG_ACK_RELIABLE, TAG_ACK_NACK_UNRELIABLE):
        values, pos = _pull_ranges(data, pos, limits)
        if tag == TAG_ACK_RELIABLE:
            _ranges.check_ack_reliable(values)
            return AckReliable(values), pos
        _ranges.check_ack_nack(values)
        return AckNackUnreliable(values), pos
    if tag == TAG_SENT_UNRELIABLE:
        value, pos = pull_varint(data, pos)
        return SentUnreliable(value), pos
    if tag == TAG_FINISH_SENDER:
        value, pos = pull_varint(data, pos)
        return FinishSender(value), pos
    if tag == TAG_CANCEL_SENDER:
        return CancelSender(), pos
    if tag == TAG_CLOSE_RECEIVER:
        return CloseReceiver(), pos
    if tag == TAG_FORGET_CHANNEL:
        return ForgetChannel(), pos
    if tag == TAG_ACK_VERSION:
        return AckVersion(), pos
    if tag == TAG_CONNECTION_HEADERS:
        headers, pos = pull_headers(data, pos, limits)
        return ConnectionHeaders(headers), pos
    if tag == TAG_VERSION:
        return _pull_version(data, pos - 1)
    if tag == TAG_DEQUEUED:
        if not flow_control:
            raise RemoteProtocolError("DEQUEUED (tag 12) without negotiated flow control")
        value, pos = pull_varint(data, pos)
        return Dequeued(value), pos
    raise RemoteProtocolError(f"unknown frame tag {tag}")


def decode_frame(
    data: bytes, limits: WireLimits = DEFAULT_LIMITS, flow_control: bool = False
) -> Frame:
    """Decode exactly one frame from ``data`` (tests and tools)."""
    view = memoryview(data)
    try:
        frame, pos = pull_frame(view, 0, limits, flow_control)
    except Truncated:
        raise RemoteProtocolError("frame truncated") from None
    if pos != len(view):
        raise RemoteProtocolError(f"{len(view) - pos} bytes after the frame")
    return frame
