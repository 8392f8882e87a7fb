"""Aqueduct over TLS/TCP, raw channel throughput (issue 15): server -> client, one ORDERED
channel, raw codec, messages of ``--message`` MiB, ``--total`` MiB in all.

``python -m benchmarks.bench_transport_tcp [--loop asyncio|uvloop] [--transport tcp|quic]
[--netns]``. With ``--netns`` (root) the server runs in one network namespace and the client
in another, joined by a veth pair at MTU 1500 (``shared/design/real-paths.md``); otherwise on
loopback. Prints MB/s (10**6 bytes/s, client's view from request to last byte) and the CPU
seconds per GB of each process.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import subprocess
import sys
import time
import uuid
from typing import Any

MiB = 1 << 20


def _loop_factory(name: str) -> Any:
    if name == "uvloop":
        import uvloop

        return uvloop.new_event_loop
    return asyncio.new_event_loop


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _config(transport: str, tuning: str) -> Any:
    """The TransportConfig for ``tuning`` = "read_buffer,write_high_water,chunk_size"."""
    from aqueduct_core import TransportConfig
    from aqueduct_core.transport.mux_wire import MuxSettings, TcpSettings

    read, high, chunk = (int(x) for x in tuning.split(","))
    tcp = TcpSettings(read_buffer=read, write_high_water=high, mux=MuxSettings(chunk_size=chunk))
    return TransportConfig(transport=transport, tcp=tcp)  # type: ignore[arg-type]


async def _server(host: str, transport: str, tuning: str) -> None:
    from aqueduct_core import RawCodec, serve
    from aqueduct_core.api import channel

    async def handler(conn: Any, rx: Any) -> None:
        async for req in rx:
            tx = req["tx"]
            payload = os.urandom(req["size"])
            for _ in range(req["count"]):
                await tx.send(payload)
            tx.finish()
            print("CPU " + json.dumps(_cpu()), flush=True)

    server = await serve(handler, host, 0, transport=transport, config=_config(transport, tuning))
    print("READY " + json.dumps({"port": server.port, "fp": server.fingerprint}), flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    await server.close()
    del channel, RawCodec


async def _client(
    host: str, port: int, fp: str, transport: str, size: int, total: int, tuning: str
) -> dict[str, float]:
    from aqueduct_core import ClientTLS, connect
    from aqueduct_core.api import channel

    conn = await connect(
        host, port, tls=ClientTLS(fingerprint=fp), config=_config(transport, tuning)
    )
    count = max(1, total // size)
    tx, rx = channel(codec="raw")
    cpu0, t0 = _cpu(), time.perf_counter()
    await conn.entrypoint.send({"tx": tx, "size": size, "count": count})
    got = 0
    async for msg in rx:
        got += len(msg)
    elapsed = time.perf_counter() - t0
    cpu = _cpu() - cpu0
    await conn.close()
    return {"bytes": got, "seconds": elapsed, "client_cpu": cpu, "transport": conn.transport}  # type: ignore[dict-item]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--role", default="main")
    ap.add_argument("--loop", default="uvloop", choices=["asyncio", "uvloop"])
    ap.add_argument("--transport", default="tcp", choices=["tcp", "quic"])
    ap.add_argument("--message", type=int, default=4, help="MiB per message")
    ap.add_argument("--total", type=int, default=1024, help="MiB in all")
    ap.add_argument("--netns", action="store_true")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument(
        "--tuning",
        default="262144,1048576,262144",
        help="read_buffer,write_high_water,chunk_size (bytes; the defaults)",
    )
    args = ap.parse_args()
    if args.role == "server":
        with asyncio.Runner(loop_factory=_loop_factory(args.loop)) as runner:
            runner.run(_server(args.host, args.transport, args.tuning))
        return
    prefix: list[str] = []
    cprefix: list[str] = []
    host = args.host
    names: list[str] = []
    if args.netns:
        tag = uuid.uuid4().hex[:6]
        a, b = f"aqA{tag}", f"aqB{tag}"
        names = [a, b]
        for cmd in (
            f"ip netns add {a}",
            f"ip netns add {b}",
            f"ip link add vA{tag} type veth peer name vB{tag}",
            f"ip link set vA{tag} netns {a}",
            f"ip link set vB{tag} netns {b}",
            f"ip -n {a} addr add 198.18.0.1/24 dev vA{tag}",
            f"ip -n {b} addr add 198.18.0.2/24 dev vB{tag}",
            f"ip -n {a} link set vA{tag} mtu 1500 up",
            f"ip -n {b} link set vB{tag} mtu 1500 up",
            f"ip -n {a} link set lo up",
            f"ip -n {b} link set lo up",
        ):
            subprocess.run(cmd.split(), check=True)
        prefix, cprefix, host = ["ip", "netns", "exec", a], ["ip", "netns", "exec", b], "198.18.0.1"
    try:
        server = subprocess.Popen(
            [
                *prefix,
                sys.executable,
                "-m",
                "benchmarks.bench_transport_tcp",
                "--role",
                "server",
                "--loop",
                args.loop,
                "--transport",
                args.transport,
                "--host",
                host,
                "--tuning",
                args.tuning,
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert server.stdout is not None and server.stdin is not None
        line = server.stdout.readline()
        ready = json.loads(line.split(" ", 1)[1])
        client = subprocess.run(
            [
                *cprefix,
                sys.executable,
                "-c",
                "import asyncio,json,sys; from benchmarks.bench_transport_tcp import _client, _loop_factory;"
                f"r=asyncio.Runner(loop_factory=_loop_factory({args.loop!r})).run(_client({host!r},"
                f"{ready['port']},{ready['fp']!r},{args.transport!r},{args.message * MiB},"
                f"{args.total * MiB},{args.tuning!r}));"
                "print(json.dumps(r))",
            ],
            stdout=subprocess.PIPE,
            text=True,
            check=True,
        )
        result = json.loads(client.stdout.strip().splitlines()[-1])
        server_cpu = json.loads(server.stdout.readline().split(" ", 1)[1])
        server.stdin.close()
        server.wait(10)
        gb = result["bytes"] / 1e9
        print(
            json.dumps(
                {
                    "loop": args.loop,
                    "transport": result["transport"],
                    "netns": args.netns,
                    "tuning": args.tuning,
                    "MB/s": round(result["bytes"] / result["seconds"] / 1e6),
                    "client_cpu_s_per_GB": round(result["client_cpu"] / gb, 2),
                    "server_cpu_s_per_GB (incl. startup)": round(server_cpu / gb, 2),
                }
            )
        )
    finally:
        for n in names:
            subprocess.run(["ip", "netns", "del", n], check=False)


if __name__ == "__main__":
    main()
