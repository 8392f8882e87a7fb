"""UDP for the QUIC adapter: many packets per system call (GSO on send, GRO on receive).

The asyncio datagram transport makes one ``sendto`` per QUIC packet and one ``recvfrom`` per
received packet, each followed in the QUIC libraries by a full receive/transmit cycle. At a
1500-byte MTU that is ~70,000 packets per second per 100 MB/s, and the per-packet cost of the
system call and the Python around it dominates (``shared/design/real-paths.md``). This module
replaces that transport with one built the way quinn-udp and msquic do it on Linux:

- **Send (UDP_SEGMENT, "GSO").** The adapter *corks* the transport around each library
  transmit; the packets of one transmit are then handed to the kernel as runs of equal-sized
  segments (the last may be shorter), one ``sendmsg`` with a ``UDP_SEGMENT`` control message
  per run of up to :data:`GSO_MAX_SEGMENTS` segments and 64 KiB. The kernel (or the NIC) cuts
  them into packets. Scatter-gather: the packets are not joined in Python.
- **Receive (UDP_GRO).** With ``UDP_GRO`` on, one ``recvmsg`` returns several packets of one
  flow back to back with their segment size in a control message. Each readiness callback
  reads until the socket is empty (at most :data:`RECV_BURST` calls) and hands every QUIC
  connection its packets in one ``datagrams_received`` call, so the library processes a burst
  and transmits (acknowledges) once per burst instead of once per packet.
- **Fallback.** Where the kernel refuses either option (old kernels, non-Linux), or a send
  with segments fails as quinn-udp documents for NICs without checksum offload (``EIO``,
  ``EINVAL``...), the transport sends packets one by one from then on; GRO off means one
  packet per ``recvmsg``. Nothing else changes.
- **Told when nobody listens.** A client's socket is connected to its server
  (:func:`connect_to`), so the kernel reports an ICMP "port unreachable" (or "host
  unreachable") as ``ECONNREFUSED`` (``EHOSTUNREACH``...) on the next receive; the transport
  hands it to ``on_unreachable``, and a QUIC attempt fails in a round trip instead of at its
  handshake timeout. An unconnected socket (a server's) never hears of ICMP errors. uvloop
  (libuv) stops watching a socket once it reported such an error; the transport watches it
  again.
- **Never fragmented.** The socket sets "don't fragment, ignore the path MTU cache"
  (``IP_PMTUDISC_PROBE``): a packet larger than the route's MTU fails with ``EMSGSIZE``
  and is dropped here (QUIC counts it lost) instead of leaving as IP fragments; see
  :mod:`aqueduct_core.transport.pmtu` for how the packet size is chosen.

A server's transport also routes: packets with a short header go straight to the connection
that owns their destination connection ID (the QUIC server's own table), in batches;
everything else (handshakes, unknown IDs) goes through the server's ``datagram_received``.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import socket
import struct
import sys
from collections import deque
from collections.abc import Callable
from typing import Any

from aqueduct_core.transport import pmtu

log = logging.getLogger("aqueduct.transport")

SOL_UDP = 17
UDP_SEGMENT = 103
UDP_GRO = 104
GSO_MAX_SEGMENTS = 64
"""The kernel's UDP_MAX_SEGMENTS on every kernel that has GSO (newer ones allow 128)."""
GSO_MAX_BYTES = 65000
"""A GSO send is one UDP datagram to the kernel: at most 65535 bytes with headers."""
RECV_BUFFER = 65536
"""A GRO receive returns at most one 64 KiB super-datagram."""
RECV_BURST = 64
"""``recvmsg`` calls per readiness callback before the loop gets a turn."""
SEND_QUEUE_LIMIT = 4096
"""Packets waiting for a full socket buffer; beyond that they are dropped (lost, as on a
wire), so a stalled socket cannot grow memory without bound."""
PROBE_BUDGET = 16 << 20
"""Bytes per second of probe answers a transport sends (a burst of as much): each answer is
as large as its probe, never larger, so this only bounds the work a flood of probes costs."""
PATH_SIZES_KEPT = 4096
"""Clients whose probe result a server remembers (the oldest are forgotten first)."""
_IS_LINUX = sys.platform.startswith("linux")
_SEGMENT = struct.Struct("=H")
_GRO_SIZE = struct.Struct("=i")
_ANC_SPACE = socket.CMSG_SPACE(_GRO_SIZE.size) if hasattr(socket, "CMSG_SPACE") else 0
# Errors of a GSO send that mean "this socket/NIC cannot segment", not "this packet is bad".
_GSO_REFUSED = frozenset((errno.EIO, errno.EINVAL, errno.EOPNOTSUPP, errno.ENOPROTOOPT))
IP_MTU_DISCOVER = 10
IP_PMTUDISC_PROBE = 3
IPV6_MTU_DISCOVER = 23
IPV6_PMTUDISC_PROBE = 3
UNREACHABLE = frozenset(
    (errno.ECONNREFUSED, errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EHOSTDOWN)
)
"""What a connected socket reports of an ICMP destination-unreachable: the port is closed
(nothing listens), or the host or network cannot be reached."""

