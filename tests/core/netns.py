"""Two "hosts" for real-path tests: the namespaces of ``benchmarks/bench_realpath.py`` (or,
with :func:`routed_link`, two hosts with a router between them) and a server and client that
run inside them.

    python tests/core/netns.py serve BACKEND HOST
        prints one JSON line (port, fingerprint), then serves: a request ``{"size": N,
        "seed": S, "out": <sender>}`` gets N pseudo-random bytes in 1 MiB messages; a request
        ``{"out": <sender>}`` one message with the server's UDP statistics for its connection
        (``UdpTransport.stats`` and the packet size it chose).
    python tests/core/netns.py fetch BACKEND HOST PORT FINGERPRINT SIZE
        fetches SIZE bytes, checks them byte for byte, prints one JSON line: the client's
        and the server's UDP statistics and the packet size the client chose.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import secrets
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.bench_realpath import Link, require_root, spawn_in, stop, veth_link

__all__ = [
    "Link",
    "blob",
    "require_root",
    "routed_link",
    "set_route_mtu",
    "spawn_in",
    "stop",
    "veth_link",
]

CHUNK = 1 << 20


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


@contextmanager
def routed_link(end_mtu: int, middle_mtu: int) -> Iterator[Link]:
    """Client and server namespaces with a router namespace between them. Every interface
    has ``end_mtu`` except the router's side towards the server, which has ``middle_mtu``:
    both hosts' routes say ``end_mtu``, yet the path carries only ``middle_mtu``. The router
    sends no ICMP "packet too big" (dropped by nftables), so a larger packet vanishes in
    either direction: an RFC 8899 black hole."""
    token = secrets.token_hex(3)
    net = 1 + int(token, 16) % 250
    cli, rtr, srv = (f"aqr-{token}-{role}" for role in ("cli", "rtr", "srv"))
    link = Link(srv, cli, f"aqr{token}s", f"aqr{token}c", f"198.19.{net}.2", f"198.18.{net}.2")
    made: list[str] = []
    try:
        for ns in (cli, rtr, srv):
            _ip("netns", "add", ns)
            made.append(ns)
            _ip("-n", ns, "link", "set", "lo", "up")
        ends = (
            (link.client_if, cli, f"198.18.{net}.2", f"aqr{token}a", f"198.18.{net}.1", end_mtu),
            (link.server_if, srv, f"198.19.{net}.2", f"aqr{token}b", f"198.19.{net}.1", middle_mtu),
        )
        for host_if, host_ns, host_ip, router_if, router_ip, router_mtu in ends:
            _ip("link", "add", host_if, "type", "veth", "peer", "name", router_if)
            for dev, ns, addr, mtu in (
                (host_if, host_ns, host_ip, end_mtu),
                (router_if, rtr, router_ip, router_mtu),
            ):
                _ip("link", "set", dev, "netns", ns)
                _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
                _ip("-n", ns, "link", "set", dev, "mtu", str(mtu), "up")
            _ip("-n", host_ns, "route", "add", "default", "via", router_ip)
        subprocess.run(
            ["ip", "netns", "exec", rtr, "sysctl", "-qw", "net.ipv4.ip_forward=1"], check=True
        )
        rules = (
            "table inet aqblackhole {\n chain out {\n"
            "  type filter hook output priority 0; policy accept;\n"
            "  icmp type destination-unreachable drop\n }\n}\n"
        )
        subprocess.run(
            ["ip", "netns", "exec", rtr, "nft", "-f", "-"], input=rules, text=True, check=True
        )
        yield link
    finally:
        for ns in made:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def set_route_mtu(link: Link, mtu: int) -> None:
    """Give both hosts' route to the other an ``mtu`` metric (below the link's MTU, as a
    static route or a stale path-MTU entry would): the route then says less than the path
    carries."""
    for ns, dev, peer in (
        (link.server_ns, link.server_if, link.client_ip),
        (link.client_ns, link.client_if, link.server_ip),
    ):
        _ip("-n", ns, "route", "add", f"{peer}/32", "dev", dev, "mtu", str(mtu))


def blob(seed: int, size: int) -> bytes:
    return random.Random(seed).randbytes(size)


def udp_stats(conn: Any) -> dict[str, Any]:
    driver = conn._driver
    transport = driver._transport
    quic = driver._quic
    size = getattr(quic, "_max_datagram_size", None) or quic._configuration.max_datagram_size
    stats = dict(getattr(transport, "stats", {}))
    stats.update(
        gso=getattr(transport, "gso", False),
        gro=getattr(transport, "gro", False),
        packet_size=int(size),
    )
    return stats


async def serve_main(backend: str, host: str) -> None:
    from aqueduct_core.api import Connection, Receiver
    from aqueduct_core.transport import TransportConfig
    from aqueduct_core.transport.endpoints import serve  # QUIC only, never raced with TCP

    async def handler(conn: Connection, entry: Receiver[Any]) -> None:
        async for request in entry:
            out = request["out"]
            if "size" not in request:  # asked once the client has every byte
                await out.send(json.dumps(udp_stats(conn)).encode())
                continue
            data = blob(request["seed"], request["size"])
            for start in range(0, len(data), CHUNK):
                await out.send(data[start : start + CHUNK])

    config = TransportConfig(backend=backend)  # type: ignore[arg-type]
    server = await serve(handler, host, 0, config=config)
    print(json.dumps({"port": server.port, "fingerprint": server.fingerprint}), flush=True)
    stopped = asyncio.Event()  # stop() sends SIGTERM: close, and so delete the certificate's
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stopped.set)  # temp dir
    await stopped.wait()
    await server.close()


async def fetch_main(backend: str, host: str, port: int, fingerprint: str, size: int) -> None:
    from aqueduct_core.api import channel
    from aqueduct_core.transport import ClientTLS, TransportConfig
    from aqueduct_core.transport.endpoints import connect  # QUIC only, never raced with TCP

    config = TransportConfig(backend=backend)  # type: ignore[arg-type]
    conn = await connect(host, port, tls=ClientTLS(fingerprint=fingerprint), config=config)
    tx, rx = channel(codec="raw")
    await conn.entrypoint.send({"size": size, "seed": 14, "out": tx})
    digest = hashlib.sha256()
    got = 0
    while got < size:
        piece = await rx.recv()
        digest.update(piece)
        got += len(piece)
    tx, rx = channel(codec="raw")
    await conn.entrypoint.send({"out": tx})
    server = json.loads(await rx.recv())
    result = {
        "intact": got == size and digest.digest() == hashlib.sha256(blob(14, size)).digest(),
        "client": udp_stats(conn),
        "server": server,
    }
    await conn.close()
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        asyncio.run(serve_main(sys.argv[2], sys.argv[3]))
    else:
        backend, host, port, fp, size = sys.argv[2:7]
        asyncio.run(fetch_main(backend, host, int(port), fp, int(size)))
