"""A stranger's client: the profile's WebTransport (§8) and WebSocket (§9) sections followed
from their text, against a real ``aqueduct serve --web`` (issue 29: "an independent check can
follow the profile's new sections to talk to the service").

Everything between the Aqueduct engine and the network is written here from the text alone,
on other people's libraries: aioquic's HTTP/3 layer for WebTransport (the CONNECT, the
stream and datagram prefixes, the close capsule built by hand), the ``websockets`` library
for the WebSocket upgrade and framing, and §7's multiplexer written here from §7's tables.
None of the project's transport code is used (``aqueduct_core.transport`` is not imported).
What runs inside the session is §1-§6, which these sections leave unchanged: that part is
the project's sans-IO engine and its channels (``aqueduct_core.engine``, ``.api``), as a
stranger would bring their own Aqueduct implementation. Each test lists the dataset and reads
rows of it, checking every value, and checks the bytes and numbers the text promises.
"""

from __future__ import annotations

import asyncio
import hashlib
import ssl
import struct
from pathlib import Path
from typing import Any, cast

import pyarrow as pa
import pytest
from conftest import ServiceProcess
from cryptography.hazmat.primitives.serialization import Encoding

from aqueduct_core.api.channel import EndOfChannel, channel, oneshot
from aqueduct_core.api.connection import Connection, builtin_codecs
from aqueduct_core.api.setup import client_engine
from aqueduct_core.engine import CloseConnection, Command, ResetStream, SendDatagram, WriteStream

pytestmark = pytest.mark.quic
ROWS = pa.table({"id": list(range(1000)), "name": [f"n{i}" for i in range(1000)]})


@pytest.fixture(scope="module")
def web(web_service: ServiceProcess) -> ServiceProcess:
    c = web_service.client()  # the dataset is made by the project's own client, over QUIC
    c.overwrite("stranger_trips", ROWS)
    c.close()
    return web_service


class Aqueduct:
    """The Aqueduct side (§1-§6): an engine whose streams and datagrams a transport carries.
    The transport passes its own stream ids (the engine uses them only as names)."""

    def __init__(self, transport: Any) -> None:
        codecs = builtin_codecs()
        self.conn = Connection(client_engine(None, (), codecs), codecs)
        self.conn.attach_driver(self)
        self.engine = self.conn.engine
        self.transport = transport
        self.loop = asyncio.get_running_loop()

    def execute(self, commands: list[Command]) -> None:  # the engine's writes
        for cmd in commands:
            if isinstance(cmd, WriteStream):
                self.transport.write(cmd.stream_id, bytes(cmd.data), cmd.fin)
            elif isinstance(cmd, ResetStream):
                self.transport.reset(cmd.stream_id)
            elif isinstance(cmd, SendDatagram):
                self.transport.datagram(cmd.data)
            elif isinstance(cmd, CloseConnection):
                self.transport.end(cmd.code, cmd.reason)
        self.transport.flush()

    def abort(self) -> None:
        pass

    def ready(self, max_datagram: int) -> None:
        self.engine.handshake_done(self.loop.time(), datagrams=True, max_datagram=max_datagram)
        self.conn._flush()

    def stream(self, sid: int, data: bytes, fin: bool) -> None:
        self.engine.stream_data(sid, data, fin, self.loop.time())
        self.conn._flush()

    def got_datagram(self, data: bytes) -> None:
        self.engine.datagram_received(data, self.loop.time())
        self.conn._flush()

    def lost(self, code: int | None, reason: str) -> None:
        self.engine.connection_lost(self.loop.time(), code, reason)
        self.conn._flush()

    async def ask(self, op: str, **fields: Any) -> Any:
        reply, answer = oneshot()
        await self.conn.entrypoint.send({"op": op, **fields, "reply": reply})
        result = await asyncio.wait_for(answer.recv(), 10)
        assert result.get("ok", True) and "result" in result, result
        return result["result"]

    async def rows(self, dataset: str) -> pa.Table:
        """plan, then scan each split (docs/dataset-protocol.md §5, §6)."""
        plan = await self.ask("plan", dataset=dataset)
        schema = pa.ipc.read_schema(pa.py_buffer(plan["schema"]))
        batches = []
        for split in plan["splits"]:
            out, data = channel(headers=[("aqds-schema-4b1f0a", plan["schema"])], codec="raw")
            await self.conn.entrypoint.send(
                {"op": "scan", "dataset": dataset, "split": split, "batch_rows": 300, "out": out}
            )
            while True:
                try:
                    msg = await asyncio.wait_for(data.recv_message(), 10)
                except EndOfChannel:
                    break
                assert not any(k == b"aqds-error-4b1f0a" for k, _ in msg.headers), msg.headers
                batches.append(pa.ipc.read_record_batch(pa.py_buffer(msg.value), schema))
        return pa.Table.from_batches(batches, schema)


