"""Stateless reset (``transport/reset.py``): a client learns at once that the server it spoke
to restarted, instead of waiting out its idle timeout (30 s by default)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from aqueduct_core.errors import ConnectionLost
from aqueduct_core.transport import ClientTLS, TransportConfig, connect
from aqueduct_core.transport.reset import (
    MIN_RESET,
    TOKEN_SIZE,
    Responder,
    is_reset,
    key_from_private_key,
    token,
)

pytestmark = pytest.mark.quic

SERVER = Path(__file__).with_name("quic_server_process.py")
BACKENDS = ["qh3", "aioquic"]


class ServerProcess:
    def __init__(self, backend: str, port: int, cert_dir: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(SERVER), backend, str(port), str(cert_dir)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        info = json.loads(self.proc.stdout.readline())
        self.port, self.fingerprint = int(info["port"]), info["fingerprint"]

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()
        assert self.proc.stdout is not None
        self.proc.stdout.close()


@pytest.fixture
def servers() -> Iterator[list[ServerProcess]]:
    started: list[ServerProcess] = []
    yield started
    for server in started:
        if server.proc.poll() is None:
            server.kill()


async def _lost_after_restart(
    backend: str, servers: list[ServerProcess], cert_dir: Path
) -> tuple[float, str]:
    first = ServerProcess(backend, 0, cert_dir)
    servers.append(first)
    config = TransportConfig(backend=backend, transport="quic")  # type: ignore[arg-type]
    tls = ClientTLS(fingerprint=first.fingerprint)
    conn = await connect("127.0.0.1", first.port, tls=tls, config=config)
    await conn.entrypoint.send({"hello": 1})
    first.kill()  # SIGKILL: no CONNECTION_CLOSE
    servers.append(ServerProcess(backend, first.port, cert_dir))
    start = time.monotonic()
    with pytest.raises(ConnectionLost) as lost:
        for _ in range(100):  # every send makes a packet the new process must answer
            await conn.entrypoint.send({"hello": 2})
            await asyncio.sleep(0.05)
        await asyncio.wait_for(conn.wait_closed(), 40)
    return time.monotonic() - start, str(lost.value)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_restarted_server_resets_its_old_connections_at_once(
    backend: str, servers: list[ServerProcess], tmp_path: Path
) -> None:
    took, reason = asyncio.run(_lost_after_restart(backend, servers, tmp_path))
    print(f"{backend}: connection lost {took:.2f} s after the restart ({reason})")
    assert took < 1.0, f"took {took:.1f} s: the client waited for its idle timeout"


def test_a_server_with_another_key_cannot_reset_our_connections(tmp_path: Path) -> None:
    """A reset only counts when it carries the token of the server we spoke to."""
    ours = key_from_private_key(_key_file(tmp_path / "a"))
    theirs = key_from_private_key(_key_file(tmp_path / "b"))
    cid = bytes(range(8))
    packet = b"\x41" + cid + bytes(40)
    reset = Responder(theirs, 8).reset_for(packet, 0.0)
    assert reset is not None and not is_reset(reset, [token(ours, cid)])
    genuine = Responder(ours, 8).reset_for(packet, 0.0)
    assert genuine is not None and is_reset(genuine, [token(ours, cid)])


def test_resets_are_smaller_than_their_trigger_and_rate_limited(tmp_path: Path) -> None:
    responder = Responder(key_from_private_key(_key_file(tmp_path)), 8, rate=10)
    cid = b"\x01" * 8
    assert responder.reset_for(b"\xc1" + cid + bytes(60), 0.0) is None  # long header
    assert responder.reset_for(b"\x41" + cid + bytes(11), 0.0) is None  # too small to answer
    for size in (30, 43, 1200):
        reset = responder.reset_for(b"\x41" + cid + bytes(size - 9), 0.0)
        assert reset is not None
        assert MIN_RESET <= len(reset) < size and reset[0] & 0xC0 == 0x40
        assert reset[-TOKEN_SIZE:] == token(responder.key, cid)
    sent = sum(responder.reset_for(b"\x41" + cid + bytes(40), 0.0) is not None for _ in range(50))
    assert sent == 7  # 10 in the bucket, 3 spent above
    assert responder.reset_for(b"\x41" + cid + bytes(40), 0.5) is not None  # refilled


def _key_file(where: Path) -> Path:
    from aqueduct_core.transport.tls import make_dev_certificates

    where.mkdir(parents=True, exist_ok=True)
    make_dev_certificates(where)
    return where / "server.key"
