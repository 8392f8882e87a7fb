"""The Spark host of ``bench_scale``: runs inside its namespace, measures every phase and
prints one ``SCALE_RESULT {json}`` line. See :mod:`benchmarks.bench_scale`.

Each phase is measured the same way (:func:`measure`): seconds, the bytes each service host
sent and received on its cable, and the CPU seconds of each namespace's processes (each
service process, the store, the Spark host's whole process tree: driver, JVM, Python
workers, writers), beside the machine's own busy share (``/proc/stat``, other work included).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.cpu_groups import CpuGroups

READY = "SCALE_RESULT "
MOD = 65536
"""Rows are checked by count, sum of ids and sum of (id mod MOD) squared: a row read twice
or missed changes them (and none overflows a long at the sizes run here)."""


def cables(spec: dict[str, Any], rate: str | None) -> None:
    """Shape every service host's cable to ``rate`` both ways (no change without one)."""
    from benchmarks.realpath_link import shape

    if rate is None or not spec.get("cables"):
        return
    for ns, dev, hub, port in spec["cables"]:
        shape(ns, dev, rate)
        shape(hub, port, rate)


def log(text: str) -> None:
    print(
        f"[{time.strftime('%H:%M:%S')} load {os.getloadavg()[0]:.1f}] {text}",
        file=sys.stderr,
        flush=True,
    )


OPS = ("begin", "write", "commit")
"""The service requests of an append whose counts and seconds each phase reports per host."""


def requests(url: str) -> dict[str, tuple[int, float]]:
    """A service's requests so far (its ``/metrics``): count and seconds per :data:`OPS`."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=10) as answer:
        text = answer.read().decode()
    seen: dict[str, list[float]] = {op: [0, 0.0] for op in OPS}
    for family in text_string_to_metric_families(text):
        if family.name != "aqueduct_request_duration_seconds":
            continue
        for sample in family.samples:
            op = sample.labels.get("operation")
            if op in seen and sample.name.endswith("_count"):
                seen[op][0] = sample.value
            elif op in seen and sample.name.endswith("_sum"):
                seen[op][1] = sample.value
    return {op: (int(n), s) for op, (n, s) in seen.items()}


def machine_jiffies() -> tuple[int, int]:
    """(busy, total) jiffies of the whole machine so far."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]
    return sum(fields) - idle, sum(fields)


class Hosts:
    """The namespaces to watch: service hosts (interface, process), the store, ourselves."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.services: list[dict[str, Any]] = spec["services"]
        self.store_pid: int = spec["store_pid"]
        self.groups = CpuGroups.attach(spec["cpu_groups"]) if spec.get("cpu_groups") else None
        """Each namespace's cgroup (:mod:`.cpu_groups`): CPU seconds that never go
        backwards. Without them, each process tree's live processes are summed."""
        if self.groups is not None:
            self.groups.add("spark", os.getpid())  # before the JVM: all of it starts here

    def cpu(self, name: str, pid: int) -> float:
        """CPU seconds so far of namespace ``name`` (``pid``: its process tree's root)."""
        if self.groups is not None:
            return self.groups.seconds(name)
        from benchmarks.bench_realpath_spark import tree_cpu

        return tree_cpu(pid)

    def snapshot(self) -> dict[str, Any]:
        snap: dict[str, Any] = {"at": time.perf_counter(), "machine": machine_jiffies()}
        for svc in self.services:
            snap[svc["name"]] = {
                "tx": _counter(svc, "tx_bytes"),
                "rx": _counter(svc, "rx_bytes"),
                "cpu": self.cpu(svc["name"], svc["pid"]),
                "requests": _requests_or_none(svc),
            }
        snap["store_cpu"] = self.cpu("store", self.store_pid)
        snap["spark_cpu"] = self.cpu("spark", os.getpid())
        return snap

    def measure(
        self, fn: Callable[[], Any], marks: Path | None = None
    ) -> tuple[Any, dict[str, Any]]:
        """Run ``fn``; its result and what the phase cost (``marks``: a timeline file,
        emptied first; the phase's wall-clock start and end are kept for it)."""
        sampler = None
        if marks is not None:
            marks.write_text("")
            sampler = LinkSampler(self.services, marks)
        before = self.snapshot()
        wall = time.time()
        try:
            result = fn()
        finally:
            if sampler is not None:
                sampler.finish()
        wall_end = time.time()
        after = self.snapshot()
        seconds = after["at"] - before["at"]
        busy = after["machine"][0] - before["machine"][0]
        total = after["machine"][1] - before["machine"][1]
        cost: dict[str, Any] = {
            "seconds": seconds,
            "wall": (wall, wall_end),
            "machine_busy": busy / total if total else 0.0,
            "load": round(os.getloadavg()[0], 1),
            "cpu": {
                "store": after["store_cpu"] - before["store_cpu"],
                "spark": after["spark_cpu"] - before["spark_cpu"],
            },
            "hosts": {},
        }
        for svc in self.services:
            name = svc["name"]
            a, b = after[name], before[name]
            cost["cpu"][name] = a["cpu"] - b["cpu"]
            cost["hosts"][name] = {"tx": a["tx"] - b["tx"], "rx": a["rx"] - b["rx"]}
            if a["requests"] is not None and b["requests"] is not None:
                cost.setdefault("requests", {})[name] = {
                    op: (
                        a["requests"][op][0] - b["requests"][op][0],
                        a["requests"][op][1] - b["requests"][op][1],
                    )
                    for op in OPS
                }
        cost["cpu_share"] = sum(cost["cpu"].values()) / seconds / (os.cpu_count() or 1)
        return result, cost