async def list_and_read(aq: Aqueduct) -> None:
    listed = await aq.ask("list")
    assert "stranger_trips" in [d["name"] for d in listed["datasets"]]
    got = await aq.rows("stranger_trips")
    assert got.num_rows == 1000 and got.sort_by("id").equals(ROWS)


# -- §8: WebTransport, on aioquic's HTTP/3 -----------------------------------------------

WT_RESET = 0x52E4A40FA8DB
"""§8: a reset carries the HTTP/3 code of WebTransport error 0."""


def capsule_close(code: int, reason: str) -> bytes:
    """§8 "Closing": CLOSE_WEBTRANSPORT_SESSION (0x2843) in an HTTP/3 DATA frame."""
    body = struct.pack(">I", code) + reason.encode()
    capsule = bytes([0x68, 0x43, len(body)]) + body  # 2-byte varint type; length < 64
    return bytes([0x00, len(capsule)]) + capsule


async def webtransport(host: str, port: int, hashes: list[str]) -> dict[str, Any]:
    from aioquic.asyncio.client import connect
    from aioquic.asyncio.protocol import QuicConnectionProtocol
    from aioquic.h3.connection import H3Connection
    from aioquic.h3.events import DatagramReceived as H3Datagram
    from aioquic.h3.events import HeadersReceived, WebTransportStreamDataReceived
    from aioquic.quic.configuration import QuicConfiguration
    from aioquic.quic.events import ConnectionTerminated, QuicEvent

    seen: dict[str, Any] = {"streams_in": [], "streams_out": []}

    class Session(QuicConnectionProtocol):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.h3 = H3Connection(self._quic, enable_webtransport=True)
            self.settings = asyncio.get_running_loop().create_future()
            self.answers: dict[int, asyncio.Future[dict[bytes, bytes]]] = {}
            self.closed = asyncio.get_running_loop().create_future()
            self.aq: Aqueduct | None = None
            self.ids: dict[int, int] = {}  # the engine's stream id -> QUIC's

        def quic_event_received(self, event: QuicEvent) -> None:
            if isinstance(event, ConnectionTerminated) and not self.closed.done():
                self.closed.set_result(event.error_code)
                if self.aq is not None:
                    self.aq.lost(None, event.reason_phrase)
            for ev in self.h3.handle_event(event):
                if isinstance(ev, HeadersReceived) and ev.stream_id in self.answers:
                    self.answers[ev.stream_id].set_result(dict(ev.headers))
                elif isinstance(ev, WebTransportStreamDataReceived) and self.aq is not None:
                    assert ev.session_id == 0
                    if ev.stream_id not in seen["streams_in"]:
                        seen["streams_in"].append(ev.stream_id)
                        seen.setdefault("first_bytes", ev.data)
                    self.aq.stream(ev.stream_id, ev.data, ev.stream_ended)
                elif isinstance(ev, H3Datagram) and self.aq is not None:
                    self.aq.got_datagram(ev.data)
            if self.h3.received_settings is not None and not self.settings.done():
                self.settings.set_result(dict(self.h3.received_settings))

        def connect_session(self, path: str) -> asyncio.Future[dict[bytes, bytes]]:
            sid = self._quic.get_next_available_stream_id()
            self.answers[sid] = asyncio.get_running_loop().create_future()
            headers = [
                (b":method", b"CONNECT"),
                (b":protocol", b"webtransport"),
                (b":scheme", b"https"),
                (b":authority", f"{host}:{port}".encode()),
                (b":path", path.encode()),
                (b"sec-webtransport-http3-draft02", b"1"),
            ]
            self.h3.send_headers(sid, headers)
            self.transmit()
            return self.answers[sid]

        # the transport port of Aqueduct above
        def write(self, sid: int, data: bytes, fin: bool) -> None:
            if sid not in self.ids:
                self.ids[sid] = self.h3.create_webtransport_stream(0, is_unidirectional=True)
                seen["streams_out"].append(self.ids[sid])
            self._quic.send_stream_data(self.ids[sid], data, end_stream=fin)

        def reset(self, sid: int) -> None:
            self._quic.reset_stream(self.ids[sid], WT_RESET)

        def datagram(self, data: bytes) -> None:
            self.h3.send_datagram(0, data)

        def end(self, code: int, reason: str) -> None:
            self._quic.send_stream_data(0, capsule_close(code, reason), end_stream=True)

        def flush(self) -> None:
            self.transmit()

    config = QuicConfiguration(alpn_protocols=["h3"], is_client=True, max_datagram_frame_size=65536)
    config.verify_mode = ssl.CERT_NONE  # pinned by hash instead, below
    async with connect(host, port, configuration=config, create_protocol=Session) as s:
        session = cast(Session, s)
        cert = session._quic.tls._peer_certificate
        assert cert is not None
        der = cert.public_bytes(Encoding.DER)
        assert hashlib.sha256(der).hexdigest() in hashes  # serverCertificateHashes
        seen["settings"] = await asyncio.wait_for(session.settings, 10)
        answer = await asyncio.wait_for(session.connect_session("/aqueduct"), 10)
        seen["answer"] = answer  # on stream 0: the session id is 0
        assert answer[b":status"] == b"200", answer
        aq = session.aq = Aqueduct(session)
        aq.ready(1100)  # under the largest QUIC datagram payload, minus its one-byte prefix
        await list_and_read(aq)
        for path in ("/elsewhere", "/aqueduct"):  # requests on streams 4 and 8
            done = await asyncio.wait_for(session.connect_session(path), 10)
            seen[path] = done.get(b":status")
        await asyncio.wait_for(
            aq.conn.close(), 10
        )  # the engine's CLOSE: the capsule, then the service ends QUIC
        seen["quic_close"] = await asyncio.wait_for(session.closed, 10)
    return seen


