"""QUIC between two network namespaces joined by a veth pair: a real MTU, kernel offloads,
no loopback shortcuts (issue 14). Needs root, as CI has; skipped with the reason otherwise.

- data arrives intact with UDP segmentation (GSO) and receive offload (GRO) in use at MTU 1500;
- the packet size settles from the path with no option on either end: at most 1472 bytes on
  a 1500-byte path, at least 8000 on a 9000-byte path;
- probing (RFC 8899) finds a hop in the middle that carries less than both routes say, a
  black hole that sends no ICMP, and keeps the data intact;
- probing goes past a route that says less than the link carries.
"""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from netns import Link, require_root, routed_link, set_route_mtu, spawn_in, stop, veth_link

from aqueduct_core.transport import pmtu

HERE = Path(__file__).resolve().parent
HELPER = str(HERE / "netns.py")
BACKENDS = ["aioquic", "qh3"]
SIZE = 24 << 20

_why_not = require_root("the real-path tests")
needs_root = pytest.mark.skipif(_why_not is not None, reason=_why_not or "")


@pytest.fixture
def link() -> Iterator[Link]:
    with veth_link(1500, prefix="aqt") as made:
        yield made


def transfer(link: Link, backend: str) -> dict[str, Any]:
    server, banner = spawn_in(link.server_ns, [HELPER, "serve", backend, link.server_ip], "{")
    try:
        info = json.loads("{" + banner)
        cmd = ["ip", "netns", "exec", link.client_ns, sys.executable, HELPER, "fetch", backend]
        cmd += [link.server_ip, str(info["port"]), info["fingerprint"], str(SIZE)]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-3000:]
        result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
        return result
    finally:
        stop(server)


@needs_root
@pytest.mark.parametrize("backend", BACKENDS)
def test_data_intact_with_gso_and_gro_at_mtu_1500(link: Link, backend: str) -> None:
    result = transfer(link, backend)
    assert result["intact"], "the bytes that arrived differ from the bytes sent"
    server, client = result["server"], result["client"]
    assert server["gso"] and client["gro"], "the kernel here supports GSO and GRO on UDP"
    # Offload in use: the server sent many packets per system call, the client read many.
    assert server["packets_sent"] >= 4 * server["sendmsg"], server
    assert client["packets_received"] >= 2 * client["recvmsg"], client
    assert client["largest_received"] <= 1472


@needs_root
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mtu", [1500, 9000])
def test_packet_size_settles_from_the_path(link: Link, backend: str, mtu: int) -> None:
    link.set_mtu(mtu)
    result = transfer(link, backend)
    assert result["intact"]
    largest = result["client"]["largest_received"]
    chosen = result["client"]["packet_size"], result["server"]["packet_size"]
    if mtu == 1500:
        assert largest <= 1472 and max(chosen) <= 1472, (largest, chosen)
    else:
        assert largest >= 8000 and min(chosen) >= 8000, (largest, chosen)


@needs_root
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_smaller_hop_in_the_middle_is_found_and_the_data_stays_intact(backend: str) -> None:
    # Both hosts' routes say 1500; the router forwards at most 1400-byte IP packets and
    # drops the rest without a word.
    with routed_link(end_mtu=1500, middle_mtu=1400) as path:
        result = transfer(path, backend)
    assert result["intact"], "the bytes that arrived differ from the bytes sent"
    chosen = result["client"]["packet_size"], result["server"]["packet_size"]
    assert min(chosen) >= 1300 and max(chosen) <= 1372, chosen
    assert result["client"]["largest_received"] <= 1372, result["client"]


@needs_root
@pytest.mark.parametrize("backend", BACKENDS)
def test_probing_goes_past_a_route_that_says_less_than_the_link_carries(
    link: Link, backend: str
) -> None:
    link.set_mtu(9000)
    set_route_mtu(link, 1500)
    result = transfer(link, backend)
    assert result["intact"]
    chosen = result["client"]["packet_size"], result["server"]["packet_size"]
    assert min(chosen) >= 8000, chosen
    assert result["client"]["largest_received"] >= 8000, result["client"]