class LinkSampler:
    """Appends each service host's received and sent bytes, every :data:`SAMPLE` s, to a timeline file
    as ``link`` events (from ``/proc/PID/net/dev``: the service process's namespace, read
    without starting a process) until :meth:`finish`."""

    SAMPLE = 0.1

    def __init__(self, services: list[dict[str, Any]], marks: Path) -> None:
        self.services, self.marks = list(services), marks
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        lines: list[str] = []
        while True:
            at = time.time()
            for svc in self.services:
                moved = _moved(svc)
                if moved is not None:
                    rx, tx = moved
                    lines.append(
                        json.dumps(
                            {"kind": "link", "host": svc["name"], "at": at, "tx": tx, "rx": rx}
                        )
                    )
            if self.stop.wait(self.SAMPLE):
                break
        with self.marks.open("a") as f:
            f.write("".join(line + "\n" for line in lines))

    def finish(self) -> None:
        self.stop.set()
        self.thread.join()


def _moved(svc: dict[str, Any]) -> tuple[int, int] | None:
    """Bytes service ``svc``'s interface received and sent so far; None once its process
    is gone."""
    try:
        text = Path(f"/proc/{svc['pid']}/net/dev").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        name, _, fields = line.partition(":")
        if name.strip() == svc["dev"]:
            counts = fields.split()
            return int(counts[0]), int(counts[8])
    return None


def _shape(
    marks: Path, cost: dict[str, Any], names: list[str], rate: float | None
) -> dict[str, Any]:
    """The timeline of the read just measured, logged as text (:mod:`.spark_phases`)."""
    from benchmarks.spark_phases import read_events, render, timeline

    shape = timeline(read_events(marks), *cost["wall"], names, rate)
    log("timeline:\n" + "\n".join(render(shape)))
    return shape


def _requests_or_none(svc: dict[str, Any]) -> dict[str, tuple[int, float]] | None:
    """:func:`requests` of a service, None when it does not answer (a killed one)."""
    try:
        return requests(svc["metrics"])
    except OSError:
        return None


def _counter(svc: dict[str, Any], name: str) -> int:
    path = f"/sys/class/net/{svc['dev']}/statistics/{name}"
    out = subprocess.run(["ip", "netns", "exec", svc["ns"], "cat", path], capture_output=True)
    return int(out.stdout)


class Killer:
    """SIGKILLs the ``victim`` service once ``progress()`` (0 to 1) of the work is done."""

    def __init__(self, victim: dict[str, Any], progress: Callable[[], float], at: float) -> None:
        self.victim, self.progress, self.at = victim, progress, at
        self.stop = threading.Event()
        self.killed = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.wait(0.05):
            try:
                done = self.progress()
            except Exception:  # not measurable yet (a sink that does not exist)
                continue
            if done >= self.at:
                log(f"SIGKILL {self.victim['name']} (pid {self.victim['pid']}) at {done:.0%}")
                os.kill(self.victim["pid"], 9)
                self.killed = True
                return

    def finish(self) -> bool:
        """Stop watching; whether the kill came before the work ended."""
        self.stop.set()
        self.thread.join()
        return self.killed


