"""Where the time goes at each end of a real-path read: ``perf record`` of the service (and
of the client worker) while one variant reads, for each variant in turn, with the CPU
seconds per GB of each end beside it (issue 28: the profiles behind docs/benchmarks.md).

    sudo .venv/bin/python -m benchmarks.realpath_profile [--rows N] [--table bench|taxi]
        [--rate 1gbit] [--reads K] [--variants aqueduct aqueduct-tcp-none ...] [--top 25]

Needs root (namespaces) and ``perf``; Python frames show as the interpreter's C functions
(3.11 has no perf trampoline), which is enough to tell TLS, sockets, Parquet decoding,
compression and the interpreter apart.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.bench_realpath import Session
from benchmarks.realpath_link import require_root, spawn_in, stop, veth_link
from benchmarks.realpath_variants import READY, VARIANTS, make_table

PERF_REPORT = ["perf", "report", "--stdio", "--no-children", "-g", "none"]


def perf_start(pid: int, out: Path) -> Any:
    return subprocess.Popen(
        ["perf", "record", "-F", "499", "-g", "-p", str(pid), "-o", str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def perf_stop(proc: Any) -> None:
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=60)


def report(data: Path, top: int) -> str:
    """The shared objects by self time, then the top symbols."""
    parts = []
    for sort, limit in (("dso", "1"), ("dso,sym", "0.7")):
        out = subprocess.run(
            [*PERF_REPORT, "-i", str(data), "--sort", sort, "--percent-limit", limit],
            capture_output=True,
            text=True,
        ).stdout
        lines = [x[:150] for x in out.splitlines() if x.strip() and not x.startswith("#")]
        parts.append("\n".join(lines[:top]))
    return "\n--\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--table", default="bench", choices=("bench", "taxi"))
    parser.add_argument("--rate", help="shape the link (tc units, e.g. 1gbit)")
    parser.add_argument("--reads", type=int, default=3, help="reads per variant, profiled")
    parser.add_argument("--variants", nargs="+", default=["aqueduct", "aqueduct-tcp-none"])
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--client", action="store_true", help="profile the client too")
    parser.add_argument("--packet-size", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--no-perf", action="store_true", help="CPU figures only")
    parser.add_argument(
        "--service-log-level", default="info", help="debug: also auto's codec changes"
    )
    args = parser.parse_args(argv)
    reason = require_root("profiling a real-path read")
    if reason:
        print(f"realpath_profile: {reason}", file=sys.stderr)
        return 2
    from aqueduct_core.transport import make_dev_certificates

    print(f"load {os.getloadavg()[0]:.1f}", flush=True)
    with tempfile.TemporaryDirectory(prefix="aqueduct-profile-") as tmp:
        root = Path(tmp) / "root"
        args.service_log = Path(tmp) / "service.log"
        expect = make_table(root, args.table, args.rows)
        with veth_link() as link:
            link.set_rate(args.rate)
            tls = make_dev_certificates(Path(tmp) / "tls", ("localhost", link.server_ip))
            certs = {"cert": str(tls.cert_file), "key": str(tls.key_file), "ca": str(tls.ca_file)}
            session = Session(link)
            try:
                for name in args.variants:
                    v = VARIANTS[name]
                    if v.server not in session.servers:
                        session.servers[v.server] = v.serve(link, root, certs, args)
                session.client, _ = spawn_in(
                    link.client_ns, ["-m", "benchmarks.bench_realpath", "--client-worker"], READY
                )
                for name in args.variants:  # warm up, checked
                    check = session.read(name, args.table, verify=True)
                    assert check["rows"] == expect["rows"], (name, check["rows"])
                figures: dict[str, list[tuple[float, float, float]]] = {}
                for name in args.variants:
                    proc, _ = session.servers[VARIANTS[name].server]
                    data = Path(tmp) / f"{name}.server.perf"
                    cdata = Path(tmp) / f"{name}.client.perf"
                    perf = None if args.no_perf else perf_start(proc.pid, data)
                    cperf = perf_start(session.client.pid, cdata) if args.client else None
                    time.sleep(0.5)
                    for _ in range(args.reads):
                        r = session.read(name, args.table)
                        gb = r["bytes"] / 1e9
                        figures.setdefault(name, []).append(
                            (r["seconds"], r["cpu"] / gb, r["server_cpu"] / gb)
                        )
                    if perf is not None:
                        perf_stop(perf)
                        print(f"\n== {name}: server (perf, {args.reads} reads)")
                        print(report(data, args.top))
                    if cperf is not None:
                        perf_stop(cperf)
                    if cperf is not None:
                        print(f"\n== {name}: client")
                        print(report(cdata, args.top))
                text = args.service_log.read_text()
                if args.service_log_level == "debug":
                    print(*re.findall(r"compression for .*", text), sep="\n")
                codecs = re.findall(r"op=scan .*?(compression=\S+)", text)
                print("\nthe service's scans, in order (batches per codec):", *codecs, sep="\n  ")
                print(f"\n{'variant':20} {'s':>6} {'cli s/GB':>9} {'srv s/GB':>9}  (each read)")
                for name, rows in figures.items():
                    for s, c, sv in rows:
                        print(f"{name:20} {s:6.2f} {c:9.2f} {sv:9.2f}")
            finally:
                if session.client is not None:
                    stop(session.client)
                for proc, _ in session.servers.values():
                    stop(proc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
