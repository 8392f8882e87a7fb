"""The two QUIC libraries behind one face, and the private hooks we need from them.

Neither library exposes everything Aqueduct needs, so a few hooks reach into their internals:

- the number of unidirectional streams the *peer* may open (both default to ~100-128, far too
  few for channels that each use a control stream) must be raised before the handshake;
- a qh3 client advertises ``max_udp_payload_size = 1472`` whatever its configuration, so a
  qh3 server never sends it larger packets;
- aioquic's pacer has no switch;
- a qh3 server credits its anti-amplification budget with too few bytes when a client pads
  its Initial datagram after the packet, as aioquic does (see :func:`_padded_packet_end`);
- the adapter overrides ``QuicConnectionProtocol._process_events`` (called after every
  datagram and timer) to hand the engine each batch of events at once.

Each hook checks the internals it touches and raises :class:`BackendMismatch` naming the
library version if they moved. ``tests/core/test_quic.py`` and ``tests/core/test_perf_paths.py`` run :func:`check`
so an upgrade fails loudly in CI; the versions are pinned in ``pyproject.toml``.
"""

from __future__ import annotations

import importlib
import logging
import threading
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from aqueduct_core.errors import AqueductError


class BackendMismatch(AqueductError, RuntimeError):
    """A private hook no longer matches the installed QUIC library."""

    remedy = (
        "install the QUIC library version aqueduct-spark pins (pip install aqueduct-spark), "
        "or choose the other backend (backend=aioquic or AQUEDUCT_BACKEND=aioquic)"
    )


@dataclass(frozen=True)
class Backend:
    name: str
    version: str
    QuicConfiguration: Any
    QuicConnection: Any
    QuicConnectionProtocol: Any
    QuicServer: Any
    QuicConnectionError: Any
    events: ModuleType


_loaded: dict[str, Backend] = {}


def load(name: str) -> Backend:
    """Import backend ``name`` ("aioquic" or "qh3")."""
    backend = _loaded.get(name)
    if backend is not None:
        return backend
    if name not in ("aioquic", "qh3"):
        raise ValueError(f"unknown QUIC backend {name!r}")
    try:
        package: Any = importlib.import_module(name)
    except ImportError as exc:
        raise ImportError(
            f"the {name} backend is not installed: pip install 'aqueduct-spark[{name}]', "
            "or choose the other backend"
        ) from exc
    protocol: Any = importlib.import_module(f"{name}.asyncio.protocol")
    server: Any = importlib.import_module(f"{name}.asyncio.server")
    configuration: Any = importlib.import_module(f"{name}.quic.configuration")
    connection: Any = importlib.import_module(f"{name}.quic.connection")
    if name == "qh3":
        _install_qh3_hooks()
        logging.getLogger("quic").addFilter(_quiet_normal_close)
    backend = Backend(
        name,
        package.__version__,
        configuration.QuicConfiguration,
        connection.QuicConnection,
        protocol.QuicConnectionProtocol,
        server.QuicServer,
        connection.QuicConnectionError,
        importlib.import_module(f"{name}.quic.events"),
    )
    _check(backend)
    _loaded[name] = backend
    return backend


def check(name: str) -> None:
    """Verify every private hook against the installed library (raises BackendMismatch).
    :func:`load` runs it once per process, so an incompatible version fails at the first
    connection with a message naming the moved part, not later mid-transfer."""
    _check(load(name))


def _mismatch(backend: Backend, what: str) -> BackendMismatch:
    return BackendMismatch(
        f"{backend.name} {backend.version} is not a version Aqueduct supports: {what}. "
        "Install the version pinned in aqueduct-spark's requirements (pip install "
        f"'aqueduct-spark[{backend.name}]'), or choose the other backend."
    )


