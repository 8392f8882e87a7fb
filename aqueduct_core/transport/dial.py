"""Choosing the transport: ``connect()`` over QUIC, TCP or both raced, and ``serve()`` on both.

``transport="auto"`` races the two the way Happy Eyeballs (RFC 8305) races address families.
The ``prefer``red transport (QUIC unless the caller says ``tcp``) starts first; if it has not
completed its handshake after ``tcp.race_delay`` (250 ms), the other starts too, and the first
connection whose Aqueduct handshake completes wins; the other attempt is cancelled (or closed,
if it completed in the same instant). That clean-up runs to its end even when the caller is
cancelled during it (a timeout around ``connect``, a task group closing): every connection
an attempt completed is closed, the winner too if the caller will not get it. A first attempt that fails outright (UDP refused, TCP
refused, an address that does not resolve) starts the other at once. To a service on this
machine (a loopback address, or one of the machine's own) there is no timer: no network in
between can drop either, and a loaded machine's handshake may well take longer than the
delay, so the other starts only when the first fails (a port with nothing on it fails at once).

Callers prefer TCP for bulk data (the dataset client's scans and writes: kernel TCP moves bulk
data at a fraction of user-space QUIC's CPU per byte) and QUIC for the rest; see
``docs/core-api.md`` ("QUIC or TCP").

A transport that lost a race it was preferred in (it failed, or was slower than the delay) is
remembered per service (host and port) for :data:`REMEMBER` seconds: later connections that
prefer it (every Spark task of a job) go straight to the other with no delay, and race again
if that fails. A preferred transport that wins clears the mark. When UDP is refused outright
(ICMP port unreachable), the QUIC attempt learns it at once (its socket is connected,
``udp.py``); a service that is not there at all (nothing on UDP or TCP) is reported as
:class:`~aqueduct_core.transport.endpoints.Refused` in about a round trip.

``AQUEDUCT_TRANSPORT`` (auto, quic or tcp) replaces ``auto`` wherever it is the choice, so a
deployment can pin the transport for every client without code changes.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import os
import socket
import ssl
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, cast

from aqueduct_core.api.channel import Receiver
from aqueduct_core.api.codec import Codec
from aqueduct_core.api.connection import Connection, builtin_codecs
from aqueduct_core.api.setup import HeadersHook, client_engine, server_engine
from aqueduct_core.errors import ConnectionLost
from aqueduct_core.transport import endpoints
from aqueduct_core.transport.config import Transport, TransportConfig
from aqueduct_core.transport.endpoints import (
    ConnectError,
    Handler,
    Refused,
    Server,
    unreachable_reason,
)
from aqueduct_core.transport.tcp_endpoints import TcpListener, connect_tcp, listen_tcp
from aqueduct_core.transport.tls import (
    ClientTLS,
    PinMismatch,
    ServerTLS,
    file_fingerprint,
    make_dev_certificates,
)
from aqueduct_core.transport.udp import UNREACHABLE
from aqueduct_core.transport.websocket import Responder
from aqueduct_core.wire.chanid import ENTRYPOINT

log = logging.getLogger("aqueduct")

TRANSPORTS = ("auto", "quic", "tcp", "webtransport", "websocket")
REMEMBER = 600.0
"""Seconds a race's outcome is remembered for a service (then the race runs again)."""

_winners: dict[tuple[str, int], tuple[str, float]] = {}
"""The last race's winner per service (what :func:`remembered` says)."""
_lost: dict[tuple[str, int, str], float] = {}
"""When a transport last lost a race it was preferred in, per service."""


def resolve_transport(choice: str | None, config: TransportConfig | None = None) -> Transport:
    """The transport to use: ``choice``, else the config's; ``auto`` yields to
    ``AQUEDUCT_TRANSPORT`` when that is set."""
    name = (choice or (config.transport if config is not None else "auto")).strip().lower()
    if name == "auto":
        name = os.environ.get("AQUEDUCT_TRANSPORT", "").strip().lower() or "auto"
        if name not in TRANSPORTS:
            raise ValueError(f"AQUEDUCT_TRANSPORT={name!r}: use {', '.join(TRANSPORTS)}")
    if name not in TRANSPORTS:
        raise ValueError(f"unknown transport {name!r}: use {', '.join(TRANSPORTS)}")
    return cast(Transport, name)


