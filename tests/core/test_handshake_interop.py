"""QUIC handshakes between the two backends, in all four pairings.

aioquic pads a datagram that carries an Initial packet with bytes *after* the packet; qh3
2.1 credited only the packet to its anti-amplification budget, could then not send its
first flight, and lost what it had built (two defects, worked around in
``aqueduct_core/transport/backends.py``). An aioquic client waited for its probe timeout
(200 ms to seconds) before a qh3 server answered. The sans-IO tests below drive the two real
libraries in memory with a frozen clock, so a handshake that needs a timer never completes;
the loopback test is the acceptance figure.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from aqueduct_core.engine import EngineConfig
from aqueduct_core.transport import TransportConfig, connect, make_dev_certificates, serve
from aqueduct_core.transport.backends import load

PAIRS = [(c, s) for c in ("aioquic", "qh3") for s in ("aioquic", "qh3")]
CLIENT_ADDR = ("127.0.0.1", 40000)
SERVER_ADDR = ("127.0.0.1", 4433)


def handshake_round_trips(
    client_backend: str,
    server_backend: str,
    certfile: Path,
    keyfile: Path,
    packet_size: int,
    max_trips: int = 6,
) -> int | None:
    """Round trips until the client's QUIC handshake completes, with the clock frozen
    (no probe timeout ever fires), or None if it never does."""
    cb, sb = load(client_backend), load(server_backend)
    cc = cb.QuicConfiguration(is_client=True, alpn_protocols=["aqueduct"])
    cc.max_datagram_size = packet_size
    cc.server_name = "localhost"
    cc.verify_mode = 0  # ssl.CERT_NONE: the chain's trust is not what is tested here
    client = cb.QuicConnection(configuration=cc)
    sc = sb.QuicConfiguration(is_client=False, alpn_protocols=["aqueduct"])
    sc.max_datagram_size = packet_size
    sc.load_cert_chain(str(certfile), str(keyfile))
    server: Any = None
    now = 0.0
    client.connect(SERVER_ADDR, now=now)
    for trip in range(1, max_trips + 1):
        for data, _ in client.datagrams_to_send(now=now):
            if server is None:
                server = sb.QuicConnection(
                    configuration=sc,
                    original_destination_connection_id=client.original_destination_connection_id,
                )
            server.receive_datagram(data, CLIENT_ADDR, now=now)
        if server is not None:
            for data, _ in _send(server, sb, now):
                client.receive_datagram(data, SERVER_ADDR, now=now)
        while (event := client.next_event()) is not None:
            if isinstance(event, cb.events.HandshakeCompleted):
                return trip
        now += 0.001
    return None


def _send(quic: Any, backend: Any, now: float) -> list[tuple[bytes, Any]]:
    try:
        return list(quic.datagrams_to_send(now=now))
    except backend.QuicConnectionError:
        return []  # the library could build nothing (qh3 raises instead of waiting)


@pytest.mark.parametrize("packet_size", [1200, 16384])
@pytest.mark.parametrize(("client", "server"), PAIRS)
def test_every_pair_completes_the_handshake_in_one_round_trip(
    client: str, server: str, packet_size: int, tmp_path: Path
) -> None:
    """The server answers the first Initial with its whole flight: no timer is needed."""
    certs = make_dev_certificates(tmp_path)
    trips = handshake_round_trips(client, server, certs.cert_file, certs.key_file, packet_size)
    assert trips == 1


@pytest.mark.parametrize("client", ["aioquic", "qh3"])
def test_a_flight_beyond_the_amplification_budget_goes_out_in_parts(
    client: str, tmp_path: Path
) -> None:
    """A certificate chain larger than three times the client's Initial (RFC 9000 §8.1):
    the qh3 server sends what its budget allows, the client's acknowledgement earns it the
    rest, and the handshake needs one more round trip, not a probe timeout."""
    certs = make_dev_certificates(tmp_path)
    chain = tmp_path / "long-chain.pem"
    # Extra certificates after the CA make the server's Certificate message ~4.5 KB.
    chain.write_bytes(certs.cert_file.read_bytes() + b"".join(_filler_certs(6)))
    trips = handshake_round_trips(client, "qh3", chain, certs.key_file, 1200)
    assert trips is not None and trips <= 2


def _filler_certs(n: int) -> list[bytes]:
    now = dt.datetime.now(dt.UTC)
    out = []
    for i in range(n):
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"filler {i} " + "x" * 40)])
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now)
            .not_valid_after(now + dt.timedelta(days=1))
            .sign(key, hashes.SHA256())
        )
        out.append(cert.public_bytes(serialization.Encoding.PEM))
    return out


CONNECTS = 100
STALL = 0.05
"""Event-loop lag beyond which a connect measured the machine (2 cores shared by several
test runs), not the protocol: such a connect is measured again, at most 50 times in all."""


class LoopLag:
    """Largest oversleep of a 5 ms timer since ``reset``: how long the event loop could
    not run. A handshake waiting for a probe timeout (the defect these tests catch) is idle,
    so it shows no lag; a descheduled process does."""

    def __init__(self) -> None:
        self.worst = 0.0
        self._task = asyncio.ensure_future(self._watch())

    async def _watch(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            before = loop.time()
            await asyncio.sleep(0.005)
            self.worst = max(self.worst, loop.time() - before - 0.005)

    def reset(self) -> None:
        self.worst = 0.0

    def stop(self) -> None:
        self._task.cancel()


# Slow: a timing figure, which a loaded machine breaks (p99 269-274 ms for aioquic clients at
# load 12 in the fast suite, median 50 ms). The defect it guards (an aioquic client waiting
# out its probe timeout for a qh3 server) is caught without a clock by
# test_every_pair_completes_the_handshake_in_one_round_trip, which stays fast.
@pytest.mark.slow
@pytest.mark.quic
@pytest.mark.parametrize(("client", "server"), PAIRS)
def test_100_connects_per_backend_pair_none_fails_p99_under_200_ms(
    client: str, server: str
) -> None:
    """Acceptance (issue 13): 100 sequential connects on loopback, each timed from
    ``connect()`` to its return (QUIC handshake and Aqueduct's connection headers). Full
    handshakes: 0-RTT, which would resume most of them, has its own tests. Every connect
    must succeed, including those measured again after a stall of the machine."""

    async def main() -> tuple[list[float], int]:
        async def handler(conn: Any, rx: Any) -> None:
            await conn.wait_closed()

        srv = await serve(
            handler,
            config=TransportConfig(backend=server, zero_rtt=False),  # type: ignore[arg-type]
        )
        config = TransportConfig(
            backend=client,  # type: ignore[arg-type]
            transport="quic",  # never TCP, which would win a race against a slow handshake
            engine=EngineConfig(handshake_timeout=5.0),
            zero_rtt=False,
        )
        tls = srv.client_tls()
        times: list[float] = []
        stalled = 0
        lag = LoopLag()
        try:
            # One connect first: imports and first-use costs are not the handshake's.
            await (await connect("127.0.0.1", srv.port, tls=tls, config=config)).close()
            while len(times) < CONNECTS:
                lag.reset()
                start = time.perf_counter()
                conn = await connect("127.0.0.1", srv.port, tls=tls, config=config)
                took = time.perf_counter() - start
                if lag.worst > STALL and stalled < 50:
                    stalled += 1
                else:
                    times.append(took)
                await conn.close()
        finally:
            lag.stop()
            await srv.close()
        return times, stalled

    times, stalled = asyncio.run(asyncio.wait_for(main(), 120))
    times.sort()
    assert len(times) == CONNECTS
    p99 = times[98]
    print(
        f"{client} -> {server}: median {times[49] * 1000:.1f} ms, "
        f"p99 {p99 * 1000:.1f} ms, max {times[-1] * 1000:.1f} ms "
        f"({stalled} measured again after a stall)"
    )
    assert p99 < 0.2, f"p99 handshake {p99 * 1000:.0f} ms (median {times[49] * 1000:.0f} ms)"
