"""Aqueduct over TLS/TCP on loopback: hostile peers, faults, unreliable channels, and the
QUIC/TCP race (issue 15's acceptance). Real TLS over real TCP; the hostile peers are raw TLS
sockets that speak the multiplexer's wire format (profile §7) by hand.

Every fault test checks three things a user would notice: the offending connection ends with
a clear code, a client connected before the fault keeps working, and a new client is served.
"""

from __future__ import annotations

import asyncio
import gc
import socket
import ssl
import struct
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from aqueduct_core import ClientTLS, ConnectError, Connection, TransportConfig, connect, serve
from aqueduct_core.api import channel, oneshot
from aqueduct_core.api.channel import DEFAULT_MAXSIZE
from aqueduct_core.engine import EngineConfig
from aqueduct_core.errors import CloseCode, ConnectionLost
from aqueduct_core.transport import Refused, Server, dial
from aqueduct_core.transport.mux_wire import (
    ALPN,
    FrameType,
    MuxSettings,
    TcpSettings,
    encode_frame,
    encode_settings,
)

pytestmark = pytest.mark.quic
TCP = TransportConfig(transport="tcp")


def run(coro: Any, timeout: float = 60) -> Any:
    return asyncio.run(asyncio.wait_for(coro, timeout))


async def echo(conn: Connection, rx: Any) -> None:
    """A server handler: answers {"n": x, "reply": oneshot} with x + 1; streams on request."""
    async for req in rx:
        if "stream" in req:
            async with req["stream"] as out:
                for _ in range(req["count"]):
                    await out.send(b"\xab" * req["size"])
        else:
            req["reply"].send(req["n"] + 1)


async def rpc(conn: Connection, n: int = 1) -> int:
    reply, answer = oneshot()
    await conn.entrypoint.send({"n": n, "reply": reply})
    return int(await asyncio.wait_for(answer, 10))


@asynccontextmanager
async def tcp_server(config: TransportConfig = TCP, **kw: Any) -> AsyncIterator[Server]:
    server = await serve(echo, transport="tcp", config=config, **kw)
    try:
        yield server
    finally:
        await server.close()