def remembered(host: str, port: int) -> str | None:
    """The transport that last won the race to ``host:port`` in this process, if any."""
    entry = _winners.get((host, port))
    if entry is None or time.monotonic() - entry[1] > REMEMBER:
        return None
    return entry[0]


def lost(host: str, port: int, transport: str) -> bool:
    """Whether ``transport`` lost a race to ``host:port`` it was preferred in, within
    :data:`REMEMBER` seconds: connections that prefer it go straight to the other."""
    when = _lost.get((host, port, transport))
    return when is not None and time.monotonic() - when <= REMEMBER


def forget(host: str | None = None, port: int | None = None) -> None:
    """Forget the remembered race outcomes (all, or one service's)."""
    if host is None:
        _winners.clear()
        _lost.clear()
    else:
        _winners.pop((host, port or 0), None)
        for key in [k for k in _lost if k[:2] == (host, port or 0)]:
            del _lost[key]


def _other(transport: str) -> str:
    return "tcp" if transport == "quic" else "quic"


async def connect(
    host: str,
    port: int,
    *,
    transport: str | None = None,
    headers: Any = (),
    tls: ClientTLS | None = None,
    config: TransportConfig | None = None,
    codecs: dict[str, Codec] | None = None,
    prefer: str = "quic",
    **quic_options: Any,
) -> Connection:
    """Connect to an Aqueduct server; returns once the handshake (QUIC or TLS/TCP, then
    Aqueduct's connection headers) completed. ``transport`` is ``auto`` (default: race the
    two, ``prefer`` first: ``quic`` or ``tcp``), ``quic`` or ``tcp``; ``conn.transport`` says
    which one carries it. ``headers`` are sent as our connection headers. Other keyword
    arguments (``early_data``) go to the QUIC attempt (:func:`endpoints.connect`)."""
    if prefer not in ("quic", "tcp"):
        raise ValueError(f"prefer must be quic or tcp, got {prefer!r}")
    config = config or TransportConfig()
    tls = tls or ClientTLS()
    codecs = codecs or builtin_codecs()
    choice = resolve_transport(transport, config)
    if choice == "quic":
        conn = await _quic(host, port, headers, tls, config, codecs, quic_options)
    elif choice == "tcp" or choice == "websocket":
        conn = await _tcp(host, port, headers, tls, config, codecs, choice == "websocket")
    elif choice == "webtransport":
        conn = await endpoints.connect(
            host, port, headers=headers, tls=tls, config=config, codecs=codecs, webtransport=True
        )
    else:
        conn = await _auto(host, port, headers, tls, config, codecs, quic_options, prefer)
    log.debug("connected to %s:%d over %s", host, port, conn.transport)
    return conn


async def _auto(
    host: str,
    port: int,
    headers: Any,
    tls: ClientTLS,
    config: TransportConfig,
    codecs: dict[str, Codec],
    quic_options: dict[str, Any],
    prefer: str,
) -> Connection:
    attempts = {
        "quic": lambda: _quic(host, port, headers, tls, config, codecs, quic_options),
        "tcp": lambda: _tcp(host, port, headers, tls, config, codecs),
    }
    if lost(host, port, prefer):
        other = _other(prefer)
        try:
            return await attempts[other]()
        except ConnectError as exc:
            log.info("%s to %s:%d failed (%s); racing QUIC and TCP again", other, host, port, exc)
            forget(host, port)
    return await _race(host, port, attempts[prefer], attempts[_other(prefer)], prefer, config)


