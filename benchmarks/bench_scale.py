"""Scale-out, measured (issue 30): does adding service hosts add throughput, and does losing
one cost a retry, not the job?

Five network namespaces on one bridge (``realpath_link.bridged_hosts``), MTU 1500::

    store (SeaweedFS) ---+
    svc1 ==[rate]========+
    svc2 ==[rate]========+== bridge ==+== spark (local[slots]: driver, executors, writers)
    svc3 ==[rate]========+

Each service host's cable is shaped to ``--rate`` both ways (``tc tbf``, as a NIC of that
speed sends; ``--append-rate`` during the appends), low enough that the machine's cores are
not the limit (every phase reports the CPU seconds of each namespace and the machine's busy
share); the store's and the Spark host's
cables are not shaped. Three ``aqueduct serve`` processes serve one ``s3://`` root on the
store. The Spark host (:mod:`benchmarks.scale_client`) measures:

- a Spark batch read of one dataset through an endpoint list of 1, 2 and 3 hosts: rows per
  second, and each host's share of the bytes (what its cable sent);
- appends by ``--writers`` threads of the Python client through 1, 2 and 3 hosts (group
  commit on, the service's default): commits and rows per second;
- the read through 3 hosts with one host SIGKILLed once it sent ``--kill-at`` of its bytes of
  the undisturbed read: seconds against the undisturbed read, and every row exactly once (count, sum of ids, sum of
  squares). It is warmed first by an undisturbed read, as the reads through 1-3 hosts are:
  after the appends Spark has stopped its Python workers (idle for a minute), and the first
  read after that starts them and connects again (seconds, reported beside, that have
  nothing to do with the kill);
- a stream (a backlog in ten micro-batches) from one dataset to another through 3 hosts,
  undisturbed and with a host SIGKILLed part-way: seconds, and the sink's ids exactly once.

    sudo .venv/bin/python -m benchmarks.bench_scale [--rows N] [--rate 100mbit]
        [--append-rate 50mbit] [--repeat K]
        [--writers W] [--quick] [--skip PHASE ...] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from benchmarks.cpu_groups import CpuGroups
from benchmarks.realpath_link import ROOT, bridged_hosts, rate_bits, require_root, spawn_in, stop
from benchmarks.scale_client import READY

STORE_READY = "STORE_READY "
PHASES = ("read", "appends", "kill", "stream")
METRICS_PORT = 9464
"""Each service host's Prometheus port: its requests' counts and seconds per operation."""


def store_host(data_dir: str, ip: str) -> None:
    """Runs in the store's namespace: SeaweedFS on ``ip`` until SIGTERM."""
    from aqueduct_spark.testing import start_seaweed

    store = start_seaweed(Path(data_dir), bucket="scale", host=ip)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        info = {
            "endpoint": store.endpoint,
            "bucket": store.bucket,
            "options": store.storage_options,
            "pid": store.proc.pid,
        }
        print(STORE_READY + json.dumps(info), flush=True)
        sys.stdin.read()
    finally:
        store.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=8_000_000, help="rows of the read dataset")
    ap.add_argument("--rate", default="100mbit", help="each service host's link (tc units)")
    ap.add_argument(
        "--append-rate",
        default="50mbit",
        help="each service host's link during the appends (tc units): an append moves its "
        "data twice through the host's cable (Arrow in, Parquet out to the store) and its "
        "commits cost the store CPU, so at --rate the appends through 3 hosts took 85%% of "
        "the 2 cores, no longer the links alone",
    )
    ap.add_argument("--repeat", type=int, default=3, help="reads per endpoint count (median)")
    ap.add_argument("--writers", type=int, default=6)
    ap.add_argument("--append-rows", type=int, default=100_000, help="rows per append")
    ap.add_argument("--seconds", type=float, default=20.0, help="of appends per host count")
    ap.add_argument("--stream-rows", type=int, default=1_000_000)
    ap.add_argument("--tasks", type=int, default=12, help="Spark tasks of the read")
    ap.add_argument("--slots", type=int, default=6, help="Spark's local[N]: tasks at once")
    ap.add_argument("--kill", type=int, default=1, help="which host to kill (0, 1, 2)")
    ap.add_argument(
        "--kill-at",
        type=float,
        default=0.5,
        help="how much of the work is done when the host is killed (a read: the share of its "
        "bytes the host sent; a stream: the sink's rows)",
    )
    ap.add_argument("--transport", choices=["auto", "quic", "tcp"], default=None)
    ap.add_argument(
        "--compression",
        default="none",
        help="the client's compression (none by default: the links, not the CPU, are to be "
        "the limit; auto compresses where the network is)",
    )
    ap.add_argument(
        "--timeline",
        action="store_true",
        help="time every read's planning and tasks (which host, first byte, end) through an "
        "instrumented source (benchmarks.spark_phases) and print each read's shape",
    )
    ap.add_argument("--quick", action="store_true", help="a smoke run: small, once")
    ap.add_argument(
        "--skip",
        action="append",
        choices=PHASES,
        default=[],
        help="leave a phase out (repeatable): --skip appends --skip stream looks at the reads "
        "and the kill mid-read alone; --skip read --skip stream at the appends alone (no "
        "Spark: about a minute); leaving out the reads leaves out the kill mid-read too",
    )
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--store", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.store:
        store_host(*args.store)
        return 0
    skip = {*args.skip, *(["kill"] if "read" in args.skip else [])}
    phases = [p for p in PHASES if p not in skip]
    if args.quick:
        args.rows, args.repeat, args.seconds = 300_000, 1, 4.0
        args.append_rows, args.stream_rows = 20_000, 40_000
    reason = require_root("bench_scale")
    if reason:
        print(reason, file=sys.stderr)
        return 2
    rate_bits(args.rate), rate_bits(args.append_rate)  # a bad rate fails before any namespace
    from aqueduct_core.transport import make_dev_certificates
    from benchmarks.common import machine, write_json

    out: dict[str, Any] = {
        "machine": machine(),
        "rate": args.rate,
        "append_rate": args.append_rate,
        "command": "sudo .venv/bin/python -m benchmarks.bench_scale " + " ".join(sys.argv[1:]),
        "load_before": [round(x, 1) for x in os.getloadavg()],
        "settings": {
            k: getattr(args, k)
            for k in (
                "rows",
                "repeat",
                "writers",
                "append_rows",
                "seconds",
                "stream_rows",
                "tasks",
                "slots",
                "kill",
                "kill_at",
                "transport",
                "compression",
                "timeline",
            )
        },
        "phases": phases,
    }
    started = time.monotonic()
    names = ["store", "svc1", "svc2", "svc3", "spark"]
    procs: list[Any] = []
    groups = CpuGroups(names)
    out["cpu_counter"] = "cgroup " + groups.counter if groups.available else "processes"
    with (
        tempfile.TemporaryDirectory(prefix="aqueduct-scale-") as tmp,
        bridged_hosts(names) as hosts,
    ):
        store, svcs, spark = hosts[0], hosts[1:4], hosts[4]
        try:
            for host in svcs:
                host.shape(args.rate)
            weed = ["-m", "benchmarks.bench_scale", "--store", f"{tmp}/weed", store.ip]
            store_proc, line = spawn_in(store.ns, weed, STORE_READY)
            procs.append(store_proc)
            if groups.available:
                groups.add("store", store_proc.pid)
            info = json.loads(line)
            tls = make_dev_certificates(Path(tmp) / "tls", ("localhost", *(h.ip for h in svcs)))
            root = f"s3://{info['bucket']}/scale"

            def serve_cmd(ip: str) -> list[str]:
                cmd = ["-m", "aqueduct_spark.cli", "serve", "--root", root, "--host", ip]
                cmd += ["--port", "4433", "--allow-anonymous", "--log-level", "warning"]
                cmd += ["--metrics-port", str(METRICS_PORT)]
                cmd += ["--cert", str(tls.cert_file), "--key", str(tls.key_file)]
                for k, v in info["options"].items():
                    cmd += ["--storage-option", f"{k}={v}"]
                return cmd

            with ThreadPoolExecutor(3) as pool:
                started_svcs = list(
                    pool.map(lambda h: spawn_in(h.ns, serve_cmd(h.ip), "AQUEDUCT_READY "), svcs)
                )
            services = []
            for host, (proc, banner) in zip(svcs, started_svcs, strict=True):
                procs.append(proc)
                if groups.available:
                    groups.add(host.name, proc.pid)
                services.append(
                    {
                        "name": host.name,
                        "ns": host.ns,
                        "dev": host.dev,
                        "url": json.loads(banner)["url"],
                        "metrics": f"http://{host.ip}:{METRICS_PORT}/metrics",
                        "pid": proc.pid,
                        "cmd": serve_cmd(host.ip),
                    }
                )
            fingerprint = json.loads(started_svcs[0][1])["fingerprint"]
            spec = {
                **out["settings"],
                "phases": phases,
                "services": services,
                "store_pid": info["pid"],
                "fingerprint": fingerprint,
                "options": {
                    "compression": args.compression,
                    **({"transport": args.transport} if args.transport else {}),
                },
                "tmp": tmp,
                "cpu_groups": groups.to_spec() if groups.available else None,
                "link_rate": rate_bits(args.rate) / 8,
                "rate": args.rate,
                "append_rate": args.append_rate,
                "cables": [[h.ns, h.dev, h.hub, h.port] for h in svcs],
            }
            print(f"== bench_scale: links {args.rate}, load {os.getloadavg()[0]:.1f}", flush=True)
            run = subprocess.run(
                [
                    "ip",
                    "netns",
                    "exec",
                    spark.ns,
                    sys.executable,
                    "-m",
                    "benchmarks.scale_client",
                    json.dumps(spec),
                ],
                cwd=ROOT,
                stdout=subprocess.PIPE,
                text=True,
                check=True,
                env={**os.environ, "PYTHONPATH": str(ROOT), "AQUEDUCT_TOKEN": ""},
            )
            line = next(x for x in run.stdout.splitlines() if x.startswith(READY))
            out.update(json.loads(line[len(READY) :]))
        finally:
            for proc in reversed(procs):
                stop(proc)
            groups.close()
    out["load_after"] = [round(x, 1) for x in os.getloadavg()]
    out["wall_seconds"] = round(time.monotonic() - started, 1)
    report(out)
    write_json(args.json, out)
    return 0


