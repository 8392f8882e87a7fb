"""Worker processes of ``benchmarks.bench_transport``: the QUIC side (Aqueduct and bare).

``python -m benchmarks.bench_transport_quic server BACKEND PACKET CERTDIR KINDS`` serves each
kind of KINDS (JSON list, see :func:`transport_config`) on its own loopback port: Aqueduct
with the default engine configuration (flow control negotiated), with flow control off, or
with a given window; and ``bare``, a QUIC sender built from the *same* QuicConfiguration,
socket, pacing and slice feeding as the Aqueduct adapter. It prints ``READY {json}`` and
serves until stdin closes.

``python -m benchmarks.bench_transport_quic client BACKEND PACKET CERTDIR PORTS SERVER_PID
PLAN`` runs the measurements of PLAN (JSON: sizes, bytes per measurement, repetitions, kinds)
and prints ``RESULT {json}``. Data always flows server -> client (as a Spark reader pulls
from the service); the client times from sending its request to the last byte, and reads
the CPU time of both processes around every measurement.

Both roles run on uvloop when it is installed (both kinds alike).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import time
from collections import deque
from pathlib import Path
from typing import Any

from aqueduct_core.api import channel
from aqueduct_core.engine import EngineConfig
from aqueduct_core.transport import ClientTLS, ServerTLS, TransportConfig, connect, serve
from aqueduct_core.transport.backends import Backend, apply_aioquic, load
from aqueduct_core.transport.endpoints import _quic_config
from aqueduct_core.transport.udp import udp_socket

HOST = "127.0.0.1"
_PAYLOADS: dict[int, bytes] = {}


def payload(size: int) -> bytes:
    """One payload object per size, reused for every message (no per-message copies)."""
    data = _PAYLOADS.get(size)
    if data is None:
        block = os.urandom(1 << 16)
        data = _PAYLOADS[size] = (block * (size // len(block) + 1))[:size]
    return data


def transport_config(backend: str, packet: int, kind: str) -> TransportConfig:
    """The configuration of ``kind``: ``aqueduct`` (the default engine configuration, flow
    control negotiated), ``aqueduct-noflow`` (flow control off on both sides),
    ``aqueduct-wNm`` (a receive window of N MiB, as a receiver sized to its traffic
    advertises: the Spark client uses 16 MiB), ``bare`` (the transport defaults)."""
    if kind == "aqueduct-noflow":
        engine = EngineConfig(flow_window=None)
    elif kind.startswith("aqueduct-w") and kind.endswith("m"):
        engine = EngineConfig(flow_window=int(kind[len("aqueduct-w") : -1]) << 20)
    else:
        engine = EngineConfig()
    return TransportConfig(backend=backend, packet_size=packet, engine=engine)  # type: ignore[arg-type]


def run(main: Any) -> Any:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)


def cpu_of(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (all threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# -- the bare QUIC stream ------------------------------------------------------------------


def bare_protocols(backend: Backend, config: TransportConfig) -> tuple[type, type]:
    """(server, client) protocol classes of the bare benchmark for ``backend``."""
    ev = backend.events
    is_aioquic = backend.name == "aioquic"
    high_water = config.stream_high_water
    base: Any = backend.QuicConnectionProtocol

    class BareServer(base):  # type: ignore[misc]
        """Answers ``size count`` on a client stream with ``count`` x ``size`` bytes on a
        new unidirectional stream, fed exactly as the Aqueduct adapter feeds a stream: at
        most ``stream_high_water`` bytes in the library, topped up on every transmit."""

        def __init__(self, quic: Any, stream_handler: Any = None) -> None:
            if is_aioquic:
                apply_aioquic(quic, pacing=False)
            super().__init__(quic, stream_handler)
            self.sid: int | None = None
            self.queue: deque[tuple[memoryview, bool]] = deque()

        def quic_event_received(self, event: Any) -> None:
            if type(event) is ev.StreamDataReceived and event.end_stream and self.sid is None:
                size, count = map(int, event.data.split())
                quic = self._quic
                if is_aioquic:
                    self.sid = quic.get_next_available_stream_id(is_unidirectional=True)
                else:
                    self.sid = quic._open_stream(is_unidirectional=True)
                view = memoryview(payload(size))
                self.queue.extend((view, i == count - 1) for i in range(count))
                self.feed()
                self._transmit_soon()

        def backlog(self, sid: int) -> int:
            quic = self._quic
            if is_aioquic:
                stream = quic._streams.get(sid)
                if stream is None:
                    return 0
                return int(stream.sender._buffer_stop - stream.sender._buffer_start)
            return int(quic.get_send_buffer_size(sid))

        def feed(self) -> None:
            sid, queue = self.sid, self.queue
            if sid is None or not queue:
                return
            room = high_water - self.backlog(sid)
            quic = self._quic
            while queue and room > 0:
                view, fin = queue[0]
                if len(view) <= room:
                    queue.popleft()
                    quic.send_stream_data(sid, view, end_stream=fin)
                    room -= len(view)
                else:
                    queue[0] = (view[room:], fin)
                    quic.send_stream_data(sid, view[:room], end_stream=False)
                    room = 0

        def transmit(self) -> None:
            if self.queue:
                self.feed()
            super().transmit()

    class BareClient(base):  # type: ignore[misc]
        def __init__(self, quic: Any, stream_handler: Any = None) -> None:
            if is_aioquic:
                apply_aioquic(quic, pacing=False)
            super().__init__(quic, stream_handler)
            self.received = 0
            self.done: asyncio.Future[None] = self._loop.create_future()

        def quic_event_received(self, event: Any) -> None:
            if type(event) is ev.StreamDataReceived and event.stream_id % 4 == 3:
                self.received += len(event.data)
                if event.end_stream and not self.done.done():
                    self.done.set_result(None)
            elif type(event) is ev.ConnectionTerminated and not self.done.done():
                self.done.set_exception(ConnectionError(str(event.reason_phrase)))

    return BareServer, BareClient


async def bare_serve(backend: Backend, config: TransportConfig, tls: ServerTLS) -> int:
    loop = asyncio.get_running_loop()
    qc = _quic_config(backend, config, False, HOST)
    qc.load_cert_chain(tls.certfile, tls.keyfile)
    server_cls, _ = bare_protocols(backend, config)
    sock = udp_socket(HOST, 0, config.socket_buffer)
    await loop.create_datagram_endpoint(
        lambda: backend.QuicServer(configuration=qc, create_protocol=server_cls), sock=sock
    )
    return int(sock.getsockname()[1])


async def bare_fetch(
    backend: Backend, config: TransportConfig, cafile: str, port: int, size: int, count: int
) -> tuple[int, float]:
    loop = asyncio.get_running_loop()
    qc = _quic_config(backend, config, True, HOST)
    qc.server_name = HOST
    qc.load_verify_locations(cafile=cafile)
    _, client_cls = bare_protocols(backend, config)
    sock = udp_socket("0.0.0.0", 0, config.socket_buffer)
    quic = backend.QuicConnection(configuration=qc)
    transport, proto = await loop.create_datagram_endpoint(lambda: client_cls(quic), sock=sock)
    try:
        proto.connect((HOST, port))
        await asyncio.wait_for(proto.wait_connected(), 10)
        start = time.perf_counter()
        if backend.name == "aioquic":
            sid = quic.get_next_available_stream_id(is_unidirectional=True)
        else:
            sid = quic._open_stream(is_unidirectional=True)
        quic.send_stream_data(sid, f"{size} {count}".encode(), end_stream=True)
        proto.transmit()
        await asyncio.wait_for(proto.done, 120)
        elapsed = time.perf_counter() - start
        quic.close(error_code=0, reason_phrase="done")
        proto.transmit()
        return proto.received, elapsed
    finally:
        transport.close()


# -- Aqueduct ------------------------------------------------------------------------------


async def aqueduct_serve(config: TransportConfig, tls: ServerTLS) -> int:
    async def handler(conn: Any, requests: Any) -> None:
        async for request in requests:
            data = payload(request["size"])
            async with request["out"] as out:
                for _ in range(request["count"]):
                    await out.send(data)
        await conn.wait_closed()

    server = await serve(handler, HOST, 0, tls=tls, config=config)
    return server.port


async def aqueduct_fetch(
    config: TransportConfig, cafile: str, port: int, size: int, count: int
) -> tuple[int, float]:
    conn = await connect(HOST, port, tls=ClientTLS(cafile=cafile), config=config)
    try:
        tx, rx = channel(codec="raw")
        start = time.perf_counter()
        await conn.entrypoint.send({"size": size, "count": count, "out": tx})
        received = 0
        async for message in rx:
            received += len(message)
        return received, time.perf_counter() - start
    finally:
        await conn.close()


# -- roles ---------------------------------------------------------------------------------


def server_main(backend_name: str, packet: int, certdir: str, kinds: list[str]) -> None:
    async def main() -> None:
        backend = load(backend_name)
        tls = ServerTLS(f"{certdir}/server.pem", f"{certdir}/server.key")
        ports = {}
        for kind in kinds:
            config = transport_config(backend_name, packet, kind)
            if kind == "bare":
                ports[kind] = await bare_serve(backend, config, tls)
            else:
                ports[kind] = await aqueduct_serve(config, tls)
        print("READY " + json.dumps({"ports": ports, "pid": os.getpid()}), flush=True)
        # Serve until the parent closes our stdin.
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, sys.stdin.read)

    run(main())


def client_main(
    backend_name: str, packet: int, certdir: str, ports: dict[str, int], pid: int, plan: Any
) -> None:
    cafile = f"{certdir}/ca.pem"

    async def measure(kind: str, size: int, count: int) -> dict[str, float]:
        backend = load(backend_name)
        config = transport_config(backend_name, packet, kind)
        c0, s0 = time.process_time(), cpu_of(pid)
        if kind == "bare":
            nbytes, elapsed = await bare_fetch(backend, config, cafile, ports[kind], size, count)
        else:
            nbytes, elapsed = await aqueduct_fetch(config, cafile, ports[kind], size, count)
        c1, s1 = time.process_time(), cpu_of(pid)
        if nbytes != size * count:
            raise RuntimeError(f"{kind}: received {nbytes} bytes, expected {size * count}")
        gb = nbytes / 1e9
        return {
            "MBps": nbytes / elapsed / 1e6,
            "seconds": elapsed,
            "client_cpu_s_per_GB": (c1 - c0) / gb,
            "server_cpu_s_per_GB": (s1 - s0) / gb,
        }

    async def main() -> list[dict[str, Any]]:
        samples = []
        # Warm up both paths once (imports, first handshake, caches).
        for kind in plan["kinds"]:
            await measure(kind, 1 << 20, 4)
        for rep in range(plan["repeat"]):
            for size in plan["sizes"]:
                count = max(1, plan["bytes"] // size)
                for kind in plan["kinds"]:
                    result = await measure(kind, size, count)
                    samples.append({"kind": kind, "size": size, "rep": rep, **result})
        return samples

    samples = run(main())
    print("RESULT " + json.dumps(samples), flush=True)


def pin(cpu: int | None) -> None:
    if cpu is not None and hasattr(os, "sched_setaffinity"):
        with contextlib.suppress(OSError):
            os.sched_setaffinity(0, {cpu % (os.cpu_count() or 1)})


if __name__ == "__main__":
    role, backend_arg, packet_arg, certdir_arg = sys.argv[1:5]
    cpu_arg = os.environ.get("BENCH_PIN_CPU")
    pin(int(cpu_arg) if cpu_arg else None)
    if role == "server":
        server_main(backend_arg, int(packet_arg), certdir_arg, json.loads(sys.argv[5]))
    else:
        client_main(
            backend_arg,
            int(packet_arg),
            certdir_arg,
            json.loads(sys.argv[5]),
            int(sys.argv[6]),
            json.loads(sys.argv[7]),
        )
