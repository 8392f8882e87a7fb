"""The write data path alone, across a real path (issue 28): what a Spark write task does,
without Spark. A client in one network namespace stages the Spark benchmark's table
(``bench_realpath_spark``: id, x, s, ts), in Spark's Arrow batches of 10,000 rows, into the
dataset service and into the Flight baseline server (``benchmarks.flight_server``: the same
``StageWriter``, Parquet settings and commit) in another, joined by a veth pair at MTU 1500.
Each write is ``--tasks`` write tasks at once (Spark's local[2] runs two), then one commit.

For each path: seconds, CPU seconds per GB of Arrow data at the client and at the server
(whole processes), ratios to Flight in the same run, median of ``--repeat`` with the paths
taking turns (a change of load hits them alike). Spark's own CPU is left out: what is left
is the two ends' write path.

``--perf DIR`` records the server of each path with ``perf record`` during the measured
writes (native frames: TLS, Parquet, copies, the interpreter); ``--cprofile DIR`` runs the
service under cProfile (its event loop thread) and writes the stats on exit.

    sudo .venv/bin/python -m benchmarks.bench_write_path [--rows N] [--repeat K]
        [--paths aqueduct aqueduct-tcp flight] [--perf DIR] [--cprofile DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from benchmarks.realpath_link import ROOT, proc_cpu, require_root, spawn_in, stop, veth_link

READY = "WRITE_RESULT "
BATCH_ROWS = 10_000  # spark.sql.execution.arrow.maxRecordsPerBatch's default
PATHS = (
    "flight",
    "aqueduct",
    "aqueduct-tcp",
    "aqueduct-tcp-none",
    "aqueduct-quic",
    "aqueduct-tcp-unjoined",
)
"""``aqueduct-tcp-unjoined``: over TLS/TCP, each batch its own data message
(``ClientConfig.join_bytes=0``, as before writes joined batches)."""


def spark_batches(rows: int, tasks: int, batch_rows: int = BATCH_ROWS) -> list[list[Any]]:
    """The Spark benchmark's rows as Spark hands them to a writer: ``tasks`` partitions of
    10,000-row batches (string and timestamp types as Spark's Arrow writer makes them)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    parts: list[list[Any]] = []
    per = -(-rows // tasks)
    for t in range(tasks):
        batches = []
        for start in range(t * per, min(rows, (t + 1) * per), batch_rows):
            ids = pa.array(range(start, min(start + batch_rows, (t + 1) * per, rows)), pa.int64())
            s = pc.binary_join_element_wise("row-", pc.cast(ids, pa.string()), "")
            ts = pc.cast(pc.add(ids, 1_700_000_000_000_000), pa.timestamp("us", tz="UTC"))
            x = pc.multiply(pc.cast(ids, pa.float64()), 0.5)
            batches.append(
                pa.RecordBatch.from_arrays([ids, x, s, ts], names=["id", "x", "s", "ts"])
            )
        parts.append(batches)
    return parts


def client(spec: dict[str, Any]) -> None:
    """Runs in the client namespace: each path's writes, in turn, ``repeat`` times."""
    import pyarrow.flight as fl

    from aqueduct_spark.client import Client, ClientConfig
    from aqueduct_spark.client.pool import Portal

    parts = spark_batches(spec["rows"], spec["tasks"], spec["batch_rows"])
    schema = parts[0][0].schema
    nbytes = sum(b.nbytes for p in parts for b in p)

    def paced(batches: list[Any]) -> Any:
        """The batches at ``pace`` bytes per second per task at most, as a Spark task's
        Python worker gets them from its JVM (0: as fast as they are taken)."""
        start = time.perf_counter()
        sent = 0
        for batch in batches:
            if spec["pace"]:
                ahead = sent / spec["pace"] - (time.perf_counter() - start)
                if ahead > 0:
                    time.sleep(ahead)
            yield batch
            sent += batch.nbytes

    def aqueduct(options: dict[str, Any]) -> Any:
        config = ClientConfig(
            spec["url"],
            tls=_tls(spec["fingerprint"]),
            transport=options.get("transport", "auto"),
            compression=options.get("compression", "auto"),
            join_bytes=options.get("join_bytes", ClientConfig.join_bytes),
        )
        c = Client(config=config)

        def run(table: str) -> None:
            txn = c.begin(table, schema, mode="overwrite")
            staged = _in_threads(
                [lambda p=p: c.write_task(txn, paced(p), task=uuid.uuid4().hex[:8]) for p in parts]
            )
            c.commit(txn, staged, finish=True)

        return run

    def flight(location: str) -> Any:
        with open(spec["ca"], "rb") as f:
            ca = f.read()

        def run(table: str) -> None:
            txn = uuid.uuid4().hex

            def task(p: list[Any]) -> Any:
                conn = fl.FlightClient(location, tls_root_certs=ca)
                cmd = json.dumps({"dataset": table, "txn": txn, "task": uuid.uuid4().hex[:8]})
                writer, meta = conn.do_put(fl.FlightDescriptor.for_command(cmd), schema)
                for batch in paced(p):
                    writer.write_batch(batch)
                writer.done_writing()
                answer = meta.read()
                writer.close()
                return json.loads(answer.to_pybytes())

            staged = [
                f for files in _in_threads([lambda p=p: task(p) for p in parts]) for f in files
            ]
            body = json.dumps(
                {
                    "dataset": table,
                    "mode": "overwrite",
                    "staged": staged,
                    "schema": schema.serialize().to_pybytes().hex(),
                }
            )
            conn = fl.FlightClient(location, tls_root_certs=ca)
            list(conn.do_action(fl.Action("commit", body.encode())))

        return run

    runs = {
        label: flight(p["location"]) if label == "flight" else aqueduct(p["options"])
        for label, p in spec["paths"].items()
    }
    samples: dict[str, list[dict[str, float]]] = {label: [] for label in runs}
    for label, run in runs.items():
        run("t_" + label.replace("-", "_"))  # warm-up: connections, the table
    sys.stdout.write("WARM\n")
    sys.stdout.flush()
    profile = _loop_profile() if spec.get("cprofile") else None
    for _ in range(spec["repeat"]):
        for label, run in runs.items():
            server = spec["paths"][label]["pid"]
            before = (time.perf_counter(), time.process_time(), proc_cpu(server))
            me = os.getpid(), Portal.get().thread.native_id
            threads = (thread_cpu(*me), thread_cpu(server))
            run("t_" + label.replace("-", "_"))
            after = (time.perf_counter(), time.process_time(), proc_cpu(server))
            threads_after = (thread_cpu(*me), thread_cpu(server))
            samples[label].append(
                {
                    "seconds": after[0] - before[0],
                    "client_cpu": after[1] - before[1],
                    "server_cpu": after[2] - before[2],
                    "client_loop": threads_after[0]["loop"] - threads[0]["loop"],
                    "server_loop": threads_after[1]["main"] - threads[1]["main"],
                }
            )
    result = {
        label: {k: statistics.median(s[k] for s in got) for k in got[0]}
        for label, got in samples.items()
    }
    result["_bytes"] = {"arrow": nbytes}
    if profile is not None:
        profile(f"{spec['cprofile']}/client.prof")
    print(READY + json.dumps(result), flush=True)
    os._exit(0)  # pooled connections' threads: nothing left to wait for


def thread_cpu(pid: int, loop: int | None = None) -> dict[str, float]:
    """CPU seconds of each kind of thread of process ``pid`` so far: ``main`` (the service's
    event loop), ``loop`` (the client's: thread ``loop``), ``other`` (worker threads:
    Parquet writing, decoding, a Spark task's calls). Threads that ended are not counted."""
    found = {"main": 0.0, "loop": 0.0, "other": 0.0}
    tick = os.sysconf("SC_CLK_TCK")
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        tid = int(task.name)
        kind = "main" if tid == pid else "loop" if tid == loop else "other"
        found[kind] += (int(fields[11]) + int(fields[12])) / tick
    return found


def _loop_profile() -> Any:
    """cProfile on the client's event-loop thread (where its per-byte Python work runs)
    from now; returns the function that stops it and writes the stats to a path."""
    import cProfile
    import threading as th

    from aqueduct_spark.client.pool import Portal

    prof = cProfile.Profile(time.thread_time)
    loop = Portal.get().loop

    def on_loop(fn: Any) -> None:
        done = th.Event()

        def call() -> None:
            fn()
            done.set()

        loop.call_soon_threadsafe(call)
        done.wait()

    on_loop(prof.enable)

    def stop(path: str) -> None:
        on_loop(prof.disable)
        prof.dump_stats(path)

    return stop


def _tls(fingerprint: str) -> Any:
    from aqueduct_core.transport import ClientTLS

    return ClientTLS(fingerprint=fingerprint)


def _in_threads(fns: list[Any]) -> list[Any]:
    """Run ``fns`` at once, one thread each (Spark's tasks); their results in order."""
    out: list[Any] = [None] * len(fns)
    errors: list[BaseException] = []

    def one(i: int) -> None:
        try:
            out[i] = fns[i]()
        except BaseException as exc:  # re-raised below
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(fns))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument(
        "--batch-rows",
        type=int,
        default=BATCH_ROWS,
        help="rows per batch the client is handed (Spark's maxRecordsPerBatch)",
    )
    ap.add_argument("--tasks", type=int, default=2, help="write tasks at once (Spark's cores)")
    ap.add_argument(
        "--paths",
        nargs="+",
        choices=PATHS,
        default=["flight", "aqueduct", "aqueduct-tcp", "aqueduct-tcp-unjoined"],
    )
    ap.add_argument(
        "--pace",
        type=float,
        default=0,
        help="MB/s per task at most (a Spark task's supply of batches); 0: unpaced",
    )
    ap.add_argument("--perf", help="perf record each server into this directory")
    ap.add_argument("--cprofile", help="run the service under cProfile; stats into this dir")
    ap.add_argument("--serve-args", default="", help="extra arguments for aqueduct serve")
    ap.add_argument("--client", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.client:
        client(json.loads(args.client))
        return 0
    reason = require_root("bench_write_path")
    if reason:
        print(reason, file=sys.stderr)
        return 2
    from aqueduct_core.transport import make_dev_certificates

    options = {
        "aqueduct": {},
        "aqueduct-tcp": {"transport": "tcp"},
        "aqueduct-tcp-none": {"transport": "tcp", "compression": "none"},
        "aqueduct-quic": {"transport": "quic"},
        "aqueduct-tcp-unjoined": {"transport": "tcp", "join_bytes": 0},
    }
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="aqueduct-wp-") as tmp, veth_link(1500) as link:
        root = Path(tmp) / "root"
        tls = make_dev_certificates(Path(tmp) / "tls", ("localhost", link.server_ip))
        procs, perfs = [], []
        try:
            prefix = []
            if args.cprofile:
                prefix = ["-m", "benchmarks.profiled", f"{args.cprofile}/service.prof"]
            cmd = [*prefix, "-m", "aqueduct_spark.cli", "serve", "--root", str(root)]
            cmd += ["--host", link.server_ip, "--port", "0", "--backend", "qh3"]
            cmd += ["--allow-anonymous", "--log-level", "warning", "--workers", "1"]
            cmd += ["--cert", str(tls.cert_file), "--key", str(tls.key_file)]
            cmd += args.serve_args.split()
            svc, banner = spawn_in(link.server_ns, cmd, "AQUEDUCT_READY ")
            procs.append(svc)
            info = json.loads(banner)
            flight_cmd = ["-m", "benchmarks.flight_server", str(root), str(tls.cert_file)]
            flight_cmd += [str(tls.key_file), link.server_ip]
            fproc, port = spawn_in(link.server_ns, flight_cmd, "FLIGHT_READY ")
            procs.append(fproc)
            paths: dict[str, Any] = {}
            for label in args.paths:
                if label == "flight":
                    location = f"grpc+tls://{link.server_ip}:{port}"
                    paths[label] = {"pid": fproc.pid, "location": location}
                else:
                    paths[label] = {"pid": svc.pid, "options": options[label]}
            spec = {
                "rows": args.rows,
                "repeat": args.repeat,
                "tasks": args.tasks,
                "pace": args.pace * 1e6,
                "batch_rows": args.batch_rows,
                "url": info["url"],
                "fingerprint": info["fingerprint"],
                "ca": str(tls.ca_file),
                "paths": paths,
                "cprofile": args.cprofile,
            }
            client_args = ["benchmarks.bench_write_path", "--client", json.dumps(spec)]
            proc = subprocess.Popen(
                [*("ip", "netns", "exec", link.client_ns, sys.executable, "-m"), *client_args],
                cwd=ROOT,
                stdout=subprocess.PIPE,
                text=True,
                env={**os.environ, "PYTHONPATH": str(ROOT)},
            )
            assert proc.stdout is not None
            line = proc.stdout.readline()
            if args.perf and line.startswith("WARM"):
                os.makedirs(args.perf, exist_ok=True)
                servers = (("service", svc.pid), ("flight", fproc.pid), ("client", proc.pid))
                for label, pid in servers:
                    out = f"{args.perf}/{label}.data"
                    perfs.append(
                        subprocess.Popen(
                            [*("perf", "record", "-F", "499", "-g", "-p", str(pid)), "-o", out],
                            stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL,
                        )
                    )
            while line and not line.startswith(READY):
                line = proc.stdout.readline()
            proc.wait()
            if not line:
                raise SystemExit("the write client failed (its error is above)")
            result = json.loads(line[len(READY) :])
        finally:
            for p in perfs:
                p.send_signal(2)
                p.wait()
            for p in procs:
                if args.cprofile:
                    p.send_signal(2)  # cProfile writes its stats on a clean exit
                stop(p)
    gb = result.pop("_bytes")["arrow"] / 1e9
    base = result.get("flight")
    print(
        f"{args.rows:,} rows ({gb * 1e3:.0f} MB of Arrow) in {args.tasks} tasks, median of "
        f"{args.repeat}, load {load_before:.1f} -> {os.getloadavg()[0]:.1f}; CPU s per GB, "
        "client / server; ratio = Flight time / time"
    )
    for label, r in result.items():
        ratio = f"{base['seconds'] / r['seconds']:5.2f}x" if base else ""
        print(
            f"  {label:18} {r['seconds']:6.2f} s {ratio}  cpu {r['client_cpu'] / gb:5.2f} / "
            f"{r['server_cpu'] / gb:5.2f}   of which event loop {r['client_loop'] / gb:5.2f} / "
            f"{r['server_loop'] / gb:5.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
