"""Two "hosts" for real-path tests: the namespaces of ``benchmarks/bench_realpath.py`` and a
server and client that run inside them.

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
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.bench_realpath import Link, require_root, spawn_in, stop, veth_link

__all__ = ["Link", "blob", "require_root", "spawn_in", "stop", "veth_link"]

CHUNK = 1 << 20


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
    await asyncio.Event().wait()


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
