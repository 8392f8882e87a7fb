"""Packet size from the path, not from configuration (RFC 8899 DPLPMTUD, RFC 9000 §14.3).

What each connection does when ``TransportConfig.packet_size`` is None (the operator's
override, when set, is used as is):

1. **Start from the route.** The kernel knows the MTU of the interface its route to the peer
   leaves by (``IP_MTU`` of a UDP socket connected to the peer; lowered by any ICMP
   "fragmentation needed" it has seen). The packet size starts at that MTU minus the IP and
   UDP headers, capped by the backend's limit: 1472 on a 1500-byte Ethernet, 8972 on jumbo
   frames, with no option on either end. A client sizes its packets when it connects; a
   server sizes each connection when the first packet of that client arrives, from its own
   route back to that client, so one server serves both kinds of path.
2. **Never fragment.** The socket sends with "don't fragment" (``udp.forbid_fragments``), so
   a packet too large for the first hop fails locally with ``EMSGSIZE`` (dropped, counted
   lost) and one too large for a later hop is dropped there, never split into IP fragments.
3. **Probe upward, fall back on loss.** RFC 8899's search needs probe packets of a chosen
   size that the peer acknowledges. qh3's core does this for a client (from its starting
   size up to 1472, and it lowers the size when probes are lost); aioquic has no probe
   packets. :class:`BlackHoleDetector` implements the RFC's black-hole rule on the adapter
   side for aioquic, whose packet size can change mid-connection: when the library reports
   repeated probe timeouts (PTO) at a size above the base, the route is asked again (an ICMP
   "packet too big" lowers the route's MTU) and, failing that, the size drops to the base
   (1200, every QUIC path carries it); the larger size is tried again once the connection
   has recovered, twice at most.

Loopback keeps the backend's largest packet (no Ethernet in the way).
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket
from typing import Any

BASE_PACKET = 1200
"""RFC 9000 §14: every QUIC path carries 1200-byte UDP payloads (RFC 8899 BASE_PLPMTU)."""
IP_MTU = 14
IPV6_MTU = 24
IPV4_OVERHEAD = 28
"""IPv4 header (20) and UDP header (8)."""
IPV6_OVERHEAD = 48
"""IPv6 header (40) and UDP header (8)."""
PTO_LIMIT = 5
"""Consecutive probe timeouts at a size above the base before the path is re-checked
(RFC 8899 §4.3: a black hole shows as persistent loss of every packet of a size). Five,
about a second of silence on a LAN: a peer descheduled on a busy host goes quiet for
hundreds of milliseconds, and three timeouts mistook that for a black hole."""
STRIKES = 2
"""Times the larger size is tried again after the connection recovered at the base size;
then the base size stays (the black hole is confirmed)."""
RETRY_AFTER = 1.0
"""Seconds at the base size, with acknowledgements flowing, before the larger size is
tried again (RFC 8899's search restarting after a black hole)."""


def route_mtu(ip: str) -> int | None:
    """The MTU of the route to ``ip`` as the kernel sees it now, or None if unknown."""
    try:
        addr = ipaddress.ip_address(ip.split("%", 1)[0])
    except ValueError:
        return None
    if addr.version == 6 and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    family = socket.AF_INET6 if addr.version == 6 else socket.AF_INET
    level, option = (
        (socket.IPPROTO_IPV6, IPV6_MTU)
        if family == socket.AF_INET6
        else (socket.IPPROTO_IP, IP_MTU)
    )
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as sock:
            sock.connect((str(addr), 9))  # no packet is sent: this only picks the route
            return int(sock.getsockopt(level, option))
    except OSError:
        return None


def packet_size_for_route(ip: str, limit: int) -> int | None:
    """The UDP payload that fits the route to ``ip``, at most ``limit``, at least
    :data:`BASE_PACKET`; None when the route's MTU cannot be read."""
    mtu = route_mtu(ip)
    if mtu is None:
        return None
    try:
        v6 = ipaddress.ip_address(ip.split("%", 1)[0]).version == 6
    except ValueError:
        v6 = False
    mapped = v6 and ipaddress.ip_address(ip.split("%", 1)[0]).ipv4_mapped is not None  # type: ignore[union-attr]
    overhead = IPV6_OVERHEAD if v6 and not mapped else IPV4_OVERHEAD
    return max(BASE_PACKET, min(limit, mtu - overhead))


def set_aioquic_packet_size(quic: Any, size: int) -> None:
    """Change an aioquic connection's packet size, also where its congestion controller
    and pacer cached it (else the pacer would space large packets like small ones)."""
    quic._max_datagram_size = size
    loss = getattr(quic, "_loss", None)
    for part in (getattr(loss, "_pacer", None), getattr(loss, "_cc", None)):
        if part is not None and hasattr(part, "_max_datagram_size"):
            part._max_datagram_size = size


def size_qh3_configuration(configuration: Any, size: int) -> Any:
    """A copy of a qh3 QuicConfiguration with packet size ``size`` (a server's connections
    share one; the copy keeps the adapter's private limits, which the hooks read)."""
    import copy

    sized = copy.copy(configuration)
    sized.max_datagram_size = size
    limits = getattr(configuration, "_aqueduct_limits", None)
    if limits is not None:
        sized._aqueduct_limits = (limits[0], size)
    return sized


class BlackHoleDetector:
    """RFC 8899 §4.3 black-hole detection for one connection (see the module docstring).
    ``check(pto_count, now)`` after each timer; returns the new packet size, or None.

    A suspected black hole drops the size to the base (or to the route's MTU, if an ICMP
    message lowered it). Once acknowledgements flow again for :data:`RETRY_AFTER` seconds,
    the larger size is tried again, :data:`STRIKES` times at most: a stalled peer costs a
    moment at small packets, a real black hole ends at the base size."""

    def __init__(self, peer_ip: str, size: int, limit: int) -> None:
        self.peer_ip = peer_ip
        self.size = self.found = size
        self.limit = limit
        self.strikes = 0
        self.since: float | None = None

    def check(self, pto_count: int, now: float) -> int | None:
        if self.size > BASE_PACKET:
            if pto_count < PTO_LIMIT:
                return None
            routed = packet_size_for_route(self.peer_ip, self.limit)
            if routed is not None and routed < self.size:
                self.size = self.found = routed  # the route learned a smaller MTU
                return routed
            self.strikes += 1
            self.size, self.since = BASE_PACKET, None
            return BASE_PACKET
        if self.found <= BASE_PACKET or self.strikes >= STRIKES or pto_count:
            self.since = None
            return None
        if self.since is None:
            self.since = now
        elif now - self.since >= RETRY_AFTER:
            self.size = self.found
            return self.found
        return None


def peer_ip(addr: Any) -> str | None:
    """The IP of a socket address tuple, or None."""
    with contextlib.suppress(Exception):
        return str(addr[0])
    return None
