"""Profile §7 ("Aqueduct over TCP") point by point, against a real server over real TLS and
TCP on loopback. The client here is written from the profile's text: it speaks TLS with the
standard library and the multiplexer by hand, and sends the bytes the profile writes (the
alert records and the worked example are read out of docs/protocol-profile.md itself).

These are the five points an independent client found where text and service differed
(issue 26): the ALPN and TLS-version alerts, the SETTINGS deadline, MAX_STREAMS, when credit
and PINGs come, and the example, the order of the header checks and what a CLOSE reason may
hold. Timeouts are set short by configuration, so each test takes about a second.
"""

from __future__ import annotations

import asyncio
import itertools
import re
import ssl
import struct
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import Any

import pytest

from aqueduct_core import Connection, TransportConfig, connect, serve
from aqueduct_core.api import channel, oneshot
from aqueduct_core.engine import EngineConfig
from aqueduct_core.errors import CloseCode
from aqueduct_core.transport import Server
from aqueduct_core.transport.mux_wire import (
    ALPN,
    FLAG_ACK,
    FrameType,
    MuxSettings,
    TcpSettings,
    encode_frame,
    encode_settings,
)
from aqueduct_core.wire.frames import ConnectionHeaders, Version
from aqueduct_core.wire.frames import encode_frame as aqueduct_frame

pytestmark = pytest.mark.quic
TCP = TransportConfig(transport="tcp")
PROFILE = (Path(__file__).parents[2] / "docs" / "protocol-profile.md").read_text()
SECTION = PROFILE[PROFILE.index("## 7. Aqueduct over TCP") :]
HELLO = aqueduct_frame(Version()) + aqueduct_frame(ConnectionHeaders())
"""The engine's first sequence: VERSION, then CONNECTION_HEADERS with no headers."""


def run(coro: Any, timeout: float = 60) -> Any:
    return asyncio.run(asyncio.wait_for(coro, timeout))


def profile_record(alert: str) -> bytes:
    """The alert record the profile gives for ``alert`` (e.g. ``protocol_version``)."""
    found = re.search(rf"`{alert}`\s+\(\d+\), the record\s+`([0-9a-f ]+)`", SECTION)
    assert found, f"the profile names no record for {alert}"
    return bytes.fromhex(found.group(1))


async def echo(conn: Connection, rx: Any) -> None:
    """Answers {"n": x, "reply": oneshot} with x + 1; {"out": tx, "count": k} with k
    messages on tx; each request in its own task, so that many run at once."""

    async def one(req: Any) -> None:
        if "out" in req:
            async with req["out"] as out:
                for i in range(req["count"]):
                    await out.send(i)
                    await asyncio.sleep(req.get("pause", 0))
        else:
            req["reply"].send(req["n"] + 1)

    tasks = set()
    async for req in rx:
        task = asyncio.ensure_future(one(req))
        tasks.add(task)
        task.add_done_callback(tasks.discard)


@asynccontextmanager
async def tcp_server(config: TransportConfig = TCP) -> AsyncIterator[Server]:
    server = await serve(echo, transport="tcp", config=config)
    try:
        yield server
    finally:
        await server.close()


def client_context(alpn: list[str] | None = None, tls12: bool = False) -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    if alpn is not None:
        ctx.set_alpn_protocols(alpn)
    if tls12:
        ctx.maximum_version = ssl.TLSVersion.TLSv1_2
    return ctx