def _check_transport_hooks(backend: Backend) -> None:
    """The internals udp.py (server routing, batched receive), pmtu.py (packet size of a
    live connection) and quic.py (backlog, stream limit, RTT) read or write."""
    name = backend.name
    server_init = getattr(backend.QuicServer.__init__, "__code__", None)
    routes = getattr(backend.QuicServer.datagram_received, "__code__", None)
    if server_init is None or routes is None or "_protocols" not in server_init.co_names:
        raise _mismatch(backend, "QuicServer no longer keeps its connections in _protocols")
    if "_protocols" not in routes.co_names:
        raise _mismatch(backend, "QuicServer.datagram_received no longer routes by _protocols")
    if not hasattr(backend.QuicConfiguration(is_client=False), "connection_id_length"):
        raise _mismatch(backend, "QuicConfiguration.connection_id_length moved")
    quic = backend.QuicConnection(configuration=backend.QuicConfiguration(is_client=True))
    if name == "aioquic":
        loss = getattr(quic, "_loss", None)
        for owner, attr in (
            (quic, "_max_datagram_size"),
            (quic, "_streams"),
            (quic, "_remote_max_streams_uni"),
            (loss, "_pto_count"),
            (loss, "_rtt_smoothed"),
            (getattr(loss, "_pacer", None), "_max_datagram_size"),
            (getattr(loss, "_pacer", None), "bucket_max"),
            (getattr(loss, "_cc", None), "_max_datagram_size"),
        ):
            if owner is None or not hasattr(owner, attr):
                raise _mismatch(backend, f"the packet-size/recovery attribute {attr} moved")
        return
    if getattr(quic, "_core", 0) is not None:
        raise _mismatch(backend, "QuicConnection._core is no longer made at connect()")
    for attr in ("get_send_buffer_size", "receive_many_datagrams", "_tls"):
        if not hasattr(quic, attr):
            raise _mismatch(backend, f"QuicConnection.{attr} moved")
    if not callable(getattr(backend.QuicConnectionProtocol, "datagrams_received", None)):
        raise _mismatch(backend, "QuicConnectionProtocol.datagrams_received moved")
    core = importlib.import_module("qh3._hazmat").QuicConnectionCore
    for attr in ("stream_limits", "smoothed_rtt", "poll_transmit"):
        if not hasattr(core, attr):
            raise _mismatch(backend, f"QuicConnectionCore.{attr} moved")
    qc: Any = importlib.import_module("qh3.quic.connection")
    code = getattr(getattr(qc.QuicConnection._create_core, "__wrapped__", None), "__code__", None)
    if code is None or "max_datagram_size" not in code.co_names:
        raise _mismatch(backend, "the core no longer takes max_datagram_size at connect()")


def _check(backend: Backend) -> None:
    name = backend.name
    _check_transport_hooks(backend)
    # The adapter drains the engine once per batch of events by overriding this method,
    # which the library calls after each datagram and timer, before transmitting.
    if not callable(getattr(backend.QuicConnectionProtocol, "_process_events", None)):
        raise _mismatch(backend, "QuicConnectionProtocol._process_events moved")
    if name == "aioquic":
        cfg = backend.QuicConfiguration(is_client=True)
        quic = backend.QuicConnection(configuration=cfg)
        for attr in ("_local_max_streams_uni", "_local_max_streams_bidi"):
            limit = getattr(quic, attr, None)
            if limit is None or not hasattr(limit, "value") or not hasattr(limit, "sent"):
                raise _mismatch(backend, f"QuicConnection.{attr} moved")
        pacer = getattr(getattr(quic, "_loss", None), "_pacer", None)
        if pacer is None or not hasattr(pacer, "packet_time"):
            raise _mismatch(backend, "the pacer moved")
        if not hasattr(quic, "_remote_max_datagram_frame_size"):
            raise _mismatch(backend, "datagram limit moved")
        # 0-RTT: the adapter asks whether the 0-RTT send keys are in place (quic.py).
        quic.connect(("127.0.0.1", 9), now=0.0)
        early = getattr(quic, "_cryptos", {}).get(
            importlib.import_module("aioquic.tls").Epoch.ZERO_RTT
        )
        if early is None or not callable(getattr(getattr(early, "send", None), "is_valid", None)):
            raise _mismatch(backend, "the 0-RTT keys moved")
    else:
        qc: Any = importlib.import_module("qh3.quic.connection")
        tb: Any = importlib.import_module("qh3.quic.tls_bridge")
        if not getattr(qc, "_aqueduct_hooked", False):
            raise _mismatch(backend, "its private hooks are not installed")
        if not hasattr(tb, "push_quic_transport_parameters"):
            raise _mismatch(backend, "transport parameters moved")
        if getattr(qc, "_pull_quic_header", None) is not _padded_header_hook:
            raise _mismatch(backend, "QuicConnection's header parser moved")
        quic = backend.QuicConnection(configuration=backend.QuicConfiguration(is_client=True))
        for attr in (
            "_core",
            "_call_core",
            "_quic_logger",
            "_log_datagram",
            "_log_packets",
            "_early_data_attempted",  # 0-RTT keys in place (quic.py)
        ):
            if not hasattr(quic, attr):
                raise _mismatch(backend, f"QuicConnection.{attr} moved")