def _rows(client: Any, dataset: str) -> int:
    return int(client.plan(dataset).rows)


def expected(rows: int) -> tuple[int, int, int]:
    return rows, rows * (rows - 1) // 2, sum((i % MOD) ** 2 for i in range(rows))


def main(spec: dict[str, Any]) -> None:
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    from pyspark.sql import functions as F

    from aqueduct_core.transport import ClientTLS
    from aqueduct_spark.client import Client
    from benchmarks.bench_spark import spark_session
    from benchmarks.realpath_link import spawn_in, stop

    hosts = Hosts(spec)
    urls: list[str] = [s["url"] for s in spec["services"]]
    base = {"fingerprint": spec["fingerprint"], **spec["options"]}
    tls = ClientTLS(fingerprint=spec["fingerprint"])
    client_opts: dict[str, Any] = {"tls": tls, "compression": spec["compression"]}
    if spec["transport"]:
        client_opts["transport"] = spec["transport"]
    phases = spec["phases"]
    # four attempts per task, as spark.task.maxFailures gives a cluster (local[N] gives one)
    spark: Any = None
    marks = Path(spec["tmp"]) / "timeline.jsonl" if spec.get("timeline") else None
    if marks is not None:  # before the JVM starts: its Python workers inherit it
        os.environ["AQUEDUCT_TIMELINE"] = str(marks)
    if {"read", "stream"} & set(phases):
        spark = spark_session(master=f"local[{spec['slots']},4]")
    fmt = "aqueduct"
    if marks is not None and spark is not None:
        from benchmarks.spark_phases import AqPhases

        spark.dataSource.register(AqPhases)
        fmt = "aqphases"
    out: dict[str, Any] = {"reads": [], "appends": []}
    rows = spec["rows"]
    want = expected(rows)

    if "read" in phases:
        name = "scale_read"
        df = spark.range(0, rows, numPartitions=spec["tasks"]).selectExpr(
            "id",
            "cast(id as double) * 0.5 as x",
            "concat('row-', cast(id as string)) as s",
            "timestamp_micros(id + 1700000000000000) as ts",
        )
        log(f"writing {rows:,} rows in {spec['tasks']} tasks through 3 hosts")
        _, cost = hosts.measure(
            lambda: (
                df.write.format("aqueduct")
                .options(url=",".join(urls), **base)
                .mode("overwrite")
                .save(name)
            )
        )
        out["write"] = cost
        planned = Client(",".join(urls), **client_opts).plan(name)
        split = planned.bytes // spec["tasks"] + 1
        out["dataset"] = {"rows": rows, "parquet_bytes": planned.bytes, "arrow_bytes": rows * 39}

        def read(k: int) -> Callable[[], tuple[int, int, int]]:
            opts = {**base, "url": ",".join(urls[:k]), "splitSize": str(split)}

            def run() -> tuple[int, int, int]:
                r = (
                    spark.read.format(fmt)
                    .options(**opts)
                    .load(name)
                    .agg(
                        F.count("*").alias("n"),
                        F.sum("id").alias("s"),
                        F.sum(F.pmod("id", F.lit(MOD)) * F.pmod("id", F.lit(MOD))).alias("q"),
                    )
                    .first()
                )
                return int(r["n"]), int(r["s"]), int(r["q"])

            return run

        read(3)()  # warm-up: the JVM, the Python workers, every connection
        names = [s["name"] for s in spec["services"]]
        for k in (1, 2, 3):
            samples = []
            for _ in range(spec["repeat"]):
                got, cost = hosts.measure(read(k), marks)
                assert got == want, f"read through {k} hosts: {got} != {want}"
                if marks is not None:
                    cost["timeline"] = _shape(marks, cost, names[:k], spec.get("link_rate"))
                samples.append(cost)
            mid = sorted(samples, key=lambda c: c["seconds"])[len(samples) // 2]
            mid["endpoints"] = k
            mid["rows_per_s"] = rows / mid["seconds"]
            out["reads"].append(mid)
            log(f"read through {k}: {mid['seconds']:.2f} s, {mid['rows_per_s']:,.0f} rows/s")
        last_spark = time.time()

    if "appends" in phases:
        import pyarrow as pa

        n = spec["append_rows"]
        table = pa.table(
            {
                "id": pa.array(range(n), pa.int64()),
                "x": pa.array([i * 0.5 for i in range(n)], pa.float64()),
                "s": pa.array([f"row-{i}" for i in range(n)]),
            }
        )

        def appends(k: int) -> Callable[[], dict[str, Any]]:
            url = ",".join(urls[:k])
            target = f"appends_{k}"
            Client(url, **client_opts).create(target, table.schema, exist_ok=True)

            def run() -> dict[str, Any]:
                deadline = time.monotonic() + spec["seconds"]
                done = [0] * spec["writers"]
                errors: list[BaseException] = []

                def writer(w: int) -> None:
                    client = Client(url, **client_opts)
                    while time.monotonic() < deadline:
                        try:
                            client.append(target, table)
                        except Exception as exc:
                            errors.append(exc)
                            return
                        done[w] += 1

                threads = [
                    threading.Thread(target=writer, args=(w,)) for w in range(spec["writers"])
                ]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                if errors:
                    raise errors[0]
                return {"commits": sum(done)}

            return run

        cables(spec, spec.get("append_rate"))
        for k in (1, 2, 3):
            check, run = Client(",".join(urls[:k]), **client_opts), appends(k)
            before = _rows(check, f"appends_{k}")
            got, cost = hosts.measure(run)
            # every acknowledged append once: none lost, none doubled
            landed = _rows(check, f"appends_{k}") - before
            assert landed == got["commits"] * n, f"{landed} rows, {got['commits']} appends of {n}"
            cost.update(got, endpoints=k, rows=got["commits"] * n)
            cost["commits_per_s"] = got["commits"] / cost["seconds"]
            cost["rows_per_s"] = cost["rows"] / cost["seconds"]
            out["appends"].append(cost)
            log(f"appends through {k}: {cost['commits_per_s']:.2f} commits/s")

        cables(spec, spec.get("rate"))  # the read's rate again for the kill and the stream

    # -- a host killed mid-read, and mid-stream ---------------------------------------------
    victim = spec["services"][spec["kill"]]
    restarted: list[Any] = []

    def kill_when(progress: Callable[[], float]) -> Killer:
        return Killer(victim, progress, spec["kill_at"])

    def restart() -> None:
        proc, _ = spawn_in(victim["ns"], victim["cmd"], "AQUEDUCT_READY ")
        restarted.append(proc)
        victim["pid"] = proc.pid
        if hosts.groups is not None:
            hosts.groups.add(victim["name"], proc.pid)

    if "kill" in phases:
        undisturbed = out["reads"][2]["seconds"]
        share = out["reads"][2]["hosts"][victim["name"]]["tx"]  # what the victim sends in a read
        # Warmed as the undisturbed reads were: after the appends (a minute without Spark)
        # Spark has stopped its idle Python workers (after a minute idle), and the next read
        # starts them again and connects afresh, seconds before its first task that the
        # kill has nothing to do with. What that cold read took is reported beside.
        got, warm = hosts.measure(read(3))
        assert got == want, f"read through 3 hosts before the kill: {got} != {want}"
        out["read_before_kill"] = {
            "seconds": warm["seconds"],
            "idle_before": round(warm["wall"][0] - last_spark, 1),
        }
        log(
            f"read before the kill (Spark idle {out['read_before_kill']['idle_before']:.0f} s "
            f"before it): {warm['seconds']:.2f} s"
        )
        start = _counter(victim, "tx_bytes")
        killer = kill_when(lambda: (_counter(victim, "tx_bytes") - start) / share)
        got, cost = hosts.measure(read(3), marks)
        cost["killed_mid_way"] = killer.finish()
        if marks is not None:
            cost["timeline"] = _shape(marks, cost, names, spec.get("link_rate"))
        cost["exactly_once"] = got == want
        cost["vs_undisturbed"] = cost["seconds"] / undisturbed
        out["kill_read"] = cost
        log(
            f"read with a kill: {cost['seconds']:.2f} s ({cost['vs_undisturbed']:.2f}x), "
            f"exactly once: {got == want}"
        )
        restart()

    try:
        if "stream" in phases:
            out["stream"] = stream(spark, spec, urls, base, client_opts, hosts, kill_when)
    except Exception as exc:  # the other figures stand; the report says what failed
        log(f"the stream phase failed: {exc}")
        out["stream"] = {"error": str(exc)[:2000]}
    finally:
        if spark is not None:
            spark.stop()
        for proc in restarted:
            stop(proc)
    print(READY + json.dumps(out), flush=True)


def stream(
    spark: Any,
    spec: dict[str, Any],
    urls: list[str],
    base: dict[str, str],
    client_opts: dict[str, Any],
    hosts: Hosts,
    kill_when: Callable[[Callable[[], float]], Killer],
) -> dict[str, Any]:
    """A backlog of ``stream_rows`` rows in 20 versions streamed from one dataset to another
    through all three hosts (``maxRowsPerTrigger``: ten micro-batches), undisturbed, then
    again with a host killed part-way: seconds to the last row, and the sink's ids."""
    import pyarrow as pa

    from aqueduct_spark.client import Client

    url = ",".join(urls)
    client = Client(url, **client_opts)
    total = spec["stream_rows"]
    per = total // 20
    results: dict[str, Any] = {}
    schema = pa.schema([("id", pa.int64()), ("s", pa.string())])
    for label in ("undisturbed", "kill"):
        src, dst = f"stream_src_{label}", f"stream_dst_{label}"
        client.create(src, schema)
        for v in range(20):
            ids = pa.array(range(v * per, (v + 1) * per), pa.int64())
            strings = pa.array([f"r{i}" for i in range(per)])
            client.append(src, pa.Table.from_arrays([ids, strings], schema=schema))
        want = list(range(20 * per))
        checkpoint = Path(spec["tmp"]) / f"checkpoint-{label}"

        restarts: list[str] = []

        def run(
            dst: str = dst,
            src: str = src,
            checkpoint: Path = checkpoint,
            restarts: list[str] = restarts,
        ) -> None:
            def start() -> Any:
                return (
                    spark.readStream.format("aqueduct")
                    .options(url=url, startingVersion="earliest", **base)
                    .option("maxRowsPerTrigger", str(total // 10))
                    .load(src)
                    .writeStream.format("aqueduct")
                    .options(url=url, **base)
                    .option("checkpointLocation", str(checkpoint))
                    .start(dst)
                )

            query = start()
            try:
                deadline = time.monotonic() + 600
                while time.monotonic() < deadline:
                    if not query.isActive:
                        error = str(query.exception())
                        # Spark gives a new Python worker 10 s to connect back (hard-coded);
                        # on a loaded machine it may take longer. A failed query is restarted
                        # from its checkpoint, as a scheduler would: counted and reported.
                        if "failed to connect back" not in error or len(restarts) >= 3:
                            raise RuntimeError(f"the stream failed: {error}")
                        restarts.append(error[:300])
                        log("the query failed (a Python worker's start-up); restarting it")
                        query = start()
                    try:
                        if client.plan(dst).rows >= total // 20 * 20:
                            return
                    except Exception:  # the sink does not exist yet
                        pass
                    time.sleep(0.2)
                raise RuntimeError("the stream did not finish within 600 s")
            finally:
                query.stop()

        killer = None
        if label == "kill":
            killer = kill_when(lambda dst=dst: _rows(client, dst) / (20 * per))
        _, cost = hosts.measure(run)
        if killer is not None:
            cost["killed_mid_way"] = killer.finish()
        got = sorted(client.read(dst, columns=["id"]).column("id").to_pylist())
        cost["exactly_once"] = got == want
        cost["rows"] = len(got)
        cost["restarts"] = len(restarts)
        results[label] = cost
        log(
            f"stream {label}: {cost['seconds']:.2f} s, {len(got)} rows, exactly once: {got == want}"
        )
    results["vs_undisturbed"] = results["kill"]["seconds"] / results["undisturbed"]["seconds"]
    return results


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
