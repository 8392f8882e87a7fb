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
3. **Probe, up and down, before the handshake** (RFC 8899 §6.1: an application over UDP
   brings its own probe and confirmation). Neither library can do it for us: qh3's core
   only probes a fixed list up to 1472 bytes (client side only) and cannot change the size
   of a connection once made; aioquic has no probe packets. So the client's UDP transport
   (``udp.UdpTransport.probe_path``) sends one probe datagram of each size of
   :func:`probe_ladder` (the route's size, the usual MTUs below it down to 1200 and above
   it up to the backend's limit) to the server's port. The server's UDP transport answers
   each with a datagram *of the same size*, so an answered probe proves that both
   directions carry that size. A second round refines between the largest answered and the
   smallest unanswered size. The client uses the largest answered size, advertises it
   (``max_udp_payload_size``) and tells the server in a small result datagram; the server
   sizes that connection from it. So a path whose route says 1500 but whose middle hop
   carries 1400 settles below 1400, and a route that says less than the link carries (a
   route ``mtu`` metric, a stale path-MTU entry) is probed past. A peer that does not
   answer (an older server) costs :data:`PROBE_WAIT` once per connect and leaves the
   route's size. The result is kept for the peer's address for 10 minutes: later
   connections (0-RTT resumptions too) only tell the server, with no round trip of their
   own. Probes and answers start with a zero byte, which no QUIC packet does (the
   fixed bit, RFC 9000 §17), so the transports take them out before the libraries see them.
4. **Fall back on loss, mid-connection.** :class:`BlackHoleDetector` implements RFC 8899
   §4.3's black-hole rule for aioquic, whose packet size can change mid-connection: when
   the library reports repeated probe timeouts (PTO) at a size above the base, the route is
   asked again (an ICMP "packet too big" lowers the route's MTU) and, failing that, the
   size drops to the base (1200, every QUIC path carries it); the larger size is tried
   again once the connection has recovered, twice at most. A qh3 connection keeps its size
   (its core cannot change it); a qh3 client falls back to 1200 by itself when nothing
   answers its first packets.

Loopback keeps the backend's largest packet (no Ethernet in the way).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import os
import socket
import struct
import time
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
        self.routed = packet_size_for_route(peer_ip, limit)
        """The route's size at the start: only a route that shrank since (an ICMP "packet
        too big") says more than the probes did."""
        self.strikes = 0
        self.since: float | None = None

    def check(self, pto_count: int, now: float) -> int | None:
        if self.size > BASE_PACKET:
            if pto_count < PTO_LIMIT:
                return None
            routed = packet_size_for_route(self.peer_ip, self.limit)
            if routed is not None and routed < min(self.size, self.routed or self.size):
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


# -- probing (both ends are Aqueduct UDP transports; see the module docstring, step 3) ----

PROBE_MAGIC = b"\x00AQPMTU1"
"""Starts every probe datagram. The zero first byte has the QUIC fixed bit (0x40) clear:
no QUIC packet starts so, and neither library negotiates greasing it (RFC 9287)."""
PROBE_ASK, PROBE_ANSWER, PROBE_RESULT = 0, 1, 2
_PROBE = struct.Struct("!8sB8sH")
"""magic, kind, nonce, size (the probed size; for a result, the size the client chose)."""
PROBE_HEADER = _PROBE.size
LADDER = (1200, 1232, 1280, 1350, 1400, 1452, 1472, 2048, 4052, 8164, 8972, 9188, 16356, 65507)
"""UDP payloads of the usual link MTUs (IPv4): 1280 (IPv6 minimum), 1400-1500 (tunnels,
Ethernet), 4096 and 8192 (some virtual links), 9000 and 9216 (jumbo frames), 16384, 65535."""
PROBE_WAIT = 0.25
"""Seconds to wait for the first answer; a peer that does not answer keeps the route's size."""
PROBE_SETTLE = 0.025
"""After the first answer, wait ``3 * its round trip + PROBE_SETTLE`` for the others: a
peer on a busy host answers a burst of probes in pieces, tens of milliseconds apart. Only a
path that loses probes in the middle pays it; sizes the first hop refuses are not awaited."""
REFINE_STEPS = 6
"""Sizes of the second round, evenly between the largest answered and the next lost."""


def probe_ladder(start: int, limit: int) -> list[int]:
    """Sizes to probe: ``start`` (the route's size) and every :data:`LADDER` size from the
    base to ``limit``, smallest first."""
    return sorted({start, *(size for size in LADDER if size <= limit)} - {0})


def refine_ladder(answered: int, lost: int) -> list[int]:
    """Second round: sizes evenly between ``answered`` and ``lost`` (exclusive)."""
    if lost - answered <= 2 * REFINE_STEPS:
        return []
    step = (lost - answered) / (REFINE_STEPS + 1)
    return sorted({answered + round(step * k) for k in range(1, REFINE_STEPS + 1)})


def encode_probe(kind: int, nonce: bytes, size: int, total: int | None = None) -> bytes:
    """A probe datagram: header, padded with zero bytes to ``total`` (default ``size``)."""
    head = _PROBE.pack(PROBE_MAGIC, kind, nonce, size)
    return head + bytes(max(0, (size if total is None else total) - len(head)))


def decode_probe(data: bytes) -> tuple[int, bytes, int] | None:
    """(kind, nonce, size) of a probe datagram, or None if ``data`` is not one."""
    if len(data) < PROBE_HEADER or not data.startswith(PROBE_MAGIC):
        return None
    _, kind, nonce, size = _PROBE.unpack_from(data)
    return kind, nonce, size


def new_nonce() -> bytes:
    return os.urandom(8)


FOUND_TTL = 600.0
"""Seconds a search's result is reused for the same peer (RFC 8899's PMTU_RAISE_TIMER):
later connections, 0-RTT resumptions included, skip the probes' round trip."""
_found: dict[tuple[str, int], tuple[float, int | None]] = {}
"""(peer IP, size limit) -> (when, found size or None for no answer)."""


async def search(transport: Any, addr: Any, start: int, limit: int) -> int | None:
    """On ``transport`` (a ``udp.UdpTransport``): the largest datagram both directions of
    the path to ``addr`` carry (step 3 of the module docstring); None when the peer answered
    no probe. Tells the peer the result. A result younger than :data:`FOUND_TTL` for the
    same peer is reused without probing (the peer is still told)."""
    key = (str(addr[0]), limit)
    cached = _found.get(key)
    if cached is not None and time.monotonic() - cached[0] < FOUND_TTL:
        best = cached[1]
    else:
        best = await _probe(transport, addr, start, limit)
        _found[key] = (time.monotonic(), best)
    if best is not None:
        result = encode_probe(PROBE_RESULT, new_nonce(), best, PROBE_HEADER)
        for _ in range(2):  # a lost result only costs the server its route's size
            transport.send_probe(result, addr)
    return best


async def _probe(transport: Any, addr: Any, start: int, limit: int) -> int | None:
    loop = asyncio.get_running_loop()
    nonce = new_nonce()
    answered: set[int] = set()
    event = asyncio.Event()

    def on_answer(size: int) -> None:
        answered.add(size)
        event.set()

    rtt: list[float] = []

    async def round_trip(sizes: list[int]) -> None:
        """Probe ``sizes``; wait for the first answer (at most PROBE_WAIT, or, once a round
        trip is known, the settling time), then the settling time for the others. A size
        the first hop refuses (EMSGSIZE) is lost at once and not waited for."""
        sent = loop.time()
        waiting = [
            s for s in sizes if transport.send_probe(encode_probe(PROBE_ASK, nonce, s), addr)
        ]
        end = sent + (3 * rtt[0] + PROBE_SETTLE if rtt else PROBE_WAIT)
        while any(size not in answered for size in waiting):
            now = loop.time()
            if not rtt and any(size in answered for size in waiting):
                rtt.append(now - sent)
                end = now + 3 * rtt[0] + PROBE_SETTLE
            if now >= end:
                return
            event.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(event.wait(), end - now)

    transport.probe_waiters[nonce] = on_answer
    try:
        ladder = probe_ladder(start, limit)
        await round_trip(ladder)
        if not answered:
            return None
        best = max(answered)
        above = [size for size in ladder if size > best]
        if above:
            await round_trip(refine_ladder(best, above[0]))
            best = max(answered)
    finally:
        del transport.probe_waiters[nonce]
    return best