# -- stream limits and client packet size ------------------------------------------------


def set_limits(configuration: Any, *, max_streams_uni: int, client_udp_payload: int) -> None:
    """Record our limits on a QuicConfiguration; the hooks read them."""
    configuration._aqueduct_limits = (max_streams_uni, client_udp_payload)


def apply_aioquic(quic: Any, pacing: bool) -> None:
    """Call on an aioquic QuicConnection before its handshake starts."""
    limits = getattr(quic._configuration, "_aqueduct_limits", None)
    if limits is not None:
        for limit, value in ((quic._local_max_streams_uni, limits[0]),):
            limit.value = limit.sent = value  # "sent" in the transport parameters
    pacer = quic._loss._pacer
    if not pacing:
        pacer.update_rate = lambda congestion_window, smoothed_rtt: None
        pacer.packet_time = None
        return
    library_update = pacer.update_rate

    def update_rate(congestion_window: int, smoothed_rtt: float) -> None:
        # aioquic allows bursts of 16 packets; a burst the size of one GSO send (udp.py)
        # costs one timer and one transmit instead of four, at the same average rate.
        library_update(congestion_window, smoothed_rtt)
        rate = congestion_window / max(smoothed_rtt, 1e-6)
        size = pacer._max_datagram_size
        burst = max(2 * size, min(congestion_window // 4, PACING_BURST * size)) / rate
        if burst > pacer.bucket_max:
            pacer.bucket_max = burst

    pacer.update_rate = update_rate


PACING_BURST = 64
"""Packets aioquic's pacer may send back to back (at most a quarter of the congestion
window): one GSO send (``udp.GSO_MAX_SEGMENTS``)."""


_current = threading.local()


def _quiet_normal_close(record: logging.LogRecord) -> bool:
    """qh3 logs a WARNING for every ordinary close by the peer; it is not a problem."""
    return not str(record.msg).startswith("Native peer close")


def _install_qh3_hooks() -> None:
    qc: Any = importlib.import_module("qh3.quic.connection")
    tb: Any = importlib.import_module("qh3.quic.tls_bridge")

    if getattr(qc, "_aqueduct_hooked", False):
        return
    original_push = tb.push_quic_transport_parameters
    original_serialize = tb.QuicTlsBridge.serialize_transport_parameters
    original_core = qc.QuicConnectionCore
    original_create_core = qc.QuicConnection._create_core

    def push(buf: Any, parameters: Any) -> Any:
        limits = getattr(_current, "tp", None)
        if limits is not None:
            parameters.initial_max_streams_uni = limits[0]
            if parameters.max_udp_payload_size == 1472:  # the client's hard-coded value
                parameters.max_udp_payload_size = limits[1]
        return original_push(buf, parameters)

    def serialize(self: Any) -> Any:
        _current.tp = getattr(self.configuration, "_aqueduct_limits", None)
        try:
            return original_serialize(self)
        finally:
            _current.tp = None

    def core(*args: Any) -> Any:
        limits = getattr(_current, "core", None)
        if limits is not None:
            if args[21:23] != (100, 103):
                raise BackendMismatch(
                    "this qh3 version is not one Aqueduct supports: its stream-limit "
                    "arguments moved"
                )
            args = (*args[:22], limits[0], *args[23:])
        return original_core(*args)

    def create_core(self: Any, *args: Any, **kwargs: Any) -> Any:
        _current.core = getattr(self._configuration, "_aqueduct_limits", None)
        try:
            return original_create_core(self, *args, **kwargs)
        finally:
            _current.core = None

    create_core.__wrapped__ = original_create_core  # type: ignore[attr-defined]
    tb.push_quic_transport_parameters = push
    tb.QuicTlsBridge.serialize_transport_parameters = serialize
    qc.QuicConnectionCore = core
    qc.QuicConnection._create_core = create_core
    global _original_pull_header, _qh3_error
    _original_pull_header = qc._pull_quic_header
    _qh3_error = qc.QuicConnectionError
    qc._pull_quic_header = _padded_header_hook
    qc.QuicConnection.datagrams_to_send = _datagrams_to_send
    qc._aqueduct_hooked = True


# -- qh3: credit a padded Initial datagram in full -----------------------------------------

_original_pull_header: Any = None
_qh3_error: Any = None


def _padded_header_hook(data: Any, offset: int, cid_length: int) -> Any:
    header = _original_pull_header(data, offset, cid_length)
    end = header[9]
    if end < len(data) and _padded_packet_end(data, end):
        return (*header[:9], len(data))
    return header


def _datagrams_to_send(self: Any, now: float) -> list[tuple[bytes, Any]]:
    """qh3's ``QuicConnection.datagrams_to_send``, but keeping what was built.

    Upstream defect (qh3 2.1.0): the native packet builder reports a packet that the
    anti-amplification budget (or any other limit) cannot fit as an error of the whole
    ``poll_transmit`` ("packet builder capacity exhausted"), and the library's loop then
    raises, losing the datagrams it had already built in the same call; they were counted
    as sent, so they are only resent at the server's probe timeout. A server whose first
    flight is larger than three times the client's Initial (a long certificate chain) then
    stalls for hundreds of milliseconds. The builder is transactional (a failed build
    consumes nothing), so stopping at the first failure and sending what was built is what
    RFC 9000 §8.1 asks: send up to the limit, then wait for the peer.
    """
    core = self._core
    if core is None:
        return []
    datagrams: list[tuple[bytes, Any]] = []
    while True:
        try:
            transmit = self._call_core(core.poll_transmit, now)
        except _qh3_error:
            if not datagrams:
                raise
            break
        if transmit is None:
            break
        if self._quic_logger is not None:
            self._log_datagram("datagrams_sent", transmit[0])
            self._log_packets("packet_sent", transmit[0])
        datagrams.append((transmit[0], transmit[1]))
    return datagrams


def _padded_packet_end(data: Any, end: int) -> bool:
    """Whether the bytes of ``data`` after ``end`` are padding, not another QUIC packet.

    Upstream defect (qh3 2.1.0): ``qh3.quic.connection.QuicConnection.receive_datagram``
    hands the native core one packet at a time (``data[offset:packet_end]``), and the core
    credits the server's anti-amplification budget with the length of that slice only
    (``path.receive(bytes.len())`` in ``src/quic/connection.rs``), although RFC 9000 §8.1
    says a server counts every byte of the datagram. aioquic 1.7.2 pads a datagram carrying
    an Initial packet with zero bytes *after* the packet (``QuicPacketBuilder.
    _flush_current_datagram``), which RFC 9000 §14.1 allows. So a qh3 server credits an
    aioquic ClientHello of a 1200-byte (or 16384-byte) datagram as ~520 bytes, may send
    ~1.5 KB, and its first flight (~2.6 KB with our certificates) no longer fits. qh3's
    packet builder then fails the whole ``poll_transmit`` ("packet builder capacity
    exhausted") and ``datagrams_to_send`` drops even the datagram it had already built, so
    nothing is sent until the client's probe timeout; each probe earns ~150 bytes more, and
    the handshake takes 200 ms to several seconds.

    The workaround keeps the padding in the slice of the packet before it, so the core counts
    the whole datagram. Bytes whose first byte has the fixed bit (0x40) clear cannot start a
    QUIC packet (RFC 9000 §17; neither library negotiates RFC 9287's greasing), and the core
    discards them after the packet exactly as it would have on their own.
    """
    return not data[end] & 0x40