class Raw:
    """A TLS client that speaks the multiplexer by hand."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, port: int, settings: bytes | None = None) -> Raw:
        """Connect, complete TLS with ALPN aqueduct-tcp, send ``settings`` (a SETTINGS
        frame's bytes; None: none at all)."""
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", port, ssl=client_context([ALPN])
        )
        raw = cls(reader, writer)
        if settings is not None:
            raw.send(settings)
        return raw

    def send(self, data: bytes) -> None:
        self.writer.write(data)

    async def frame(self, timeout: float = 10) -> tuple[int, int, bytes] | None:
        """The next frame the server sends, or None when it closed the connection."""
        try:
            head = await asyncio.wait_for(self.reader.readexactly(6), timeout)
        except asyncio.IncompleteReadError as exc:
            assert exc.partial == b"", "the connection ended inside a frame header"
            return None
        ftype, flags, length = struct.unpack(">BBI", head)
        body = await asyncio.wait_for(self.reader.readexactly(length), timeout)
        return ftype, flags, body

    async def until(self, ftype: int, flags: int | None = None) -> list[tuple[int, int, bytes]]:
        """Frames up to and including the first of type ``ftype`` (and ``flags``)."""
        got = []
        while True:
            frame = await self.frame()
            assert frame is not None, f"closed before a frame of type {ftype}: {got}"
            got.append(frame)
            if frame[0] == ftype and (flags is None or frame[1] == flags):
                return got

    async def closed_with(self) -> tuple[int, str]:
        """The code and reason of the server's CLOSE; then the server ends TLS and TCP."""
        frames = await self.until(FrameType.CLOSE)
        body = frames[-1][2]
        assert await self.frame() is None  # nothing after CLOSE
        self.writer.close()
        with suppress(ConnectionError, ssl.SSLError):
            await self.writer.wait_closed()
        return struct.unpack(">Q", body[:8])[0], body[8:].decode()

    async def close(self) -> None:
        self.writer.transport.abort()


def frame_close(code: int, reason: bytes) -> bytes:
    return encode_frame(FrameType.CLOSE, 0, struct.pack(">Q", code) + reason)


# -- 1. the ClientHello: TLS 1.3 and ALPN aqueduct-tcp, or a fatal alert -------------------


async def answer_to_hello(port: int, ctx: ssl.SSLContext) -> bytes:
    """Every byte the server sends in answer to the ClientHello ``ctx`` makes, until it
    closes TCP (a reset instead of a close would raise here)."""
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = ctx.wrap_bio(incoming, outgoing, server_hostname="localhost")
    with suppress(ssl.SSLWantReadError):
        tls.do_handshake()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(outgoing.read())
    try:
        return await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()
        await writer.wait_closed()


def test_1_a_hello_without_tls13_or_without_the_alpn_gets_its_fatal_alert_and_nothing_else() -> (
    None
):
    """Profile §7, "Connection": no TLS 1.3 offered -> protocol_version (70); TLS 1.3
    without ``aqueduct-tcp`` in the ALPN list, or no ALPN at all -> no_application_protocol
    (120), as RFC 7301 §3.2 asks. Each is the one record the profile writes, instead of a
    ServerHello, then a clean close (FIN, not a reset). No Aqueduct connection is made for
    them, and the server goes on serving."""
    no_alpn = profile_record("no_application_protocol")
    tls12 = profile_record("protocol_version")
    assert no_alpn == bytes.fromhex("15 03 03 00 02 02 78")

    async def main() -> None:
        async with tcp_server() as server:
            good = await connect("127.0.0.1", server.port, tls=server.client_tls(), config=TCP)
            hellos = [
                (client_context(["h2"]), no_alpn),
                (client_context(None), no_alpn),
                (client_context(["aqueduct", "http/1.1"]), no_alpn),
                (client_context([ALPN], tls12=True), tls12),
                (client_context(["h2"], tls12=True), tls12),  # the version is checked first
            ]
            answers = await asyncio.gather(*(answer_to_hello(server.port, c) for c, _ in hellos))
            assert answers == [alert for _, alert in hellos]
            # What a TLS library makes of it:
            with pytest.raises(ssl.SSLError, match="no application protocol"):
                await asyncio.open_connection("127.0.0.1", server.port, ssl=client_context(None))
            with pytest.raises(ssl.SSLError, match="protocol version"):
                await asyncio.open_connection(
                    "127.0.0.1", server.port, ssl=client_context([ALPN], tls12=True)
                )
            assert len(server.connections) == 1  # only the good client's
            reply, answer = oneshot()
            await good.entrypoint.send({"n": 1, "reply": reply})
            assert await asyncio.wait_for(answer, 10) == 2
            await good.close()

    run(main())