def report(out: dict[str, Any]) -> None:
    rate = rate_bits(out["rate"]) / 8e6
    print(
        f"\nbench_scale: 3 service hosts, each link {out['rate']} ({rate:.1f} MB/s), "
        f"load {out['load_before']} -> {out['load_after']}, {out['wall_seconds']} s in all"
    )
    if out.get("reads"):
        ds = out["dataset"]
        print(f"read: {ds['rows']:,} rows ({ds['parquet_bytes'] / 1e6:.0f} MB Parquet)")
        one = out["reads"][0]
        for r in out["reads"]:
            shares = _shares(r, "tx")
            print(
                f"  {r['endpoints']} host(s): {r['seconds']:6.2f} s "
                f"{r['rows_per_s']:>12,.0f} rows/s {r['rows_per_s'] / one['rows_per_s']:5.2f}x  "
                f"shares {shares}  {_cpu(r)}"
            )
        if len(out["reads"]) == 3:
            fixed, work = fixed_part([r["seconds"] for r in out["reads"]])
            print(
                f"  T = F + W/hosts fitted to 1 and 3 hosts: F {fixed:.2f} s that does not "
                f"shrink with hosts, W {work:.2f} s that does"
            )
        for r in out["reads"]:
            if "timeline" in r:
                t = r["timeline"]
                idle = " ".join(
                    f"{n} {h['idle']:.2f}" for n, h in t["hosts"].items() if "idle" in h
                )
                print(
                    f"  {r['endpoints']} host(s) timeline: first task at {t['first_task']:.2f} s,"
                    f" hosts' ends spread {t['hosts_end_spread']:.2f} s, tail "
                    f"{t['tail']:.2f} s; each host idle (s): {idle}"
                )
    if out.get("appends"):
        first = out["appends"][0]
        print(
            f"appends: {out['settings']['writers']} writers, "
            f"{out['settings']['append_rows']:,} rows each, group commit on, links "
            f"{out['append_rate']}"
        )
        for a in out["appends"]:
            print(
                f"  {a['endpoints']} host(s): {a['commits_per_s']:6.2f} commits/s "
                f"{a['rows_per_s']:>10,.0f} rows/s {a['rows_per_s'] / first['rows_per_s']:5.2f}x  "
                f"shares {_shares(a, 'rx')}  {_cpu(a)}"
            )
            if a.get("requests"):
                print(f"      {_requests(a)}")
    if "kill_read" in out:
        k = out["kill_read"]
        print(
            f"read, a host SIGKILLed: {k['seconds']:.2f} s = {k['vs_undisturbed']:.2f}x "
            f"undisturbed; every row exactly once: {k['exactly_once']}; killed mid-way: "
            f"{k['killed_mid_way']}; shares {_shares(k, 'tx')}"
        )
        if "read_before_kill" in out:
            print(f"  {_cold(out['read_before_kill'])}")
    if "stream" not in out:
        return
    s = out["stream"]
    if "error" in s:
        print(f"stream: failed ({s['error'][:300]})")
        return
    print(
        f"stream, a host SIGKILLed: {s['kill']['seconds']:.2f} s against "
        f"{s['undisturbed']['seconds']:.2f} s ({s['vs_undisturbed']:.2f}x); exactly once: "
        f"{s['undisturbed']['exactly_once']} / {s['kill']['exactly_once']}; queries restarted "
        f"(Spark's Python worker start-up timeout): {s['undisturbed'].get('restarts', 0)} / "
        f"{s['kill'].get('restarts', 0)}; killed mid-way: {s['kill'].get('killed_mid_way')}"
    )


