"""Profile §8 (Aqueduct over WebTransport) against a real server over real QUIC on loopback.

The Python client of :mod:`aqueduct_core.transport.webtransport` runs channels, streams and
datagrams through a session; a hostile HTTP/3 client (aioquic's own ``H3Connection``, driven
by hand) attacks each limit. Every fault test checks what a user would notice: the offending
connection ends with a clear code, and a session opened before it keeps working.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import re
import ssl
import struct
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from aioquic.asyncio import connect as quic_connect
from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.buffer import encode_uint_var
from aioquic.h3.connection import H3Connection
from aioquic.h3.events import DataReceived, HeadersReceived
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.events import ConnectionTerminated, StopSendingReceived, StreamDataReceived
from cryptography.hazmat.primitives.asymmetric import ec

from aqueduct_core import ClientTLS, ConnectError, Connection, TransportConfig, connect, serve
from aqueduct_core.api import channel, oneshot
from aqueduct_core.engine import EngineConfig
from aqueduct_core.errors import CloseCode, ConnectionLost
from aqueduct_core.transport import Server
from aqueduct_core.transport.web_config import WebSettings
from aqueduct_core.transport.webtransport import close_capsule
from aqueduct_core.transport.wt_cert import LIFETIME, WebTransportCertificates, period_certificate
from aqueduct_core.wire.frames import ConnectionHeaders, Version, encode_frame

pytestmark = pytest.mark.quic
WEB = TransportConfig(web=WebSettings(webtransport=True))
PROFILE = (Path(__file__).parents[2] / "docs" / "protocol-profile.md").read_text()
SECTION = PROFILE[PROFILE.index("## 8. Aqueduct over WebTransport") :]
HELLO = encode_frame(Version()) + encode_frame(ConnectionHeaders())


def run(coro: Any, timeout: float = 60) -> Any:
    return asyncio.run(asyncio.wait_for(coro, timeout))


async def echo(conn: Connection, rx: Any) -> None:
    async for req in rx:
        if "out" in req:
            out = req["out"]
            if req.get("unreliable"):
                out.unreliable(maxsize=None)
            async with out:
                for i in range(req["count"]):
                    await out.send(req.get("blob", i))
        elif "close" in req:
            await conn.close(req["close"], "bye")
        else:
            req["reply"].send(req["n"] + 1)


@asynccontextmanager
async def web_server(config: TransportConfig = WEB) -> AsyncIterator[Server]:
    server = await serve(echo, config=config)
    try:
        yield server
    finally:
        await server.close()


async def session(server: Server, backend: str = "auto", **web: Any) -> Connection:
    tls = ClientTLS(fingerprint=server.webtransport_fingerprints[0])
    config = TransportConfig(backend=backend, web=WebSettings(**web))  # type: ignore[arg-type]
    return await connect("127.0.0.1", server.port, tls=tls, config=config, transport="webtransport")


async def ask(conn: Connection, n: int) -> int:
    reply, answer = oneshot()
    await conn.entrypoint.send({"n": n, "reply": reply})
    return int(await asyncio.wait_for(answer, 10))


def hex_block(after: str) -> str:
    """The code block of the profile's section that follows ``after``."""
    start = SECTION.index(after)
    found = re.search(r"```\n(.*?)```", SECTION[start:], flags=re.S)
    assert found is not None
    return found.group(1)


def annotated_bytes(block: str) -> bytes:
    """The bytes of an annotated block: each line's leading two-digit hex tokens."""
    out = []
    for line in block.splitlines():
        for token in line.split():
            if not re.fullmatch(r"[0-9a-f]{2}", token):
                break
            out.append(token)
    return bytes.fromhex(" ".join(out))