async def _race(
    host: str,
    port: int,
    first: Callable[[], Awaitable[Connection]],
    second: Callable[[], Awaitable[Connection]],
    prefer: str,
    config: TransportConfig,
) -> Connection:
    head = asyncio.ensure_future(first())
    tasks = [head]
    winner: Connection | None = None
    try:
        # On this machine nothing between us drops packets: the second transport only if
        # the first fails outright.
        delay = None if await _same_host(host, port) else config.tcp.race_delay
        await asyncio.wait(tasks, timeout=delay)
        if not head.done() or head.exception() is not None:
            tasks.append(asyncio.ensure_future(second()))
        pending = set(tasks)
        while pending and winner is None:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            # Both may complete in one turn of the loop: the preferred one, first, wins then.
            for task in tasks:
                if task in done and task.exception() is None:
                    winner = task.result()
                    break
        if winner is None:
            a, b = head.exception(), tasks[1].exception()
            q, t = (a, b) if prefer == "quic" else (b, a)
            if isinstance(q, Refused) and isinstance(t, Refused):
                raise Refused(
                    f"nothing listens at {host}:{port} over QUIC ({q.reason}) or TCP "
                    f"({t.reason}). Is the service running (aqueduct serve), and is the port "
                    "right?",
                    f"QUIC: {q.reason}; TCP: {t.reason}",
                )
            raise ConnectError(f"{q} (and over TCP: {t})")
        now = time.monotonic()
        _winners[(host, port)] = (winner.transport, now)
        if winner.transport == prefer:
            _lost.pop((host, port, prefer), None)
        else:
            _lost[(host, port, prefer)] = now
        return winner
    finally:
        await _settle(tasks, winner)


async def _same_host(host: str, port: int) -> bool:
    """Whether ``host`` is this machine: a loopback address, or one of its own (a UDP socket
    connected to it takes it as its own address; connecting a UDP socket sends nothing)."""
    try:
        infos = [(0, ipaddress.ip_address(host.strip("[]")).exploded)]
    except ValueError:
        try:
            found = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_DGRAM)
        except OSError:
            return False
        infos = [(family, str(addr[0])) for family, _, _, _, addr in found]
    for family, address in infos:
        ip = ipaddress.ip_address(address.split("%")[0])
        if ip.is_loopback:
            return True
        family = family or (socket.AF_INET6 if ip.version == 6 else socket.AF_INET)
        with contextlib.suppress(OSError), socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect((address, port))
            if ipaddress.ip_address(probe.getsockname()[0].split("%")[0]) == ip:
                return True
    return False


async def _settle(tasks: Sequence[asyncio.Future[Connection]], winner: Connection | None) -> None:
    """The race's clean-up (:func:`_drop_losers`), run to the end even if the caller is
    cancelled meanwhile (a timeout around ``connect``, a task group closing, a second cancel
    while the first one's clean-up runs): an attempt that completed but did not win is then
    still closed, and so is the winner, which nobody will get now."""
    cleanup = asyncio.ensure_future(_drop_losers(tasks, winner))
    try:
        await asyncio.shield(cleanup)
    except asyncio.CancelledError:
        orphan = asyncio.ensure_future(_close_orphaned(cleanup, winner))
        _cleanups.add(orphan)
        orphan.add_done_callback(_cleanups.discard)
        raise


_cleanups: set[asyncio.Future[None]] = set()
"""Clean-ups of races whose caller was cancelled, running on (the loop keeps only a weak
reference to a task: one not held here could be collected half-way)."""


async def _close_orphaned(cleanup: asyncio.Future[None], winner: Connection | None) -> None:
    try:
        await cleanup
    finally:  # even if the clean-up failed, or this is cancelled as the loop ends
        if winner is not None:
            with contextlib.suppress(ConnectionLost):
                await winner.close(0, "the connection attempt was cancelled")


async def _drop_losers(
    tasks: Sequence[asyncio.Future[Connection]], winner: Connection | None
) -> None:
    """Cancel the attempts still running; close any that completed but did not win."""
    for task in tasks:
        task.cancel()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    for conn in results:
        if isinstance(conn, Connection) and conn is not winner:
            with contextlib.suppress(ConnectionLost):
                await conn.close(0, "another transport won the race")


