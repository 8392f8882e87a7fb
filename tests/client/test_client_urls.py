"""Service addresses: what the client accepts, what it refuses (at once, saying what
works), that each accepted form reaches a real service, and that the work of a client
given several endpoints is spread over them (the choice itself: test_spread.py)."""

from __future__ import annotations

import asyncio
import random
import re
from dataclasses import replace
from typing import Any

import pyarrow as pa
import pytest

from aqueduct_core.transport import ClientTLS
from aqueduct_spark.client import (
    DEFAULT_PORT,
    AsyncClient,
    Client,
    ClientConfig,
    Endpoint,
    parse_endpoints,
    parse_url,
)
from aqueduct_spark.client.session import BULK
from aqueduct_spark.client.spread import spread_for
from aqueduct_spark.testing import ServiceProcess, closed_port, start_service


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("quic://data1:5000", [Endpoint("data1", 5000)]),
        ("aqueduct://data1:5000", [Endpoint("data1", 5000)]),
        ("tcp://data1:5000", [Endpoint("data1", 5000, "tcp")]),
        ("data1:5000", [Endpoint("data1", 5000)]),
        ("data1", [Endpoint("data1", DEFAULT_PORT)]),
        ("quic://data1", [Endpoint("data1", DEFAULT_PORT)]),
        ("QUIC://Data1:5000/", [Endpoint("data1", 5000)]),
        ("quic://[::1]:4433", [Endpoint("::1", 4433)]),
        ("tcp://[2001:db8::7]", [Endpoint("2001:db8::7", DEFAULT_PORT, "tcp")]),
        ("[::1]:5000", [Endpoint("::1", 5000)]),
        ("::1", [Endpoint("::1", DEFAULT_PORT)]),
        ("10.0.0.7:5000", [Endpoint("10.0.0.7", 5000)]),
        (
            "quic://a:1, tcp://b:2,c,",
            [Endpoint("a", 1), Endpoint("b", 2, "tcp"), Endpoint("c", DEFAULT_PORT)],
        ),
    ],
)
def test_accepted_addresses(url: str, expected: list[Endpoint]) -> None:
    assert parse_endpoints(url) == expected
    assert parse_url(url) == [(e.host, e.port) for e in expected]


def test_the_default_port_is_the_one_aqueduct_serve_listens_on() -> None:
    from aqueduct_spark.cli.arguments import DEFAULT_URL, build_parser

    assert parse_url(DEFAULT_URL) == [("127.0.0.1", DEFAULT_PORT)]
    assert build_parser().parse_args(["serve"]).port == DEFAULT_PORT


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("http://data1:4433", "http:// is not one this client speaks (the service speaks Aqueduct"),
        ("https://data1", "https:// is not one this client speaks"),
        ("udp://data1:4433", "udp:// is not one"),
        ("quic://data1:0", "1 to 65535"),
        ("quic://data1:70000", "'70000' is not a number from 1 to 65535"),
        ("data1:port", "'port' is not a number"),
        ("quic://::1:4433", "an IPv6 address goes in brackets"),
        ("quic://[::1", "Invalid IPv6 URL"),
        ("quic://admin:pw@data1:4433", "give the token option instead"),
        ("quic://data1:4433/trips", "no path"),
        ("quic://:4433", "no host name"),
    ],
)
def test_refused_addresses_say_what_is_wrong_and_what_works(url: str, problem: str) -> None:
    with pytest.raises(ValueError) as refused:
        parse_endpoints(url)
    message = str(refused.value)
    assert repr(url.strip()) in message and problem in message
    assert "use quic://host:port (or tcp://host:port" in message
    assert "quic://[::1]:4433" in message  # the IPv6 form is shown


@pytest.mark.parametrize("url", ["", " , ,"])
def test_no_address_at_all(url: str) -> None:
    with pytest.raises(ValueError, match="no service address given: use quic://host:port"):
        parse_endpoints(url)


def test_a_client_with_a_bad_address_fails_when_made_before_any_network() -> None:
    with pytest.raises(ValueError, match="http:// is not one this client speaks"):
        Client("http://127.0.0.1:4433")


def _client(svc: ServiceProcess, url: str) -> Client:
    return Client(url, tls=ClientTLS(fingerprint=svc.fingerprint), retries=0)