def test_a_stalled_peer_costs_a_moment_at_small_packets_a_black_hole_ends_at_the_base(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """RFC 8899 §4.3 on aioquic: repeated probe timeouts drop the size to 1200; once
    acknowledgements flow again the found size is tried again, twice at most."""
    monkeypatch.setattr(pmtu, "packet_size_for_route", lambda ip, limit: 8972)
    det = pmtu.BlackHoleDetector("198.18.0.2", 8972, 16384)
    assert det.check(pmtu.PTO_LIMIT - 1, 0.0) is None
    assert det.check(pmtu.PTO_LIMIT, 0.1) == pmtu.BASE_PACKET  # strike 1
    assert det.check(0, 0.2) is None
    assert det.check(0, 0.2 + pmtu.RETRY_AFTER) == 8972  # recovered: try the found size
    assert det.check(pmtu.PTO_LIMIT, 2.0) == pmtu.BASE_PACKET  # strike 2
    assert det.check(0, 2.1) is None
    assert det.check(0, 9.0) is None  # confirmed: stays at the base
    assert det.size == pmtu.BASE_PACKET


def test_the_probe_ladder_covers_the_usual_mtus_around_the_route() -> None:
    ladder = pmtu.probe_ladder(1372, 16384)
    assert ladder[0] == pmtu.BASE_PACKET and ladder[-1] == 16356
    assert {1372, 1472, 8972} <= set(ladder), "the route's size and Ethernet's, jumbo's"
    assert pmtu.refine_ladder(1350, 1400) == [1357, 1364, 1371, 1379, 1386, 1393]
    assert pmtu.refine_ladder(1472, 1480) == []
    probe = pmtu.encode_probe(pmtu.PROBE_ASK, b"n" * 8, 1400)
    assert len(probe) == 1400 and probe[0] == 0, "a zero first byte: never a QUIC packet"
    assert pmtu.decode_probe(probe) == (pmtu.PROBE_ASK, b"n" * 8, 1400)
    assert pmtu.decode_probe(b"\x40" + probe[1:]) is None


@pytest.fixture(autouse=True)
def _no_remembered_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pmtu, "_found", {})


async def _pair(answer: bool) -> tuple[Any, Any]:
    from aqueduct_core.transport.udp import create_endpoint

    loop = asyncio.get_running_loop()
    ends = []
    for _ in range(2):
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.bind(("127.0.0.1", 0))
        sock.setblocking(False)
        transport, _ = await create_endpoint(loop, asyncio.DatagramProtocol, sock=sock)
        ends.append(transport)
    if not answer:
        ends[1].send_probe = lambda data, addr: True  # a peer that ignores probes
    return ends[0], ends[1]


def with_pair(body: Any, answer: bool = True) -> None:
    """Run ``await body(client, server)`` on two fresh loopback transports, then close them."""

    async def main() -> None:
        client, server = await _pair(answer)
        try:
            await body(client, server)
        finally:
            client.close()
            server.close()

    asyncio.run(asyncio.wait_for(main(), 10))


def test_a_probe_search_finds_the_largest_size_and_tells_the_peer() -> None:
    async def body(client: Any, server: Any) -> None:
        found = await client.probe_path(server.get_extra_info("sockname"), 1472, 16384)
        assert found == 16356, "loopback carries every size up to the limit"
        await asyncio.sleep(0.05)
        assert server.path_sizes == {client.get_extra_info("sockname"): 16356}

    with_pair(body)


def test_a_peer_that_answers_no_probe_leaves_the_route_size() -> None:
    async def body(client: Any, server: Any) -> None:
        found = await client.probe_path(server.get_extra_info("sockname"), 1472, 16384)
        assert found is None and not server.path_sizes

    with_pair(body, answer=False)


def test_sizes_the_first_hop_refuses_cost_no_waiting() -> None:
    """A 9000-byte link: probes above it fail at once (EMSGSIZE); the search neither waits
    for them nor for a second round of sizes that all fail so."""

    async def body(client: Any, server: Any) -> None:
        real = client.send_probe
        client.send_probe = lambda data, addr: len(data) <= 8972 and real(data, addr)
        loop = asyncio.get_running_loop()
        started = loop.time()
        found = await client.probe_path(server.get_extra_info("sockname"), 1472, 65507)
        assert found == 8972
        assert loop.time() - started < pmtu.PROBE_WAIT / 2

    with_pair(body)


def test_a_second_connection_to_the_peer_reuses_the_result_and_still_tells_the_server() -> None:
    async def body(client: Any, server: Any) -> None:
        later, spare = await _pair(answer=True)  # another client socket of this process
        asked: list[int] = []
        real = later.send_probe
        later.send_probe = lambda data, addr: asked.append(data[8]) or real(data, addr)
        try:
            addr = server.get_extra_info("sockname")
            assert await client.probe_path(addr, 1472, 16384) == 16356
            assert await later.probe_path(addr, 1472, 16384) == 16356
            assert set(asked) == {pmtu.PROBE_RESULT}, "no probe, no waiting: only the result"
            await asyncio.sleep(0.05)
            assert server.path_sizes[later.get_extra_info("sockname")] == 16356
        finally:
            later.close()
            spare.close()

    with_pair(body)
