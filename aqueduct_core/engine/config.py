"""Engine configuration: timers and limits of profile §2.12, flow control of §3.4."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aqueduct_core.wire.frames import DEFAULT_VERSION
from aqueduct_core.wire.primitives import Headers, WireLimits

PayloadBuffers = Callable[[int, Headers], "tuple[memoryview, Any] | None"]
"""``(payload length, channel headers) -> (writable view of that length, the object the
payload is handed out as) or None``: see ``EngineConfig.payload_buffers``."""

DEFAULT_WINDOW = 16 * 1024 * 1024
"""Per-channel receive window. Larger than the Arrow batches Aqueduct carries (1-8 MiB), so
several messages are in flight; a window smaller than one message lets a single message
through at a time and costs a round trip per message (the profile's 256 KiB measured at 0.6x
the throughput of no flow control with 1 MiB messages)."""


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Every timer and limit of the engine. Times are in seconds."""

    ack_delay: float = 0.05
    """Reliable acks are sent at most this long after a message arrives (<= 1 s)."""
    sent_unreliable_delay: float = 0.05
    """SENT_UNRELIABLE is flushed at most this long after an unreliable send."""
    unreliable_deadline_min: float = 0.1
    unreliable_deadline_max: float = 1.0
    """The unreliable receipt deadline is clamp(2 * RTT, min, max) from when a number is known."""
    forget_interval: float = 1.0
    """At most one FORGET_CHANNEL per channel per interval (G20)."""
    handshake_timeout: float = 10.0
    """The peer's CONNECTION_HEADERS must arrive within this time (close code 4)."""
    limits: WireLimits = field(default_factory=WireLimits)
    max_channels: int = 10_000
    """Live channel state machines on this connection (ours and the peer's) beyond which a
    channel the peer creates closes the connection (code 3). A channel lives until the peer
    closes its end, so a peer that never does would otherwise grow our state without bound
    while keeping to its credit (each costs about 2.7 KB)."""
    max_pending_channels: int = 4096
    """Live remote-created channels that are not attached yet (close code 3 beyond it)."""
    max_pending_bytes: int = 256 * 1024 * 1024
    """Bytes buffered in channels that are not attached yet (close code 3 beyond it). Fixed
    rather than max_pending_channels x window: any peer that reaches the port can create
    such channels, so this bounds what it can make us hold. A conforming peer exceeds it only
    when more than 16 channels carry a full 16 MiB window before the messages attaching them
    arrive; raise it for such workloads."""
    max_message_gap: int = 1 << 20
    """How far beyond the lowest undecided message number of a channel (reliable or
    unreliable) a MESSAGE_NUM, or a SENT_UNRELIABLE total, may reach (G31; close code 3
    beyond it). Numbers are sequential, so a conforming sender is ahead only by what it sent
    within about one unreliable deadline (<= 1 s); no Python sender approaches 2**20."""
    max_early_bytes: int = 16 * 1024 * 1024
    """Bytes accepted before the peer's CONNECTION_HEADERS (close code 3 beyond it). A
    conforming peer sends at most one message per channel before it knows our window."""
    require_flow_control: bool = False
    """Refuse a peer that does not advertise a flow-control window (close code 3): without
    one it has unlimited credit, so nothing bounds what it makes us hold. A server facing
    untrusted clients sets this (``aqueduct serve`` does)."""
    flow_window: int | None = DEFAULT_WINDOW
    """Per-channel receive window we advertise (bytes); None: do not take part in flow
    control (the peer then gets unlimited credit and never sees DEQUEUED)."""
    entry_window: int | None = None
    """A server's receive window on the entrypoint channel (bytes), if smaller than
    ``flow_window``: how much a client may send ahead of the server's application taking its
    messages (profile §4, flow control item 9). A server that reads a request only when it
    can serve it thus holds at most this much of one client's backlog, however many requests
    the client fires at once: the rest waits in the client. A client that sends beyond it is
    disconnected (code 3). None: the entrypoint has ``flow_window`` like any channel."""
    entry_window_setting: str = "EngineConfig.entry_window"
    """What the close reason calls the setting behind ``entry_window``, so that whoever
    reads it knows what to raise (``aqueduct serve`` says ``--request-window``)."""
    dequeued_delay: float = 0.02
    """Unreported dequeued bytes below half the window are reported after this delay."""
    version: bytes = DEFAULT_VERSION
    """The version string sent and required (G30)."""
    max_datagram_size: int = 1200
    """Largest datagram the engine builds, until the transport reports the real limit."""
    payload_buffers: PayloadBuffers | None = None
    """Where a large incoming MESSAGE is gathered once its whole cost is charged to its
    channel's flow-control window (so never more than we granted): called with the payload
    length (at least 64 KiB) and the channel's headers, it returns a writable view of that
    length and the object to hand the application as the payload (bytes-like, of that
    length, keeping the view's memory alive and to itself), or None. A pool of reused buffers here spares the
    receiver a fresh buffer, its page faults and its freeing, per message. None: a
    ``bytearray`` that grows with what arrived."""
