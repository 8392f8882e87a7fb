"""Aqueduct over real QUIC on loopback, with both backends: what only a real network shows.

The API scenarios (modes, oneshots, nesting, cancel/finish, headers) run over QUIC in
``test_api.py``; this file covers large messages, loss at the socket, a killed server, a
misbehaving raw QUIC peer, TLS, and the private backend hooks.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
import ssl
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from aqueduct_core.api import Connection, Receiver, channel, oneshot
from aqueduct_core.engine import EngineConfig
from aqueduct_core.errors import ConnectionLost, LostInTransit
from aqueduct_core.testing.quicpair import quic_pair
from aqueduct_core.testing.udpproxy import LossyUDPProxy
from aqueduct_core.transport import (
    ClientTLS,
    ConnectError,
    InsecureConnectionWarning,
    TransportConfig,
    connect,
    make_dev_certificates,
    serve,
)
from aqueduct_core.transport import backends as backend_hooks
from aqueduct_core.wire import RouteTo, Version, encode_frames

pytestmark = pytest.mark.quic
BACKENDS = ["aioquic", "qh3"]
HERE = Path(__file__).parent


def run(coro: Any, timeout: float = 60) -> Any:
    return asyncio.run(asyncio.wait_for(coro, timeout))


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_64_mib_message_arrives_intact(backend: str) -> None:
    async def main() -> None:
        async with quic_pair(backend, backend) as pair:
            tx, rx = channel(codec="raw")
            await pair.client.entrypoint.send({"in": rx})
            inbox = (await pair.entrypoint_receiver.recv())["in"]
            blob = os.urandom(1 << 20) * 64
            await tx.send(blob)
            tx.finish()
            got = await inbox.recv()
            assert len(got) == len(blob) and bytes(got) == blob
            assert [m async for m in inbox] == []

    run(main())


@pytest.mark.parametrize("backend", BACKENDS)
def test_datagram_loss_at_the_socket_is_reported_as_the_engine_decides(backend: str) -> None:
    """20% of UDP packets dropped both ways: every oneshot that rode in an unreliable message
    either reached the server (and its value arrives) or is LostInTransit at the client,
    never both, never neither.

    Loss starts once the handshake is done: qh3 2.1 can wedge a handshake that loses
    packets ("packet builder capacity exhausted" from every poll), a library defect
    recorded in the transport notes; loss during data transfer is what this test is about.
    """

    async def main() -> None:
        config = TransportConfig(backend=backend)  # type: ignore[arg-type]
        got: list[int] = []
        finished = asyncio.Event()

        async def handler(conn: Connection, entry: Receiver[Any]) -> None:
            request = await entry.recv()
            async for message in request["in"]:
                got.append(await message["rx"])
            finished.set()
            await entry.recv()

        server = await serve(handler, config=config)
        proxy = await LossyUDPProxy.start(("127.0.0.1", server.port), loss=0.0, seed=7)
        try:
            conn = await connect("127.0.0.1", proxy.port, tls=server.client_tls(), config=config)
            proxy.loss = 0.2
            tx, rx = channel()
            tx.unreliable(maxsize=None)
            await conn.entrypoint.send({"in": rx})
            senders = []
            for i in range(60):
                one_tx, one_rx = oneshot()
                await tx.send({"i": i, "rx": one_rx})
                senders.append(one_tx)
                await asyncio.sleep(0.005)
            tx.finish()
            delivered, lost = set(), set()
            for i, one_tx in enumerate(senders):
                try:
                    one_tx.send(i)
                    await one_tx.wait_closed()
                    delivered.add(i)
                except LostInTransit:
                    lost.add(i)
            await asyncio.wait_for(finished.wait(), 20)
            assert proxy.dropped > 0
            assert lost, "with 20% packet loss some unreliable messages must be lost"
            assert delivered | lost == set(range(60)) and not delivered & lost
            assert set(got) == delivered
            await conn.close()
        finally:
            proxy.close()
            await server.close()

    run(main(), timeout=90)


@pytest.mark.fault
@pytest.mark.parametrize("backend", BACKENDS)
def test_server_killed_mid_transfer_gives_connection_lost_within_the_idle_timeout(
    backend: str, tmp_path: Path
) -> None:
    # its certificate in our tmp_path: a killed server cannot delete a directory of its own
    with subprocess.Popen(
        [sys.executable, str(HERE / "quic_server_process.py"), backend, "0", str(tmp_path)],
        stdout=subprocess.PIPE,
        text=True,
    ) as proc:
        try:
            assert proc.stdout is not None
            info = json.loads(proc.stdout.readline())

            async def main() -> float:
                idle = 2.0
                config = TransportConfig(backend=backend, idle_timeout=idle)  # type: ignore[arg-type]
                conn = await connect(
                    "127.0.0.1",
                    info["port"],
                    tls=ClientTLS(fingerprint=info["fingerprint"]),
                    config=config,
                )
                tx, rx = channel(codec="raw")
                await conn.entrypoint.send({"op": "blobs", "out": tx})
                for _ in range(3):
                    assert len(await rx.recv()) == 1 << 20
                os.kill(proc.pid, signal.SIGKILL)
                killed = time.monotonic()
                with pytest.raises(ConnectionLost):
                    while True:
                        await rx.recv()
                elapsed = time.monotonic() - killed
                assert conn.is_closed
                return elapsed

            elapsed = run(main(), timeout=30)
            assert elapsed < 2.0 * 2 + 1, f"ConnectionLost took {elapsed:.1f} s"
        finally:
            proc.kill()


@pytest.mark.parametrize("backend", BACKENDS)
def test_malformed_frames_close_only_that_connection(backend: str) -> None:
    """A raw QUIC client that speaks ALPN aqueduct but sends a bad frame sequence is closed
    with code 1 (protocol violation); another client on the same server is unaffected."""
    from aioquic.asyncio import connect as raw_connect
    from aioquic.asyncio.protocol import QuicConnectionProtocol
    from aioquic.quic.configuration import QuicConfiguration
    from aioquic.quic.events import ConnectionTerminated

    class Recorder(QuicConnectionProtocol):
        def __init__(self, *a: Any, **kw: Any) -> None:
            super().__init__(*a, **kw)
            self.terminated: asyncio.Future[ConnectionTerminated] = (
                asyncio.get_running_loop().create_future()
            )

        def quic_event_received(self, event: Any) -> None:
            if isinstance(event, ConnectionTerminated) and not self.terminated.done():
                self.terminated.set_result(event)

    async def handler(conn: Connection, entry: Receiver[Any]) -> None:
        async for request in entry:
            request["reply"].send(request["x"] * 2)

    async def main() -> None:
        config = TransportConfig(backend=backend)  # type: ignore[arg-type]
        server = await serve(handler, config=config)
        try:
            good = await connect("127.0.0.1", server.port, tls=server.client_tls(), config=config)
            raw_config = QuicConfiguration(
                is_client=True, alpn_protocols=["aqueduct"], max_datagram_frame_size=65536
            )
            raw_config.verify_mode = ssl.CERT_NONE
            async with raw_connect(
                "127.0.0.1", server.port, configuration=raw_config, create_protocol=Recorder
            ) as raw:
                bad = encode_frames(Version(), RouteTo(0)) + bytes([13])  # unknown tag 13
                raw._quic.send_stream_data(2, bad, end_stream=True)
                raw.transmit()
                event = await asyncio.wait_for(raw.terminated, 10)
                assert event.error_code == 1
                assert event.frame_type is None  # an application close, not a QUIC error
            reply, answer = oneshot()
            await good.entrypoint.send({"x": 21, "reply": reply})
            assert await answer == 42
            await good.close()
        finally:
            await server.close()

    run(main())


@pytest.mark.parametrize("backend", BACKENDS)
def test_tls_modes(backend: str, tmp_path: Path) -> None:
    async def handler(conn: Connection, entry: Receiver[Any]) -> None:
        async for request in entry:
            request["reply"].send("hello")

    async def ask(port: int, tls: ClientTLS, config: TransportConfig) -> str:
        conn = await connect("127.0.0.1", port, tls=tls, config=config)
        reply, answer = oneshot()
        await conn.entrypoint.send({"reply": reply})
        result: str = await answer
        await conn.close()
        return result

    async def main() -> None:
        config = TransportConfig(backend=backend, engine=EngineConfig(handshake_timeout=3))  # type: ignore[arg-type]
        certs = make_dev_certificates(tmp_path / "certs")
        server = await serve(handler, tls=certs.server_tls, config=config)
        try:
            assert server.fingerprint == certs.fingerprint
            assert await ask(server.port, ClientTLS(cafile=str(certs.ca_file)), config) == "hello"
            assert (
                await ask(server.port, ClientTLS(fingerprint=certs.fingerprint), config) == "hello"
            )
            with pytest.warns(InsecureConnectionWarning):
                assert await ask(server.port, ClientTLS(insecure=True), config) == "hello"
            with pytest.raises(ConnectError, match=r"fingerprint|certificate|TLS|connect"):
                await ask(server.port, ClientTLS(fingerprint="ab" * 32), config)
            other = make_dev_certificates(tmp_path / "other")
            with pytest.raises(ConnectError):
                await ask(server.port, ClientTLS(cafile=str(other.ca_file)), config)
        finally:
            await server.close()
        # The port is closed now: the host says so (ICMP), no handshake timeout to wait out.
        with pytest.raises(ConnectError, match=r"nothing listens at .*over QUIC \(ICMP port"):
            await ask(server.port, ClientTLS(insecure=True), config)

    with pytest.warns(InsecureConnectionWarning):
        run(main())


@pytest.mark.parametrize("backend", BACKENDS)
def test_private_backend_hooks_still_match_the_library(backend: str) -> None:
    """Fails loudly if an upgrade of aioquic or qh3 moved what the adapter reaches into."""
    backend_hooks.check(backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_library_whose_internals_moved_is_refused_with_a_clear_message(
    backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An upgrade that renames what the packet-size code writes (aioquic) or drops the
    batched receive (qh3) fails at load, naming the version and the fix."""
    loaded = backend_hooks.load(backend)
    if backend == "aioquic":
        real = loaded.QuicConnection

        class Moved(real):  # type: ignore[misc, valid-type]
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(*args, **kwargs)
                del self._loss._pacer._max_datagram_size

        loaded = dataclasses.replace(loaded, QuicConnection=Moved)
    else:
        monkeypatch.delattr(loaded.QuicConnectionProtocol, "datagrams_received")
    with pytest.raises(backend_hooks.BackendMismatch) as info:
        backend_hooks._check(loaded)
    message = str(info.value)
    assert loaded.version in message and "pip install" in message, message


def test_many_channels_need_raised_stream_limits() -> None:
    """300 channels live at once: far beyond the libraries' default 100-128 streams."""

    async def main() -> None:
        async with quic_pair("qh3", "qh3") as pair:
            receivers = []
            for _ in range(300):
                tx, rx = channel()
                await pair.client.entrypoint.send({"in": rx})
                receivers.append((tx, (await pair.entrypoint_receiver.recv())["in"]))
            for i, (tx, _) in enumerate(receivers):
                await tx.send(i)
            for i, (tx, rx) in enumerate(receivers):
                assert await rx.recv() == i
                tx.finish()
                assert [m async for m in rx] == []

    run(main())