def fixed_part(seconds: list[float]) -> tuple[float, float]:
    """``T = F + W / hosts`` through the times of 1 and 3 hosts (``seconds[0]`` and
    ``seconds[2]``): F, the part of a read that does not shrink with hosts, and W."""
    one, three = seconds[0], seconds[2]
    work = (one - three) * 3 / 2
    return one - work, work


def _requests(phase: dict[str, Any]) -> str:
    """Per host: its commits, and the mean seconds of its begin, write and commit requests."""
    parts = []
    for name, ops in phase["requests"].items():
        if not any(n for n, _ in ops.values()):
            continue
        means = " ".join(
            f"{op} {ops[op][1] / ops[op][0]:.2f}" if ops[op][0] else f"{op} -"
            for op in ("begin", "write", "commit")
        )
        parts.append(f"{name}: {ops.get('commit', (0, 0))[0]} commits, mean s {means}")
    return "; ".join(parts)


def _ratios(data: dict[str, Any]) -> tuple[float, float]:
    """Rows per second through 3 hosts / through 1: reads, appends."""
    reads, appends = data["reads"], data["appends"]
    return (
        reads[-1]["rows_per_s"] / reads[0]["rows_per_s"],
        appends[-1]["rows_per_s"] / appends[0]["rows_per_s"],
    )


