"""``connect()`` and ``serve()``: Aqueduct over real QUIC."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import socket
import ssl
import tempfile
import time
import weakref
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import TracebackType
from typing import Any

from aqueduct_core.api.channel import Receiver
from aqueduct_core.api.codec import Codec
from aqueduct_core.api.connection import Connection, builtin_codecs
from aqueduct_core.api.setup import HeadersHook, client_engine, server_engine
from aqueduct_core.errors import CloseCode, ConnectionLost
from aqueduct_core.transport.backends import load, set_limits
from aqueduct_core.transport.config import (
    QH3_MAX_PACKET,
    TransportConfig,
    pacing_for,
    packet_size_for,
    resolve_backend,
    zero_rtt_enabled,
)
from aqueduct_core.transport.quic import protocol_class
from aqueduct_core.transport.reset import (
    Responder,
    install_tokens,
    key_from_private_key,
    resetting_server,
)
from aqueduct_core.transport.tls import (
    CLIENT_SESSIONS,
    ClientTLS,
    DevCertificates,
    ServerTickets,
    ServerTLS,
    file_fingerprint,
    make_dev_certificates,
    normalize_fingerprint,
    warn_insecure,
)
from aqueduct_core.transport.udp import UdpTransport, connect_to, create_endpoint, udp_socket
from aqueduct_core.transport.web_config import H3_ALPN
from aqueduct_core.transport.webtransport import webtransport_backend, webtransport_class
from aqueduct_core.transport.wt_cert import ATTR as ALPN_CERTS
from aqueduct_core.transport.wt_cert import WebTransportCertificates, install_aioquic_hook
from aqueduct_core.wire.chanid import ENTRYPOINT

log = logging.getLogger("aqueduct")

Handler = Callable[[Connection, Receiver[Any]], Awaitable[None]]
"""A server's per-connection coroutine: ``handler(connection, entrypoint_receiver)``."""


class ConnectError(ConnectionLost):
    """Connecting failed: the server is unreachable, the handshake timed out, or TLS failed.
    The message names the address and the likely fix."""

    remedy = (
        "check the URL, and that the service runs there (aqueduct status URL); start it with "
        "aqueduct serve"
    )


class Refused(ConnectError):
    """Nothing listens at the address, as the host itself said at once: ICMP "port
    unreachable" for QUIC (or "host unreachable"), a reset (``ECONNREFUSED``) for TCP.
    ``reason`` is that answer in a few words."""

    remedy = "start the service (aqueduct serve), or correct the port in the URL"

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


def unreachable_reason(exc: OSError, transport: str) -> str:
    """A refusal in a few words: ``ICMP port unreachable``, ``connection refused``..."""
    if exc.errno == errno.ECONNREFUSED:
        return "connection refused" if transport == "tcp" else "ICMP port unreachable"
    return (exc.strerror or str(exc)).lower()


def _quic_config(backend: Any, config: TransportConfig, client: bool, host: str) -> Any:
    qc = backend.QuicConfiguration(is_client=client)
    qc.alpn_protocols = [config.alpn]
    qc.max_datagram_size = packet_size_for(config, backend.name, host)
    qc.max_data = config.max_data
    qc.max_stream_data = config.max_stream_data
    qc.idle_timeout = config.idle_timeout
    qc.initial_rtt = config.initial_rtt
    qc.max_datagram_frame_size = config.max_datagram_frame_size
    qc.supported_versions = [0x00000001]
    set_limits(
        qc,
        max_streams_uni=config.max_streams_uni,
        client_udp_payload=min(qc.max_datagram_size, QH3_MAX_PACKET),
    )
    return qc


