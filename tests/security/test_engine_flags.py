"""The engine's limits are `aqueduct serve` flags, and each flag takes effect: a real service
started with a small limit cuts off, over real QUIC, an attacker that stays within the
default but not within the flag's value."""

from __future__ import annotations

import resource
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import (
    MIB,
    REQUEST,
    TOKEN,
    Attacker,
    ServerMemory,
    Target,
    assert_cut_off,
    attacked,
    message_head,
    run,
)

from aqueduct_core.wire import Attachment, Message, RouteTo, Version, encode_frames
from aqueduct_core.wire.chanid import Side, make_chanid
from aqueduct_core.wire.frames import message_cost
from aqueduct_spark.service.admission import REQUEST_WINDOW
from aqueduct_spark.testing import start_service

CLIENT, SERVER = Side.CLIENT, Side.SERVER

pytestmark = [pytest.mark.quic, pytest.mark.timeout(120)]


@pytest.fixture
def tight(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Target]:
    svc = start_service(tmp_path / "root", token=TOKEN, args=request.param)
    try:
        memory = ServerMemory(svc.proc.pid)
        _, hard = resource.prlimit(svc.proc.pid, resource.RLIMIT_AS)
        resource.prlimit(svc.proc.pid, resource.RLIMIT_AS, (memory.address_space + (2 << 30), hard))
        yield Target(svc, memory)
    finally:
        svc.stop()


@pytest.mark.parametrize("tight", [["--max-message-gap", "1000"]], indirect=True)
def test_max_message_gap_flag(tight: Target) -> None:
    """Message 5000 is well inside the default gap (2**20), beyond the flag's 1000."""

    async def number_5000(attacker: Attacker) -> None:
        attacker.hello()
        await attacker.wait_server_headers()
        attacker.datagram(encode_frames(RouteTo(0), Message(5000, payload=b"x")))

    assert_cut_off(run(attacked(tight, number_5000, cut_off=True)))


@pytest.mark.parametrize("tight", [["--max-early-bytes", "100000"]], indirect=True)
def test_max_early_bytes_flag(tight: Target) -> None:
    """300 kB before the connection headers: fine by default (16 MiB), not with 100 kB."""

    async def early_bytes(attacker: Attacker) -> None:
        for _ in range(3):
            attacker.stream(
                encode_frames(Version(), RouteTo(8)) + message_head(0, 1 << 20) + b"\0" * 100_000
            )
        await attacker.flush(0, stall=3.0)

    assert_cut_off(run(attacked(tight, early_bytes, cut_off=True)))


@pytest.mark.parametrize("tight", [["--max-pending-bytes", str(4 * MIB)]], indirect=True)
def test_max_pending_bytes_flag(tight: Target) -> None:
    """Unfinished 3 MiB messages on fresh, never attached channels: the second passes the
    flag's 4 MiB (the default allows 256 MiB)."""

    async def unattached(attacker: Attacker) -> None:
        attacker.hello(16 * MIB)
        await attacker.wait_server_headers()
        for i in range(1, 4):
            attacker.stream(encode_frames(RouteTo(i * 8)) + message_head(0, 3 * MIB) + b"\0")
        await attacker.flush(0, stall=3.0)

    assert_cut_off(run(attacked(tight, unattached, cut_off=True)))


@pytest.mark.parametrize("tight", [["--max-pending-channels", "10"]], indirect=True)
def test_max_pending_channels_flag(tight: Target) -> None:
    async def channels(attacker: Attacker) -> None:
        attacker.hello()
        await attacker.wait_server_headers()
        for i in range(1, 30):
            attacker.stream(encode_frames(RouteTo(i * 8)), end=False)
        await attacker.flush(0, stall=3.0)

    assert_cut_off(run(attacked(tight, channels, cut_off=True)))


@pytest.mark.parametrize("tight", [["--max-channels", "50"]], indirect=True)
def test_max_channels_flag(tight: Target) -> None:
    """Requests attaching a channel each, never closed by the client: fine up to 10,000 by
    default, cut off past the flag's 50. The attacker keeps to the entrypoint's window
    (``--request-window``), so that it is this limit that cuts it off."""

    async def channels_kept(attacker: Attacker) -> None:
        attacker.hello(16 * MIB)
        await attacker.wait_server_headers()
        sid = attacker.stream(encode_frames(RouteTo(0)))
        for i in range(120):
            message = Message(i, (), (Attachment(make_chanid(CLIENT, SERVER, False, i)),), b"x")
            if not await attacker.wait_credit(REQUEST_WINDOW - message_cost(message)):
                break
            attacker.stream(encode_frames(message), stream_id=sid)
            attacker.charged += message_cost(message)
        await attacker.flush(0, stall=3.0)

    closed = run(attacked(tight, channels_kept, cut_off=True))
    assert_cut_off(closed)
    assert closed is not None and "live channels" in closed.reason_phrase, closed


@pytest.mark.parametrize("tight", [["--request-window", "20000"]], indirect=True)
def test_request_window_flag(tight: Target) -> None:
    """Ten requests sent at once, each with its reply channel (about 42 KB of credit, in one
    packet): well within the default window (256 KiB), beyond the flag's 20,000 bytes. A
    client that ignores the window is cut off, told which flag to raise."""

    async def requests_ahead(attacker: Attacker) -> None:
        attacker.hello(16 * MIB)
        await attacker.wait_server_headers()
        requests = [
            Message(i, (), (Attachment(make_chanid(CLIENT, SERVER, True, i)),), REQUEST)
            for i in range(10)
        ]
        attacker.stream(encode_frames(RouteTo(0), *requests))
        await attacker.flush(0, stall=3.0)

    closed = run(attacked(tight, requests_ahead, cut_off=True))
    assert_cut_off(closed)
    assert closed is not None and "--request-window" in closed.reason_phrase, closed