def test_1_the_alpn_is_decided_before_the_first_flight_even_after_a_hello_retry() -> None:
    """The server refuses a missing ALPN by holding back its first flight (tls_stream.py):
    that must hold when the first flight is a HelloRetryRequest (a server preferring P-256
    asks a client that sent an X25519 key share for another hello). Sans-IO, in memory."""
    import tempfile

    from aqueduct_core.transport.tls import make_dev_certificates
    from aqueduct_core.transport.tls_stream import AlpnRefused, TlsStream, server_context

    with tempfile.TemporaryDirectory() as tmp:
        ctx = server_context(make_dev_certificates(tmp).server_tls)
    ctx.set_ecdh_curve("prime256v1")  # the client's default hello offers X25519: a retry

    def shake(alpn: list[str] | None) -> tuple[bytes, bool]:
        """What the server sent before it refused or completed, and whether it completed."""
        server = TlsStream(ctx, server_side=True)
        inc, out = ssl.MemoryBIO(), ssl.MemoryBIO()
        client = client_context(alpn).wrap_bio(inc, out, server_hostname="localhost")
        sent = b""
        for _ in range(4):
            with suppress(ssl.SSLWantReadError):
                client.do_handshake()
            server.receive(out.read())
            try:
                done = server.handshake()
            except AlpnRefused:
                return sent + server.outgoing(), False
            flight = server.outgoing()
            sent += flight
            inc.write(flight)
            if done:
                return sent, True
        raise AssertionError("no end to the handshake")

    sent, done = shake([ALPN])
    assert done and sent[5 + 4 + 2 : 5 + 4 + 2 + 32] == HELLO_RETRY_RANDOM  # it retried
    sent, done = shake(["h2"])
    assert not done and sent == profile_record("no_application_protocol")


HELLO_RETRY_RANDOM = bytes.fromhex(
    "cf21ad74e59a6111be1d8c021e65b891c2a211167abb8c5e079e09e2c8a8339c"
)
"""RFC 8446 §4.1.3: the random of a ServerHello that is a HelloRetryRequest."""


# -- 2. the handshake deadline covers TLS and SETTINGS, from the TCP connect ---------------


def test_2_settings_must_arrive_within_the_handshake_timeout_of_the_tcp_connect() -> None:
    """Profile §7, "The handshake deadline", with a 2 s handshake timeout: a client that
    waits 1 s before TLS and then sends nothing is closed with CLOSE code 4 about 1 s after
    TLS (2 s after its TCP connect, not 2 s after TLS); a TCP client that never starts TLS
    is closed at the same deadline, without a word; and one that sends SETTINGS but no
    CONNECTION_HEADERS is closed by the engine's own timer (code 4), 2 s later."""
    config = TCP.with_(engine=EngineConfig(handshake_timeout=2.0))

    async def silent_after_tls(port: int) -> tuple[float, float, int, str]:
        t0 = time.monotonic()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        await asyncio.sleep(1.0)
        await writer.start_tls(client_context([ALPN]))
        t1 = time.monotonic()
        raw = Raw(reader, writer)
        code, reason = await raw.closed_with()
        return t1 - t0, time.monotonic() - t0, code, reason

    async def silent_tcp(port: int) -> float:
        t0 = time.monotonic()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        assert await asyncio.wait_for(reader.read(), 10) == b""
        writer.close()
        return time.monotonic() - t0

    async def settings_only(port: int) -> tuple[float, int, str]:
        raw = await Raw.open(port, encode_settings({}))
        t0 = time.monotonic()
        code, reason = await raw.closed_with()
        return time.monotonic() - t0, code, reason

    async def main() -> None:
        async with tcp_server(config) as server:
            (
                (tls_at, closed_at, code, reason),
                tcp_closed,
                (after, code2, reason2),
            ) = await asyncio.gather(
                silent_after_tls(server.port),
                silent_tcp(server.port),
                settings_only(server.port),
            )
            assert code == CloseCode.HANDSHAKE_TIMEOUT
            assert "no SETTINGS from the peer within the handshake timeout (2 s)" in reason
            assert closed_at >= 1.95  # never before the deadline ...
            assert closed_at - tls_at < 1.6  # ... which counts from the TCP connect
            assert 1.95 <= tcp_closed < 6
            assert code2 == CloseCode.HANDSHAKE_TIMEOUT and "CONNECTION_HEADERS" in reason2
            assert 1.9 <= after < 6

    run(main())


