"""One client floods ``aqueduct serve``; another client, and the server's CPU, must not notice.

Issue 13: 20,000 cheap requests from one connection made another client's ``ls`` take
9-11 s, and the server kept burning CPU for 15 s after the attacker had gone. The service
serves at most ``--max-requests`` of a connection's requests at once, hands its worker
threads to the connections in turn, and cancels a closed connection's work at once
(``aqueduct_spark/service/admission.py``).

Issue 26: a client that fires its requests all at once (the project's own ``AsyncClient``
and ``asyncio.gather``, never yielding) still made another client's ``list`` 38x slower, and
the service served on for 1.6 s after the client was killed: the entrypoint had the 16 MiB
window of every channel, so about 3,900 requests sat parsed in the service, each with its
reply channel, and were all served for nobody. The entrypoint's window is now
``--request-window`` (256 KiB): the rest of a burst waits in the client.

What these tests assert does not depend on how loaded the machine is (2 cores, shared):
the requests the service answers after the flooding client has gone are counted (its
``/metrics``), and bounded by what the service may hold of one connection
(``--max-requests`` running and ``--request-window`` queued), not timed; the other client's
latency is compared with its latency to a second, identical service nobody attacks, the two
measured in turn, so that whatever else loads the machine slows both alike. The absolute
figures of issue 26 (50 ms, idle within 0.5 s) are a benchmark: ``benchmarks/bench_burst.py``.
"""

from __future__ import annotations

import statistics
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pytest
from prometheus_client.parser import text_string_to_metric_families
from service_process import ProcessStats, Remote, client_transport, wait_until

from aqueduct_core.wire.frames import ATTACHMENT_COST, MESSAGE_OVERHEAD
from aqueduct_spark.service.admission import REQUEST_WINDOW
from aqueduct_spark.service.server import ServiceConfig
from aqueduct_spark.testing import ServiceProcess, start_service

pytestmark = [pytest.mark.quic]

SAMPLES = 41
SLOWER = 5
"""How much slower another client's ``ls`` may be than on the unattacked service. Issue 26's
target is 3x (or 50 ms), checked by ``benchmarks/bench_burst.py`` on a quiet machine; here,
on a machine loaded by other work, the attacked service measured 0.9-2.5x, and issue 26's
service 38x (a window's worth of requests parsed in one go stalled its event loop)."""
HELD = ServiceConfig(".").max_requests + REQUEST_WINDOW // (ATTACHMENT_COST + MESSAGE_OVERHEAD)
"""The most requests of one connection the service holds at a time: ``--max-requests``
being served, and what fits in ``--request-window`` (each request carries a reply channel,
which costs ATTACHMENT_COST of the window). Issue 26's service held about 3,900."""


@dataclass
class Observed:
    svc: ServiceProcess
    metrics: str
    """The service's metrics endpoint (``--metrics-port 0``)."""
    control: ServiceProcess
    """A second service like it, which nobody attacks."""

    def answered(self, op: str) -> int:
        """Requests ``op`` the service answered so far, whatever the outcome."""
        with urllib.request.urlopen(self.metrics + "/metrics", timeout=10) as resp:
            body = resp.read().decode()
        return int(
            sum(
                s.value
                for family in text_string_to_metric_families(body)
                for s in family.samples
                if s.name == "aqueduct_requests_total" and s.labels.get("operation") == op
            )
        )


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Observed]:
    root = tmp_path_factory.mktemp("flood-root")
    log = root.parent / "flood-service.log"
    svc = start_service(root, args=["--metrics-port", "0"], log=log)
    control = None
    try:
        control = start_service(tmp_path_factory.mktemp("control-root"))
        for s in (svc, control):
            client = s.client(transport=client_transport())
            for name in ("flood", "other"):
                client.overwrite(name, pa.table({"id": pa.array(range(1000), pa.int64())}))
            client.close()
        yield Observed(svc, metrics_url(log), control)
    finally:
        svc.stop()
        if control is not None:
            control.stop()


def metrics_url(log: Path) -> str:
    """The metrics endpoint the service logged (before its ready line)."""
    for line in log.read_text().splitlines():
        if "metrics and health endpoint listening" in line:
            return line.split("url=", 1)[1].split()[0]
    raise AssertionError(f"no metrics endpoint in {log}")


class Victim:
    """An honest client of the attacked service, and the same client of the control."""

    def __init__(self, service: Observed) -> None:
        self.attacked = service.svc.client(transport=client_transport())
        self.control = service.control.client(transport=client_transport())
        self.ratio()  # connected and warm

    def ratio(self, n: int = SAMPLES) -> tuple[float, float, float]:
        """``ls`` on each service in turn, ``n`` times: the median latencies (attacked,
        control) and their ratio."""
        times: tuple[list[float], list[float]] = ([], [])
        for _ in range(n):
            for client, out in zip((self.attacked, self.control), times, strict=True):
                start = time.monotonic()
                client.list()
                out.append(time.monotonic() - start)
        attacked, control = (statistics.median(t) for t in times)
        return attacked, control, attacked / control

    def close(self) -> None:
        self.attacked.close()
        self.control.close()