def summary_rows(data: dict[str, Any]) -> list[tuple[str, str, str, str, str]]:
    """Rows of the report's summary: (issue, comparison, this run, target, verdict)."""
    read, append = _ratios(data)
    kill, stream = data["kill_read"], data["stream"]

    def verdict(ok: bool) -> str:
        return "met" if ok else "**behind**"

    if "error" in stream:
        stream = {"vs_undisturbed": float("nan"), "kill": {"exactly_once": False}}
    return [
        (
            "30",
            "Spark read rows/s, 3 service hosts / 1 (shaped links)",
            f"{read:.2f}x",
            ">= 2.6x",
            verdict(read >= 2.6),
        ),
        (
            "30",
            "append rows/s, 3 service hosts / 1 (group commit)",
            f"{append:.2f}x",
            ">= 2.5x",
            verdict(append >= 2.5),
        ),
        (
            "30",
            "Spark read with a host SIGKILLed, time / undisturbed",
            f"{kill['vs_undisturbed']:.2f}x, exactly once: {kill['exactly_once']}",
            "<= 1.5x, every row once",
            verdict(
                kill["vs_undisturbed"] <= 1.5 and kill["exactly_once"] and kill["killed_mid_way"]
            ),
        ),
        (
            "30",
            "stream with a host SIGKILLed",
            f"{stream['vs_undisturbed']:.2f}x the time, "
            f"exactly once: {stream['kill']['exactly_once']}",
            "recovers, no duplicate",
            verdict(stream["kill"]["exactly_once"] and bool(stream["kill"].get("killed_mid_way"))),
        ),
    ]