Address = Any


def enable_gro(sock: socket.socket) -> bool:
    """Turn UDP_GRO on; False where the kernel refuses it."""
    if not _IS_LINUX:
        return False
    try:
        sock.setsockopt(SOL_UDP, UDP_GRO, 1)
        return sock.getsockopt(SOL_UDP, UDP_GRO) == 1
    except OSError:
        return False


def gso_supported(sock: socket.socket) -> bool:
    """Whether the kernel knows UDP_SEGMENT (checked the way quinn-udp does: set the option;
    it is then reset, so only per-message control messages ever segment)."""
    if not _IS_LINUX:
        return False
    try:
        sock.setsockopt(SOL_UDP, UDP_SEGMENT, 1200)
        sock.setsockopt(SOL_UDP, UDP_SEGMENT, 0)
    except OSError:
        return False
    return True


def forbid_fragments(sock: socket.socket) -> bool:
    """Set DF and ignore the path-MTU cache: oversized packets fail with EMSGSIZE here
    instead of being fragmented (IPv4) and packet size is ours to choose. False if refused."""
    if not _IS_LINUX:
        return False
    try:
        if sock.family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, IPV6_MTU_DISCOVER, IPV6_PMTUDISC_PROBE)
            with contextlib.suppress(OSError):  # dual-stack sockets also send IPv4
                sock.setsockopt(socket.IPPROTO_IP, IP_MTU_DISCOVER, IP_PMTUDISC_PROBE)
        else:
            sock.setsockopt(socket.IPPROTO_IP, IP_MTU_DISCOVER, IP_PMTUDISC_PROBE)
    except OSError:
        return False
    return True


def connect_to(sock: socket.socket, addr: Address) -> bool:
    """Connect a client's UDP socket to its server, so ICMP errors reach it (see the module
    docstring). Linux only: elsewhere a connected socket may refuse ``sendto`` with an
    address. False if not connected (the socket works as before, without the reports)."""
    if not _IS_LINUX:
        return False
    try:
        sock.connect(addr)
    except OSError:
        return False
    return True