async def _quic(
    host: str,
    port: int,
    headers: Any,
    tls: ClientTLS,
    config: TransportConfig,
    codecs: dict[str, Codec],
    quic_options: dict[str, Any],
) -> Connection:
    conn = await endpoints.connect(
        host, port, headers=headers, tls=tls, config=config, codecs=codecs, **quic_options
    )
    conn.transport = "quic"
    return conn


async def _tcp(
    host: str,
    port: int,
    headers: Any,
    tls: ClientTLS,
    config: TransportConfig,
    codecs: dict[str, Codec],
    websocket: bool = False,
) -> Connection:
    engine_cfg = config.engine

    def make() -> Connection:
        return Connection(client_engine(engine_cfg, headers, codecs), codecs)

    target = f"{'wss' if websocket else 'tcp'}://{host}:{port}"
    try:
        return await connect_tcp(
            host, port, make_connection=make, tls=tls, config=config, websocket=websocket
        )
    except PinMismatch as exc:
        raise ConnectError(f"{target}: {exc}") from None
    except ssl.SSLError as exc:
        raise ConnectError(
            f"TLS with {target} failed: {exc.reason or exc}. If this is a certificate problem, "
            "give the server's CA file (cafile=...) or pin its fingerprint (fingerprint=...)."
        ) from exc
    except TimeoutError:
        raise ConnectError(
            f"no Aqueduct server answered at {target} within {config.handshake_timeout} s"
        ) from None
    except OSError as exc:
        hint = (
            "Is the service running, listening on TCP (aqueduct serve --transport quic,tcp), "
            "and is the port right?"
        )
        if exc.errno in UNREACHABLE:
            reason = unreachable_reason(exc, "tcp")
            raise Refused(f"nothing listens at {target}: {reason}. {hint}", reason) from None
        raise ConnectError(f"cannot reach {target}: {exc.strerror or exc}. {hint}") from exc
    except ConnectionLost as exc:
        raise ConnectError(f"could not connect to {target}: {exc}") from exc


# -- serving ------------------------------------------------------------------------------


def listen_transports(choice: str | Iterable[str] | None, config: TransportConfig) -> set[str]:
    """``quic,tcp`` (or ``auto``), ``quic`` or ``tcp`` as the set of transports to serve."""
    if choice is None:
        choice = config.transport
    names = choice.split(",") if isinstance(choice, str) else list(choice)
    chosen: set[str] = set()
    for name in (n.strip().lower() for n in names):
        if name == "auto":
            chosen |= {"quic", "tcp"}
        elif name in ("quic", "tcp"):
            chosen.add(name)
        elif name:
            raise ValueError(f"unknown transport {name!r}: use quic, tcp or quic,tcp")
    if not chosen:
        raise ValueError("serve at least one transport: quic, tcp or quic,tcp")
    return chosen


class _Listeners:
    """What ``Server.close()`` closes: the QUIC endpoint and the TCP listener."""

    def __init__(self, *listeners: Any) -> None:
        self.listeners = [x for x in listeners if x is not None]
        self.tcp: TcpListener | None = next(
            (x for x in self.listeners if isinstance(x, TcpListener)), None
        )

    def close(self) -> None:
        for x in self.listeners:
            x.close()


