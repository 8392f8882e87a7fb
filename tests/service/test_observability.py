"""Service observability (issue 20 item 4) against a real ``aqueduct serve`` process: the
Prometheus counters move during a real client write (scraped over real HTTP), every request
leaves an access line with its fields and outcome, tokens never reach the log, ``/health``
answers, and ``--workers`` gives each worker its own metrics port."""

from __future__ import annotations

import json
import logging
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from prometheus_client.parser import text_string_to_metric_families

from aqueduct_spark import protocol as P
from aqueduct_spark.service.observability import JsonFormatter, TextFormatter
from aqueduct_spark.testing import ServiceProcess, start_service

TOKEN = "tok-9c1e77-never-logged"
WRONG = "wrong-4d20aa-never-logged"
BATCHES, ROWS = 6, 2000


def get(url: str) -> tuple[int, str, str]:
    """(status, content type, body) of a real HTTP GET."""
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return resp.status, resp.headers["Content-Type"], resp.read().decode()
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.headers["Content-Type"], exc.read().decode()


def scrape(base: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of ``/metrics``, parsed by prometheus-client's own text parser."""
    status, ctype, body = get(base + "/metrics")
    assert status == 200 and ctype.startswith("text/plain"), (status, ctype)
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(body)
        for s in family.samples
    }