def section(data: dict[str, Any]) -> list[str]:
    """The report's section (``benchmarks.run_all``)."""
    s = data["settings"]
    ds = data["dataset"]
    lines = [
        "## Scale-out: 1, 2, 3 service hosts on shaped links (issue 30)",
        "",
        f"Five namespaces on one bridge: SeaweedFS, three `aqueduct serve` hosts over one "
        f"`s3://` root, each host's cable shaped to {data['rate']} both ways (`tc tbf`), and a "
        f"Spark host (`local[{s['slots']},4]`). `benchmarks/bench_scale.py`; topology and reading "
        "guide in [operations](operations.md#scale-out-measured). *cores busy*: CPU seconds per "
        "second of each namespace's processes; *ours*: all of them as a share of the machine's "
        "cores; *machine*: the machine's busy share (other work included).",
        "",
        f"Spark read of {ds['rows']:,} rows ({ds['parquet_bytes'] / 1e6:.0f} MB Parquet) in "
        f"{s['tasks']} tasks, median of {s['repeat']}; appends of {s['append_rows']:,} rows by "
        f"{s['writers']} writer threads for {s['seconds']:g} s, group commit on, each cable "
        f"at {data.get('append_rate', data['rate'])} (an append crosses it twice: Arrow in, "
        "Parquet out to the store).",
        "",
        "| work | hosts | s | rows/s | x 1 host | commits/s | share of bytes per host "
        "| cores busy (svc1 svc2 svc3 store spark) | ours | machine | load |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for label, phases, way in (("read", data["reads"], "tx"), ("append", data["appends"], "rx")):
        base = phases[0]["rows_per_s"]
        for p in phases:
            cpu = " ".join(
                f"{p['cpu'][n] / p['seconds']:.2f}"
                for n in ("svc1", "svc2", "svc3", "store", "spark")
            )
            commits = f"{p['commits_per_s']:.2f}" if "commits_per_s" in p else ""
            lines.append(
                f"| {label} | {p['endpoints']} | {p['seconds']:.2f} | {p['rows_per_s']:,.0f} | "
                f"{p['rows_per_s'] / base:.2f}x | {commits} | {_shares(p, way)} | {cpu} | "
                f"{p['cpu_share']:.0%} | {p['machine_busy']:.0%} | {p['load']} |"
            )
    if any(a.get("requests") for a in data["appends"]):
        lines += [
            "",
            "Appends, per service host: commits (each host commits the writes it received), "
            "and the mean seconds of its begin, write and commit requests (its `/metrics`).",
            "",
            "| hosts | per host |",
            "|---|---|",
            *(f"| {a['endpoints']} | {_requests(a)} |" for a in data["appends"]),
        ]
    kill, stream = data["kill_read"], data["stream"]
    if "error" in stream:
        return [*lines, "", f"The stream phase failed: {stream['error'][:500]}", ""]
    lines += [
        "",
        f"| a host SIGKILLed at {s['kill_at']:.0%} of its work | undisturbed s | disturbed s "
        "| ratio | every row once | killed before the end |",
        "|---|---|---|---|---|---|",
        f"| Spark read, 3 hosts | {data['reads'][-1]['seconds']:.2f} | {kill['seconds']:.2f} | "
        f"{kill['vs_undisturbed']:.2f}x | {kill['exactly_once']} | {kill['killed_mid_way']} |",
        f"| stream, 3 hosts ({stream['kill']['rows']:,} rows) | "
        f"{stream['undisturbed']['seconds']:.2f} | {stream['kill']['seconds']:.2f} | "
        f"{stream['vs_undisturbed']:.2f}x | {stream['kill']['exactly_once']} | "
        f"{stream['kill'].get('killed_mid_way')} |",
        "",
    ]
    if "read_before_kill" in data:
        lines += [
            f"The read with a kill is warmed first, as the undisturbed reads are: "
            f"{_cold(data['read_before_kill'])}.",
            "",
        ]
    return lines


def _cold(warm: dict[str, Any]) -> str:
    return (
        f"the read that warms it, after {warm['idle_before']:.0f} s without Spark work (Spark "
        f"stops Python workers idle for a minute), took {warm['seconds']:.2f} s"
    )


def _shares(phase: dict[str, Any], way: str) -> str:
    moved = {name: h[way] for name, h in phase["hosts"].items()}
    total = sum(moved.values()) or 1
    return " ".join(f"{name} {v / total:4.0%}" for name, v in moved.items())


def _cpu(phase: dict[str, Any]) -> str:
    cpu = " ".join(f"{name} {v / phase['seconds']:.2f}" for name, v in phase["cpu"].items())
    return f"cores busy: {cpu}; ours {phase['cpu_share']:.0%}, machine {phase['machine_busy']:.0%}"


if __name__ == "__main__":
    sys.exit(main())
