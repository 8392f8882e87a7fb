"""The two QUIC libraries behind one face, and the private hooks we need from them.

Neither library exposes everything Aqueduct needs, so a few hooks reach into their internals:

- the number of unidirectional streams the *peer* may open (both default to ~100-128, far too
  few for channels that each use a control stream) must be raised before the handshake;
- a qh3 client advertises ``max_udp_payload_size = 1472`` whatever its configuration, so a
  qh3 server never sends it larger packets;
- aioquic's pacer has no switch;
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


class BackendMismatch(RuntimeError):
    """A private hook no longer matches the installed QUIC library."""


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
    backend = _loaded[name] = Backend(
        name,
        package.__version__,
        configuration.QuicConfiguration,
        connection.QuicConnection,
        protocol.QuicConnectionProtocol,
        server.QuicServer,
        connection.QuicConnectionError,
        importlib.import_module(f"{name}.quic.events"),
    )
    return backend


def check(name: str) -> None:
    """Verify every private hook against the installed library (raises BackendMismatch)."""
    backend = load(name)
    # The adapter drains the engine once per batch of events by overriding this method,
    # which the library calls after each datagram and timer, before transmitting.
    if not callable(getattr(backend.QuicConnectionProtocol, "_process_events", None)):
        raise BackendMismatch(
            f"{name} {backend.version}: QuicConnectionProtocol._process_events moved"
        )
    if name == "aioquic":
        cfg = backend.QuicConfiguration(is_client=True)
        quic = backend.QuicConnection(configuration=cfg)
        for attr in ("_local_max_streams_uni", "_local_max_streams_bidi"):
            limit = getattr(quic, attr, None)
            if limit is None or not hasattr(limit, "value") or not hasattr(limit, "sent"):
                raise BackendMismatch(f"aioquic {backend.version}: QuicConnection.{attr} moved")
        pacer = getattr(getattr(quic, "_loss", None), "_pacer", None)
        if pacer is None or not hasattr(pacer, "packet_time"):
            raise BackendMismatch(f"aioquic {backend.version}: the pacer moved")
        if not hasattr(quic, "_remote_max_datagram_frame_size"):
            raise BackendMismatch(f"aioquic {backend.version}: datagram limit moved")
    else:
        qc: Any = importlib.import_module("qh3.quic.connection")
        tb: Any = importlib.import_module("qh3.quic.tls_bridge")
        if not getattr(qc, "_aqueduct_hooked", False):
            raise BackendMismatch("qh3 hooks are not installed")
        if not hasattr(tb, "push_quic_transport_parameters"):
            raise BackendMismatch(f"qh3 {backend.version}: transport parameters moved")


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
    if not pacing:
        pacer = quic._loss._pacer
        pacer.update_rate = lambda congestion_window, smoothed_rtt: None
        pacer.packet_time = None


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
                    "qh3 internals moved: QuicConnectionCore stream-limit arguments changed"
                )
            args = (*args[:22], limits[0], *args[23:])
        return original_core(*args)

    def create_core(self: Any, *args: Any, **kwargs: Any) -> Any:
        _current.core = getattr(self._configuration, "_aqueduct_limits", None)
        try:
            return original_create_core(self, *args, **kwargs)
        finally:
            _current.core = None

    tb.push_quic_transport_parameters = push
    tb.QuicTlsBridge.serialize_transport_parameters = serialize
    qc.QuicConnectionCore = core
    qc.QuicConnection._create_core = create_core
    qc._aqueduct_hooked = True
