"""What a connection's transport measures of its network path, as plain numbers.

A transport (the driver of a :class:`~aqueduct_core.api.Connection`) may report a
:class:`PathSample`: cumulative counters read from its socket (TCP: the kernel's
``TCP_INFO``) or from its QUIC library, at one moment. Two samples make a
:class:`PathReading`: over the time between them, how much of it the sender spent limited by
the network itself, by the peer's receive window, or not limited at all (nothing to send:
its own CPU, or the application, was the limit), and the rate the path delivered while the
network was the limit. The `auto` compression policy decides from these numbers
(``aqueduct_spark.protocol.compression``); nothing here knows about sockets or clocks, so the
engine stays sans-IO and a test can feed readings of its own.
"""

from __future__ import annotations

from dataclasses import dataclass

LINK_BUSY = 0.8
"""The least share of an interval the sender must have had data in flight for the interval
to count as limited by the network."""
LINK_HELD = 0.1
"""The most share of an interval the sender may have been held back by the peer's receive
window (or its own send buffer) for the interval to count as limited by the network."""


@dataclass(frozen=True, slots=True)
class PathSample:
    """Cumulative counters of one connection's transport, read at ``at`` (the event loop's
    clock, seconds). Times are seconds since the connection began."""

    at: float
    delivered: int
    """Bytes the peer has acknowledged (TCP: ``tcpi_bytes_acked``; QUIC: bytes sent and
    acknowledged as far as the library tells)."""
    busy: float
    """Seconds the sender had data in flight or queued in the transport (TCP:
    ``tcpi_busy_time``, which includes the two below)."""
    peer_limited: float
    """Seconds of ``busy`` the peer's receive window held the sender back (TCP:
    ``tcpi_rwnd_limited``; QUIC: flow control)."""
    buffer_limited: float = 0.0
    """Seconds of ``busy`` the sender's own send buffer held it back (TCP:
    ``tcpi_sndbuf_limited``)."""
    rtt: float | None = None
    """The smoothed round-trip time, seconds, when known."""


@dataclass(frozen=True, slots=True)
class PathReading:
    """The path between two samples of one connection."""

    seconds: float
    delivered: int
    """Bytes the path delivered in the interval."""
    busy_share: float
    """Share of the interval with data in flight."""
    held_share: float
    """Share of the interval the peer's window (or the send buffer) held the sender back."""

    @property
    def link_limited(self) -> bool:
        """The network was the limit: data waited to go out nearly all the time, and it was
        not the peer's window that kept it waiting."""
        return self.busy_share >= LINK_BUSY and self.held_share <= LINK_HELD

    @property
    def link_rate(self) -> float:
        """Bytes per second the path carried while the network was the limit (0 when it
        never was in the interval)."""
        network = (self.busy_share - self.held_share) * self.seconds
        return self.delivered / network if network > 0 else 0.0

    @classmethod
    def between(cls, before: PathSample, after: PathSample) -> PathReading | None:
        """The reading from ``before`` to ``after`` (None if no time passed, or the counters
        went back: another connection's sample, or a transport that restarted them)."""
        seconds = after.at - before.at
        delivered = after.delivered - before.delivered
        busy = after.busy - before.busy
        held = after.peer_limited + after.buffer_limited
        held -= before.peer_limited + before.buffer_limited
        if seconds <= 0 or delivered < 0 or busy < 0 or held < 0:
            return None
        # The kernel counts busy time in jiffies (1-4 ms): clamp the shares to [0, 1].
        busy_share = min(1.0, busy / seconds)
        return cls(seconds, delivered, busy_share, min(busy_share, held / seconds))
