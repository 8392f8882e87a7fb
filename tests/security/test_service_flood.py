"""One client floods ``aqueduct serve``; another client, and the server's CPU, must not notice.

Issue 13: 20,000 cheap requests from one connection made another client's ``ls`` take
9-11 s, and the server kept burning CPU for 15 s after the attacker had gone. The service
now serves at most ``--max-requests`` of a connection's requests at once, hands its worker
threads to the connections in turn, and cancels a closed connection's work at once
(``aqueduct_spark/service/admission.py``).

Latencies are compared as ratios of medians against the same client's unloaded latency,
measured before and after the flood, because the machine running the tests is shared.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterator

import pyarrow as pa
import pytest
from service_process import ProcessStats, Remote, client_transport, wait_until

from aqueduct_spark.testing import ServiceProcess, start_service

pytestmark = [pytest.mark.quic]

SAMPLES = 41


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    svc = start_service(tmp_path_factory.mktemp("flood-root"))
    client = svc.client(transport=client_transport())
    for name in ("flood", "other"):
        client.overwrite(name, pa.table({"id": pa.array(range(1000), pa.int64())}))
    yield svc
    svc.stop()


def ls_latencies(client: object, n: int = SAMPLES) -> list[float]:
    out = []
    for _ in range(n):
        start = time.monotonic()
        client.list()  # type: ignore[attr-defined]
        out.append(time.monotonic() - start)
    return out


def idle(stats: ProcessStats) -> bool:
    """The server uses (almost) no CPU: under 15% of a core over 0.1 s."""
    return stats.busy(0.1) < 0.15


@pytest.mark.parametrize("flood", [5_000, pytest.param(20_000, marks=pytest.mark.slow)])
def test_a_flood_leaves_another_clients_ls_fast_and_ends_with_the_connection(
    service: ServiceProcess, flood: int
) -> None:
    """20,000 is issue 13's figure; 5,000 shows the same in a third of the time (the
    attacker's own sending takes most of it), and still far more than ``--max-requests``."""
    stats = ProcessStats(service.proc.pid)
    victim = service.client(transport=client_transport())
    ls_latencies(victim, 5)  # connected and warm
    unloaded = ls_latencies(victim)
    with Remote("flood", service.url, service.fingerprint, flood, "describe") as attacker:
        attacker.expect("SENT")
        cpu, start = stats.cpu(), time.monotonic()
        loaded = ls_latencies(victim)
        busy = (stats.cpu() - cpu) / (time.monotonic() - start)
        attacker.tell("count")
        answered = int(attacker.expect("ANSWERED")[0])
        # The victim measured while the flood was being served, else this proves nothing.
        assert 0 < answered < flood, f"{answered} of {flood} flood requests answered"
        attacker.tell()
        attacker.expect("CLOSED")
        closed = time.monotonic()
        wait_until(lambda: idle(stats), 10, "server CPU back to idle after the attacker left")
        to_idle = time.monotonic() - closed
    unloaded += ls_latencies(victim)
    ratio = statistics.median(loaded) / statistics.median(unloaded)
    print(
        f"ls unloaded {statistics.median(unloaded) * 1000:.1f} ms, under flood "
        f"{statistics.median(loaded) * 1000:.1f} ms (x{ratio:.2f}), server busy {busy:.2f} "
        f"cores, {answered} of {flood} answered; idle {to_idle:.2f} s after the attacker closed"
    )
    assert ratio < 3, f"another client's ls is {ratio:.1f}x slower under the flood"
    # The last window that counted as idle started up to 0.1 s before wait_until returned.
    assert to_idle < 1.0, f"the server kept working {to_idle:.1f} s after the attacker left"