def test_a_strangers_webtransport_client_lists_and_reads(web: ServiceProcess) -> None:
    seen = asyncio.run(webtransport("127.0.0.1", web.port, web.webtransport_hashes))
    # the service's SETTINGS, as the text lists them byte by byte
    assert seen["settings"] == {0x1: 4096, 0x7: 16, 0x8: 1, 0x21: 1, 0x33: 1, 0x2B603742: 1}
    assert seen["answer"][b"sec-webtransport-http3-draft"] == b"draft02"
    assert seen["/elsewhere"] == b"404" and seen["/aqueduct"] == b"429"  # one session each
    # the service's first Aqueduct stream is QUIC stream 15 (after its control and QPACK
    # streams), ours 14
    assert seen["streams_in"][0] == 15 and seen["streams_out"][0] == 14
    # and the service's first bytes on it are those of §8's example
    example = """ef505fa6600f408e 4151554544554354 0b 302e302e302d4146544552  01
                    02 6c  13 617164732d76657273696f6e2d346231663061 01 31
                           15 6171756564756374 2d636f6465632d3365376139 31 04 63626f72
                           14 6171756564756374 2d666c6f772d396430346232 04 80808008
                           1c 61717565647563742d656e7472792d77696e646f772d313965613435 03 808010"""
    assert seen["first_bytes"].startswith(bytes.fromhex("".join(example.split())))
    assert seen["quic_close"] == 0x100  # H3_NO_ERROR, once our session ended


# -- §9: WebSocket, §7's frames in binary messages -----------------------------------------

SETTINGS, STREAM, RESET, CREDIT, DATAGRAM, PING, CLOSE = range(1, 8)
INITIAL = 1 << 20  # the INITIAL_STREAM_CREDIT we announce


def frame(kind: int, body: bytes, flags: int = 0) -> bytes:
    return struct.pack(">BBI", kind, flags, len(body)) + body