def value(samples: dict[Any, float], name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def log_lines(log: Path, logger: str) -> list[dict[str, Any]]:
    lines = [json.loads(x) for x in log.read_text().splitlines() if x.startswith("{")]
    return [x for x in lines if x["logger"] == logger]


def wait_for_line(log: Path, logger: str = "aqueduct.access", **match: Any) -> dict[str, Any]:
    """The line with these fields (an access line is written as the request ends)."""
    deadline = time.monotonic() + 10
    while True:
        for line in log_lines(log, logger):
            if all(line.get(k) == v for k, v in match.items()):
                return line
        assert time.monotonic() < deadline, f"no {logger} line with {match}"
        time.sleep(0.05)


def metrics_urls(log: Path) -> list[str]:
    """Where each service process's metrics port listens, as its log says (``--metrics-port
    0``: a port the process bound itself, so no other process can take it meanwhile)."""
    lines = log_lines(log, "aqueduct.service")
    return [x["url"] for x in lines if x["msg"] == "metrics and health endpoint listening"]


@pytest.fixture(scope="module")
def observed(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[ServiceProcess, str, Path]]:
    root = tmp_path_factory.mktemp("observed")
    log = root.parent / "observed-service.log"
    # debug: the check that no token reaches the log covers every level
    flags = ["--metrics-port", "0", "--log-format", "json", "--log-level", "debug"]
    svc = start_service(root, token=TOKEN, args=flags, log=log)
    (url,) = metrics_urls(log)  # logged before the ready line
    assert re.fullmatch(r"http://127\.0\.0\.1:\d+", url), url
    yield svc, url, log
    svc.stop()


def test_metrics_move_during_a_write(observed: tuple[ServiceProcess, str, Path]) -> None:
    svc, base, _ = observed
    client = svc.client()
    schema = pa.schema([("id", pa.int64()), ("name", pa.string())])
    before = scrape(base)
    txn = client.begin("observed_write", schema, mode="create")
    after_begin = scrape(base)
    assert value(after_begin, "aqueduct_requests_total", operation="begin", outcome="ok") == (
        value(before, "aqueduct_requests_total", operation="begin", outcome="ok") + 1
    )
    seen_mid_write: list[dict[Any, float]] = []

    def batches() -> Iterator[pa.RecordBatch]:
        for i in range(BATCHES):
            if i == BATCHES // 2:
                # Half the batches are out: the service counts them while the write runs.
                rows_in = value(before, "aqueduct_rows_total", direction="in")
                deadline = time.monotonic() + 10
                while True:
                    now = scrape(base)
                    if value(now, "aqueduct_rows_total", direction="in") > rows_in:
                        break
                    assert time.monotonic() < deadline, "rows_total did not move mid-write"
                    time.sleep(0.05)
                seen_mid_write.append(now)
            ids = pa.array(range(i * ROWS, (i + 1) * ROWS), pa.int64())
            yield pa.record_batch([ids, pa.array([f"n{j}" for j in range(ROWS)])], schema=schema)

    staged = client.write_task(txn, batches())
    (mid,) = seen_mid_write
    assert value(mid, "aqueduct_requests_in_flight") >= 1  # the write had not ended
    assert value(mid, "aqueduct_connections_open") >= 1
    assert value(mid, "aqueduct_bytes_total", direction="in") > value(
        before, "aqueduct_bytes_total", direction="in"
    )
    after_write = scrape(base)
    assert value(after_write, "aqueduct_rows_total", direction="in") == (
        value(before, "aqueduct_rows_total", direction="in") + BATCHES * ROWS
    )
    assert value(after_write, "aqueduct_requests_total", operation="write", outcome="ok") == 1
    commits = value(after_write, "aqueduct_commits_total")
    latency = value(after_write, "aqueduct_commit_duration_seconds_count")

    client.commit(txn, [staged])
    done = scrape(base)
    assert value(done, "aqueduct_commits_total") == commits + 1
    assert value(done, "aqueduct_commit_duration_seconds_count") == latency + 1
    assert value(done, "aqueduct_commit_duration_seconds_sum") > 0
    assert value(done, "aqueduct_connections_total", transport="quic") >= 1
    assert not any(
        name == "aqueduct_requests_total" and ("operation", "unknown") in labels
        for name, labels in done
    ), "a request of the client was counted as an unknown operation"
    for kind in ("credit", "transport"):
        assert ("aqueduct_flow_control_stalls_total", (("kind", kind),)) in done
    assert value(done, "process_resident_memory_bytes") > 0

    assert client.read("observed_write").num_rows == BATCHES * ROWS
    read = scrape(base)
    assert value(read, "aqueduct_rows_total", direction="out") >= BATCHES * ROWS


def test_access_lines_carry_the_fields_and_outcome(
    observed: tuple[ServiceProcess, str, Path],
) -> None:
    svc, base, log = observed
    client = svc.client()
    data = pa.table({"x": pa.array(range(500), pa.int64())})
    client.write("observed_access", data, mode="create")
    line = wait_for_line(log, op="write", dataset="observed_access")
    assert line["outcome"] == "ok" and line["level"] == "info"
    assert line["rows"] == 500 and line["bytes"] > 0
    assert isinstance(line["duration_ms"], int | float) and line["duration_ms"] >= 0
    assert re.fullmatch(r"127\.0\.0\.1:\d+", line["peer"]), line["peer"]
    assert line["user"] == "the --token token"  # the grant's name, never the token
    assert line["msg"] == "request" and re.fullmatch(r"\d{4}-.*T.*Z", line["ts"])
    commit = wait_for_line(log, op="commit", dataset="observed_access")
    assert commit["outcome"] == "ok"

    with pytest.raises(P.DatasetNotFound):
        client.describe("observed_missing")
    missing = wait_for_line(log, op="describe", dataset="observed_missing")
    assert missing["outcome"] == "not_found" and "does not exist" in missing["error"]

    stranger = svc.client(token=WRONG)
    with pytest.raises(P.Unauthenticated):
        stranger.list()
    refused = wait_for_line(log, op="list", outcome="unauthenticated")
    assert refused["level"] == "warning" and refused["rows"] == 0 and refused["user"] == "-"
    opened = wait_for_line(log, "aqueduct.service", msg="connection opened", peer=refused["peer"])
    assert opened["transport"] in ("quic", "tcp")
    stranger.close()
    closed = wait_for_line(log, "aqueduct.service", msg="connection closed", peer=refused["peer"])
    assert closed["requests"] == 1 and closed["duration_s"] >= 0
    assert value(
        scrape(base), "aqueduct_requests_total", operation="list", outcome="unauthenticated"
    )

    text = log.read_text()
    assert TOKEN not in text and WRONG not in text  # neither the right token nor a wrong one


def test_a_connection_without_requests_is_logged_at_debug_only(
    observed: tuple[ServiceProcess, str, Path],
) -> None:
    """The losing side of a client's QUIC/TCP race connects and closes without a request:
    at the default level it leaves nothing in the log (was: ``connection opened ...
    transport=tcp`` and ``connection closed requests=0`` at INFO for every race loser)."""
    import asyncio

    from aqueduct_core import ClientTLS, connect

    svc, _, log = observed

    async def idle() -> None:
        conn = await connect(
            "127.0.0.1", svc.port, transport="tcp", tls=ClientTLS(fingerprint=svc.fingerprint)
        )
        await conn.close(0, "another transport won the race")

    asyncio.run(idle())
    closed = wait_for_line(log, "aqueduct.service", msg="connection closed", requests=0)
    assert closed["level"] == "debug"
    opened = wait_for_line(log, "aqueduct.service", msg="connection opened", peer=closed["peer"])
    assert opened["level"] == "debug" and opened["transport"] == "tcp"
    loud = [
        x
        for x in log_lines(log, "aqueduct.service")
        if x["msg"].startswith("connection ") and x["level"] != "debug"
    ]
    assert all(x["msg"] == "connection opened" or x["requests"] > 0 for x in loud), loud


def test_health_answers_and_unknown_paths_do_not(
    observed: tuple[ServiceProcess, str, Path],
) -> None:
    _, base, _ = observed
    status, ctype, body = get(base + "/health")
    assert status == 200 and ctype == "application/json"
    health = json.loads(body)
    assert health["status"] == "ok" and health["protocol"] == P.PROTOCOL_VERSION
    assert health["uptime_s"] >= 0 and health["connections"] >= 0
    status, _, body = get(base + "/nothing-here")
    assert status == 404 and "/metrics" in body
    request = urllib.request.Request(base + "/health", method="POST", data=b"x")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    with refused.value:
        assert refused.value.code == 405


# Slow (two workers spawned: 26 s at load 12). The fast suite has the port arithmetic
# (test_worker_i_gets_metrics_port_plus_i), metrics of one worker (test_metrics_move_during_a_write)
# and two workers serving one port (test_service.py::test_several_worker_processes_share_one_port).
@pytest.mark.slow
def test_each_worker_serves_its_own_metrics_port(tmp_path: Path) -> None:
    log = tmp_path / "workers.log"
    flags = ["--metrics-port", "0", "--log-format", "json"]
    svc = start_service(tmp_path / "root", workers=2, args=flags, log=log)
    try:
        urls = metrics_urls(log)  # every worker listens before the ready line
        assert len(set(urls)) == 2, urls
        tagged = {x.get("worker") for x in log_lines(log, "aqueduct.service")}
        assert tagged == {0, 1}  # every line says which worker wrote it
        workers = set()
        for url in urls:
            status, _, body = get(url + "/health")
            assert status == 200
            workers.add(json.loads(body)["worker"])
            assert "aqueduct_connections_open" in get(url + "/metrics")[2]
        assert workers == {0, 1}
    finally:
        svc.stop()


def test_worker_i_gets_metrics_port_plus_i() -> None:
    from aqueduct_spark.cli.serve import _worker_specs

    metrics = {"host": "10.0.0.5", "port": 9464, "worker": None}
    log = {"level": "info", "format": "text"}
    specs = _worker_specs({"metrics": metrics, "log": log}, 3)
    assert [(m["host"], m["port"], m["worker"]) for m in (s["metrics"] for s in specs)] == [
        ("10.0.0.5", 9464, 0),
        ("10.0.0.5", 9465, 1),
        ("10.0.0.5", 9466, 2),
    ]
    assert [s["log"]["worker"] for s in specs] == [0, 1, 2]  # a field of its log lines
    free = _worker_specs({"metrics": {**metrics, "port": 0}, "log": log}, 2)
    assert [s["metrics"]["port"] for s in free] == [0, 0]  # each binds a free one itself
    plain = _worker_specs({"metrics": None, "log": log}, 2)
    assert [(s["metrics"], s["log"]["worker"]) for s in plain] == [(None, 0), (None, 1)]
    with pytest.raises(ValueError, match="no room for 3 workers"):
        _worker_specs({"metrics": {**metrics, "port": 65534}, "log": log}, 3)


def test_a_metrics_port_in_use_stops_the_start_with_the_fix(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        cmd = [sys.executable, "-m", "aqueduct_spark.cli", "serve", "--root", str(tmp_path)]
        done = subprocess.run(
            [*cmd, "--port", "0", "--metrics-port", str(port)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert done.returncode == 2, done.stderr  # a startup error: one line, status 2
    assert f"cannot listen for metrics on http://127.0.0.1:{port}" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "--metrics-port" in done.stderr and "Traceback" not in done.stderr
    assert "AQUEDUCT_READY" not in done.stdout


def _record(**fields: Any) -> logging.LogRecord:
    record = logging.LogRecord("aqueduct.access", logging.INFO, __file__, 1, "request", (), None)
    record.fields = fields
    return record


def test_text_format_is_key_value_with_quoting_where_needed() -> None:
    line = TextFormatter().format(
        _record(peer="[::1]:5000", op="write", rows=3, error='no "x" here', dataset="")
    )
    assert re.fullmatch(
        r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z INFO aqueduct\.access: request "
        r'peer=\[::1\]:5000 op=write rows=3 error="no \\"x\\" here" dataset=""',
        line,
    ), line


def test_json_format_is_one_object_per_line() -> None:
    line = JsonFormatter().format(_record(op="scan", rows=7, msg="not the message"))
    assert "\n" not in line
    parsed = json.loads(line)
    assert parsed["msg"] == "request"  # a field never overwrites the record's own keys
    assert (parsed["op"], parsed["rows"], parsed["level"]) == ("scan", 7, "info")


def aqueduct(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "aqueduct_spark.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={"PATH": "/usr/bin:/bin", "HOME": str(Path.home())},  # no AQUEDUCT_* of ours
    )


def test_status_shows_a_service_up_with_or_without_the_token(
    observed: tuple[ServiceProcess, str, Path],
) -> None:
    svc, _, _ = observed
    trust = ["--fingerprint", svc.fingerprint]
    done = aqueduct("status", svc.url, *trust, "--token", TOKEN)
    assert done.returncode == 0, done.stderr
    assert f"service   {svc.url}" in done.stdout
    assert re.search(r"status    up, over (quic|tcp)", done.stdout), done.stdout
    assert re.search(r"latency   [\d.]+ ms to the first answer", done.stdout)
    assert re.search(r"datasets  \d+ \(", done.stdout)

    refused = aqueduct("status", svc.url, *trust, "--json")
    assert refused.returncode == 0, refused.stderr
    report = json.loads(refused.stdout)
    assert report["status"] == "up" and report["authenticated"] is False
    assert "token" in report["error"] and report["first_answer_ms"] > 0


def test_status_of_a_service_that_is_not_there_is_down() -> None:
    with socket.socket() as s:  # a TCP port nobody listens on: refused at once
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    done = aqueduct("status", f"tcp://127.0.0.1:{port}", "--insecure", "--json")
    assert done.returncode == 1
    report = json.loads(done.stdout)
    assert report["status"] == "down" and f"127.0.0.1:{port}" in report["error"]


def test_a_metrics_host_of_colons_answers_ipv4_and_ipv6() -> None:
    """``--host ::`` serves clients over IPv6 and IPv4; so does its metrics port."""
    import asyncio

    from aqueduct_spark.service.health import start_http
    from aqueduct_spark.service.observability import Observer

    async def both() -> list[int]:
        endpoint = await start_http(Observer(), "::", 0)
        loop = asyncio.get_running_loop()
        try:
            urls = [f"http://{h}:{endpoint.port}/health" for h in ("127.0.0.1", "[::1]")]
            return [(await loop.run_in_executor(None, get, url))[0] for url in urls]
        finally:
            await endpoint.close()

    assert asyncio.run(both()) == [200, 200]


def test_a_reader_with_a_small_window_shows_as_credit_stalls(
    observed: tuple[ServiceProcess, str, Path],
) -> None:
    """Batches bigger than the client's flow-control window, read slowly: the service's next
    batch waits for the reader to take the one before (the engine counts each wait), and
    the metric shows it. (A fast reader may take a batch before the next is ready: then
    nothing waited, and nothing is counted.)"""
    from aqueduct_core.engine import EngineConfig
    from aqueduct_core.transport import TransportConfig

    svc, base, _ = observed
    rows = 20_000
    names = pa.array([f"name-{i:08d}" for i in range(rows)])
    svc.client().write("observed_stalls", pa.table({"id": range(rows), "name": names}))
    before = value(scrape(base), "aqueduct_flow_control_stalls_total", kind="credit")
    small = TransportConfig(engine=EngineConfig(flow_window=16 * 1024))
    reader = svc.client(transport=small)
    plan = reader.plan("observed_stalls")
    got = 0
    for split in plan.splits:
        for batch in reader.scan(split, schema=plan.schema, batch_rows=2000):
            got += batch.num_rows
            time.sleep(0.1)  # a slow reader: the service has the next batch ready meanwhile
    assert got == rows
    after = value(scrape(base), "aqueduct_flow_control_stalls_total", kind="credit")
    assert 5 <= after - before <= rows // 2000, (before, after)  # at most one per batch
    reader.close()


def test_serve_without_the_prometheus_client_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    import importlib.util

    from aqueduct_spark import cli

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name: None if name == "prometheus_client" else find_spec(name),
    )
    assert cli.main(["serve", "--root", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "needs the Prometheus client: pip install 'aqueduct-spark[service]'" in err, err