def test_2_the_serve_flag_sets_the_handshake_deadline(tmp_path: Path) -> None:
    """``aqueduct serve --handshake-timeout 0.5``: a real service closes a client that
    completed TLS and sent nothing after half a second (the default would hold it 10 s)."""
    from aqueduct_spark.testing import start_service

    svc = start_service(tmp_path / "root", args=["--handshake-timeout", "0.5"])
    try:

        async def main() -> None:
            t0 = time.monotonic()
            raw = await Raw.open(svc.port)
            code, reason = await raw.closed_with()
            assert code == CloseCode.HANDSHAKE_TIMEOUT and "(0.5 s)" in reason
            assert time.monotonic() - t0 < 5

        run(main())
    finally:
        svc.stop()


# -- 3. MAX_STREAMS: at least 100 ----------------------------------------------------------


def test_3_max_streams_below_100_is_refused_and_100_carries_many_channels() -> None:
    """Profile §7, "Settings": MAX_STREAMS 1 (which stalled the service after its first
    reply) is refused at once, naming the range. At the minimum, 100, a client with 120
    channels the server streams into at once (an ORDERED stream each, held until the
    channel finishes) and 100 requests is served in full: the streams beyond the limit
    wait for others to end, and the open ones keep flowing meanwhile (they did not: a
    write to an open stream while another waited for a slot stayed queued, and with every
    slot taken the connection stalled for good)."""

    async def main() -> None:
        async with tcp_server() as server:
            raw = await Raw.open(server.port, encode_settings({3: 1}))
            code, reason = await raw.closed_with()
            assert code == CloseCode.PROTOCOL_VIOLATION
            assert "MAX_STREAMS 1 not in [100, 2^62-1]" in reason

            config = TCP.with_(tcp=TcpSettings(mux=MuxSettings(max_streams=100)))
            conn = await connect("127.0.0.1", server.port, tls=server.client_tls(), config=config)
            outs = []
            for _ in range(120):
                tx, rx = channel()
                await conn.entrypoint.send({"out": tx, "count": 3, "pause": 0.05})
                outs.append(rx)

            async def rpc(n: int) -> int:
                reply, answer = oneshot()
                await conn.entrypoint.send({"n": n, "reply": reply})
                return int(await answer)

            async def drain(rx: Any) -> list[int]:
                return [v async for v in rx]

            got = await asyncio.wait_for(
                asyncio.gather(*(rpc(n) for n in range(100)), *(drain(rx) for rx in outs)), 30
            )
            assert got[:100] == [n + 1 for n in range(100)]
            assert got[100:] == [[0, 1, 2]] * 120
            await conn.close()

    run(main())


# -- 4. when credit and PINGs come ---------------------------------------------------------


