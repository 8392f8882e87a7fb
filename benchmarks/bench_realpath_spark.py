"""Spark across a real path (issues 15, 28): Spark (local[2], driver and executors) runs in
one network namespace, the dataset service and the Flight baseline servers in another,
joined by a veth pair at MTU 1500 (``shared/design/real-paths.md``), unshaped and shaped to
each ``--rate`` (``tc tbf`` on both ends). Writes then reads the same table through the
Flight data source (``benchmarks.spark_sources.FlightBench``: as users run it, and with zstd
IPC compression on both ways) and through the aqueduct data source, in one run. For every
path and operation: seconds, the ratio to Flight (time / Flight time: below 1.0 is faster),
bytes on the wire (what the Spark namespace's interface received for a read, sent for a
write), and CPU seconds per GB of Arrow data at each end (Spark's whole process tree; the
server process of that path).

    sudo .venv/bin/python -m benchmarks.bench_realpath_spark [--rows N] [--repeat K]
        [--rate 1gbit 10gbit] [--paths aqueduct aqueduct-tcp ...] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.realpath_link import ROOT, require_root, spawn_in, stop, veth_link

READY = "SPARK_RESULT "
PATHS = ("aqueduct", "aqueduct-tcp", "aqueduct-tcp-none", "aqueduct-quic", "floor")
"""``aqueduct``: every default (transport and compression auto); ``-tcp`` over TLS/TCP with
the default compression; ``-tcp-none`` uncompressed; ``-quic`` over QUIC (qh3). ``floor``:
no network and no server (``benchmarks.spark_sources.DeltaFloor``): Spark's executors write
the same Parquet files into the table themselves, the least a write through any server can
cost on this machine (both "hosts" share its cores)."""
TICK = os.sysconf("SC_CLK_TCK")


def tree_cpu(root: int) -> float:
    """CPU seconds of process ``root`` and every descendant, live or reaped (a reaped one's
    time is in its parent's cutime/cstime)."""
    children: dict[int, list[int]] = {}
    times: dict[int, float] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid = int(entry.name)
        children.setdefault(int(fields[1]), []).append(pid)
        times[pid] = sum(int(x) for x in fields[11:15]) / TICK
    total, todo = 0.0, [root]
    while todo:
        pid = todo.pop()
        total += times.get(pid, 0.0)
        todo += children.get(pid, [])
    return total


def counters(dev: str, servers: list[int]) -> dict[str, float]:
    net = Path(f"/sys/class/net/{dev}/statistics")
    found = {
        "rx": float((net / "rx_bytes").read_text()),
        "tx": float((net / "tx_bytes").read_text()),
    }
    found["client_cpu"] = tree_cpu(os.getpid())
    found["server_cpu"] = sum(tree_cpu(pid) for pid in servers)
    found["at"] = time.perf_counter()
    return found


def spark_client(spec: dict[str, Any]) -> None:
    """Runs in the client namespace: the Spark job, measured per path and operation."""
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    from benchmarks.bench_spark import spark_session

    spark = spark_session()
    phases = Path(spec["phases"]) if spec.get("phases") else None
    if phases is not None:
        from benchmarks.spark_phases import AqPhases, FlPhases, summary

        spark.dataSource.register(AqPhases)
        spark.dataSource.register(FlPhases)
    df = spark.range(0, spec["rows"], numPartitions=4).selectExpr(
        "id",
        "cast(id as double) * 0.5 as x",
        "concat('row-', cast(id as string)) as s",
        "timestamp_micros(id + 1700000000000000) as ts",
    )
    jobs: dict[tuple[str, str], tuple[Any, str, list[int]]] = {}
    for label, (fmt, options, server) in spec["paths"].items():
        name = "t_" + "".join(c if c.isalnum() else "_" for c in label)
        if phases is not None:
            fmt = {"aqueduct": "aqphases", "flightbench": "flphases"}.get(fmt, fmt)

        def write(fmt: str = fmt, options: dict[str, str] = options, name: str = name) -> None:
            df.write.format(fmt).options(**options).mode("overwrite").save(name)

        def read(fmt: str = fmt, options: dict[str, str] = options, name: str = name) -> None:
            spark.read.format(fmt).options(**options).load(name).write.format("noop").mode(
                "overwrite"
            ).save()

        servers = [server] if server else []
        jobs[label, "write"] = (write, "tx", servers)
        jobs[label, "read"] = (read, "rx", servers)
    for fn, _, _ in jobs.values():
        fn()  # warm-up (and for a read: the table its write just made)
    # Rounds, each path and operation once per round: a drift of the machine (another
    # process, the page cache, the JIT) falls on every path alike, not on the one measured
    # while it happened (the paths measured one after another moved Flight's 4M-row write
    # by 18% between two runs).
    samples: dict[tuple[str, str], list[dict[str, float]]] = {key: [] for key in jobs}
    spent: dict[tuple[str, str], dict[str, list[float]]] = {key: {} for key in jobs}
    for _ in range(spec["repeat"]):
        for key, (fn, _, servers) in jobs.items():
            if phases is not None:
                phases.write_text("")
            before = counters(spec["dev"], servers)
            began = time.time()
            fn()
            after = counters(spec["dev"], servers)
            if phases is not None:
                from benchmarks.spark_phases import event, read_events, write_path

                query = {"start": began, "end": time.time()}
                event("query", path=key[0], op=key[1], **query)
                marks = Path(os.environ.get("AQUEDUCT_TIMELINE", ""))
                if key[1] == "write" and marks.name:
                    source = "fl" if key[0].startswith("flight") else "aq"
                    steps = write_path(read_events(marks), source, query)
                    for step, took in steps.items():
                        got = spent[key].setdefault("path." + step, [0.0, 0.0])
                        got[0] += 1 / spec["repeat"]
                        got[1] += took / spec["repeat"]
                    marks.write_text("")
            samples[key].append({k: after[k] - before[k] for k in before})
            if phases is not None:  # per query: seconds summed over the processes
                for k, (n, t) in summary(phases).items():
                    got = spent[key].setdefault(k, [0.0, 0.0])
                    got[0] += n / spec["repeat"]
                    got[1] += t / spec["repeat"]
    results: dict[str, Any] = {}
    for (label, op), (_, wire, _) in jobs.items():
        ordered = sorted(samples[label, op], key=lambda s: s["at"])
        mid = ordered[len(ordered) // 2]
        results.setdefault(label, {})[op] = {
            "seconds": mid["at"],
            "wire": mid[wire],
            "client_cpu": mid["client_cpu"],
            "server_cpu": mid["server_cpu"],
        }
        if phases is not None:
            results[label][op]["phases"] = {k: tuple(v) for k, v in spent[label, op].items()}
    for label, r in results.items():
        print(
            f"{label:18} write {r['write']['seconds']:6.2f} s   read {r['read']['seconds']:6.2f} s",
            file=sys.stderr,
            flush=True,
        )
    spark.stop()
    print(READY + json.dumps(results), flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=2_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument(
        "--rate",
        nargs="*",
        default=["1gbit"],
        help="also run with the link shaped to these speeds (tc units); unshaped always runs",
    )
    ap.add_argument(
        "--paths",
        nargs="+",
        default=list(PATHS),
        choices=list(PATHS),
        help="Aqueduct paths to measure (the Flight data source, plain and zstd, runs first)",
    )
    ap.add_argument("--quick", action="store_true", help="200k rows, 1 run, unshaped only")
    ap.add_argument(
        "--phases",
        action="store_true",
        help="time each data source hook and connection in Spark's Python processes "
        "(benchmarks.spark_phases) and print them per query, and each write's path through "
        "Spark: its planning, set-up, tasks (their wait for the first batch and their tail "
        "after the last), commit",
    )
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--spark-client", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.spark_client:
        spark_client(json.loads(args.spark_client))
        return 0
    if args.quick:
        args.rows, args.repeat, args.rate = 200_000, 1, []
    reason = require_root("bench_realpath_spark")
    if reason:
        print(reason, file=sys.stderr)
        return 2
    from aqueduct_core.transport import make_dev_certificates
    from benchmarks.common import machine, write_json

    out: dict[str, Any] = {
        "machine": machine(),
        "rows": args.rows,
        "repeat": args.repeat,
        "arrow_bytes": args.rows * 39,  # id, x, s ("row-<id>", ~11 B + offset), ts
        "command": " ".join(
            ["sudo .venv/bin/python -m benchmarks.bench_realpath_spark", *sys.argv[1:]]
        ),
        "load_before": [round(x, 1) for x in os.getloadavg()],
        "runs": [],
    }
    with tempfile.TemporaryDirectory(prefix="aqueduct-rp-spark-") as tmp, veth_link(1500) as link:
        root = Path(tmp) / "root"
        tls = make_dev_certificates(Path(tmp) / "tls", ("localhost", link.server_ip))
        procs = []
        try:
            cmd = ["-m", "aqueduct_spark.cli", "serve", "--root", str(root)]
            cmd += ["--host", link.server_ip, "--port", "0", "--backend", "qh3"]
            # a veth pair between two private namespaces: no one else can reach it, and Flight
            # runs without a token too (serve refuses a non-loopback host without one otherwise)
            cmd += ["--allow-anonymous", "--log-level", "warning"]
            cmd += ["--cert", str(tls.cert_file), "--key", str(tls.key_file)]
            svc, banner = spawn_in(link.server_ns, cmd, "AQUEDUCT_READY ")
            procs.append(svc)
            info = json.loads(banner)
            flights = {}
            for codec in ("", "zstd"):
                flight_cmd = ["-m", "benchmarks.flight_server", str(root), str(tls.cert_file)]
                flight_cmd += [str(tls.key_file), link.server_ip, *([codec] if codec else [])]
                proc, port = spawn_in(link.server_ns, flight_cmd, "FLIGHT_READY ")
                procs.append(proc)
                flights[codec] = (proc.pid, f"grpc+tls://{link.server_ip}:{port}")
            aq = {"url": info["url"], "fingerprint": info["fingerprint"]}
            ca = str(tls.ca_file)
            paths: dict[str, Any] = {
                "flight-tls": (
                    "flightbench",
                    {"location": flights[""][1], "ca": ca},
                    flights[""][0],
                ),
                "flight-zstd": (
                    "flightbench",
                    {"location": flights["zstd"][1], "ca": ca, "compression": "zstd"},
                    flights["zstd"][0],
                ),
                "aqueduct": ("aqueduct", aq, svc.pid),
                "aqueduct-tcp": ("aqueduct", {**aq, "transport": "tcp"}, svc.pid),
                "aqueduct-tcp-none": (
                    "aqueduct",
                    {**aq, "transport": "tcp", "compression": "none"},
                    svc.pid,
                ),
                "aqueduct-quic": (
                    "aqueduct",
                    {**aq, "transport": "quic", "backend": "qh3"},
                    svc.pid,
                ),
                "floor": ("deltafloor", {"root": str(root)}, 0),
            }
            paths = {k: v for k, v in paths.items() if k.startswith("flight") or k in args.paths}
            for rate in [None, *args.rate]:
                link.set_rate(rate)
                spec = {
                    "rows": args.rows,
                    "repeat": args.repeat,
                    "paths": paths,
                    "dev": link.client_if,
                    "phases": str(Path(tmp) / "phases.log") if args.phases else None,
                }
                load = round(os.getloadavg()[0], 1)
                print(f"== MTU 1500, link {rate or 'unshaped'}, load {load}", flush=True)
                client = ["benchmarks.bench_realpath_spark", "--spark-client", json.dumps(spec)]
                run = subprocess.run(
                    ["ip", "netns", "exec", link.client_ns, sys.executable, "-m", *client],
                    cwd=ROOT,
                    stdout=subprocess.PIPE,
                    text=True,
                    check=True,
                    env={
                        **os.environ,
                        "PYTHONPATH": str(ROOT),
                        "AQUEDUCT_PHASES": spec["phases"] or "",
                        # the write's path through Spark (spark_phases.write_path)
                        "AQUEDUCT_TIMELINE": spec["phases"] + ".timeline" if spec["phases"] else "",
                    },
                )
                line = next(x for x in run.stdout.splitlines() if x.startswith(READY))
                out["runs"].append(
                    {"rate": rate, "load": load, "paths": json.loads(line[len(READY) :])}
                )
        finally:
            for proc in procs:
                stop(proc)
    out["load_after"] = [round(x, 1) for x in os.getloadavg()]
    report(out)
    write_json(args.json, out)
    return 0


def report(out: dict[str, Any]) -> None:
    gb = out["arrow_bytes"] / 1e9
    print(
        f"\nMTU 1500, {out['rows']:,} rows, median of {out['repeat']}; ratio = time / Flight "
        "time; wire MB per operation; CPU s per GB of Arrow data, Spark's side / the server's"
    )
    for run in out["runs"]:
        base = run["paths"]["flight-tls"]
        for label, r in run["paths"].items():
            cells = []
            for op in ("write", "read"):
                x = r[op]
                cells.append(
                    f"{op} {x['seconds']:6.2f} s {x['seconds'] / base[op]['seconds']:5.2f}x "
                    f"{x['wire'] / 1e6:6.0f} MB cpu {x['client_cpu'] / gb:5.1f}/{x['server_cpu'] / gb:4.1f}"
                )
            print(f"  {run['rate'] or 'unshaped':8} {label:18} " + "   ".join(cells))
            for op in ("write", "read"):
                found = r[op].get("phases", {})
                for phase, (n, t) in sorted(found.items()):
                    if not phase.startswith("path."):
                        print(f"      {op:5} {phase:28} {t:7.3f} s in {n:4.1f} calls per query")
                if any(p.startswith("path.") for p in found):
                    from benchmarks.spark_phases import WRITE_STEPS

                    steps = [(s, found.get("path." + s, (0, 0.0))[1]) for s in WRITE_STEPS]
                    print(
                        f"      {op:5} path (ms, mean): "
                        + ", ".join(f"{s} {t * 1000:.1f}" for s, t in steps)
                    )


if __name__ == "__main__":
    sys.exit(main())