# -- the happy path -------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["aioquic", "qh3"])
def test_channels_streams_and_datagrams_run_through_a_session(backend: str) -> None:
    async def main() -> None:
        async with web_server() as server:
            conn = await session(server, backend)
            assert conn.transport == "webtransport"
            assert await ask(conn, 41) == 42
            tx, rx = channel()
            await conn.entrypoint.send({"out": tx, "count": 8, "blob": b"\xab" * 300_000})
            got = [m async for m in rx]
            assert got == [b"\xab" * 300_000] * 8
            tx, rx = channel()  # small unreliable messages travel as datagrams
            await conn.entrypoint.send({"out": tx, "count": 50, "unreliable": True})
            got = [m async for m in rx]
            assert 40 <= len(got) <= 50 and got == sorted(set(got))  # never duplicated
            native = await connect(
                "127.0.0.1", server.port, tls=server.client_tls(), transport="quic"
            )
            assert native.transport == "quic" and await ask(native, 1) == 2  # the same port
            await native.close()
            await conn.close()

    run(main())


def test_the_session_close_carries_the_code_and_reason_both_ways() -> None:
    async def main() -> None:
        async with web_server() as server:
            conn = await session(server)
            await conn.entrypoint.send({"close": CloseCode.LIMIT_VIOLATION})
            await asyncio.wait_for(conn.wait_closed(), 10)
            with pytest.raises(ConnectionLost, match=r"bye \(close code 3\)"):
                await ask(conn, 1)
            conn = await session(server)
            (served,) = [
                c for c in server.connections if c.transport == "webtransport" and not c.is_closed
            ]
            await conn.close(CloseCode.INTERNAL, "client gone")
            await asyncio.wait_for(served.wait_closed(), 10)
            assert served._close_error is not None and "code 5: client gone" in str(
                served._close_error
            )

    run(main())


def test_the_capsule_is_the_profiles() -> None:
    wire = annotated_bytes(hex_block("Code 3 with reason `bye`"))
    assert wire == b"\x00\x0a" + close_capsule(encode_uint_var, 3, "bye")
    long = close_capsule(encode_uint_var, 1, "é" * 1000)  # cut at a character boundary
    assert len(long) == 2 + 2 + 4 + 1024 and long[8:].decode() == "é" * 512


# -- certificates ---------------------------------------------------------------------------