def test_4_credit_is_granted_when_at_most_half_remains() -> None:
    """Profile §7, "Credit", with INITIAL_STREAM_CREDIT 65536: 32767 bytes on a new
    stream leave 32769, more than half, and draw no CREDIT; one more byte leaves exactly
    half and draws a CREDIT of 32768. A PING after each shows it: its answer follows every
    CREDIT owed for the frames before it. (The bytes are the engine's first sequence, with a
    header padding it to 32768 bytes, since the engine reads them.)"""
    config = TCP.with_(tcp=TcpSettings(mux=MuxSettings(initial_stream_credit=65536)))
    padded = aqueduct_frame(Version()) + aqueduct_frame(
        ConnectionHeaders(((b"pad", b"x" * 32729),))
    )
    assert len(padded) == 32768

    def stream2(data: bytes) -> bytes:
        return encode_frame(FrameType.STREAM, 0, struct.pack(">Q", 2) + data)

    async def main() -> None:
        async with tcp_server(config) as server:
            raw = await Raw.open(server.port, encode_settings({}))
            [(_, _, settings)] = await raw.until(FrameType.SETTINGS)
            assert struct.pack(">HQ", 2, 65536) in settings
            raw.send(stream2(padded[:32767]) + encode_frame(FrameType.PING, 0, b"first..."))
            before = await raw.until(FrameType.PING, FLAG_ACK)
            assert [f for f in before if f[0] == FrameType.CREDIT] == []
            assert before[-1][2] == b"first..."
            raw.send(stream2(padded[32767:]) + encode_frame(FrameType.PING, 0, b"second.."))
            after = await raw.until(FrameType.PING, FLAG_ACK)
            credits = [body for ftype, _, body in after if ftype == FrameType.CREDIT]
            assert credits == [struct.pack(">QQ", 2, 32768)]
            assert after[-1][2] == b"second.."
            await raw.close()

    run(main())