async def connect(
    host: str,
    port: int,
    *,
    headers: Any = (),
    tls: ClientTLS | None = None,
    config: TransportConfig | None = None,
    codecs: dict[str, Codec] | None = None,
    early_data: bool = False,
    webtransport: bool = False,
) -> Connection:
    """Connect to an Aqueduct server; returns once the handshake (QUIC, then Aqueduct's
    connection headers) completed. ``headers`` are sent as our connection headers.
    ``webtransport``: as a browser does, in a WebTransport session (profile §8; pin the
    server's WebTransport certificate, ``server.webtransport_fingerprints``).

    With ``early_data=True`` and a session ticket from an earlier connection to the same
    server in this process, it returns at once: what is sent next rides 0-RTT, a round trip
    sooner, but an attacker can replay it, so send only requests that are safe to repeat
    (a server holds the others until the handshake completes). Messages sent before the
    server's headers arrive use the ``cbor`` codec."""
    config = config or TransportConfig()
    tls = tls or ClientTLS()
    backend = load(resolve_backend(config.backend))
    qc = _quic_config(backend, config, True, host)
    if webtransport:
        qc.alpn_protocols = [H3_ALPN]
    qc.server_name = tls.server_name or host
    pin = None
    if tls.fingerprint is not None:
        pin = normalize_fingerprint(tls.fingerprint)
        qc.verify_mode = ssl.CERT_NONE
        if backend.name == "qh3":
            qc.assert_fingerprint = pin
    elif tls.insecure:
        warn_insecure(host)
        qc.verify_mode = ssl.CERT_NONE
    elif tls.cafile is not None or tls.cadata is not None:
        cadata = tls.cadata.encode() if tls.cadata is not None else None
        qc.load_verify_locations(cafile=tls.cafile, cadata=cadata)
    codecs = codecs or builtin_codecs()
    loop = asyncio.get_running_loop()
    target = f"quic://{host}:{port}"
    try:
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_DGRAM)
    except OSError as exc:
        raise ConnectError(f"cannot resolve {target}: {exc}") from exc
    family, _, _, _, addr = infos[0]
    bind = "::" if family == socket.AF_INET6 else "0.0.0.0"
    sock = udp_socket(bind, 0, config.socket_buffer, family)
    told = connect_to(sock, addr)  # ICMP errors reach a connected socket only
    quic, resuming = _client_quic(
        backend, config.with_(zero_rtt=not webtransport and config.zero_rtt), qc, (host, port, tls)
    )
    engine_cfg = config.engine
    options: dict[str, Any] = {}
    if webtransport:
        proto_cls = webtransport_class(backend)
        options = {"web": config.web, "authority": f"{host}:{port}"}
    else:
        proto_cls = protocol_class(backend)

    def make() -> Connection:
        return Connection(client_engine(engine_cfg, headers, codecs), codecs)

    try:
        transport, protocol = await create_endpoint(
            loop,
            lambda: proto_cls(
                quic,
                config=config,
                make_connection=make,
                pin=pin,
                pacing=pacing_for(config, host),
                **options,
            ),
            sock=sock,
            gso=config.udp_offload,
            gro=config.udp_offload,
        )
    except BaseException:
        sock.close()
        raise
    refused: list[OSError] = []
    if told and isinstance(transport, UdpTransport):

        def unreachable(exc: OSError) -> None:
            # Only before the handshake, where nothing else can tell a closed port from a
            # slow server; afterwards QUIC's own timers judge (an ICMP error can be forged),
            # and the connection only keeps it as a hint (Connection.unreachable_at).
            conn = protocol.conn
            if conn is not None and conn.handshake_confirmed:
                conn.unreachable_at = time.monotonic()
            elif not refused:
                refused.append(exc)
                transport.close()

        transport.on_unreachable = unreachable
    try:
        await protocol.find_packet_size(addr)
    except BaseException:
        protocol._transport.close()
        raise
    if resuming:
        protocol.connect_early(addr)
        if early_data and protocol.zero_rtt:
            return protocol.conn  # type: ignore[no-any-return]
    else:
        protocol.connect(addr)
    try:
        await asyncio.wait_for(_ready(protocol), config.handshake_timeout)
    except asyncio.CancelledError:
        # The race in dial.py cancels the losing attempt: tell the server at once, so its
        # half-open connection ends now rather than at its idle timeout.
        with contextlib.suppress(Exception):
            protocol._quic.close(error_code=0, reason_phrase="connection attempt abandoned")
            protocol.transmit()
        protocol._transport.close()
        raise
    except (TimeoutError, ConnectionLost, ConnectionError) as exc:
        protocol._transport.close()
        if protocol.pin_error is not None:
            raise ConnectError(f"{target}: {protocol.pin_error}") from None
        if getattr(protocol, "refused", None):
            raise ConnectError(f"{target}: {protocol.refused}") from None
        if refused:
            reason = unreachable_reason(refused[0], "quic")
            raise Refused(
                f"nothing listens at {target}: {reason}. Is the service running (aqueduct "
                "serve), is the port right, and does it serve QUIC?",
                reason,
            ) from None
        if isinstance(exc, asyncio.TimeoutError):
            raise ConnectError(
                f"no Aqueduct server answered at {target} within {config.handshake_timeout} s: "
                "is the service running, is the port right, and does UDP reach it?"
            ) from None
        raise ConnectError(
            f"could not connect to {target}: {exc}. If this is a certificate problem, give the "
            "server's CA file (cafile=...) or pin its fingerprint (fingerprint=...)."
        ) from exc
    return protocol.conn  # type: ignore[no-any-return]