def test_each_form_reaches_a_real_service(service: ServiceProcess) -> None:
    port = service.port
    # each client closed: one dropped open leaves its sockets (the race's QUIC and TCP) to
    # the garbage collector, whose ResourceWarning then fails whichever test runs next
    with _client(service, f"quic://127.0.0.1:{port}") as client:
        client.write("urls", pa.table({"n": [1, 2]}))
    for url in (f"aqueduct://127.0.0.1:{port}", f"127.0.0.1:{port}", f"localhost:{port}"):
        with _client(service, url) as client:
            assert client.describe("urls").rows == 2, url
    with _client(service, f"tcp://127.0.0.1:{port}") as over_tcp:
        assert over_tcp.read("urls").num_rows == 2
        assert over_tcp.transport == "tcp"  # tcp:// forces TLS/TCP (the default races QUIC)


def test_a_list_is_tried_in_order(service: ServiceProcess) -> None:
    """The first address refuses (nothing listens on TCP port 1), the second answers."""
    with _client(service, f"tcp://127.0.0.1:1, quic://127.0.0.1:{service.port}") as client:
        client.list()
        assert client.transport in ("quic", "tcp")


def test_an_ipv6_literal_reaches_a_service_on_ipv6(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    svc = start_service(tmp_path_factory.mktemp("v6-root"), args=["--host", "::1"])
    try:
        assert svc.url == f"quic://[::1]:{svc.port}"  # what serve prints is usable as is
        for url in (svc.url, f"tcp://[::1]:{svc.port}"):
            with _client(svc, url) as client:
                client.write("v6", pa.table({"n": [1]}))
                assert client.read("v6").num_rows >= 1, url
    finally:
        svc.stop()


@pytest.mark.quic
def test_work_spreads_over_endpoints_and_avoids_a_dead_one(
    service: ServiceProcess, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Reads and writes spread over the two live endpoints; the closed port is avoided
    after its first refusal; a scan cut off mid-way resumes on the other endpoint. And a
    host that stops answering (SIGSTOP: not even pings answered; QUIC ignores ICMP after the
    handshake, so a dead host is known by its silence) is left after STALL seconds: both
    endpoints fall silent here, are left in turn, and the scan is done once it is back.

    Nothing here assumes a fast machine: a small receive window keeps the service from
    sending a scan far ahead of its reader (else a slow reader has the whole task buffered
    before the cut, which then cuts nothing); the silent endpoints are held open before the
    stop (one being connected to is not watched for silence: connecting has its own
    timeout); and the service is resumed once both were left, not after a fixed time, with
    STALL back to its default (a short one would also judge the resumed service's first
    answer, a handshake and a scan, against 0.25 s)."""
    import logging
    import os
    import signal

    from aqueduct_core.engine.config import EngineConfig
    from aqueduct_core.transport import TransportConfig
    from aqueduct_spark.client import spreader as spread_module

    port = service.url.rsplit(":", 1)[1]
    tcp_url = f"tcp://127.0.0.1:{port}"
    small_window = TransportConfig(engine=EngineConfig(flow_window=16 * 1024))
    config = ClientConfig(
        f"quic://127.0.0.1:{closed_port()},{service.url},{tcp_url}",
        tls=ClientTLS(fingerprint=service.fingerprint),
        token=service.token,
        retries=1,
        transport=small_window,
    )
    ids = pa.array(range(8_000), pa.int64())
    table = pa.table({"id": ids, "s": pa.array([f"row-{i}" for i in range(8_000)])})

    class ResumeWhenBothAreLeft(logging.Handler):
        """SIGCONT to the service once the scan left both silent endpoints."""

        def __init__(self) -> None:
            super().__init__()
            self.left = 0

        def emit(self, record: logging.LogRecord) -> None:
            if "no answer for 0.25 s" in record.getMessage():
                self.left += 1
                if self.left == 2:
                    resume()

    def resume() -> None:
        monkeypatch.setattr(spread_module, "STALL", normal_stall)
        os.kill(service.proc.pid, signal.SIGCONT)

    normal_stall = spread_module.STALL

    async def run() -> tuple[list[Any], pa.Schema, list[int]]:
        async with AsyncClient(config) as client:
            spread = spread_for(client._endpoints)
            name = f"spread_{random.randrange(1 << 30)}"
            txn = await client.begin(name, table.schema)
            staged = await asyncio.gather(
                *(
                    client.write_task(txn, table.slice(i * 2_000, 2_000).to_batches())
                    for i in range(4)
                )
            )
            await client.commit(txn, staged)
            assert spread.avoided()[0] and spread.done()[1] >= 1 and spread.done()[2] >= 1

            plan = await client.plan(name, min_tasks=4)
            tasks = plan.task_splits()
            assert len(tasks) == 4

            async def scan(task: list[dict[str, object]], home: int, cut: bool) -> list[int]:
                got: list[int] = []
                async for batch in client.scan(
                    task, schema=plan.schema, batch_rows=200, endpoint=home
                ):
                    got += batch.column("id").to_pylist()
                    if cut and len(got) == 200:  # lose the connection mid-scan
                        spreader = client._spreader
                        assert spreader is not None
                        held = spreader._clients[home]._held(BULK)
                        assert held is not None
                        await held.close()
                return got

            before = spread.done()
            read = await asyncio.gather(*(scan(t, 1 + i % 2, i == 0) for i, t in enumerate(tasks)))
            after = spread.done()
            rows = sorted(r for part in read for r in part)
            assert rows == list(range(8_000))  # every row exactly once
            assert after[1] - before[1] >= 2 and after[2] - before[2] >= 2
            assert "(resuming after row 200)" in caplog.text  # the cut one moved on
        return tasks, plan.schema, read[0]

    async def stall(tasks: list[Any], schema: pa.Schema, expected: list[int]) -> None:
        # The two live endpoints alone (a spread of its own, nothing avoided), each with
        # its bulk connection open and proven.
        again = replace(config, url=f"{service.url},{tcp_url}", retry_backoff=0.05)
        async with AsyncClient(again) as client:
            for home in (0, 1):
                async for _ in client.scan(tasks[1], schema=schema, endpoint=home):
                    pass
            spreader = client._spreader
            assert spreader is not None
            assert all(spreader._clients[i]._held(BULK) is not None for i in (0, 1))
            # Stopped before the scan, so that nothing of it can be buffered already.
            monkeypatch.setattr(spread_module, "STALL", 0.25)
            os.kill(service.proc.pid, signal.SIGSTOP)
            backstop = asyncio.get_running_loop().call_later(10, resume)
            got = [
                i
                async for b in client.scan(tasks[0], schema=schema, endpoint=0)
                for i in b.column("id").to_pylist()
            ]
            backstop.cancel()
            assert got == expected
            left = re.findall(r"at (\S+) failed \(no answer for 0\.25 s\b", caplog.text)
            assert sorted(left) == sorted([service.url, tcp_url])  # each left once, in turn

    watcher = ResumeWhenBothAreLeft()
    logging.getLogger("aqueduct.client").addHandler(watcher)
    try:
        asyncio.run(stall(*asyncio.run(run())))
    finally:
        logging.getLogger("aqueduct.client").removeHandler(watcher)
        os.kill(service.proc.pid, signal.SIGCONT)


@pytest.mark.quic
@pytest.mark.parametrize(
    ("transport", "told", "pause"),
    [
        ("auto", "the TCP connection closed", 0.0),  # scans go over TLS/TCP by default
        ("quic", "its host says nothing listens there any more (ICMP unreachable)", 0.8),
    ],
)
def test_a_host_killed_mid_scan_is_left_at_once(
    service: ServiceProcess,
    caplog: pytest.LogCaptureFixture,
    transport: str,
    told: str,
    pause: float,
) -> None:
    """The first endpoint is a host whose service is SIGKILLed while a scan streams from it:
    its kernel says so (ends the TCP connection; answers QUIC's pings with ICMP port
    unreachable), so the scan moves at once, not after STALL seconds of silence, to the
    endpoint the planner gave it next, and every row arrives exactly once. Over QUIC the
    host is first paused (SIGSTOP) for longer than the pings' interval: silent, but nothing
    said, so the scan stays and goes on when it is back. The host is a
    relay process in front of the service (a second ``aqueduct serve`` would cost seconds to
    start; the client sees the same: a killed process's sockets closed by its kernel). A
    small flow-control window keeps the service from sending the scan ahead, so the kill cuts
    it after its third batch and the little that was in flight. The survivor sends only the
    rows not delivered (its ``status`` counts the rows its connection carried): the resumed
    scan asked it to leave out the others. A real service SIGKILLed under Spark:
    test_scale_out (slow)."""
    import os
    import signal

    from aqueduct_core.engine.config import EngineConfig
    from aqueduct_core.testing.relay import Relay
    from aqueduct_core.transport import TransportConfig

    rows = 30_000
    name = f"killed_{random.randrange(1 << 30)}"
    _client(service, service.url).write(name, pa.table({"id": pa.array(range(rows))}))
    host = Relay.start(service.port)
    config = ClientConfig(
        f"quic://127.0.0.1:{host.port},{service.url}",
        tls=ClientTLS(fingerprint=service.fingerprint),
        token=service.token,
        transport=TransportConfig(transport=transport, engine=EngineConfig(flow_window=16 * 1024)),
    )

    async def run() -> tuple[list[int], int]:
        async with AsyncClient(config) as client:
            plan = await client.plan(name)
            got: list[int] = []
            async for batch in client.scan(
                plan.splits[0], schema=plan.schema, batch_rows=1_000, endpoint=(0, 1)
            ):
                if not got and pause:  # a pause (a GC, a loaded machine): no cause to move
                    os.kill(host.proc.pid, signal.SIGSTOP)
                    asyncio.get_running_loop().call_later(
                        pause, os.kill, host.proc.pid, signal.SIGCONT
                    )
                if len(got) == 2_000:
                    os.kill(host.proc.pid, signal.SIGKILL)
                got += batch.column("id").to_pylist()
            assert spread_for(client._endpoints).avoided() == [True, False]
            assert client._spreader is not None
            survivor = await client._spreader.client(1).call("status", lane=BULK)
            (carried,) = [c["rows"] for c in survivor["connections_listed"] if c["yours"]]
            return got, carried

    try:
        got, carried = asyncio.run(run())
    finally:
        host.stop()
    assert sorted(got) == list(range(rows))  # every row exactly once
    assert caplog.text.count("failed (") == 1  # moved once: on the kill, not the pause
    cut = re.search(r"resuming after row (\d+)", caplog.text)
    assert cut is not None and 3_000 <= int(cut[1]) < rows  # cut, with what was in flight
    assert carried == rows - int(cut[1])  # none of the rows delivered was sent again
    assert told in caplog.text  # known by the host's word, not by STALL s of silence


def _requests_ok(metrics_url: str) -> dict[str, float]:
    """A service's requests answered ok so far, by operation (its ``/metrics``)."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(metrics_url, timeout=10) as answer:
        text = answer.read().decode()
    return {
        s.labels["operation"]: s.value
        for family in text_string_to_metric_families(text)
        if family.name == "aqueduct_requests"
        for s in family.samples
        if s.name == "aqueduct_requests_total" and s.labels.get("outcome") == "ok"
    }


def test_each_process_commits_the_writes_it_received(service: ServiceProcess) -> None:
    """A second ``aqueduct serve`` over the module's root: appends through a URL naming a
    dead endpoint and both processes each go whole (begin, data, commit) to one live
    process, so both commit (the commits race for the log's versions across processes);
    every row lands exactly once, none is lost."""
    metrics = closed_port()
    other = start_service(service.root, args=["--metrics-port", str(metrics)])
    try:
        url = f"quic://127.0.0.1:{closed_port()},{service.url},{other.url}"
        config = ClientConfig(url, tls=ClientTLS(fingerprint=service.fingerprint), retries=1)
        name = f"homes_{random.randrange(1 << 30)}"
        writes = 6

        async def run() -> list[int]:
            async with AsyncClient(config) as client:
                await client.create(name, pa.schema([("id", pa.int64())]))
                done = await asyncio.gather(
                    *(
                        client.append(name, pa.table({"id": pa.array(range(i * 50, i * 50 + 50))}))
                        for i in range(writes)
                    )
                )
                assert all(d["committed"] for d in done)
                table = await client.read(name)
                return sorted(table.column("id").to_pylist())

        before = _requests_ok(f"http://127.0.0.1:{metrics}/metrics")
        assert asyncio.run(run()) == list(range(writes * 50))  # every row exactly once
        after = _requests_ok(f"http://127.0.0.1:{metrics}/metrics")
        there = {op: after.get(op, 0) - before.get(op, 0) for op in ("begin", "write", "commit")}
        # the second process began, received and committed the same writes: some, not all
        assert 0 < there["commit"] < writes, there
        assert there["begin"] == there["write"] == there["commit"], there
    finally:
        other.stop()