class Mux:
    """§7 from its tables: the client end of the multiplexer, one frame per message."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.out: list[bytes] = []
        self.peer: dict[int, int] | None = None
        self.waiting: list[bytes] = []  # stream frames before the peer's SETTINGS
        self.left: dict[int, int] = {}  # credit left on the service's streams
        self.aq: Aqueduct | None = None
        self.first_message: bytes | None = None
        self.close_seen: tuple[int, str] | None = None
        self.sending: asyncio.Queue[bytes] = asyncio.Queue()  # b"": then the WebSocket close
        own = {0x1: 1 << 20, 0x2: INITIAL, 0x3: 1000, 0x4: 65536, 0x5: 30000}
        self.out.append(frame(SETTINGS, b"".join(struct.pack(">HQ", k, v) for k, v in own.items())))

    def receive(self, message: bytes) -> None:
        if self.first_message is None:
            self.first_message = message
        pos = 0
        while pos < len(message):
            kind, flags, n = struct.unpack_from(">BBI", message, pos)
            body, pos = message[pos + 6 : pos + 6 + n], pos + 6 + n
            assert len(body) == n, "a message ended inside a frame"
            self.frame(kind, flags, body)

    def frame(self, kind: int, flags: int, body: bytes) -> None:
        aq = self.aq
        assert aq is not None
        if kind == SETTINGS:
            self.peer = dict(struct.unpack_from(">HQ", body, i) for i in range(0, len(body), 10))
            self.out += self.waiting
            self.waiting.clear()
            aq.ready(self.peer.get(0x4, 0))
        elif kind == STREAM:
            (sid,) = struct.unpack_from(">Q", body)
            payload, fin = body[8:], bool(flags & 1)
            left = self.left.get(sid, INITIAL) - len(payload)
            assert left >= 0, "the service sent beyond its credit"
            if not fin and left <= INITIAL // 2:
                self.out.append(frame(CREDIT, struct.pack(">QQ", sid, INITIAL - left)))
                left = INITIAL
            self.left[sid] = left
            aq.stream(sid, payload, fin)
        elif kind == RESET:
            aq.engine.stream_reset(struct.unpack_from(">Q", body)[0], aq.loop.time())
            aq.conn._flush()
        elif kind == DATAGRAM:
            aq.got_datagram(body)
        elif kind == PING and not flags & 1:
            self.out.append(frame(PING, body, 1))
        elif kind == CLOSE:
            (code,) = struct.unpack_from(">Q", body)
            self.close_seen = (code, body[8:].decode(errors="replace"))
            aq.lost(code, self.close_seen[1])
        self.flush()

    # the transport port of Aqueduct above
    def write(self, sid: int, data: bytes, fin: bool) -> None:
        limit = (self.peer or {}).get(0x1, 16384) - 8
        chunks = [data[i : i + limit] for i in range(0, len(data), limit)] or [b""]
        for i, chunk in enumerate(chunks):
            last = fin and i == len(chunks) - 1
            f = frame(STREAM, struct.pack(">Q", sid) + chunk, 1 if last else 0)
            (self.out if self.peer is not None else self.waiting).append(f)

    def reset(self, sid: int) -> None:
        (self.out if self.peer is not None else self.waiting).append(
            frame(RESET, struct.pack(">QQ", sid, 0))
        )

    def datagram(self, data: bytes) -> None:
        self.out.append(frame(DATAGRAM, data))

    def end(self, code: int, reason: str) -> None:
        """§9 "Closing": CLOSE in a binary message, then the WebSocket close (1000)."""
        self.out += [frame(CLOSE, struct.pack(">Q", code) + reason.encode()), b""]

    def flush(self) -> None:
        out, self.out = self.out, []
        for message in out:
            self.sending.put_nowait(message)

    async def writer(self) -> None:
        while message := await self.sending.get():
            await self.ws.send(message)
        await self.ws.close(1000)


async def websocket(url: str, cafile: Path) -> dict[str, Any]:
    from websockets.asyncio.client import connect

    tls = ssl.create_default_context(cafile=str(cafile))  # the development CA (§9, 2.)
    seen: dict[str, Any] = {}
    async with connect(
        url,
        ssl=tls,
        subprotocols=["aqueduct-tcp"],
        compression=None,
        max_size=None,  # type: ignore[list-item]
    ) as ws:
        seen["protocol"] = ws.subprotocol
        seen["accept"] = ws.response.headers["Sec-WebSocket-Accept"]
        mux = Mux(ws)
        aq = mux.aq = Aqueduct(mux)
        mux.flush()  # our SETTINGS, at once

        async def pump() -> None:
            async for message in ws:
                assert isinstance(message, bytes), "a text message"
                mux.receive(message)

        reader, writer = asyncio.ensure_future(pump()), asyncio.ensure_future(mux.writer())
        await list_and_read(aq)
        seen["first_message"] = mux.first_message
        await asyncio.wait_for(aq.conn.close(), 10)
        await asyncio.wait_for(asyncio.gather(reader, writer), 10)
        seen["ws_close"] = ws.close_code
    return seen


def test_a_strangers_websocket_client_lists_and_reads(web: ServiceProcess) -> None:
    root = Path(web.root)
    seen = asyncio.run(
        websocket(f"wss://127.0.0.1:{web.port}/aqueduct", root / ".aqueduct-tls" / "ca.pem")
    )
    assert seen["protocol"] == "aqueduct-tcp"
    # the service's SETTINGS, the first message, as the example in §9 gives it
    text = "01 00 00000032  0001 0000000000100000  0002 0000000001000000  0003 0000000000002710"
    text += "  0004 0000000000010000  0005 0000000000007530"
    assert seen["first_message"] == bytes.fromhex(text.replace(" ", ""))
    assert seen["ws_close"] == 1000
