"""A closed port is known in a round trip: the host answers TCP with a reset and UDP with an
ICMP port unreachable, which a QUIC client hears on its connected socket (``udp.py``). Real
sockets on loopback, under asyncio's loop and uvloop (the client's portal loop)."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from aqueduct_core import Connection, TransportConfig, connect, serve
from aqueduct_core.transport import Refused
from aqueduct_core.transport.mux_wire import TcpSettings
from aqueduct_core.transport.udp import connect_to, create_endpoint
from aqueduct_spark.testing import closed_port

pytestmark = pytest.mark.quic


def loops() -> list[str]:
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return ["asyncio"]
    return ["asyncio", "uvloop"]


def run(loop_name: str, coro: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
    if loop_name == "uvloop":
        import uvloop

        return uvloop.run(asyncio.wait_for(coro(), 30))
    return asyncio.run(asyncio.wait_for(coro(), 30))


@pytest.mark.parametrize("transport", ["quic", "tcp", "auto"])
def test_nothing_listening_is_known_in_a_round_trip(transport: str) -> None:
    port = closed_port()

    async def attempt() -> tuple[float, BaseException]:
        started = time.monotonic()
        with pytest.raises(Refused) as refused:
            await connect("127.0.0.1", port, transport=transport)
        return time.monotonic() - started, refused.value

    took, exc = run("asyncio", attempt)
    assert took < 2.0  # not the 10 s handshake timeout (under load: generous)
    assert (
        f"nothing listens at {'' if transport == 'auto' else transport + '://'}127.0.0.1:{port}"
        in (str(exc))
    )
    if transport != "tcp":
        assert "ICMP port unreachable" in str(exc)


def test_a_refused_quic_attempt_starts_tcp_at_once() -> None:
    """Only TCP listens: the race's QUIC side hears the port is closed and TCP starts without
    waiting out the race delay (set long here, so waiting would show)."""
    slow_race = TransportConfig(tcp=TcpSettings(race_delay=5.0))

    async def main() -> tuple[float, str]:
        async def handler(conn: Connection, rx: Any) -> None:
            await conn.wait_closed()

        server = await serve(handler, transport="tcp")
        try:
            started = time.monotonic()
            conn = await connect(
                "127.0.0.1", server.port, config=slow_race, tls=server.client_tls()
            )
            took = time.monotonic() - started
            transport = conn.transport
            await conn.close()
            return took, transport
        finally:
            await server.close()

    took, transport = run("asyncio", main)
    assert transport == "tcp"
    assert took < 2.5  # the race delay is 5 s


@pytest.mark.parametrize("loop_name", loops())
def test_a_connected_socket_hears_again_after_an_icmp_error(loop_name: str) -> None:
    """libuv stops watching a socket that reported an error: the transport must watch it
    again, or a client whose service restarted never hears from the new process."""

    class Collect(asyncio.DatagramProtocol):
        def __init__(self) -> None:
            self.got: list[bytes] = []
            self.arrived = asyncio.Event()

        def datagram_received(self, data: bytes, addr: Any) -> None:
            self.got.append(data)
            self.arrived.set()

        def datagrams_received(self, datagrams: list[bytes], addr: Any) -> None:
            for data in datagrams:
                self.datagram_received(data, addr)

    async def main() -> tuple[list[OSError], list[bytes]]:
        port = closed_port()
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.bind(("127.0.0.1", 0))
        sock.setblocking(False)
        assert connect_to(sock, ("127.0.0.1", port))
        transport, protocol = await create_endpoint(asyncio.get_running_loop(), Collect, sock=sock)
        errors: list[OSError] = []
        transport.on_unreachable = errors.append
        for _ in range(3):  # each send draws an ICMP port unreachable
            transport.sendto(b"\x40anyone there?", ("127.0.0.1", port))
            await asyncio.sleep(0.05)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as peer:
            peer.bind(("127.0.0.1", port))  # the service is back
            peer.sendto(b"\x40hello", sock.getsockname())
            await asyncio.wait_for(protocol.arrived.wait(), 5)
        transport.close()
        return errors, protocol.got

    errors, got = run(loop_name, main)
    assert errors and all(isinstance(e, ConnectionRefusedError) for e in errors)
    assert got == [b"\x40hello"]