def test_h3_connections_get_a_pinnable_certificate_and_native_ones_keep_theirs(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        async with web_server() as server:
            assert server.dev_certificates is not None
            with pytest.raises(ConnectError, match=r"(?i)fingerprint"):  # not the service's own
                await connect(
                    "127.0.0.1",
                    server.port,
                    tls=server.client_tls(),
                    config=WEB,
                    transport="webtransport",
                )
            with pytest.raises(ConnectError):  # nor the other way round
                await connect(
                    "127.0.0.1",
                    server.port,
                    transport="quic",
                    tls=ClientTLS(fingerprint=server.webtransport_fingerprints[0]),
                )
            keyfile = server.dev_certificates.key_file
            again = WebTransportCertificates(keyfile)  # another worker, or a restart
            assert again.fingerprints() == server.webtransport_fingerprints

    run(main())
    from aqueduct_core.transport.tls import make_dev_certificates

    certs = make_dev_certificates(tmp_path)
    now = dt.datetime.now(dt.UTC).timestamp()
    wt = WebTransportCertificates(certs.key_file, clock=lambda: now)
    cert, _, key = wt.current()
    assert isinstance(key, ec.EllipticCurvePrivateKey) and key.curve.name == "secp256r1"
    life = cert.not_valid_after_utc - cert.not_valid_before_utc
    assert life == dt.timedelta(seconds=LIFETIME) <= dt.timedelta(days=14)  # what browsers take
    assert cert.not_valid_before_utc.timestamp() < now < cert.not_valid_after_utc.timestamp()
    nxt = WebTransportCertificates(certs.key_file, clock=lambda: now + 6 * 86400)
    assert nxt.fingerprints()[0] == wt.fingerprints()[1] != wt.fingerprints()[0]
    secret = b"k" * 32
    assert period_certificate(secret, 7)[0] == period_certificate(secret, 7)[0]


def test_a_server_asked_for_qh3_with_webtransport_is_refused() -> None:
    async def main() -> None:
        with pytest.raises(ValueError, match="aioquic"):
            await serve(echo, config=WEB.with_(backend="qh3"))

    run(main())


# -- a hostile HTTP/3 client --------------------------------------------------------------


class RawH3(QuicConnectionProtocol):
    """An HTTP/3 client driven by hand: headers, streams and bytes as the test says."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.h3 = H3Connection(self._quic, enable_webtransport=True)
        self.events: asyncio.Queue[Any] = asyncio.Queue()
        self.terminated: asyncio.Future[ConnectionTerminated] = self._loop.create_future()
        self.raw: dict[int, bytearray] = {}
        self.answer: dict[bytes, bytes] = {}

    def quic_event_received(self, event: Any) -> None:
        if isinstance(event, ConnectionTerminated) and not self.terminated.done():
            self.terminated.set_result(event)
        if isinstance(event, StopSendingReceived):
            self.events.put_nowait(event)
        if isinstance(event, StreamDataReceived):
            self.raw.setdefault(event.stream_id, bytearray()).extend(event.data)
        for h3_event in self.h3.handle_event(event):
            self.events.put_nowait(h3_event)

    async def settings(self) -> dict[int, int]:
        for _ in range(100):
            if self.h3._received_settings is not None:
                return dict(self.h3._received_settings)
            await asyncio.sleep(0.01)
        raise AssertionError("no SETTINGS from the server")

    async def request(self, headers: list[tuple[bytes, bytes]]) -> tuple[int, int]:
        """Send a request on a new stream; (stream id, status)."""
        await self.settings()
        sid = self._quic.get_next_available_stream_id()
        self.h3.send_headers(sid, headers)
        self.transmit()
        while True:
            event = await asyncio.wait_for(self.events.get(), 10)
            if isinstance(event, HeadersReceived) and event.stream_id == sid:
                self.answer = dict(event.headers)
                return sid, int(self.answer[b":status"])

    async def open_session(self, path: bytes = b"/aqueduct", **extra: bytes) -> tuple[int, int]:
        headers = [
            (b":method", b"CONNECT"),
            (b":protocol", extra.pop("protocol", b"webtransport")),
            (b":scheme", b"https"),
            (b":authority", b"127.0.0.1"),
            (b":path", path),
            *((k.encode(), v) for k, v in extra.items()),
        ]
        return await self.request(headers)

    def uni(self, data: bytes, fin: bool = False) -> int:
        sid = self._quic.get_next_available_stream_id(is_unidirectional=True)
        self._quic.send_stream_data(sid, data, end_stream=fin)
        self.transmit()
        return sid

    async def closed(self, timeout: float = 10) -> ConnectionTerminated:
        return await asyncio.wait_for(asyncio.shield(self.terminated), timeout)


@asynccontextmanager
async def raw_h3(server: Server) -> AsyncIterator[RawH3]:
    config = QuicConfiguration(
        is_client=True,
        alpn_protocols=["h3"],
        max_datagram_frame_size=65536,
        verify_mode=ssl.CERT_NONE,
    )
    async with quic_connect(
        "127.0.0.1", server.port, configuration=config, create_protocol=RawH3
    ) as client:
        yield client  # type: ignore[misc]


def test_the_service_settings_are_the_profiles() -> None:
    async def main() -> None:
        async with web_server() as server, raw_h3(server) as raw:
            settings = await raw.settings()
            assert settings[0x08] == settings[0x33] == settings[0x2B603742] == 1
            wire = annotated_bytes(hex_block("The service's control stream (QUIC stream 3)"))
            assert bytes(raw.raw[3]) == wire
            sid, status = await raw.open_session(**{"sec-webtransport-http3-draft02": b"1"})
            assert (sid, status) == (0, 200)
            # Chromium takes the session only with draft-02's answer header
            assert raw.answer[b"sec-webtransport-http3-draft"] == b"draft02"
            raw.uni(b"\x40\x54\x00" + HELLO)  # the profile's example, byte by byte
            await asyncio.sleep(0.3)
            example = hex_block("answers on its first stream with VERSION").split(
                "S (QUIC stream 15):"
            )[1]
            # The example is the dataset service's: VERSION and ACK_VERSION, then
            # CONNECTION_HEADERS (type 02, length) with aqds-version, the codec, the flow
            # window and the entrypoint's window, one header a line. This bare engine server
            # sends the same VERSION and ACK_VERSION and the engine's own two headers.
            lines = example.strip().splitlines()
            hello, codec, flow = (bytes.fromhex(lines[i]) for i in (0, 2, 3))
            headers = codec + flow
            assert bytes(raw.raw[15]) == hello + bytes([0x02, len(headers)]) + headers

    run(main())


def test_requests_that_open_no_session_are_answered_with_their_status() -> None:
    config = WEB.with_(web=WebSettings(webtransport=True, origins=("https://console.example",)))

    async def main() -> None:
        async with web_server(config) as server, raw_h3(server) as raw:
            assert (await raw.open_session(b"/elsewhere"))[1] == 404
            assert (
                await raw.request(
                    [
                        (b":method", b"GET"),
                        (b":scheme", b"https"),
                        (b":authority", b"x"),
                        (b":path", b"/aqueduct"),
                    ]
                )
            )[1] == 404
            assert (await raw.open_session(protocol=b"connect-udp"))[1] == 400
            assert (await raw.open_session(origin=b"https://evil.example"))[1] == 403
            assert (await raw.open_session(origin=b"https://console.example"))[1] == 200
            assert (await raw.open_session())[1] == 429  # one session per connection

    run(main())


def test_a_connection_that_opens_no_session_is_closed_at_the_handshake_timeout() -> None:
    config = WEB.with_(engine=EngineConfig(handshake_timeout=0.5))

    async def main() -> None:
        async with web_server(config) as server, raw_h3(server) as raw:
            await raw.settings()
            closed = await raw.closed(5)
            assert closed.error_code == 0x10B and "handshake timeout" in closed.reason_phrase

    run(main())


def test_http3_bytes_beyond_the_limit_close_only_that_connection() -> None:
    async def main() -> None:
        async with web_server() as server:
            bystander = await session(server)
            async with raw_h3(server) as raw:
                await raw.settings()
                # a reserved frame type on the control stream, which HTTP/3 must buffer whole
                frame = encode_uint_var(0x21) + encode_uint_var(100_000) + b"\0" * 100_000
                raw._quic.send_stream_data(raw.h3._local_control_stream_id, frame)
                raw.transmit()
                closed = await raw.closed()
                assert closed.error_code == 0x107 and "max_http_bytes" in closed.reason_phrase
            assert await ask(bystander, 1) == 2
            assert await ask(await session(server), 2) == 3
            await bystander.close()

    run(main())


def test_streams_for_another_session_are_refused_and_bidirectional_ones_close_it() -> None:
    async def main() -> None:
        async with web_server() as server, raw_h3(server) as raw:
            sid, status = await raw.open_session()
            assert status == 200
            raw.uni(b"\x40\x54\x00" + HELLO)
            stray = raw.uni(b"\x40\x54\x04" + b"x" * 100)  # session 4 does not exist
            while True:
                event = await asyncio.wait_for(raw.events.get(), 10)
                if isinstance(event, StopSendingReceived):
                    assert (event.stream_id, event.error_code) == (stray, 0x3994BD84)
                    break
            bidi = raw._quic.get_next_available_stream_id()
            raw._quic.send_stream_data(bidi, b"\x40\x41\x00" + HELLO)
            raw.transmit()
            capsule = b""
            while not capsule:
                event = await asyncio.wait_for(raw.events.get(), 10)
                if isinstance(event, DataReceived) and event.stream_id == sid:
                    capsule = event.data
            assert capsule[:2] == b"\x68\x43"  # CLOSE_WEBTRANSPORT_SESSION
            (code,) = struct.unpack(">I", capsule[3:7])
            assert code == CloseCode.PROTOCOL_VIOLATION and b"bidirectional" in capsule
            assert (await raw.closed()).error_code == 0x100  # then the connection, politely

    run(main())