async def _ready(protocol: Any) -> None:
    """The Aqueduct handshake completed (over WebTransport: once the session is open)."""
    if protocol.conn is None:
        await protocol.ready
    await protocol.conn.wait_ready()


def _client_quic(backend: Any, config: TransportConfig, qc: Any, server: Any) -> tuple[Any, bool]:
    """The client's QuicConnection, resuming the server's session (0-RTT, profile §2.11)
    with the ticket and token kept from an earlier connection in this process; tickets and
    tokens this connection receives are kept for the next one (``tls.ClientSessions``).
    Returns it and whether a ticket was presented."""
    if not zero_rtt_enabled(config):
        return backend.QuicConnection(configuration=qc), False
    key = (backend.name, config.alpn, qc.server_name, *server)
    ticket = CLIENT_SESSIONS.take_ticket(key)
    if ticket is not None:
        qc.session_ticket = ticket
    handlers: dict[str, Any] = {
        "session_ticket_handler": lambda t: CLIENT_SESSIONS.ticket_received(key, t)
    }
    if backend.name == "aioquic":
        # qh3 2.1 neither presents a configured token nor reports NEW_TOKEN frames.
        qc.token = CLIENT_SESSIONS.token(key)
        handlers["token_handler"] = lambda t: CLIENT_SESSIONS.token_received(key, t)
    return backend.QuicConnection(configuration=qc, **handlers), ticket is not None


class Server:
    """A running Aqueduct server. ``port`` is the bound port (useful with port 0);
    ``fingerprint`` the SHA-256 of its certificate, for clients to pin."""

    def __init__(self) -> None:
        self.host = ""
        self.port = 0
        self.fingerprint = ""
        self.dev_certificates: DevCertificates | None = None
        self.connections: weakref.WeakSet[Connection] = weakref.WeakSet()
        self._quic_server: Any = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self._closed = asyncio.Event()
        self.tickets = ServerTickets()
        """Session tickets issued for 0-RTT, each accepted once (``tls.ServerTickets``)."""
        self.webtransport: WebTransportCertificates | None = None
        """With WebTransport on: the certificates browsers pin (``wt_cert.py``)."""

    @property
    def webtransport_fingerprints(self) -> list[str]:
        """SHA-256 (hex) of the WebTransport certificate presented now and of the next one:
        what a page passes as ``serverCertificateHashes``. Empty without WebTransport."""
        return self.webtransport.fingerprints() if self.webtransport else []

    @property
    def ca_file(self) -> str | None:
        """The development CA file, when the server made its own certificate."""
        return str(self.dev_certificates.ca_file) if self.dev_certificates else None

    def client_tls(self) -> ClientTLS:
        """TLS settings a client of this server can use (pins its fingerprint)."""
        return ClientTLS(fingerprint=self.fingerprint)

    async def close(self) -> None:
        """Close every connection (code 0) and stop listening."""
        for conn in list(self.connections):
            if not conn.is_closed:
                await conn.close(CloseCode.NO_ERROR, "server shutting down")
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._quic_server is not None:
            self._quic_server.close()
            self._quic_server = None
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None
        self._closed.set()

    async def wait_closed(self) -> None:
        await self._closed.wait()

    async def __aenter__(self) -> Server:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()