def test_4_pings_come_at_a_regular_interval_when_answered() -> None:
    """Profile §7, "Heartbeats": with an idle timeout of 6 s and a PING interval of 0.2 s,
    a client that answers every PING at once sees one every 0.2 s (before, the gaps
    alternated between the interval and the idle timeout less it: 0.2 s, 5.8 s, ...)."""
    mux = MuxSettings(idle_timeout=6.0, ping_interval=0.2)
    config = TCP.with_(tcp=TcpSettings(mux=mux))

    async def main() -> None:
        async with tcp_server(config) as server:
            raw = await Raw.open(server.port, encode_settings({}))
            arrivals = []
            while len(arrivals) < 7:
                [*_, (_, flags, body)] = await raw.until(FrameType.PING)
                if flags & FLAG_ACK:
                    continue
                arrivals.append(time.monotonic())
                raw.send(encode_frame(FrameType.PING, FLAG_ACK, body))
            gaps = sorted(b - a for a, b in itertools.pairwise(arrivals))
            assert 0.15 < gaps[len(gaps) // 2] < 0.6, gaps
            assert gaps[-1] < 3.0, gaps
            await raw.close()

    run(main())


# -- 5. the worked example, the order of the checks, the CLOSE reason ----------------------


def example() -> list[tuple[str, bytes]]:
    """The worked example's lines: ("C" or "S", the bytes)."""
    block = SECTION[SECTION.index("**Example.**") :].split("```")[1]
    lines = [line.split(":", 1) for line in block.strip().splitlines()]
    return [(side.strip(), bytes.fromhex(hexed)) for side, hexed in lines]


def test_5_the_worked_example_is_what_the_server_does() -> None:
    """Profile §7, "Example": the client's bytes, sent as written (its STREAM after the
    server's SETTINGS), get the server's SETTINGS as written, the PING's answer as written,
    and an Aqueduct handshake answer on stream 3 (VERSION, ACK_VERSION, then the server's
    CONNECTION_HEADERS); the connection is then ready."""
    lines = example()
    assert [side for side, _ in lines] == ["C", "S", "C", "C", "S"]
    assert lines[2][1] == encode_frame(FrameType.STREAM, 1, struct.pack(">Q", 2) + HELLO)

    async def main() -> None:
        async with tcp_server() as server:
            raw = await Raw.open(server.port, lines[0][1])
            assert await raw.frame() == (FrameType.SETTINGS, 0, lines[1][1][6:])
            raw.send(lines[2][1] + lines[3][1])
            pong, stream3, fin = None, b"", False
            while pong is None or not fin:  # in either order
                frame = await raw.frame()
                assert frame is not None
                ftype, flags, body = frame
                if ftype == FrameType.PING:
                    pong = encode_frame(ftype, flags, body)
                elif ftype == FrameType.STREAM and body[:8] == struct.pack(">Q", 3):
                    stream3 += body[8:]
                    fin = bool(flags & 1)
            assert pong == lines[4][1]
            assert stream3.startswith(aqueduct_frame(Version()) + b"\x01\x02")
            [conn] = server.connections
            await asyncio.wait_for(conn.wait_ready(), 10)
            await raw.close()

    run(main())


PROTOCOL, LIMIT = CloseCode.PROTOCOL_VIOLATION, CloseCode.LIMIT_VIOLATION
HEADER_CASES = [
    # rule 1 (type) before rule 2 (SETTINGS first)
    (False, encode_frame(0x09, 0, b""), PROTOCOL, "unknown frame type"),
    (False, encode_frame(FrameType.PING, 0, bytes(8)), PROTOCOL, "PING before SETTINGS"),
    # rule 3 (flags) before rule 4 (length limits)
    (True, struct.pack(">BBI", FrameType.DATAGRAM, 0x80, 70_000), PROTOCOL, "flags 0x80"),
    # rule 4 (length limits) before rule 5 (the length fits the type)
    (False, struct.pack(">BBI", FrameType.SETTINGS, 0, 641), LIMIT, "SETTINGS frame too large"),
    (True, struct.pack(">BBI", FrameType.PING, 0, 2 << 20), LIMIT, "2097152 bytes, limit 1048576"),
    (True, struct.pack(">BBI", FrameType.DATAGRAM, 0, 65537), LIMIT, "65537 bytes, limit 65536"),
    # rule 5
    (True, encode_frame(FrameType.STREAM, 0, bytes(4)), PROTOCOL, "STREAM frame shorter than 8"),
    (True, encode_frame(FrameType.CREDIT, 0, bytes(17)), PROTOCOL, "CREDIT body of 17 bytes"),
]


@pytest.mark.parametrize(
    ("first", "frame", "code", "words"), HEADER_CASES, ids=[c[3] for c in HEADER_CASES]
)
def test_5_frame_headers_are_checked_in_the_profiles_order(
    first: bool, frame: bytes, code: int, words: str
) -> None:
    """Profile §7, "Checking a frame header": a header that breaks two rules closes with
    the code of the first. ``first``: the frame follows a valid SETTINGS. Only the header
    is sent: the server decides before it reads a body."""

    async def main() -> None:
        async with tcp_server() as server:
            raw = await Raw.open(server.port, encode_settings({}) if first else None)
            raw.send(frame)
            got_code, reason = await raw.closed_with()
            assert got_code == code and words in reason, (got_code, reason)

    run(main())


def test_5_a_close_reason_too_long_or_not_utf8_is_cut_and_mended_never_answered() -> None:
    """Profile §7, "Close": the receiver reports the first 1024 bytes of the reason,
    invalid UTF-8 replaced (here a stray 0xff and the half of an 'é' the cut leaves), and
    sends no frame after the peer's CLOSE; the code is reported as received (4711 is in no
    table)."""
    reason = b"\xff" + "é".encode() * 700

    async def main() -> None:
        async with tcp_server() as server:
            raw = await Raw.open(server.port, encode_settings({}))
            await raw.until(FrameType.SETTINGS)
            [conn] = server.connections
            raw.send(frame_close(4711, reason))
            assert await raw.frame() is None  # the server closed, sending no frame
            await raw.close()
            await asyncio.wait_for(conn.wait_closed(), 10)
            expected = "\ufffd" + "é" * 511 + "\ufffd"
            assert reason[:1024].decode("utf-8", "replace") == expected
            error = conn._close_error
            assert str(error).startswith(f"connection closed (code 4711: {expected})")

    run(main())
