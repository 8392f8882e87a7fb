"""The service against the real browser: Debian's headless Chromium reaches a dataset service
over WebTransport (profile §8) and over WebSocket (§9).

The page is a dumb pipe (``pipe.js``): the bytes it sends were built here by the project's
own client engine and multiplexer, and the bytes it received are decoded here by them, so
what is tested is the service's side of both mappings against Chromium's own WebTransport
and WebSocket: the draft of WebTransport it speaks, certificate pinning by hash, stream and
session framing, the WebSocket upgrade and subprotocol, and messages holding whole frames.
The TypeScript client's own browser tests live with it (``clients/typescript``).

One browser run carries every session (Chromium starts once).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import shutil
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from aqueduct_core.api.channel import oneshot
from aqueduct_core.api.connection import Connection, builtin_codecs
from aqueduct_core.api.setup import client_engine
from aqueduct_core.engine import (
    CloseConnection,
    Command,
    EngineConfig,
    ResetStream,
    SendDatagram,
    WriteStream,
)
from aqueduct_core.transport import TransportConfig
from aqueduct_core.transport.mux import MuxConnection
from aqueduct_core.transport.mux_wire import HEADER_SIZE, StreamData, encode_settings
from aqueduct_core.transport.web_config import WS_SUBPROTOCOL, WebSettings

# In make slow: Chromium costs about 5 s of CPU per run. The fast suite keeps every point
# it checks covered without a browser (tests/core/test_webtransport.py, test_websocket.py:
# the same settings, headers and bytes, against the same service code).
pytestmark = [pytest.mark.browser, pytest.mark.slow]
HERE = Path(__file__).parent
CHROMIUM = shutil.which("chromium")


@pytest.fixture(scope="module")
def pipe() -> Path:
    """pipe.js with playwright-core installed next to it (npm, from the lock file)."""
    if CHROMIUM is None:
        pytest.fail("chromium is not installed: make test installs it (apt-get install chromium)")
    if not (HERE / "node_modules" / "playwright-core").is_dir():
        subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=HERE, check=True)
    return HERE / "pipe.js"


class PipeClient:
    """A client engine whose bytes the browser carries: what it writes is recorded per
    stream (the Driver port), what the page received is fed back as the server's streams."""

    def __init__(self) -> None:
        codecs = builtin_codecs()
        # The answer comes back only after the whole browser run: no handshake deadline here.
        config = EngineConfig(handshake_timeout=600)
        self.conn = Connection(client_engine(config, (), codecs), codecs)
        self.conn.attach_driver(self)
        self.streams: dict[int, bytearray] = {}
        self.fins: set[int] = set()
        loop = asyncio.get_running_loop()
        self.conn.engine.handshake_done(loop.time(), datagrams=True, max_datagram=1000)
        self.conn._flush()

    def execute(self, commands: list[Command]) -> None:
        for cmd in commands:
            if isinstance(cmd, WriteStream):
                self.streams.setdefault(cmd.stream_id, bytearray()).extend(cmd.data)
                if cmd.fin:
                    self.fins.add(cmd.stream_id)
            else:
                assert not isinstance(cmd, ResetStream | SendDatagram | CloseConnection), cmd

    def abort(self) -> None:
        pass

    def request(self, op: str, **fields: Any) -> Any:
        reply, answer = oneshot()
        self.conn.entrypoint.send_nowait({"op": op, **fields, "reply": reply})
        return answer

    def written(self) -> list[tuple[int, bytes, bool]]:
        return [(sid, bytes(data), sid in self.fins) for sid, data in sorted(self.streams.items())]

    def feed(self, streams: list[tuple[int, bytes, bool]]) -> None:
        engine, now = self.conn.engine, asyncio.get_running_loop().time()
        for sid, data, fin in streams:
            engine.stream_data(sid, data, fin, now)
        self.conn._flush()


def ws_messages(client: PipeClient) -> list[str]:
    """The client's streams as §7 frames, one per WebSocket message (base64)."""
    mux = MuxConnection(client=True)
    mux.receive_data(encode_settings({}), 0.0)  # the peer's defaults: 16 KiB frames
    for sid, data, fin in client.written():
        mux.write(sid, data, fin)
    out, buf = [], b"".join(bytes(b) for b in mux.data_to_send())
    while buf:
        n = HEADER_SIZE + int.from_bytes(buf[2:6], "big")
        out.append(base64.b64encode(buf[:n]).decode())
        buf = buf[n:]
    return out


def ws_streams(messages: list[str]) -> list[tuple[int, bytes, bool]]:
    """The server's messages decoded by the multiplexer; each must hold whole frames."""
    mux = MuxConnection(client=True)
    streams: list[tuple[int, bytes, bool]] = []
    for text in messages:
        message = base64.b64decode(text)
        assert HEADER_SIZE + int.from_bytes(message[2:6], "big") == len(message)
        for ev in mux.receive_data(message, 0.0):
            if isinstance(ev, StreamData):
                streams.append((ev.stream_id, bytes(ev.data), ev.fin))
    return streams


def wt_streams(streams: list[dict[str, Any]]) -> list[tuple[int, bytes, bool]]:
    """The server's WebTransport streams, under server stream ids in arrival order."""
    return [
        (3 + 4 * i, b"".join(base64.b64decode(c) for c in s["chunks"]), s["fin"])
        for i, s in enumerate(streams)
    ]