async def serve(
    handler: Handler,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    transport: str | Iterable[str] | None = None,
    tls: ServerTLS | None = None,
    headers: HeadersHook | None = None,
    config: TransportConfig | None = None,
    codecs: dict[str, Codec] | None = None,
    reuse_port: bool = False,
    **quic_options: Any,
) -> Server:
    """Serve Aqueduct on ``host:port``, over QUIC (UDP) and TLS/TCP on the same port number
    by default (``transport="quic,tcp"``; ``"quic"`` or ``"tcp"`` alone; None: the config's
    ``transport``, ``auto`` meaning both). Otherwise as :func:`endpoints.serve`:
    ``handler(connection, entrypoint_receiver)`` runs once per client after the handshake;
    ``conn.transport`` says which transport carries it. Other keyword arguments go to the
    QUIC side."""
    config = config or TransportConfig()
    chosen = listen_transports(transport, config)
    codecs = codecs or builtin_codecs()
    for attempt in range(20):
        if "quic" in chosen:
            server = await endpoints.serve(
                handler,
                host,
                port,
                tls=tls,
                headers=headers,
                config=config,
                codecs=codecs,
                reuse_port=reuse_port,
                **quic_options,
            )
        else:
            server = Server()
            server.host = host
        if "tcp" not in chosen:
            return server
        server_tls = tls
        if server_tls is None:
            if server.dev_certificates is None:
                server._tmp = tempfile.TemporaryDirectory(prefix="aqueduct-dev-cert-")
                server.dev_certificates = make_dev_certificates(Path(server._tmp.name))
            server_tls = server.dev_certificates.server_tls
        server.fingerprint = file_fingerprint(server_tls.certfile)
        try:
            listener = await listen_tcp(
                host,
                server.port if "quic" in chosen else port,
                tls=server_tls,
                make_connection=_maker(server, handler, headers, config, codecs),
                config=config,
                reuse_port=reuse_port,
            )
        except OSError as exc:
            await server.close()
            if port != 0 or attempt == 19:
                raise OSError(exc.errno, f"cannot listen on TCP {host}:{port}: {exc}") from exc
            continue  # the port the UDP side got is taken on TCP: try another
        if "quic" not in chosen:
            sock = listener.server.sockets[0]
            server.host, server.port = sock.getsockname()[:2]
        server._quic_server = _Listeners(server._quic_server, listener)
        log.info(
            "serving Aqueduct on %s:%d over %s", server.host, server.port, "+".join(sorted(chosen))
        )
        return server
    raise AssertionError("unreachable")


async def serve_web(
    server: Server,
    handler: Handler,
    host: str,
    port: int,
    *,
    responder: Responder,
    tls: ServerTLS | None = None,
    headers: HeadersHook | None = None,
    config: TransportConfig | None = None,
    codecs: dict[str, Codec] | None = None,
    reuse_port: bool = False,
) -> TcpListener:
    """A web port beside ``server`` (the console's, ``aqueduct serve --console``): HTTPS, and
    plain HTTP from this machine; ``responder`` answers plain requests, and ``/aqueduct``
    upgrades to Aqueduct over WebSocket served by ``handler`` like the server's own
    connections (profile §9). ``server.close()`` closes it too."""
    config = config or TransportConfig()
    if tls is None:
        assert server.dev_certificates is not None, "a server without tls has its own"
        tls = server.dev_certificates.server_tls
    listener = await listen_tcp(
        host,
        port,
        tls=tls,
        make_connection=_maker(server, handler, headers, config, codecs or builtin_codecs()),
        config=config,
        reuse_port=reuse_port,
        responder=responder,
    )
    if isinstance(server._quic_server, _Listeners):
        server._quic_server.listeners.append(listener)
    else:
        server._quic_server = _Listeners(server._quic_server, listener)
    return listener


def _maker(
    server: Server,
    handler: Handler,
    headers: HeadersHook | None,
    config: TransportConfig,
    codecs: dict[str, Codec],
) -> Any:
    loop = asyncio.get_running_loop()

    def start(conn: Connection) -> None:
        rx = Receiver[Any](None)
        rx._bind(conn, ENTRYPOINT)
        task = loop.create_task(endpoints._run_handler(handler, conn, rx))
        server._tasks.add(task)
        task.add_done_callback(server._tasks.discard)

    def make() -> Connection:
        conn = Connection(server_engine(config.engine, headers, codecs), codecs)
        conn.transport = "tcp"
        conn.on_ready = start
        server.connections.add(conn)
        return conn

    return make