class RawPeer:
    """A TLS client that speaks the mux by hand."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, port: int, alpn: str = ALPN, settings: bool = True) -> RawPeer:
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        ctx.set_alpn_protocols([alpn])
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ctx)
        peer = cls(reader, writer)
        if settings:
            peer.send(encode_settings({1: 1 << 20, 2: 1 << 20, 3: 100, 4: 65536}))
        return peer

    def send(self, data: bytes) -> None:
        self.writer.write(data)

    async def frames(self, until: int, timeout: float = 10) -> list[tuple[int, int, bytes]]:
        """Frames the server sends, up to (including) the first of type ``until``."""
        out = []
        while True:
            head = await asyncio.wait_for(self.reader.readexactly(6), timeout)
            ftype, flags, length = struct.unpack(">BBI", head)
            body = await asyncio.wait_for(self.reader.readexactly(length), timeout)
            out.append((ftype, flags, body))
            if ftype == until:
                return out

    async def close_frame(self) -> tuple[int, str]:
        frames = await self.frames(FrameType.CLOSE)
        body = frames[-1][2]
        # After CLOSE the server closes the connection.
        assert await asyncio.wait_for(self.reader.read(), 10) == b""
        self.writer.close()
        return struct.unpack(">Q", body[:8])[0], body[8:].decode()

    def abort(self) -> None:
        self.writer.transport.abort()


async def still_serving(server: Server, earlier: Connection) -> None:
    """The client connected before the fault and a new one are both served."""
    assert await rpc(earlier, 41) == 42
    fresh = await connect("127.0.0.1", server.port, tls=server.client_tls(), transport="tcp")
    try:
        assert await rpc(fresh, 1) == 2
    finally:
        await fresh.close()


# -- the basics ---------------------------------------------------------------------------


def test_rpc_and_a_large_stream_over_tcp_with_nagle_off() -> None:
    async def main() -> None:
        async with tcp_server() as server:
            conn = await connect("127.0.0.1", server.port, tls=server.client_tls(), config=TCP)
            assert conn.transport == "tcp"
            server_conn = next(iter(server.connections))
            assert server_conn.transport == "tcp"
            sock = conn._driver._transport.get_extra_info("socket")  # type: ignore[union-attr]
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
            assert await rpc(conn, 9) == 10
            tx, rx = channel(codec="raw")
            await conn.entrypoint.send({"stream": tx, "count": 12, "size": 3_000_001})
            sizes = [len(m) async for m in rx]
            assert sizes == [3_000_001] * 12
            await conn.close()

    run(main())


def test_tls_is_checked_like_quic() -> None:
    async def main() -> None:
        async with tcp_server() as server:
            wrong = ClientTLS(fingerprint="00" * 32)
            with pytest.raises(ConnectError, match="fingerprint"):
                await connect("127.0.0.1", server.port, tls=wrong, transport="tcp")
            assert server.ca_file is not None
            conn = await connect(
                "127.0.0.1", server.port, tls=ClientTLS(cafile=server.ca_file), transport="tcp"
            )
            assert await rpc(conn) == 2
            with pytest.raises(ConnectError, match="certificate"):
                await connect("127.0.0.1", server.port, tls=ClientTLS(), transport="tcp")
            # Another ALPN (or a TLS client that offers none) is refused in the handshake
            # (tests/core/test_tcp_profile.py has the details).
            with pytest.raises(ssl.SSLError, match="no application protocol"):
                await RawPeer.open(server.port, alpn="h2", settings=False)
            await still_serving(server, conn)
            await conn.close()

    run(main())


def test_a_pinned_client_skips_the_system_ca_store() -> None:
    """A pin consults no CA: loading the system store would only cost every connection (and
    every Spark task) tens of milliseconds. Verification by CA still loads it."""
    from aqueduct_core.transport.tcp import client_context

    pinned = client_context(ClientTLS(fingerprint="ab" * 32), "h")
    assert pinned.cert_store_stats()["x509_ca"] == 0
    assert pinned.verify_mode == ssl.CERT_NONE and not pinned.check_hostname
    assert pinned.minimum_version == ssl.TLSVersion.TLSv1_3
    system = client_context(ClientTLS(), "h")
    assert system.verify_mode == ssl.CERT_REQUIRED and system.check_hostname
    # Nor is cryptography imported for it (0.1-0.2 s in each of Spark's planning processes).
    probe = (
        "import sys; from aqueduct_core.transport.tcp import client_context;"
        "from aqueduct_core import ClientTLS; client_context(ClientTLS(fingerprint='ab' * 32), 'h');"
        "print(any(m.startswith('cryptography') for m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# -- hostile peers and faults -------------------------------------------------------------


@pytest.mark.parametrize(
    ("garbage", "code", "words"),
    [
        (encode_frame(0x7F, 0, b"zz"), CloseCode.PROTOCOL_VIOLATION, "unknown frame type"),
        (encode_frame(FrameType.PING, 0x80, bytes(8)), CloseCode.PROTOCOL_VIOLATION, "flags"),
        (
            encode_frame(FrameType.STREAM, 0, struct.pack(">Q", 3) + b"x"),
            CloseCode.PROTOCOL_VIOLATION,
            "not the peer's",
        ),
        (struct.pack(">BBI", FrameType.STREAM, 0, 50 << 20), CloseCode.LIMIT_VIOLATION, "limit"),
    ],
)
def test_malformed_frames_close_only_that_connection(garbage: bytes, code: int, words: str) -> None:
    async def main() -> None:
        async with tcp_server() as server:
            good = await connect("127.0.0.1", server.port, tls=server.client_tls(), config=TCP)
            peer = await RawPeer.open(server.port)
            peer.send(garbage)
            got_code, reason = await peer.close_frame()
            assert got_code == code and words in reason
            await still_serving(server, good)
            await good.close()

    run(main())


def test_frames_before_settings_are_refused() -> None:
    async def main() -> None:
        async with tcp_server() as server:
            peer = await RawPeer.open(server.port, settings=False)
            peer.send(encode_frame(FrameType.DATAGRAM, 0, b"hi"))
            got_code, reason = await peer.close_frame()
            assert got_code == CloseCode.PROTOCOL_VIOLATION and "before SETTINGS" in reason

    run(main())


def test_a_credit_violation_closes_with_limit_violation() -> None:
    config = TCP.with_(tcp=TcpSettings(mux=MuxSettings(initial_stream_credit=65536)))

    async def main() -> None:
        async with tcp_server(config) as server:
            good = await connect("127.0.0.1", server.port, tls=server.client_tls(), config=TCP)
            peer = await RawPeer.open(server.port)
            frames = await peer.frames(FrameType.SETTINGS)
            assert struct.pack(">HQ", 2, 65536) in frames[-1][2]  # the server's credit
            body = struct.pack(">Q", 2) + b"v" * 65537
            peer.send(encode_frame(FrameType.STREAM, 0, body))
            got_code, reason = await peer.close_frame()
            assert got_code == CloseCode.LIMIT_VIOLATION and "credit" in reason
            await still_serving(server, good)
            await good.close()

    run(main())


def test_a_corrupted_tls_record_gets_the_tls_alert_and_ends_only_that_connection() -> None:
    """A client completes TLS by hand, then sends a record that fails its MAC: it gets the
    bad_record_mac alert (TLS's own, no CLOSE frame can follow it), its connection ends as
    lost, and the server serves the rest."""

    async def main() -> None:
        async with tcp_server() as server:
            good = await connect("127.0.0.1", server.port, tls=server.client_tls(), config=TCP)
            before = set(server.connections)
            ctx = ssl.create_default_context()
            ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
            ctx.set_alpn_protocols([ALPN])
            incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
            tls = ctx.wrap_bio(incoming, outgoing, server_hostname="localhost")
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            while True:
                try:
                    tls.do_handshake()
                    break
                except ssl.SSLWantReadError:
                    writer.write(outgoing.read())
                    incoming.write(await asyncio.wait_for(reader.read(65536), 10))
            writer.write(outgoing.read() + bytes.fromhex("17 0303 0020") + bytes(32))
            incoming.write(await asyncio.wait_for(reader.read(), 10))  # until the server's FIN
            writer.close()
            with pytest.raises(ssl.SSLError, match="bad record mac"):
                while True:
                    tls.read(65536)  # the server's SETTINGS, then the alert
            [cut] = set(server.connections) - before
            await asyncio.wait_for(cut.wait_closed(), 10)
            await still_serving(server, good)
            await good.close()

    run(main())


def test_a_connection_cut_mid_message_ends_only_that_connection() -> None:
    """A raw peer opens a stream, sends half of a frame it announced, and cuts TCP (no TLS
    close, no CLOSE frame): the server ends that connection and serves the rest."""

    async def main() -> None:
        async with tcp_server() as server:
            good = await connect("127.0.0.1", server.port, tls=server.client_tls(), config=TCP)
            before = set(server.connections)
            peer = await RawPeer.open(server.port)
            await peer.frames(FrameType.SETTINGS)
            peer.send(struct.pack(">BBIQ", FrameType.STREAM, 0, 8 + 100_000, 2) + b"m" * 500)
            await peer.writer.drain()
            [cut] = set(server.connections) - before
            peer.abort()
            await asyncio.wait_for(cut.wait_closed(), 10)
            assert not good.is_closed
            await still_serving(server, good)
            await good.close()

    run(main())


def test_a_server_cut_mid_message_gives_the_client_connection_lost() -> None:
    """The client's view: its server dies while a large message is on its way. Every handle
    ends with ConnectionLost naming the TCP close, nothing hangs."""

    async def main() -> None:
        started = asyncio.Event()

        async def handler(conn: Connection, rx: Any) -> None:
            req = await rx.recv()
            await req["out"].send(b"\x01" * 20_000_000)
            started.set()
            await asyncio.sleep(30)

        server = await serve(handler, transport="tcp")
        conn = await connect("127.0.0.1", server.port, tls=server.client_tls(), transport="tcp")
        tx, rx = channel(codec="raw")
        await conn.entrypoint.send({"out": tx})
        await asyncio.wait_for(started.wait(), 10)
        for c in list(server.connections):
            c._driver._transport.abort()  # type: ignore[union-attr]
        with pytest.raises(ConnectionLost, match="TCP connection closed"):
            await asyncio.wait_for(rx.recv(), 10)
        await conn.wait_closed()
        await server.close()

    run(main())


def test_a_peer_that_stops_reading_is_closed_and_memory_stays_bounded(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A client asks for 200 MB and stops reading its socket. The server's senders pause at
    the send budget (memory bounded), its heartbeat goes unanswered, and after the idle
    timeout the connection closes with code 6; another client is served throughout."""
    budget = 2 << 20
    mux = MuxSettings(idle_timeout=2.0, ping_interval=0.3)
    config = TCP.with_(send_budget=budget, tcp=TcpSettings(mux=mux))

    async def main() -> None:
        async with tcp_server(config) as server:
            good = await connect("127.0.0.1", server.port, tls=server.client_tls(), config=TCP)
            greedy = await connect("127.0.0.1", server.port, tls=server.client_tls(), config=TCP)
            tx, _rx = channel(codec="raw")
            greedy._driver._transport.pause_reading()  # type: ignore[union-attr]
            await greedy.entrypoint.send({"stream": tx, "count": 200, "size": 1_000_000})
            stalled = [c for c in server.connections if c is not None]
            t0 = time.monotonic()
            peak = 0
            while time.monotonic() - t0 < 30:
                for c in stalled:
                    peak = max(peak, c.memory().total)
                if any(c.is_closed for c in stalled):
                    break
                assert await rpc(good, 5) == 6
                await asyncio.sleep(0.1)
            closed = [c for c in stalled if c.is_closed]
            assert len(closed) == 1, "the stalled connection was not closed"
            # Here the stalled peer is our own client, which (reading nothing) times out too;
            # whichever side notices first, the connection ends with code 6.
            assert "closed: nothing received" in caplog.text or "unanswered" in caplog.text
            # Bounded: the sender's queue (DEFAULT_MAXSIZE messages), the transport budget
            # (mux + event loop) and the message being written.
            assert peak <= DEFAULT_MAXSIZE * 1_000_000 + budget + 2 * 1_000_000
            await still_serving(server, good)
            await good.close()
            await greedy.close()

    run(main())


def test_a_peer_that_sends_but_never_reads_is_closed_by_the_heartbeat(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A raw peer keeps sending PINGs (so the server never sees silence) but reads nothing:
    the server's own PING goes unanswered and the connection closes after the idle timeout."""
    mux = MuxSettings(idle_timeout=1.5, ping_interval=0.2)
    config = TCP.with_(tcp=TcpSettings(mux=mux))

    async def main() -> None:
        async with tcp_server(config) as server:
            good = await connect("127.0.0.1", server.port, tls=server.client_tls(), config=TCP)
            before = set(server.connections)
            peer = await RawPeer.open(server.port)
            for _ in range(100):
                if set(server.connections) - before:
                    break
                await asyncio.sleep(0.05)
            [rude] = set(server.connections) - before
            for _ in range(100):
                if rude.is_closed:
                    break
                peer.send(encode_frame(FrameType.PING, 0, b"12345678"))
                await asyncio.sleep(0.1)
            assert rude.is_closed
            assert "PING unanswered for 1.5 s" in caplog.text
            peer.abort()
            await still_serving(server, good)
            await good.close()

    run(main())


def test_the_idle_timeout_of_the_transport_config_applies_over_tcp() -> None:
    """``TransportConfig.idle_timeout`` (the Spark option idleTimeout) bounds the TCP
    connection too: a client that hears nothing for 1 s ends it with code 6."""

    async def main() -> None:
        async with tcp_server() as server:
            config = TCP.with_(idle_timeout=1.0)
            conn = await connect("127.0.0.1", server.port, tls=server.client_tls(), config=config)
            conn._driver._transport.pause_reading()  # type: ignore[union-attr]
            t0 = time.monotonic()
            await asyncio.wait_for(conn.wait_closed(), 10)
            assert time.monotonic() - t0 < 5
            with pytest.raises(ConnectionLost, match="code 6"):
                await conn.entrypoint.send({"n": 1})

    run(main())


def test_server_close_reaches_tcp_clients_with_code_0() -> None:
    async def main() -> None:
        server = await serve(echo, transport="tcp")
        conn = await connect("127.0.0.1", server.port, tls=server.client_tls(), transport="tcp")
        assert await rpc(conn) == 2
        await server.close()
        await asyncio.wait_for(conn.wait_closed(), 10)
        with pytest.raises(ConnectionLost, match=r"server shutting down \(close code 0\)"):
            await conn.entrypoint.send({"n": 1})

    run(main())


def test_close_returns_with_the_socket_closed_even_when_the_server_is_slow() -> None:
    """Closing TLS is a round trip (our close_notify, then the server's), so the socket
    outlives the engine; close() waits for it, at most CLOSE_GRACE when the server does not
    answer. asyncio.run() right after close() then leaks no socket: before, under load, an
    'unclosed <socket.socket>' ResourceWarning surfaced in whichever later test the garbage
    collector ran (an error there, with filterwarnings=error)."""
    started, stall = threading.Event(), threading.Event()
    box: dict[str, Any] = {}

    def server_thread() -> None:
        async def main() -> None:
            box["loop"], box["stop"] = asyncio.get_running_loop(), asyncio.Event()
            async with tcp_server() as server:
                box["server"] = server
                started.set()
                await box["stop"].wait()

        asyncio.run(main())

    thread = threading.Thread(target=server_thread, daemon=True)
    thread.start()
    assert started.wait(30)
    server, loop = box["server"], box["loop"]

    async def client() -> None:
        conn = await connect("127.0.0.1", server.port, tls=server.client_tls(), config=TCP)
        assert await rpc(conn) == 2
        loop.call_soon_threadsafe(stall.wait, 30)  # the server stops answering (a loaded host)
        await conn.close()

    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            run(client())
            gc.collect()  # a socket left open would be found here, with its warning
    finally:
        stall.set()
        loop.call_soon_threadsafe(box["stop"].set)
        thread.join(30)
    assert [str(w.message) for w in caught if w.category is ResourceWarning] == []


# -- unreliable channels ------------------------------------------------------------------


def test_unreliable_channels_keep_their_meaning_when_the_sender_drops_datagrams() -> None:
    """Profile §7: a datagram that was sent arrives; one the sender drops (its queue is
    bounded) is a lost message, nacked like a lost QUIC datagram. With the default queue all
    200 small unreliable messages arrive; with a queue of 0 bytes every one that went as a
    datagram is dropped: the channel still finishes, nothing hangs, and what arrives is an
    ordered subset of what was sent."""

    async def relay(conn: Connection, rx: Any) -> None:
        async for req in rx:
            async with req["back"] as back:
                async for v in req["relay"]:
                    await back.send(v)

    async def no_datagrams() -> list[int]:
        """A server that takes no datagrams (MAX_DATAGRAM 0): unreliable messages go on
        streams, so all arrive."""
        server_cfg = TCP.with_(tcp=TcpSettings(mux=MuxSettings(max_datagram=0)))
        server = await serve(relay, transport="tcp", config=server_cfg)
        try:
            conn = await connect("127.0.0.1", server.port, tls=server.client_tls(), config=TCP)
            up_tx, up_rx = channel()
            back_tx, back_rx = channel()
            up_tx.unreliable(maxsize=None)
            await conn.entrypoint.send({"relay": up_rx, "back": back_tx})
            for i in range(50):
                up_tx.send_nowait(i)
            up_tx.finish()
            got = [v async for v in back_rx]
            await conn.close()
            return got
        finally:
            await server.close()

    async def scenario(queue: int) -> list[int]:
        config = TCP.with_(tcp=TcpSettings(mux=MuxSettings(datagram_queue=queue)))
        server = await serve(relay, transport="tcp")
        try:
            conn = await connect("127.0.0.1", server.port, tls=server.client_tls(), config=config)
            up_tx, up_rx = channel()
            back_tx, back_rx = channel()
            up_tx.unreliable(maxsize=None)
            await conn.entrypoint.send({"relay": up_rx, "back": back_tx})
            for i in range(200):
                up_tx.send_nowait(i)
            up_tx.finish()
            got = [v async for v in back_rx]
            await conn.close()
            return got
        finally:
            await server.close()

    kept = run(scenario(256 * 1024))
    dropped = run(scenario(0))
    assert run(no_datagrams()) == list(range(50))
    assert kept == list(range(200))
    assert len(dropped) < 200
    assert dropped == sorted(dropped) and set(dropped) <= set(range(200))


# -- the race (issue 15 acceptance) -------------------------------------------------------


class Blackhole:
    """A UDP socket on the service's port that reads and never answers."""

    def __init__(self, port: int) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", port))
        self.sock.setblocking(False)
        self.packets = 0

    def drain(self) -> int:
        while True:
            try:
                self.sock.recv(65536)
            except BlockingIOError:
                return self.packets
            self.packets += 1

    def close(self) -> None:
        self.sock.close()


async def timed_connect(port: int, tls: ClientTLS, **kw: Any) -> tuple[Connection, float]:
    t0 = time.perf_counter()
    conn = await connect("127.0.0.1", port, tls=tls, **kw)
    return conn, time.perf_counter() - t0


@pytest.mark.parametrize("udp", ["blackholed", "refused"])
def test_auto_falls_back_to_tcp_and_later_connections_pay_nothing(
    udp: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """UDP blackholed (a socket on the port that never answers) or refused (nothing bound:
    ICMP port unreachable): ``auto`` connects over TCP, paying the race delay (at most 1 s
    more than TCP alone) on the first connection, and later connections in the process make
    no QUIC attempt at all. A dataset-style read over the connection succeeds. The service
    is on loopback, taken for another machine's (on this one, the race has no timer)."""
    monkeypatch.delenv("AQUEDUCT_TRANSPORT", raising=False)
    monkeypatch.setattr(dial, "_same_host", elsewhere)

    async def main() -> None:
        async with tcp_server() as server:
            hole = Blackhole(server.port) if udp == "blackholed" else None
            try:
                tls = server.client_tls()
                direct, t_tcp = await timed_connect(server.port, tls, transport="tcp")
                await direct.close()
                dial.forget()
                first, t_first = await timed_connect(server.port, tls)
                assert first.transport == "tcp"
                assert t_first - t_tcp <= 1.0, f"first connection paid {t_first - t_tcp:.2f} s"
                tx, rx = channel(codec="raw")
                await first.entrypoint.send({"stream": tx, "count": 4, "size": 1_000_000})
                assert [len(m) async for m in rx] == [1_000_000] * 4
                if hole is not None:
                    assert hole.drain() > 0  # QUIC did try first
                seen = hole.drain() if hole is not None else 0
                for _ in range(3):
                    later, _t = await timed_connect(server.port, tls)
                    assert later.transport == "tcp" and await rpc(later) == 2
                    await later.close()
                if hole is not None:
                    await asyncio.sleep(0.2)
                    assert hole.drain() == seen, "a later connection tried QUIC again"
                await first.close()
            finally:
                if hole is not None:
                    hole.close()
                dial.forget()

    run(main())


async def elsewhere(host: str, port: int) -> bool:
    """``dial._same_host`` for tests of the race on loopback: as if on another machine."""
    return False


def test_on_this_machine_quic_wins_and_tcp_is_never_tried(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Loopback, with no race delay at all: QUIC, however long its handshake takes on a loaded
    machine, and no TCP attempt (which would write a connection's lines to a service's log).
    Was: TCP started with the timer and won 2 of 4 ``aqueduct status`` runs under load."""
    monkeypatch.delenv("AQUEDUCT_TRANSPORT", raising=False)
    config = TransportConfig(tcp=TcpSettings(race_delay=0.0))

    async def main() -> None:
        server = await serve(echo)
        try:
            for host in ("127.0.0.1", "localhost"):
                for _ in range(3):
                    dial.forget()
                    conn = await connect(host, server.port, tls=server.client_tls(), config=config)
                    assert conn.transport == "quic" and await rpc(conn) == 2
                    await conn.close()
            assert {c.transport for c in server.connections} <= {"quic"}
            assert await dial._same_host("localhost", server.port)
            assert not await dial._same_host("192.0.2.1", server.port)  # TEST-NET-1
        finally:
            await server.close()
            dial.forget()

    run(main())


def test_auto_prefers_quic_when_it_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AQUEDUCT_TRANSPORT", raising=False)
    # A long race delay: QUIC must win however loaded the machine is.
    config = TransportConfig(tcp=TcpSettings(race_delay=10.0))

    async def main() -> None:
        server = await serve(echo)
        try:
            conn = await connect("127.0.0.1", server.port, tls=server.client_tls(), config=config)
            assert conn.transport == "quic" and dial.remembered("127.0.0.1", server.port) == "quic"
            assert {c.transport for c in server.connections} == {"quic"}
            assert await rpc(conn) == 2
            await conn.close()
            # Both listen on one port number: a TCP client is served too.
            tcp = await connect("127.0.0.1", server.port, tls=server.client_tls(), transport="tcp")
            assert await rpc(tcp) == 2
            await tcp.close()
        finally:
            await server.close()
            dial.forget()

    run(main())


def test_preferring_tcp_races_tcp_first_and_quic_when_tcp_is_not_there(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``prefer="tcp"`` (the dataset client's bulk lane): TCP wins against a service on both,
    with no QUIC attempt on this machine however loaded it is (the second transport starts
    only when the first fails). Against a service on QUIC only (TCP refused at once), QUIC
    wins at once; TCP is then remembered as lost for that service, so the next connection
    that prefers it goes straight to QUIC, and one that prefers QUIC is not affected."""
    monkeypatch.delenv("AQUEDUCT_TRANSPORT", raising=False)
    config = TransportConfig(tcp=TcpSettings(race_delay=0.0))

    async def main() -> None:
        both = await serve(echo)
        quic_only = await serve(echo, transport="quic")
        try:
            for _ in range(3):
                conn = await connect(
                    "127.0.0.1", both.port, tls=both.client_tls(), config=config, prefer="tcp"
                )
                assert conn.transport == "tcp" and await rpc(conn) == 2
                await conn.close()
            assert {c.transport for c in both.connections} <= {"tcp"}
            assert not dial.lost("127.0.0.1", both.port, "tcp")
            tls = quic_only.client_tls()
            conn, took = await timed_connect(quic_only.port, tls, config=config, prefer="tcp")
            assert conn.transport == "quic" and await rpc(conn) == 2 and took < 5.0
            assert dial.lost("127.0.0.1", quic_only.port, "tcp")
            await conn.close()
            again = await connect("127.0.0.1", quic_only.port, tls=tls, prefer="tcp")
            other = await connect("127.0.0.1", quic_only.port, tls=tls)
            assert again.transport == other.transport == "quic"
            assert not dial.lost("127.0.0.1", quic_only.port, "quic")
            await again.close()
            await other.close()
            with pytest.raises(ValueError, match="prefer must be quic or tcp"):
                await connect("127.0.0.1", both.port, tls=both.client_tls(), prefer="udp")
        finally:
            await both.close()
            await quic_only.close()
            dial.forget()

    run(main())


def test_the_race_leaves_only_the_winner(monkeypatch: pytest.MonkeyPatch) -> None:
    """With no race delay both attempts run every time (to a service taken for another
    machine's); whichever wins, the loser is cancelled or closed: the server ends up with
    exactly one live connection per client."""
    monkeypatch.delenv("AQUEDUCT_TRANSPORT", raising=False)
    monkeypatch.setattr(dial, "_same_host", elsewhere)
    config = TransportConfig(tcp=TcpSettings(race_delay=0.0))

    async def live(server: Server) -> list[Connection]:
        return [c for c in server.connections if not c.is_closed]

    async def main() -> None:
        server = await serve(echo)
        try:
            for _ in range(8):
                dial.forget()
                conn = await connect(
                    "127.0.0.1", server.port, tls=server.client_tls(), config=config
                )
                assert await rpc(conn) == 2
                for _ in range(100):
                    if len(await live(server)) == 1:
                        break
                    await asyncio.sleep(0.05)
                assert [c.transport for c in await live(server)] == [conn.transport]
                await conn.close()
                for _ in range(100):
                    if not await live(server):
                        break
                    await asyncio.sleep(0.05)
        finally:
            await server.close()
            dial.forget()

    run(main())


def test_the_environment_replaces_auto_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AQUEDUCT_TRANSPORT", "tcp")
    assert dial.resolve_transport(None, TransportConfig()) == "tcp"
    assert dial.resolve_transport("quic", TransportConfig()) == "quic"
    assert dial.resolve_transport(None, TransportConfig(transport="quic")) == "quic"
    monkeypatch.setenv("AQUEDUCT_TRANSPORT", "carrier-pigeon")
    with pytest.raises(ValueError, match="AQUEDUCT_TRANSPORT"):
        dial.resolve_transport(None, TransportConfig())
    with pytest.raises(ValueError, match="unknown transport"):
        dial.resolve_transport("udp", None)
    assert dial.listen_transports("quic,tcp", TransportConfig()) == {"quic", "tcp"}
    assert dial.listen_transports(None, TransportConfig()) == {"quic", "tcp"}
    with pytest.raises(ValueError):
        dial.listen_transports("", TransportConfig())

    async def main() -> None:
        async with tcp_server() as server:
            conn = await connect("127.0.0.1", server.port, tls=server.client_tls())
            assert conn.transport == "tcp"  # auto, replaced by the environment
            await conn.close()

    monkeypatch.setenv("AQUEDUCT_TRANSPORT", "tcp")
    run(main())


def test_nothing_listening_fails_fast_with_both_reasons(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AQUEDUCT_TRANSPORT", raising=False)
    config = TransportConfig(engine=EngineConfig(handshake_timeout=1.0))

    async def main() -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        with pytest.raises(Refused) as info:
            await connect("127.0.0.1", port, tls=ClientTLS(insecure=True), config=config)
        assert isinstance(info.value, ConnectError)
        message = str(info.value)
        assert "over QUIC (ICMP port unreachable) or TCP (connection refused)" in message
        assert "aqueduct serve" in message

    with pytest.warns(UserWarning, match="without verifying"):
        run(main())
