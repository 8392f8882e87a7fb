"""Profile §9 (Aqueduct over WebSocket) against a real server over real TLS/TCP on loopback.

The Python client (``transport="websocket"``) runs channels through the WebSocket; a raw
client (TLS from the standard library, the upgrade and framing from ``websockets``' sans-IO
client, §7's frames by hand) attacks each rule and limit. Each fault test checks that the
offending connection ends with a clear answer and that a client connected before keeps
working.
"""

from __future__ import annotations

import asyncio
import re
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from websockets.client import ClientProtocol
from websockets.frames import Frame, Opcode
from websockets.http11 import Response
from websockets.uri import parse_uri

from aqueduct_core import Connection, TransportConfig, connect, serve
from aqueduct_core.api import channel, oneshot
from aqueduct_core.engine import EngineConfig
from aqueduct_core.errors import CloseCode
from aqueduct_core.transport import Server
from aqueduct_core.transport.mux_wire import FrameType, encode_frame, encode_settings
from aqueduct_core.transport.web_config import WS_SUBPROTOCOL, WebSettings
from aqueduct_core.wire.frames import ConnectionHeaders, Version
from aqueduct_core.wire.frames import encode_frame as aqueduct_frame

pytestmark = pytest.mark.quic
WEB = TransportConfig(web=WebSettings(websocket=True))
PROFILE = (Path(__file__).parents[2] / "docs" / "protocol-profile.md").read_text()
SECTION = PROFILE[PROFILE.index("## 9. Aqueduct over WebSocket") :]
HELLO = aqueduct_frame(Version()) + aqueduct_frame(ConnectionHeaders())


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
        else:
            req["reply"].send(req["n"] + 1)


@asynccontextmanager
async def web_server(config: TransportConfig = WEB) -> AsyncIterator[Server]:
    server = await serve(echo, config=config)
    try:
        yield server
    finally:
        await server.close()


async def ask(conn: Connection, n: int) -> int:
    reply, answer = oneshot()
    await conn.entrypoint.send({"n": n, "reply": reply})
    return int(await asyncio.wait_for(answer, 10))


async def ws_client(server: Server) -> Connection:
    return await connect(
        "127.0.0.1", server.port, tls=server.client_tls(), config=WEB, transport="websocket"
    )


def test_channels_run_through_a_websocket_beside_tcp_on_one_port() -> None:
    async def main() -> None:
        async with web_server() as server:
            conn = await ws_client(server)
            assert conn.transport == "websocket"
            assert await ask(conn, 41) == 42
            tx, rx = channel()
            await conn.entrypoint.send({"out": tx, "count": 6, "blob": b"\xcd" * 1_500_000})
            assert [m async for m in rx] == [b"\xcd" * 1_500_000] * 6  # frames of 256 KiB
            tx, rx = channel()
            await conn.entrypoint.send({"out": tx, "count": 100, "unreliable": True})
            assert [m async for m in rx] == list(range(100))  # datagrams, in one TCP
            tcp = await connect("127.0.0.1", server.port, tls=server.client_tls(), transport="tcp")
            assert tcp.transport == "tcp" and await ask(tcp, 1) == 2
            await tcp.close()
            await conn.close()

    run(main())


def test_http11_without_websocket_is_refused_as_section_7_says() -> None:
    async def main() -> None:
        async with web_server(TransportConfig()) as server:
            with pytest.raises(ssl.SSLError, match="no application protocol"):
                await RawWs.open(server.port)

    run(main())


# -- a raw client -------------------------------------------------------------------------


def tls_context() -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.set_alpn_protocols(["http/1.1"])
    return ctx


