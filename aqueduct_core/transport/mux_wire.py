"""Aqueduct over TCP: the multiplexer's wire format, settings and events.

Everything here is what a peer or the transport sees of the multiplexer: the frame header,
frame types and flags, SETTINGS and their limits, the close codes of its own, the encoders,
and the events :class:`~aqueduct_core.transport.mux.MuxConnection` (the state machine, in
``mux.py``) hands its transport. The format is specified in ``docs/protocol-profile.md``
("Aqueduct over TCP").
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

from aqueduct_core.errors import CloseCode, RemoteProtocolError
from aqueduct_core.wire.frames import Payload

ALPN = "aqueduct-tcp"
"""The TLS ALPN value of Aqueduct over TCP."""

HEADER = struct.Struct(">BBI")
"""type (u8), flags (u8), body length (u32), big-endian."""
HEADER_SIZE = HEADER.size
STREAM_HEAD = struct.Struct(">BBIQ")
U64 = struct.Struct(">Q")
TWO_U64 = struct.Struct(">QQ")
SETTING = struct.Struct(">HQ")

MAX_VARINT = (1 << 62) - 1
"""Largest stream id, credit total and code (as in QUIC)."""
MIN_FRAME_SIZE = 16384
"""Every endpoint accepts frame bodies at least this large."""
MAX_FRAME_SIZE = (1 << 24) - 1
MAX_SETTINGS_BODY = 640
"""64 settings; a SETTINGS frame above this is a LIMIT_VIOLATION."""
MIN_STREAMS = 100
"""The smallest MAX_STREAMS: Aqueduct holds a stream open for a channel's whole life (its
receiver's acks, its ordered sender's data), so a smaller limit stalls a connection with a
handful of channels (at 1: after the first reply, behind the entrypoint's ack stream)."""
MAX_REASON = 1024
"""Bytes of CLOSE reason sent at most (a longer reason is truncated at a character
boundary); a receiver reads at most this many and replaces what is not UTF-8."""
IDLE_TIMEOUT = 6
"""Close code of Aqueduct over TCP: the peer was silent, or left a PING unanswered, for the
idle timeout (on QUIC the library closes silently)."""


class FrameType(enum.IntEnum):
    SETTINGS = 0x01
    STREAM = 0x02
    RESET = 0x03
    CREDIT = 0x04
    DATAGRAM = 0x05
    PING = 0x06
    CLOSE = 0x07


FLAG_FIN = 0x01
"""STREAM: the last frame of the stream."""
FLAG_ACK = 0x01
"""PING: this is the answer (pong)."""


class Setting(enum.IntEnum):
    MAX_FRAME_SIZE = 0x1
    INITIAL_STREAM_CREDIT = 0x2
    MAX_STREAMS = 0x3
    MAX_DATAGRAM = 0x4
    IDLE_TIMEOUT_MS = 0x5


class MuxProtocolError(RemoteProtocolError):
    """The peer broke the multiplexing rules; ``code`` is the close code sent to it."""


@dataclass(frozen=True)
class MuxSettings:
    """Our side of the multiplexer. Sizes in bytes, times in seconds. Each limit is checked
    against the peer (``docs/protocol-profile.md``, "Aqueduct over TCP")."""

    max_frame_size: int = 1024 * 1024
    """Largest frame body we accept (STREAM: id plus data). A larger frame: LIMIT_VIOLATION."""
    initial_stream_credit: int = 16 * 1024 * 1024
    """Bytes the peer may send on each stream it opens before we grant more."""
    max_streams: int = 10_000
    """Streams the peer may have open at once (at least 100). One more: LIMIT_VIOLATION."""
    max_datagram: int = 65536
    """Largest DATAGRAM body we accept (0: none). Larger: LIMIT_VIOLATION."""
    datagram_queue: int = 256 * 1024
    """Bytes of outgoing datagrams kept while TCP is busy; beyond it the oldest are dropped."""
    chunk_size: int = 256 * 1024
    """Largest STREAM payload we send in one frame (streams take turns per chunk)."""
    idle_timeout: float = 30.0
    """Close after this long without a byte from the peer or an answer to our PING (the
    transport uses the smaller of this and ``TransportConfig.idle_timeout``)."""
    ping_interval: float = 10.0
    """Send a PING this long after the previous one (a third of the idle timeout if that is
    shorter), once the previous one was answered."""

    def __post_init__(self) -> None:
        if not MIN_FRAME_SIZE <= self.max_frame_size <= MAX_FRAME_SIZE:
            raise ValueError(f"max_frame_size must be in [{MIN_FRAME_SIZE}, {MAX_FRAME_SIZE}]")
        if not 0 <= self.max_datagram <= self.max_frame_size:
            raise ValueError("max_datagram must be in [0, max_frame_size]")
        if not 1 <= self.initial_stream_credit <= MAX_VARINT:
            raise ValueError("initial_stream_credit must be at least 1")
        if not MIN_STREAMS <= self.max_streams <= MAX_VARINT:
            raise ValueError(f"max_streams must be at least {MIN_STREAMS}")
        if self.chunk_size < 1024 or self.datagram_queue < 0:
            raise ValueError("chunk_size must be at least 1024, datagram_queue not negative")
        if self.idle_timeout <= 0 or self.ping_interval <= 0:
            raise ValueError("idle_timeout and ping_interval must be positive")


@dataclass(frozen=True)
class PeerSettings:
    max_frame_size: int = MIN_FRAME_SIZE
    initial_stream_credit: int = 0
    max_streams: int = 0
    max_datagram: int = 0
    idle_timeout: float | None = None


# -- events -------------------------------------------------------------------------------


@dataclass(slots=True)
class PeerReady:
    """The peer's SETTINGS arrived: streams and datagrams may flow."""

    settings: PeerSettings


@dataclass(slots=True)
class StreamData:
    """Bytes of a stream; ``data`` may be a view of the caller's receive buffer."""

    stream_id: int
    data: Payload
    fin: bool


@dataclass(slots=True)
class StreamReset:
    stream_id: int
    code: int


@dataclass(slots=True)
class DatagramReceived:
    data: bytes


@dataclass(slots=True)
class ConnectionClosed:
    """The connection ended: the peer's CLOSE (``by_peer``) or our idle timeout."""

    code: int
    reason: str
    by_peer: bool


MuxEvent = PeerReady | StreamData | StreamReset | DatagramReceived | ConnectionClosed


# -- encoding -----------------------------------------------------------------------------


def encode_frame(ftype: int, flags: int, body: bytes = b"") -> bytes:
    return HEADER.pack(ftype, flags, len(body)) + body


def encode_settings(values: dict[int, int]) -> bytes:
    body = b"".join(SETTING.pack(k, v) for k, v in values.items())
    return encode_frame(FrameType.SETTINGS, 0, body)


def encode_close(code: int, reason: str) -> bytes:
    text = reason.encode("utf-8")[:MAX_REASON].decode("utf-8", "ignore").encode("utf-8")
    return encode_frame(FrameType.CLOSE, 0, U64.pack(code) + text)


def protocol_error(code: CloseCode, message: str) -> MuxProtocolError:
    """The error for a broken rule (the caller raises it; the state machine sends CLOSE)."""
    return MuxProtocolError(f"mux: {message}", code)


_FLAGS: dict[int, int] = {
    FrameType.SETTINGS: 0,
    FrameType.STREAM: FLAG_FIN,
    FrameType.RESET: 0,
    FrameType.CREDIT: 0,
    FrameType.DATAGRAM: 0,
    FrameType.PING: FLAG_ACK,
    FrameType.CLOSE: 0,
}
"""The flag bits each frame type defines (its keys are the known types)."""


def _name(ftype: int) -> str:
    return FrameType(ftype).name


def check_header(
    ftype: int, flags: int, length: int, settings: MuxSettings, peer_ready: bool
) -> None:
    """The rules a frame header alone must meet, before any byte of its body is read, in
    the profile's order (the first rule broken decides the code): the type is known; the
    peer's first frame is SETTINGS (or CLOSE) and no SETTINGS comes twice; no undefined
    flag; the length within our limits (LIMIT_VIOLATION); the length fits the type's fixed
    fields. ``settings`` are ours; ``peer_ready``: the peer's SETTINGS arrived. Raises
    MuxProtocolError."""
    allowed = _FLAGS.get(ftype)
    if allowed is None:
        raise protocol_error(CloseCode.PROTOCOL_VIOLATION, f"unknown frame type {ftype:#x}")
    if not peer_ready:
        if ftype != FrameType.SETTINGS and ftype != FrameType.CLOSE:
            raise protocol_error(CloseCode.PROTOCOL_VIOLATION, f"{_name(ftype)} before SETTINGS")
    elif ftype == FrameType.SETTINGS:
        raise protocol_error(CloseCode.PROTOCOL_VIOLATION, "a second SETTINGS frame")
    if flags & ~allowed:
        raise protocol_error(CloseCode.PROTOCOL_VIOLATION, f"{_name(ftype)} flags {flags:#x}")
    if length > settings.max_frame_size:
        raise protocol_error(
            CloseCode.LIMIT_VIOLATION,
            f"{_name(ftype)} frame of {length} bytes, limit {settings.max_frame_size}",
        )
    if ftype == FrameType.STREAM or ftype == FrameType.CLOSE:
        if length < 8:
            raise protocol_error(
                CloseCode.PROTOCOL_VIOLATION, f"{_name(ftype)} frame shorter than 8"
            )
    elif ftype == FrameType.DATAGRAM:
        if length > settings.max_datagram or not settings.max_datagram:
            raise protocol_error(
                CloseCode.LIMIT_VIOLATION,
                f"DATAGRAM of {length} bytes, limit {settings.max_datagram}",
            )
    elif ftype == FrameType.SETTINGS:
        if length > MAX_SETTINGS_BODY:
            raise protocol_error(CloseCode.LIMIT_VIOLATION, "SETTINGS frame too large")
        if length % SETTING.size:
            raise protocol_error(CloseCode.PROTOCOL_VIOLATION, "SETTINGS not whole entries")
    elif length != (8 if ftype == FrameType.PING else 16):
        raise protocol_error(CloseCode.PROTOCOL_VIOLATION, f"{_name(ftype)} body of {length} bytes")


def parse_settings(body: Payload) -> PeerSettings:
    """The peer's SETTINGS body; absent settings take their defaults (profile). Raises
    MuxProtocolError."""
    seen: dict[int, int] = {}
    for key, value in SETTING.iter_unpack(body):
        if key in seen:
            raise protocol_error(CloseCode.PROTOCOL_VIOLATION, f"setting {key:#x} given twice")
        seen[key] = value
    frame = seen.get(Setting.MAX_FRAME_SIZE, MIN_FRAME_SIZE)
    credit = seen.get(Setting.INITIAL_STREAM_CREDIT, 65536)
    streams = seen.get(Setting.MAX_STREAMS, MIN_STREAMS)
    datagram = seen.get(Setting.MAX_DATAGRAM, 0)
    idle = seen.get(Setting.IDLE_TIMEOUT_MS, 0)
    bad = None
    if not MIN_FRAME_SIZE <= frame <= MAX_FRAME_SIZE:
        bad = f"MAX_FRAME_SIZE {frame} not in [{MIN_FRAME_SIZE}, {MAX_FRAME_SIZE}]"
    elif not 1 <= credit <= MAX_VARINT:
        bad = f"INITIAL_STREAM_CREDIT {credit} not in [1, 2^62-1]"
    elif not MIN_STREAMS <= streams <= MAX_VARINT:
        bad = f"MAX_STREAMS {streams} not in [{MIN_STREAMS}, 2^62-1]"
    elif datagram > frame:
        bad = f"MAX_DATAGRAM {datagram} above MAX_FRAME_SIZE {frame}"
    elif idle > MAX_VARINT:
        bad = f"IDLE_TIMEOUT_MS {idle} above 2^62-1"
    if bad is not None:
        raise protocol_error(CloseCode.PROTOCOL_VIOLATION, bad)
    return PeerSettings(frame, credit, streams, datagram, idle / 1000 if idle else None)


@dataclass(frozen=True)
class TcpSettings:
    """Aqueduct over TCP: the multiplexer's limits plus the socket-side knobs (measured in
    ``docs/benchmarks/transport.md``)."""

    mux: MuxSettings = MuxSettings()
    race_delay: float = 0.25
    """``transport="auto"``: how long QUIC has alone before TCP joins the race (RFC 8305's
    connection attempt delay)."""
    read_buffer: int = 256 * 1024
    """The receive buffer TLS decrypts into (reused for every read)."""
    write_high_water: int = 1024 * 1024
    """Bytes the event loop may hold unsent before the multiplexer stops handing it more
    (engine senders pause at ``TransportConfig.send_budget`` counting these)."""
    write_chunk: int = 1024 * 1024
    """Stream bytes handed to the event loop per write call."""

    def __post_init__(self) -> None:
        if self.race_delay < 0 or self.read_buffer < 16384 or self.write_high_water < 16384:
            raise ValueError("race_delay >= 0, read_buffer and write_high_water >= 16384")
        if self.write_chunk < 16384:
            raise ValueError("write_chunk must be at least 16384")
