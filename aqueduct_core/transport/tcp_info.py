"""The kernel's view of a TCP connection (Linux ``TCP_INFO``) as a :class:`PathSample`.

``getsockopt(IPPROTO_TCP, TCP_INFO)`` fills ``struct tcp_info`` (``linux/tcp.h``); the fields
read here and their offsets (all little-endian on the platforms Linux runs this on):

    u32 tcpi_rtt               @ 68   smoothed RTT, microseconds
    u64 tcpi_bytes_acked       @ 120  bytes the peer acknowledged (RFC 4898 tcpEStatsAppHCThruOctetsAcked)
    u64 tcpi_busy_time         @ 168  microseconds with data outstanding or queued ("busy" chrono,
                                      plus the two below)
    u64 tcpi_rwnd_limited      @ 176  microseconds stalled by the peer's receive window
    u64 tcpi_sndbuf_limited    @ 184  microseconds stalled by our send buffer

(the chrono counters exist since Linux 4.10, 2017). One call costs about a microsecond; a
platform without them gives None, and the compression policy then treats the path as
unknown (it does not compress on its own).
"""

from __future__ import annotations

import socket
import struct
from typing import Any

from aqueduct_core.api.path import PathSample

_SIZE = 192
_RTT = struct.Struct("<I")
_ACKED = struct.Struct("<Q")
_CHRONO = struct.Struct("<QQQ")
_US = 1e-6


def tcp_path_sample(sock: Any, now: float) -> PathSample | None:
    """``sock``'s counters now (``now``: the caller's clock), or None where the kernel does
    not report them (not Linux, an old kernel, a closed socket)."""
    option = getattr(socket, "TCP_INFO", None)
    if sock is None or option is None:
        return None
    try:
        raw = sock.getsockopt(socket.IPPROTO_TCP, option, _SIZE)
    except (OSError, ValueError):
        return None
    if len(raw) < _SIZE:
        return None
    return parse_tcp_info(raw, now)


def parse_tcp_info(raw: bytes, now: float) -> PathSample:
    """The sample in a ``struct tcp_info`` of at least 192 bytes."""
    (rtt,) = _RTT.unpack_from(raw, 68)
    (acked,) = _ACKED.unpack_from(raw, 120)
    busy, rwnd, sndbuf = _CHRONO.unpack_from(raw, 168)
    return PathSample(
        at=now,
        delivered=acked,
        busy=busy * _US,
        peer_limited=rwnd * _US,
        buffer_limited=sndbuf * _US,
        rtt=rtt * _US if rtt else None,
    )