def spki_hash(cert_file: Path) -> str:
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    cert = x509.load_pem_x509_certificate(cert_file.read_bytes())
    spki = cert.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return base64.b64encode(hashlib.sha256(spki).digest()).decode()


async def run_pipe(pipe: Path, plan: dict[str, Any], tmp: Path) -> dict[str, Any]:
    (tmp / "plan.json").write_text(json.dumps({"chromium": CHROMIUM, **plan}))
    proc = await asyncio.create_subprocess_exec(
        "node", str(pipe), str(tmp / "plan.json"), stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0, err.decode()
    return json.loads(out)  # type: ignore[no-any-return]


def test_chromium_reads_datasets_over_webtransport_and_websocket(
    pipe: Path, tmp_path: Path
) -> None:
    """A page from the console's port (plain HTTP on loopback, as ``http://localhost``)
    finds the service in ``aqueduct.json`` and lists datasets over WebTransport (pinned by
    hash) and over WebSocket (the console's own origin); a WebSocket to the service's TLS
    port works for a browser that trusts its key. Refusals: a wrong path, no subprotocol."""
    from deltalake import write_deltalake

    from aqueduct_spark.service.console import start_console
    from aqueduct_spark.service.server import ServiceConfig, start

    root = tmp_path / "root"
    write_deltalake(str(root / "trips"), pa.table({"id": list(range(10))}))

    async def main() -> None:
        web = WebSettings(webtransport=True, websocket=True)
        service, server = await start(ServiceConfig(str(root)), transport=TransportConfig(web=web))
        console = await start_console(service, server, "127.0.0.1", 0, directory=None, tls=None)
        try:
            origin = f"http://localhost:{console.server.sockets[0].getsockname()[1]}"
            config = json.loads(
                await asyncio.to_thread(
                    lambda: urllib.request.urlopen(origin + "/aqueduct.json", timeout=10).read()
                )
            )  # in a thread: this loop serves the console
            clients = [PipeClient() for _ in range(3)]
            # One request each: before the service's window is known, one message may go.
            asked = [c.request("list") for c in clients]
            wt, ws, wss = clients
            assert server.dev_certificates is not None
            # each session runs until the answer naming the dataset came (then 300 ms more)
            quiet: dict[str, Any] = {"quietMs": 300, "maxMs": 30000, "waitFor": "trips"}
            refused: dict[str, Any] = {"quietMs": 0, "maxMs": 0}
            seen = await run_pipe(
                pipe,
                {
                    "origin": origin,
                    "config": True,
                    # wss:// to the service's self-signed port: trust its key for this run only
                    "args": [
                        "--ignore-certificate-errors-spki-list="
                        + spki_hash(server.dev_certificates.cert_file)
                    ],
                    "sessions": [
                        {
                            "kind": "webtransport",
                            "url": config["webtransport"]["url"],
                            "hashes": config["webtransport"]["certificateHashes"],
                            "streams": [[b64(d), fin] for _, d, fin in wt.written()],
                            "close": {"closeCode": 0, "reason": "done"},
                            **quiet,
                        },
                        {
                            "kind": "websocket",
                            "url": config["websocket"]["url"],
                            "protocols": [WS_SUBPROTOCOL],
                            "messages": ws_messages(ws),
                            **quiet,
                        },
                        {
                            "kind": "websocket",
                            "url": f"wss://127.0.0.1:{server.port}/aqueduct",
                            "protocols": [WS_SUBPROTOCOL],
                            "messages": ws_messages(wss),
                            **quiet,
                        },
                        {
                            "kind": "webtransport",  # a path the service does not serve
                            "url": f"https://127.0.0.1:{server.port}/elsewhere",
                            "hashes": server.webtransport_fingerprints,
                            "streams": [],
                            **refused,
                        },
                        {
                            "kind": "websocket",  # without the subprotocol: refused
                            "url": config["websocket"]["url"],
                            "protocols": [],
                            "messages": [],
                            **refused,
                        },
                    ],
                },
                tmp_path,
            )
            assert seen["config"] == config  # the page found the service as a console does
            over_wt, over_ws, over_wss, wrong_path, no_protocol = seen["results"]
            assert "ready" in over_wt["events"], over_wt
            wt.feed(wt_streams(over_wt["streams"]))
            ws.feed(ws_streams(over_ws["messages"]))
            wss.feed(ws_streams(over_wss["messages"]))
            for name, listed, result in zip(
                ("wt", "ws", "wss"), asked, seen["results"][:3], strict=True
            ):
                try:
                    answer = await asyncio.wait_for(listed, 5)
                except TimeoutError:
                    raise AssertionError(f"{name}: no answer; the page saw {result}") from None
                assert [d["name"] for d in answer["result"]["datasets"]] == ["trips"]
            assert over_wt["maxDatagramSize"] > 1000  # H3 datagrams were negotiated
            assert over_ws["protocol"] == over_wss["protocol"] == WS_SUBPROTOCOL
            assert "error" in wrong_path and "error" in no_protocol
            assert "HeadlessChrome/" in seen["userAgent"]
        finally:
            await server.close()

    asyncio.run(asyncio.wait_for(main(), 180))


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()
