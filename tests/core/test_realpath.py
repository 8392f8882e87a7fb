"""QUIC between two network namespaces joined by a veth pair: a real MTU, kernel offloads,
no loopback shortcuts (issue 14). Needs root, as CI has; skipped with the reason otherwise.

- data arrives intact with UDP segmentation (GSO) and receive offload (GRO) in use at MTU 1500;
- the packet size settles from the path with no option on either end: at most 1472 bytes on
  a 1500-byte path, at least 8000 on a 9000-byte path.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from netns import Link, require_root, spawn_in, stop, veth_link

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