async def serve(
    handler: Handler,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    tls: ServerTLS | None = None,
    headers: HeadersHook | None = None,
    config: TransportConfig | None = None,
    codecs: dict[str, Codec] | None = None,
    reuse_port: bool = False,
) -> Server:
    """Serve Aqueduct on ``host:port`` (loopback by default; port 0 picks a free one).

    ``handler(connection, entrypoint_receiver)`` runs once per client, after the handshake;
    the connection is closed when it returns (code 0) or raises (code 5, logged).
    ``headers(client_headers)`` returns the server's connection headers. ``reuse_port`` lets
    several worker processes serve one port (SO_REUSEPORT). Without ``tls`` the
    server makes a development CA and certificate in a temporary directory; clients pin
    ``server.fingerprint`` or trust ``server.ca_file``.
    """
    config = config or TransportConfig()
    web = config.web.webtransport
    backend = load(webtransport_backend(config) if web else resolve_backend(config.backend))
    server = Server()
    if tls is None:
        server._tmp = tempfile.TemporaryDirectory(prefix="aqueduct-dev-cert-")
        server.dev_certificates = make_dev_certificates(Path(server._tmp.name))
        tls = server.dev_certificates.server_tls
    qc = _quic_config(backend, config, False, host)
    qc.load_cert_chain(tls.certfile, tls.keyfile)
    server.fingerprint = file_fingerprint(tls.certfile)
    alpn_certs: dict[str, Any] = {}
    if web:
        install_aioquic_hook()
        server.webtransport = WebTransportCertificates(tls.keyfile)
        qc.alpn_protocols = [config.alpn, H3_ALPN]
        alpn_certs = {H3_ALPN: server.webtransport.current}
    codecs = codecs or builtin_codecs()
    proto_cls = protocol_class(backend)
    loop = asyncio.get_running_loop()

    def start(conn: Connection) -> None:
        rx = Receiver[Any](None)
        rx._bind(conn, ENTRYPOINT)
        task = loop.create_task(_run_handler(handler, conn, rx))
        server._tasks.add(task)
        task.add_done_callback(server._tasks.discard)

    def make() -> Connection:
        conn = Connection(server_engine(config.engine, headers, codecs), codecs)
        conn.on_ready = start
        server.connections.add(conn)
        return conn

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = udp_socket(host, port, config.socket_buffer, family, reuse_port)

    tickets: dict[str, Any] = {}
    if zero_rtt_enabled(config):
        tickets = {
            "session_ticket_fetcher": server.tickets.pop,
            "session_ticket_handler": server.tickets.add,
        }

    reset_key = key_from_private_key(tls.keyfile)

    options: dict[str, Any] = {}
    if web:
        proto_cls = webtransport_class(backend)
        options = {"web": config.web}

    def create_protocol(quic: Any, stream_handler: Any = None) -> Any:
        install_tokens(quic, reset_key, backend.name)
        if alpn_certs:
            setattr(quic, ALPN_CERTS, alpn_certs)
        return proto_cls(
            quic,
            stream_handler,
            config=config,
            make_connection=make,
            pacing=pacing_for(config, host),
            **options,
        )

    server_cls = resetting_server(backend.QuicServer)

    def quic_server(qc: Any, create_protocol: Any, tickets: dict[str, Any]) -> Any:
        quic_server = server_cls(configuration=qc, create_protocol=create_protocol, **tickets)
        quic_server.responder = Responder(reset_key, qc.connection_id_length)
        return quic_server

    try:
        _, server._quic_server = await create_endpoint(
            loop,
            lambda: quic_server(qc, create_protocol, tickets),
            sock=sock,
            gso=config.udp_offload,
            gro=config.udp_offload,
        )
    except BaseException:
        sock.close()
        raise
    server.host, server.port = sock.getsockname()[:2]
    return server


async def _run_handler(handler: Handler, conn: Connection, rx: Receiver[Any]) -> None:
    code, reason = CloseCode.NO_ERROR, ""
    try:
        await handler(conn, rx)
    except ConnectionLost:
        return
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        log.exception("connection handler failed")
        code, reason = CloseCode.INTERNAL, f"server error: {type(exc).__name__}"
    finally:
        rx.close()
    if not conn.is_closed:
        with contextlib.suppress(ConnectionLost):
            await conn.close(code, reason)