def figures(attacked: float, control: float, ratio: float) -> str:
    return f"ls {attacked * 1000:.1f} ms, {control * 1000:.1f} ms unattacked (x{ratio:.2f})"


def idle(stats: ProcessStats) -> bool:
    """The server uses (almost) no CPU: under 15% of a core over 0.1 s."""
    return stats.busy(0.1) < 0.15


def settled(service: Observed, op: str, stats: ProcessStats) -> int:
    """Wait until the service stopped answering ``op`` and its CPU is idle; returns the
    count then. How long that takes is the machine's business, not the test's: only a
    service that never stops fails (after a minute)."""
    last = [service.answered(op)]

    def still() -> bool:
        now = service.answered(op)
        moved, last[0] = now != last[0], now
        return not moved and idle(stats)

    wait_until(still, 60, f"the service to stop answering {op!r} and go idle")
    return last[0]


def test_a_flood_leaves_another_clients_ls_fast_and_ends_with_the_connection(
    service: Observed,
) -> None:
    """A flood from a client that yields every 100 sends, then closes its connection: the
    other client's ``ls`` stays within SLOWER x the unattacked service's, and once the attacker
    has closed, the service answers at most what it held of it (its close may reach the
    service behind the requests already in flight: that race made the old 1 s bound
    flaky)."""
    flood = 5_000
    stats = ProcessStats(service.svc.proc.pid)
    victim = Victim(service)
    before = victim.ratio()
    with Remote("flood", service.svc.url, service.svc.fingerprint, flood, "describe") as attacker:
        attacker.expect("SENT")
        during = victim.ratio()
        attacker.tell("count")
        answered = int(attacker.expect("ANSWERED")[0])
        # The victim measured while the flood was being served, else this proves nothing.
        assert 0 < answered < flood, f"{answered} of {flood} flood requests answered"
        attacker.tell()
        attacker.expect("CLOSED")
        at_close = service.answered("describe")
        after_close = settled(service, "describe", stats) - at_close
    victim.close()
    print(
        f"before the flood {figures(*before)}; under it {figures(*during)}; {answered} of "
        f"{flood} answered; {after_close} more after the attacker closed (at most {HELD})"
    )
    assert during[2] < SLOWER, f"another client's ls is {during[2]:.1f}x slower under the flood"
    assert after_close <= HELD, (
        f"the service answered {after_close} requests after the attacker closed its "
        f"connection; it may hold {HELD} of one connection"
    )


@pytest.mark.parametrize(
    "transport,burst",
    [
        # 5-10 s each: make slow. The fast suite covers the burst with
        # tests/service/test_burst.py (the real service code in memory: it holds at most its
        # window, and a closed connection's requests never start; 0.2 s) and the fairness
        # between connections with tests/service/test_admission.py.
        pytest.param("quic", 5_000, marks=pytest.mark.slow),
        pytest.param("quic", 20_000, marks=pytest.mark.slow),
        pytest.param("tcp", 5_000, marks=pytest.mark.slow),
    ],
)
def test_a_burst_waits_in_its_client_and_ends_when_the_client_is_killed(
    service: Observed, transport: str, burst: int
) -> None:
    """Issue 26's client in its own process: ``asyncio.gather`` of ``burst`` requests,
    never yielding; the other client's ``ls`` stays within SLOWER x the unattacked service's.
    Then the bursting client is killed (SIGKILL: over QUIC nothing tells the service) at a
    moment its requests wait for credit, so the service holds all it may of them; it answers
    at most that (issue 26: about 3,900 requests, 1.6 s of CPU). Over TCP the kernel closes
    a killed process's socket: the service cancels what runs and drops what waits at once,
    so it answers at most the requests that were running (cancelled)."""
    stats = ProcessStats(service.svc.proc.pid)
    victim = Victim(service)
    url, fingerprint = service.svc.url, service.svc.fingerprint
    with Remote("burst", url, fingerprint, burst, "describe", transport) as attacker:
        attacker.expect("FIRST")
        during = victim.ratio()
        attacker.tell("count")
        answered = int(attacker.expect("ANSWERED")[0])
        assert answered < burst, "the burst was over before the victim had measured"
        attacker.tell("stalled")
        attacker.expect("STALLED")
        attacker.proc.kill()
        attacker.proc.wait()
        killed, cpu = service.answered("describe"), stats.cpu()
        start = time.monotonic()
        after_kill = settled(service, "describe", stats) - killed
        seconds, cpu = time.monotonic() - start, stats.cpu() - cpu
    victim.close()
    print(
        f"under a burst of {burst} over {transport} {figures(*during)}; after the kill "
        f"{after_kill} answered, settled in {seconds:.2f} s, {cpu:.2f} s CPU"
    )
    assert during[2] < SLOWER, f"another client's ls is {during[2]:.1f}x slower under the burst"
    bound = HELD if transport == "quic" else ServiceConfig(".").max_requests
    assert after_kill <= bound, (
        f"the service answered {after_kill} requests of a client killed over {transport}; "
        f"at most {bound} (HELD: what it may hold of one connection)"
    )
