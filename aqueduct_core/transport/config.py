"""Transport configuration: every QUIC setting, with defaults measured on this project's
machines (``shared/design/transport-tuning.md``).

Nothing is left to a library default: aioquic and qh3 disagree on most of them (packet size,
windows, idle timeout, versions, datagram advertisement).
"""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass, field, replace
from typing import Literal

from aqueduct_core.engine.config import EngineConfig
from aqueduct_core.transport.mux import TcpSettings
from aqueduct_core.transport.web_config import WebSettings

Backend = Literal["auto", "aioquic", "qh3"]
Transport = Literal["auto", "quic", "tcp", "webtransport", "websocket"]

AIOQUIC_MAX_PACKET = 16384
"""aioquic writes every STREAM frame length in 2 bytes: packets above 16414 corrupt data."""
QH3_MAX_PACKET = 65507
"""The largest UDP payload over IPv4."""
ETHERNET_PACKET = 1472
"""1500-byte MTU minus IPv4 and UDP headers: the size off loopback until the path is known
(``pmtu.py`` then sizes each connection from its route and probes)."""


@dataclass(frozen=True)
class TransportConfig:
    """How an Aqueduct connection uses QUIC. All sizes in bytes, times in seconds."""

    backend: Backend = "auto"
    """``auto`` uses qh3 when it is installed (2-3x less CPU per byte), else aioquic."""
    packet_size: int | None = None
    """QUIC packet (UDP payload) size. None: the largest the backend can do on loopback
    (aioquic 16384, qh3 65507); to any other address, the largest the path carries, found
    per connection: from the MTU of the route to the peer minus the IP and UDP headers (1472
    on Ethernet, 8972 on jumbo frames), then probed larger and smaller before the handshake
    (RFC 8899, ``pmtu.py``). Set it only to override that (where probes cannot pass); paths
    that cannot carry it lose every large packet."""
    socket_buffer: int = 4 * 1024 * 1024
    """SO_RCVBUF and SO_SNDBUF. Without large buffers, large packets are lost in bursts.
    The kernel caps them at net.core.rmem_max / wmem_max."""
    idle_timeout: float = 30.0
    """A peer silent for this long is gone: every handle then raises ConnectionLost."""
    initial_rtt: float = 0.1
    """RTT assumed before the first measurement (aioquic's default; qh3 assumes 0.333 s,
    which makes a lossy handshake back off for seconds)."""
    max_data: int = 64 * 1024 * 1024
    """QUIC connection receive window. The engine drains QUIC at once, so this only bounds
    bytes in flight, not application memory."""
    max_stream_data: int = 16 * 1024 * 1024
    max_streams_uni: int = 10_000
    """Unidirectional streams the peer may have open at once (two per live channel, plus one
    per in-flight UNORDERED message). Raised before the handshake."""
    max_datagram_frame_size: int = 65536
    """DATAGRAM frames must be enabled: Aqueduct refuses a peer without them."""
    alpn: str = "aqueduct"
    transport: Transport = "auto"
    """``quic``, ``tcp`` (TLS over TCP, where UDP is blocked), or ``auto``: QUIC first, TCP
    after ``tcp.race_delay`` if QUIC has not answered (``AQUEDUCT_TRANSPORT`` overrides it)."""
    tcp: TcpSettings = field(default_factory=TcpSettings)
    """Aqueduct over TCP: multiplexer limits and socket knobs."""
    web: WebSettings = field(default_factory=WebSettings)
    """Aqueduct for browsers: WebTransport on the UDP port, WebSocket on the TCP port
    (``serve`` accepts them only when enabled here; profile §8, §9)."""
    stream_high_water: int = 1024 * 1024
    """Bytes of one stream handed to the QUIC library at a time; the rest waits, without a
    copy, in the adapter (aioquic re-copies its whole unacked buffer on every ACK)."""
    send_budget: int = 8 * 1024 * 1024
    """Senders pause while this many bytes wait to be sent on the whole connection."""
    pacing: bool | None = None
    """aioquic only: False turns its pacer off (much faster on loopback, risky on real
    paths). None: off for loopback addresses, on otherwise. qh3 always paces."""
    udp_offload: bool = True
    """Send runs of packets with one system call (UDP_SEGMENT) and receive them likewise
    (UDP_GRO) where the kernel allows; False sends and reads one packet per call."""
    zero_rtt: bool | None = None
    """0-RTT (profile §2.11). A client resumes a server it connected to before in this
    process and sends its connection headers in 0-RTT, so it is ready one round trip
    sooner; a server issues single-use session tickets and accepts 0-RTT. None: on, unless
    the environment sets ``AQUEDUCT_ZERORTT=0``. False: every connection is a full
    handshake."""
    engine: EngineConfig = field(default_factory=EngineConfig)

    @property
    def handshake_timeout(self) -> float:
        """Seconds a connection may take to be ready at either end: the QUIC or TLS/TCP
        handshake, then the Aqueduct connection headers. It lives in one place,
        ``engine.handshake_timeout`` (``EngineConfig(handshake_timeout=...)``)."""
        return self.engine.handshake_timeout

    def with_(self, **changes: object) -> TransportConfig:
        return replace(self, **changes)  # type: ignore[arg-type]


def resolve_backend(name: Backend) -> Literal["aioquic", "qh3"]:
    """The backend to use; ``AQUEDUCT_BACKEND`` overrides ``auto``."""
    if name == "auto":
        env = os.environ.get("AQUEDUCT_BACKEND", "").strip().lower()
        if env in ("aioquic", "qh3"):
            name = env  # type: ignore[assignment]
    if name == "auto":
        try:
            import qh3  # noqa: F401
        except ImportError:
            return "aioquic"
        return "qh3"
    if name not in ("aioquic", "qh3"):
        raise ValueError(f"unknown QUIC backend {name!r}: use 'auto', 'aioquic' or 'qh3'")
    return name


def zero_rtt_enabled(config: TransportConfig) -> bool:
    if config.zero_rtt is not None:
        return config.zero_rtt
    setting = os.environ.get("AQUEDUCT_ZERORTT", "1").strip().lower()
    return setting not in ("0", "false", "no", "off")


def is_loopback(host: str) -> bool:
    if host in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def pacing_for(config: TransportConfig, host: str) -> bool:
    return (not is_loopback(host)) if config.pacing is None else config.pacing


def packet_size_for(config: TransportConfig, backend: str, host: str) -> int:
    limit = AIOQUIC_MAX_PACKET if backend == "aioquic" else QH3_MAX_PACKET
    if config.packet_size is None:
        return limit if is_loopback(host) else ETHERNET_PACKET
    if not 1200 <= config.packet_size <= QH3_MAX_PACKET:
        raise ValueError(f"packet_size must be between 1200 and {QH3_MAX_PACKET}")
    return min(config.packet_size, limit)