class RawWs:
    """A WebSocket client by hand: the upgrade and framing from ``websockets``' sans-IO
    client, what goes inside as the test says."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.ws: ClientProtocol | None = None
        self.response: Response | None = None
        self.frames: list[Frame] = []

    @classmethod
    async def open(cls, port: int) -> RawWs:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=tls_context())
        return cls(reader, writer)

    async def upgrade(
        self, port: int, path: str = "/aqueduct", subprotocols: list[str] | None = None
    ) -> int:
        ws = self.ws = ClientProtocol(
            parse_uri(f"wss://127.0.0.1:{port}{path}"),
            subprotocols=[WS_SUBPROTOCOL] if subprotocols is None else subprotocols,  # type: ignore[misc]
            max_size=None,
        )
        ws.send_request(ws.connect())
        self._flush()
        while self.response is None:
            await self._read()
        return self.response.status_code

    def _flush(self) -> None:
        assert self.ws is not None
        for data in self.ws.data_to_send():
            if data:
                self.writer.write(data)

    async def _read(self, timeout: float = 10) -> bool:
        assert self.ws is not None
        data = await asyncio.wait_for(self.reader.read(65536), timeout)
        if not data:
            self.ws.receive_eof()
            return False
        self.ws.receive_data(data)
        for event in self.ws.events_received():
            if isinstance(event, Response):
                self.response = event
            else:
                self.frames.append(event)
        self._flush()
        return True

    def send(self, data: bytes, text: bool = False) -> None:
        assert self.ws is not None
        (self.ws.send_text if text else self.ws.send_binary)(data)
        self._flush()

    async def until_closed(self, timeout: float = 10) -> list[Frame]:
        """Read until the server ends the connection; every frame it sent."""
        while await self._read(timeout):
            pass
        return self.frames

    def binary(self) -> bytes:
        return b"".join(
            bytes(f.data) for f in self.frames if f.opcode in (Opcode.BINARY, Opcode.CONT)
        )


def close_frames(frames: list[Frame]) -> list[tuple[int, str]]:
    """The §7 CLOSE frames found in the binary messages: (code, reason)."""
    out = []
    for f in frames:
        data = bytes(f.data)
        if f.opcode is Opcode.BINARY and data[:1] == bytes([FrameType.CLOSE]):
            out.append((int.from_bytes(data[6:14], "big"), data[14:].decode()))
    return out


def ws_close_code(frames: list[Frame]) -> int | None:
    for f in frames:
        if f.opcode is Opcode.CLOSE:
            return int.from_bytes(bytes(f.data)[:2], "big")
    return None


def test_the_upgrade_and_first_messages_are_the_profiles() -> None:
    async def main() -> None:
        async with web_server() as server:
            raw = await RawWs.open(server.port)
            assert await raw.upgrade(server.port) == 101
            assert raw.response is not None
            assert raw.response.headers["Sec-WebSocket-Protocol"] == WS_SUBPROTOCOL
            assert "Sec-WebSocket-Extensions" not in raw.response.headers
            while not raw.frames:
                await raw._read()
            example = re.search(r"\nS: 82 38  (.*)\n", SECTION)
            assert example is not None
            assert bytes(raw.frames[0].data) == bytes.fromhex(example.group(1))
            raw.send(encode_settings({0x1: 1 << 20}))
            raw.send(encode_frame(FrameType.STREAM, 1, (2).to_bytes(8, "big") + HELLO))
            while len(raw.frames) < 2:
                await raw._read()
            headers = bytes(raw.frames[1].data)  # the service's stream 3: its headers
            assert headers[:1] == bytes([FrameType.STREAM]) and headers[6:14] == (3).to_bytes(
                8, "big"
            )
            raw.writer.close()

    run(main())


def test_requests_that_open_no_websocket_get_their_status_and_the_connection_ends() -> None:
    config = TransportConfig(web=WebSettings(websocket=True, origins=("https://console.example",)))

    async def main() -> None:
        async with web_server(config) as server:
            bystander = await ws_client(server)
            for path, protocols, status in (
                ("/elsewhere", None, 404),
                ("/aqueduct", [], 400),
                ("/aqueduct", ["chat"], 400),
            ):
                raw = await RawWs.open(server.port)
                assert await raw.upgrade(server.port, path, protocols) == status
                await raw.until_closed()
            raw = await RawWs.open(server.port)  # a plain GET of the path
            raw.writer.write(b"GET /aqueduct HTTP/1.1\r\nHost: x\r\n\r\n")
            answer = await raw.reader.read()
            assert answer.startswith(b"HTTP/1.1 426 ")
            raw = await RawWs.open(server.port)  # a browser from another origin
            raw.writer.write(
                b"GET /aqueduct HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
                b"Sec-WebSocket-Protocol: aqueduct-tcp\r\nOrigin: https://evil.example\r\n\r\n"
            )
            assert (await raw.reader.read()).startswith(b"HTTP/1.1 403 ")
            raw = await RawWs.open(server.port)  # a request head over the limit
            raw.writer.write(b"GET /aqueduct HTTP/1.1\r\n" + b"X-Junk: " + b"j" * 70_000 + b"\r\n")
            assert (await raw.reader.read()).startswith(b"HTTP/1.1 431 ")
            assert await ask(bystander, 1) == 2
            await bystander.close()

    run(main())


def test_a_client_that_never_upgrades_is_dropped_at_the_handshake_timeout() -> None:
    config = WEB.with_(engine=EngineConfig(handshake_timeout=0.5))

    async def main() -> None:
        async with web_server(config) as server:
            raw = await RawWs.open(server.port)
            raw.writer.write(b"GET /aqueduct HTTP/1.1\r\n")  # and nothing more
            assert await asyncio.wait_for(raw.reader.read(), 5) == b""

    run(main())


@pytest.mark.parametrize(
    "message, text, code, ws_code",
    [
        (encode_settings({})[:4], False, CloseCode.PROTOCOL_VIOLATION, 1000),  # cut a frame
        (b"", False, CloseCode.PROTOCOL_VIOLATION, 1000),  # empty
        (b"hello", True, CloseCode.PROTOCOL_VIOLATION, 1000),  # text
        (encode_frame(FrameType.PING, 0, b"\0" * 8)[:6] + b"\0" * (2 << 20), False, None, 1009),
    ],
    ids=["cut-frame", "empty", "text", "too-large"],
)
def test_messages_break_the_rules_close_only_that_connection(
    message: bytes, text: bool, code: int | None, ws_code: int
) -> None:
    async def main() -> None:
        async with web_server() as server:
            bystander = await ws_client(server)
            raw = await RawWs.open(server.port)
            assert await raw.upgrade(server.port) == 101
            raw.send(encode_settings({}))
            raw.send(message, text)
            frames = await raw.until_closed()
            closes = close_frames(frames)
            if code is None:
                assert closes == []  # refused before it is read: no CLOSE, status 1009
            else:
                assert [c for c, _ in closes] == [code], closes
            assert ws_close_code(frames) == ws_code
            assert await ask(bystander, 1) == 2
            assert await ask(await ws_client(server), 2) == 3
            await bystander.close()

    run(main())


def test_a_websocket_close_without_close_is_a_lost_connection() -> None:
    async def main() -> None:
        async with web_server() as server:
            raw = await RawWs.open(server.port)
            assert await raw.upgrade(server.port) == 101
            raw.send(encode_settings({}))
            raw.send(encode_frame(FrameType.STREAM, 0, (2).to_bytes(8, "big") + HELLO))
            for _ in range(100):
                if any(not c.is_closed for c in server.connections):
                    break
                await asyncio.sleep(0.02)
            (served,) = [c for c in server.connections if not c.is_closed]
            assert raw.ws is not None
            raw.ws.send_close(1000)
            raw._flush()
            await asyncio.wait_for(served.wait_ended(), 10)
            assert "without CLOSE" in str(served._close_error)

    run(main())