class UdpTransport(asyncio.DatagramTransport):
    """A datagram transport over a non-blocking UDP socket with GSO and GRO (see the module
    docstring). Only the parts of ``asyncio.DatagramTransport`` the QUIC libraries use, plus
    :meth:`cork` / :meth:`uncork` to batch the packets of one transmit."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        sock: socket.socket,
        protocol: asyncio.DatagramProtocol,
        *,
        gso: bool = True,
        gro: bool = True,
    ) -> None:
        super().__init__()
        self._loop = loop
        self._sock = sock
        self._fd = sock.fileno()
        self._protocol = protocol
        self.gso = gso and gso_supported(sock)
        self.gro = gro and enable_gro(sock)
        self.no_fragments = forbid_fragments(sock)
        self._corked = 0
        self._batch: list[tuple[bytes, Address]] = []
        self._queue: deque[tuple[bytes, Address]] = deque()
        self._closing = False
        self._closed = False
        self._writer = False
        self._extra = {"socket": sock, "sockname": sock.getsockname(), "peername": None}
        with contextlib.suppress(OSError):  # a connected socket (connect_to)
            self._extra["peername"] = sock.getpeername()
        self.on_unreachable: Callable[[OSError], None] | None = None
        """Called with the error when a connected socket (:func:`connect_to`) learns that
        the peer's port is closed or the peer cannot be reached (:data:`UNREACHABLE`)."""
        # A QUIC server routes by connection ID; its table is reused for batching.
        self._routes: dict[bytes, Any] | None = getattr(protocol, "_protocols", None)
        self.probe_waiters: dict[bytes, Callable[[int], None]] = {}
        """Probe searches under way (pmtu.search), by nonce."""
        self.path_sizes: dict[Address, int] = {}
        """Server: the packet size each client found for its path (pmtu.py, step 3)."""
        self._probe_credit = float(PROBE_BUDGET)
        self._probe_time = loop.time()
        cid_conf = getattr(protocol, "_configuration", None)
        self._cid_length = int(getattr(cid_conf, "connection_id_length", 8) or 8)
        self.stats = {
            "sendmsg": 0,
            "packets_sent": 0,
            "largest_sent": 0,
            "recvmsg": 0,
            "packets_received": 0,
            "largest_received": 0,
        }
        """System calls and packets each way (GSO/GRO at work when calls < packets) and the
        largest packet each way; cheap enough to keep on: one update per call."""
        loop.add_reader(self._fd, self._on_readable)

    # -- asyncio.BaseTransport -----------------------------------------------------------

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._extra.get(name, default)

    def is_closing(self) -> bool:
        return self._closing

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._protocol

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._protocol = protocol  # type: ignore[assignment]

    def close(self) -> None:
        if self._closing:
            return
        self._closing = True
        self._batch.clear()
        self._loop.remove_reader(self._fd)
        if not self._queue:
            self._loop.call_soon(self._finish)

    def abort(self) -> None:
        self._queue.clear()
        self.close()

    def _finish(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._writer:
            self._loop.remove_writer(self._fd)
            self._writer = False
        try:
            self._protocol.connection_lost(None)
        finally:
            self._sock.close()

    def get_write_buffer_size(self) -> int:
        return sum(len(data) for data, _ in self._queue)

    # -- sending -------------------------------------------------------------------------

    def cork(self) -> None:
        """Hold packets until the matching :meth:`uncork`, then send them in GSO runs."""
        self._corked += 1

    def uncork(self) -> None:
        self._corked -= 1
        if self._corked == 0 and self._batch:
            batch, self._batch = self._batch, []
            self._send_many(batch)

    def sendto(self, data: bytes | bytearray | memoryview, addr: Address = None) -> None:
        if self._closing:
            return
        if self._corked:
            self._batch.append((data, addr))  # type: ignore[arg-type]
        else:
            self._send_many([(data, addr)])  # type: ignore[list-item]

    def _send_many(self, packets: list[tuple[bytes, Address]]) -> None:
        if self._queue:  # the socket was full: keep the order
            self._enqueue(packets, 0)
            return
        i, n = 0, len(packets)
        sock = self._sock
        while i < n:
            data, addr = packets[i]
            size = len(data)
            j = i + 1
            if self.gso:
                # A run: equal sizes to one address; the last may be shorter, then it ends.
                limit = min(n, i + GSO_MAX_SEGMENTS, i + max(1, GSO_MAX_BYTES // max(size, 1)))
                while j < limit:
                    nxt, to = packets[j]
                    if to != addr or len(nxt) > size:
                        break
                    j += 1
                    if len(nxt) < size:
                        break
            try:
                if j - i == 1:
                    sock.sendto(data, addr)
                else:
                    sock.sendmsg(
                        [p for p, _ in packets[i:j]],
                        [(SOL_UDP, UDP_SEGMENT, _SEGMENT.pack(size))],
                        0,
                        addr,
                    )
                stats = self.stats
                stats["sendmsg"] += 1
                stats["packets_sent"] += j - i
                if size > stats["largest_sent"]:
                    stats["largest_sent"] = size
            except (BlockingIOError, InterruptedError):
                self._enqueue(packets, i)
                return
            except OSError as exc:
                if j - i > 1 and exc.errno in _GSO_REFUSED:
                    self._gso_refused(packets[i:j], exc)
                elif exc.errno != errno.EMSGSIZE:
                    # EMSGSIZE: larger than the route's MTU (a probe, or the path shrank).
                    # It is dropped, as the network would; QUIC counts it lost.
                    self._error(exc)
            i = j

    def _gso_refused(self, run: list[tuple[bytes, Address]], exc: OSError) -> None:
        """A run failed as a whole: send it packet by packet. If those go out, this socket
        cannot segment (quinn-udp sees EIO from NICs without checksum offload): stop
        trying. If they fail with EMSGSIZE, the segment size was too large, not GSO."""
        sent = 0
        for data, addr in run:
            try:
                self._sock.sendto(data, addr)
                sent += 1
            except (BlockingIOError, InterruptedError):
                break
            except OSError as inner:
                if inner.errno != errno.EMSGSIZE:
                    self._error(inner)
        if sent:
            log.info("UDP segmentation offload refused (%s): sending packets one by one", exc)
            self.gso = False

    def _enqueue(self, packets: list[tuple[bytes, Address]], start: int) -> None:
        room = SEND_QUEUE_LIMIT - len(self._queue)
        self._queue.extend(packets[start : start + max(0, room)])
        if not self._writer:
            self._loop.add_writer(self._fd, self._on_writable)
            self._writer = True

    def _on_writable(self) -> None:
        queue, self._queue = list(self._queue), deque()
        self._send_many(queue)
        if not self._queue:
            self._loop.remove_writer(self._fd)
            self._writer = False
            if self._closing:
                self._finish()

    def _error(self, exc: OSError) -> None:
        if exc.errno in UNREACHABLE and self._extra["peername"] is not None:
            # libuv (uvloop) stops watching a socket that reported an error (POLLERR) for
            # good: watch it again, once this turn of the loop is over. Without this, one
            # ICMP error (a service restarting) leaves a client deaf to the new process.
            self._loop.call_soon(self._watch_again)
            if self.on_unreachable is not None:
                self.on_unreachable(exc)
            return
        handler: Callable[[Exception], None] | None = getattr(
            self._protocol, "error_received", None
        )
        if handler is not None:
            handler(exc)

    def _watch_again(self) -> None:
        if not self._closing:
            self._loop.remove_reader(self._fd)
            self._loop.add_reader(self._fd, self._on_readable)
        if self._writer and not self._closed:
            self._loop.remove_writer(self._fd)
            self._loop.add_writer(self._fd, self._on_writable)

    # -- receiving -----------------------------------------------------------------------

    def _on_readable(self) -> None:
        sock = self._sock
        got: list[tuple[bytes, Address]] = []
        anc = _ANC_SPACE if self.gro else 0
        largest = 0
        for _ in range(RECV_BURST):
            try:
                data, ancdata, flags, addr = sock.recvmsg(RECV_BUFFER, anc)
            except (BlockingIOError, InterruptedError):
                break
            except OSError as exc:
                self._error(exc)
                break
            self.stats["recvmsg"] += 1
            if flags & socket.MSG_TRUNC:
                continue
            if data and not data[0]:
                # Not QUIC (the fixed bit is clear): a path probe (pmtu.py). Only a
                # buffer's first packet is looked at; a probe coalesced behind QUIC packets
                # of the same flow reaches the library, which drops it as malformed.
                self._probe_received(data, addr)
                continue
            segment = 0
            for level, kind, payload in ancdata:
                if level == SOL_UDP and kind == UDP_GRO and len(payload) >= _GRO_SIZE.size:
                    segment = _GRO_SIZE.unpack_from(payload)[0]
            if 0 < segment < len(data):
                for k in range(0, len(data), segment):
                    got.append((data[k : k + segment], addr))
            else:
                segment = len(data)
                got.append((data, addr))
            if segment > largest:
                largest = segment
        if got:
            stats = self.stats
            stats["packets_received"] += len(got)
            if largest > stats["largest_received"]:
                stats["largest_received"] = largest
            self._deliver(got)

    # -- path probes (pmtu.py, step 3) ---------------------------------------------------

    def probe_path(self, addr: Address, start: int, limit: int) -> Any:
        """Find the packet size of the path to ``addr`` (a coroutine: ``pmtu.search``)."""
        return pmtu.search(self, addr, start, limit)

    def send_probe(self, data: bytes, addr: Address) -> bool:
        """Send one probe datagram; False if it could not leave (EMSGSIZE: larger than the
        first hop carries; or a full socket buffer): that probe is lost."""
        try:
            self._sock.sendto(data, addr)
        except OSError as exc:
            if exc.errno in UNREACHABLE:
                self._error(exc)  # the send took the socket's pending ICMP report
            elif exc.errno not in (errno.EMSGSIZE, errno.EAGAIN, errno.EWOULDBLOCK):
                log.debug("path probe to %s not sent: %s", addr, exc)
            return False
        return True

    def _probe_received(self, data: bytes, addr: Address) -> None:
        probe = pmtu.decode_probe(data)
        if probe is None:
            return
        kind, nonce, size = probe
        if kind == pmtu.PROBE_ASK and size == len(data):
            now = self._loop.time()
            credit = self._probe_credit + (now - self._probe_time) * PROBE_BUDGET
            self._probe_time = now
            self._probe_credit = min(float(PROBE_BUDGET), credit)
            if self._probe_credit >= size:
                self._probe_credit -= size
                self.send_probe(pmtu.encode_probe(pmtu.PROBE_ANSWER, nonce, size), addr)
        elif kind == pmtu.PROBE_ANSWER and size == len(data):
            waiter = self.probe_waiters.get(nonce)
            if waiter is not None:
                waiter(size)
        elif kind == pmtu.PROBE_RESULT and size >= pmtu.BASE_PACKET:
            sizes = self.path_sizes
            sizes.pop(addr, None)
            if len(sizes) >= PATH_SIZES_KEPT:
                del sizes[next(iter(sizes))]
            sizes[addr] = size

    def _deliver(self, got: list[tuple[bytes, Address]]) -> None:
        routes = self._routes
        protocol: Any = self._protocol
        if routes is None:
            _in_runs(protocol, got)
            return
        # A server: short-header packets of known connections go to them in batches.
        cid_end = 1 + self._cid_length
        run: list[tuple[bytes, Address]] = []
        target: Any = None
        for data, addr in got:
            owner = routes.get(data[1:cid_end]) if data and not data[0] & 0x80 else None
            if owner is None:
                if run:
                    _in_runs(target, run)
                    run = []
                protocol.datagram_received(data, addr)
                continue
            if owner is not target and run:
                _in_runs(target, run)
                run = []
            target = owner
            run.append((data, addr))
        if run:
            _in_runs(target, run)


def _in_runs(protocol: Any, got: list[tuple[bytes, Address]]) -> None:
    """Hand ``got`` to ``protocol``: one ``datagrams_received`` per run of one address."""
    many = getattr(protocol, "datagrams_received", None)
    if many is None:
        for data, addr in got:
            protocol.datagram_received(data, addr)
        return
    start = 0
    addr = got[0][1]
    for k in range(1, len(got)):
        if got[k][1] != addr:
            many([d for d, _ in got[start:k]], addr)
            start, addr = k, got[k][1]
    many([d for d, _ in got[start:]], addr)


async def create_endpoint(
    loop: asyncio.AbstractEventLoop,
    protocol_factory: Callable[[], Any],
    *,
    sock: socket.socket,
    gso: bool = True,
    gro: bool = True,
) -> tuple[UdpTransport, Any]:
    """Like ``loop.create_datagram_endpoint(factory, sock=sock)``, with :class:`UdpTransport`
    (asyncio's own transport on Windows, whose proactor loop cannot watch a socket)."""
    if sys.platform == "win32":
        return await loop.create_datagram_endpoint(protocol_factory, sock=sock)  # type: ignore[return-value]
    protocol = protocol_factory()
    transport = UdpTransport(loop, sock, protocol, gso=gso, gro=gro)
    protocol.connection_made(transport)
    return transport, protocol


def udp_socket(
    host: str, port: int, buffer: int, family: int = socket.AF_INET, reuse_port: bool = False
) -> socket.socket:
    """A bound, non-blocking UDP socket with large kernel buffers. With ``reuse_port``
    several processes can bind the same port; the kernel keeps each client on one of them."""
    sock = socket.socket(family, socket.SOCK_DGRAM)
    try:
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        for opt in (socket.SO_RCVBUF, socket.SO_SNDBUF):
            sock.setsockopt(socket.SOL_SOCKET, opt, buffer)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.bind((host, port))
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock
