"""Real-path benchmark (issues 14, 28): the dataset service and Arrow Flight between two
"hosts".

Two network namespaces joined by a veth pair stand in for two machines on one Ethernet link
(``shared/design/real-paths.md``): a real MTU (1500 and 9000), the kernel's offloads as on a
NIC, no loopback shortcuts, and optionally a link of a given speed (``--rate``: ``tc tbf``
on both ends). The service (``aqueduct serve``) and the Flight servers run in the server
namespace over the same Delta tables, all with TLS from the same certificate; the clients
run in the other namespace. For every path it reports MB/s of Arrow data, the ratio to
Flight (the faster of the project's Flight server and a plain one) and to Flight with zstd
IPC compression, measured in the same run; the bytes the client's interface received per
read (the wire: headers, TLS, retransmissions); and CPU seconds per GB of Arrow data at
each end (``/proc/<pid>/stat`` of the server process, ``getrusage`` of the client's).

    sudo .venv/bin/python -m benchmarks.bench_realpath [--quick] [--rows N] [--repeat K]
        [--tables bench taxi] [--mtu 1500 9000] [--rate 1gbit 10gbit] [--loss 0.001 0.01]
        [--variants aqueduct aqueduct-tcp ...] [--copies] [--json out.json]

Tables: ``bench`` (ids, halves, "row-<id>" strings, timestamps: very regular) and ``taxi``
(the shape and entropy of NYC taxi trips, ``benchmarks/taxi.py``); every read is checked.
Root is required (namespaces, veth): without it the script says so and exits with status 2.
``--loss`` adds runs with that fraction of TCP and UDP packets dropped at random in both
directions (nftables ``numgen``; ``make debs`` installs nft). Namespaces get unique names
per run and are deleted in a ``finally``. Only 198.18.0.0/15 (RFC 2544) addresses are used.
Variants are listed in ``benchmarks/realpath_variants.py``. ``--copies`` measures issue 28's
copy work: each path beside the same path with the copying code of before it at both ends
(``benchmarks/realpath_oldpath.py``), in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.realpath_link import (
    ROOT,
    Link,
    proc_cpu,
    require_root,
    rx_bytes,
    spawn_in,
    stop,
    veth_link,
)
from benchmarks.realpath_variants import (
    COPIES_VARIANTS,
    DEFAULT_VARIANTS,
    READY,
    TABLES,
    VARIANTS,
    check_batch,
    flight_server,
    make_table,
)

__all__ = ["ROOT", "Link", "require_root", "spawn_in", "stop", "veth_link"]


def client_worker() -> None:
    """Runs in the client namespace: one JSON request per stdin line, one answer each."""
    print(READY, flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        variant = VARIANTS[req["variant"]]
        before = resource.getrusage(resource.RUSAGE_SELF)
        wire = rx_bytes(req["dev"])
        start = time.perf_counter()
        nbytes = rows = a = b = 0
        try:
            for batch in variant.read(req["info"], req["table"]):
                nbytes += batch.nbytes
                if req["verify"]:
                    n, x, y = check_batch(req["table"], batch)
                    rows, a, b = rows + n, a + x, b + y
                else:
                    rows += batch.num_rows
            error = None
        except Exception as exc:  # reported to the parent, which fails the run
            error = f"{type(exc).__name__}: {exc}"
        seconds = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_SELF)
        cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
        answer = {"seconds": seconds, "bytes": nbytes, "rows": rows, "cpu": cpu, "error": error}
        answer["wire"] = rx_bytes(req["dev"]) - wire
        if req["verify"]:
            answer.update(sum_a=a, sum_b=b)
        print(json.dumps(answer), flush=True)


@dataclass
class Session:
    """The servers of every variant on one link, and one client worker process."""

    link: Link
    servers: dict[str, tuple[Any, dict[str, Any]]] = field(default_factory=dict)
    client: Any = None

    def read(self, name: str, table: str, verify: bool = False) -> dict[str, Any]:
        proc, info = self.servers[VARIANTS[name].server]
        assert self.client.stdin is not None and self.client.stdout is not None
        cpu0 = proc_cpu(proc.pid)
        req = {"variant": name, "info": info, "table": table, "verify": verify}
        self.client.stdin.write(json.dumps({**req, "dev": self.link.client_if}) + "\n")
        self.client.stdin.flush()
        line = self.client.stdout.readline()
        if not line:
            raise RuntimeError("the client worker died")
        result: dict[str, Any] = json.loads(line)
        result["server_cpu"] = proc_cpu(proc.pid) - cpu0
        if result["error"]:
            raise RuntimeError(f"{name}: {result['error']}")
        return result


def measure(
    link: Link,
    root: Path,
    certs: dict[str, str],
    args: argparse.Namespace,
    table: str,
    expect: dict[str, int],
) -> dict[str, Any]:
    """Every variant on the current link settings: a verified warm-up read each, then
    ``repeat`` timed reads, interleaved so that noise hits every variant alike."""
    session = Session(link)
    out: dict[str, Any] = {}
    try:
        for name in args.variants:
            v = VARIANTS[name]
            if v.server not in session.servers:
                session.servers[v.server] = v.serve(link, root, certs, args)
        session.client, _ = spawn_in(
            link.client_ns, ["-m", "benchmarks.bench_realpath", "--client-worker"], READY
        )
        for name in args.variants:
            check = session.read(name, table, verify=True)
            expect.setdefault("bytes", check["bytes"])  # Arrow bytes as the first counts them
            for key in ("rows", "sum_a", "sum_b"):
                if check[key] != expect[key]:
                    raise AssertionError(f"{name}: {key} {check[key]} != {expect[key]}")
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name in args.variants}
        for _ in range(args.repeat):
            for name in args.variants:
                runs[name].append(session.read(name, table))
    finally:
        if session.client is not None:
            stop(session.client)
        for proc, _ in session.servers.values():
            stop(proc)
    gb = expect["bytes"] / 1e9
    for name, rs in runs.items():
        secs = statistics.median(r["seconds"] for r in rs)
        out[name] = {
            "seconds": secs,
            "all_seconds": [round(r["seconds"], 3) for r in rs],
            "MBps": expect["bytes"] / secs / 1e6,
            "wire_bytes": statistics.median(r["wire"] for r in rs),
            "client_cpu_per_GB": statistics.median(r["cpu"] for r in rs) / gb,
            "server_cpu_per_GB": statistics.median(r["server_cpu"] for r in rs) / gb,
            "intact": True,
        }
    ratios(out)
    return out


def ratios(out: dict[str, Any]) -> None:
    """Each variant against Flight (the faster of the project's and the plain one, as users
    would choose), against Flight with zstd, and its bytes on the wire against Flight's."""
    plain = [out[n] for n in ("flight", "flight-plain") if n in out]
    base = max(plain, key=lambda r: r["MBps"])
    zstd = out.get("flight-zstd")
    for run in out.values():
        run["vs_flight"] = run["MBps"] / base["MBps"]
        run["wire_vs_flight"] = run["wire_bytes"] / max(base["wire_bytes"], 1)
        if zstd is not None:
            run["vs_flight_zstd"] = run["MBps"] / zstd["MBps"]


def print_table(results: dict[str, Any]) -> None:
    print(
        f"\n{'table':6} {'MTU':>5} {'rate':>7} {'loss':>6} {'variant':18} {'s':>6} {'MB/s':>6}"
        f" {'vs Fl':>6} {'vs Fz':>6} {'wire MB':>8} {'wire/Fl':>7} {'cli s/GB':>8} {'srv s/GB':>8}"
    )
    for row in results["runs"]:
        for name, r in row["variants"].items():
            print(
                f"{row.get('table', 'bench'):6} {row['mtu']:>5} {row.get('rate') or '-':>7} "
                f"{row['loss']:>6.3%} {name:18} {r['seconds']:6.2f} {r['MBps']:6.0f} "
                f"{r['vs_flight']:5.2f}x {r.get('vs_flight_zstd', 0):5.2f}x "
                f"{r['wire_bytes'] / 1e6:8.1f} {r['wire_vs_flight']:7.2f} "
                f"{r['client_cpu_per_GB']:8.2f} {r['server_cpu_per_GB']:8.2f}"
            )


def print_auto(results: dict[str, Any]) -> None:
    """What ``compression=auto`` does against ``none`` on the same transport, in one run:
    the time ratio (above 1: auto faster) and each end's CPU per GB."""
    for row in results["runs"]:
        v = row["variants"]
        for auto, none in (("aqueduct", "aqueduct-none"), ("aqueduct-tcp", "aqueduct-tcp-none")):
            if auto in v and none in v:
                a, n = v[auto], v[none]
                print(
                    f"{row.get('table', 'bench')} {row.get('rate') or 'unshaped'}: {auto} / "
                    f"{none} {n['seconds'] / a['seconds']:.2f}x the speed, wire "
                    f"{a['wire_bytes'] / max(n['wire_bytes'], 1):.2f}x, CPU s/GB client "
                    f"{a['client_cpu_per_GB']:.2f} / {n['client_cpu_per_GB']:.2f}, server "
                    f"{a['server_cpu_per_GB']:.2f} / {n['server_cpu_per_GB']:.2f}"
                )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--rows",
        type=int,
        default=2_000_000,
        help="rows per table (2M ~ 78 MB of Arrow in bench, ~300 MB in taxi)",
    )
    parser.add_argument("--repeat", type=int, default=3, help="timed reads per variant (median)")
    parser.add_argument("--quick", action="store_true", help="500k rows, 2 reads, MTU 1500 only")
    parser.add_argument("--tables", nargs="+", default=list(TABLES), choices=TABLES)
    parser.add_argument("--mtu", type=int, nargs="+", default=[1500, 9000])
    parser.add_argument(
        "--rate",
        nargs="*",
        default=["1gbit", "10gbit"],
        help="extra runs at MTU 1500 with the link shaped to this speed (tc units; none: --rate)",
    )
    parser.add_argument(
        "--loss",
        type=float,
        nargs="*",
        default=[0.001, 0.01],
        help="extra runs at MTU 1500 with this fraction of packets dropped (none: --loss)",
    )
    parser.add_argument("--variants", nargs="+", default=DEFAULT_VARIANTS, choices=list(VARIANTS))
    parser.add_argument(
        "--copies",
        action="store_true",
        help="issue 28's copy work: TCP and QUIC without compression (and TCP with lz4), each "
        "beside the same path with the copying code of before it at both ends (-copies), "
        "instead of --variants",
    )
    parser.add_argument("--packet-size", type=int, help="set the QUIC packet size on both ends")
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--client-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--flight-server", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.client_worker:
        client_worker()
        return 0
    if args.flight_server:
        flight_server(*args.flight_server)
        return 0
    reason = require_root("the real-path benchmark")
    if reason:
        print(f"bench_realpath: {reason}; no figures were measured", file=sys.stderr)
        return 2
    if args.loss and shutil.which("nft") is None:
        print(
            "bench_realpath: --loss needs nftables (as root: make debs, or "
            "apt-get install -y nftables); no figures were measured",
            file=sys.stderr,
        )
        return 2
    if args.copies:
        args.variants = list(COPIES_VARIANTS)
    if args.quick:
        args.rows, args.repeat, args.mtu, args.loss = 500_000, 2, [1500], []
    for needed in ("flight-plain", "flight"):  # the baseline, first
        if needed not in args.variants:
            args.variants.insert(0, needed)
    from aqueduct_core.transport import make_dev_certificates
    from benchmarks.common import machine, write_json

    results: dict[str, Any] = {
        "machine": machine(),
        "rows": args.rows,
        "repeat": args.repeat,
        "runs": [],
        "command": " ".join(["sudo .venv/bin/python -m benchmarks.bench_realpath", *sys.argv[1:]]),
        "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "load_before": [round(x, 1) for x in os.getloadavg()],
        "arrow_bytes": {},
    }
    with tempfile.TemporaryDirectory(prefix="aqueduct-realpath-") as tmp:
        root = Path(tmp) / "root"
        expected = {}
        for table in args.tables:
            print(f"writing {args.rows:,} rows of {table} ...", flush=True)
            expected[table] = make_table(root, table, args.rows)
        with veth_link() as link:
            tls = make_dev_certificates(Path(tmp) / "tls", ("localhost", link.server_ip))
            certs = {"cert": str(tls.cert_file), "key": str(tls.key_file), "ca": str(tls.ca_file)}
            plan = [(mtu, None, 0.0) for mtu in args.mtu]
            plan += [(1500, rate, 0.0) for rate in args.rate]
            plan += [(1500, None, loss) for loss in args.loss]
            for table in args.tables:
                for mtu, rate, loss in plan:
                    link.set_mtu(mtu)
                    link.set_rate(rate)
                    link.set_loss(loss)
                    load = round(os.getloadavg()[0], 1)
                    print(
                        f"== {table}: MTU {mtu}, rate {rate or 'unshaped'}, loss {loss:.1%}, load {load}",
                        flush=True,
                    )
                    variants = measure(link, root, certs, args, table, expected[table])
                    row = {"table": table, "mtu": mtu, "rate": rate, "loss": loss, "load": load}
                    results["runs"].append({**row, "variants": variants})
                    for name, r in variants.items():
                        print(
                            f"   {name:18} {r['MBps']:7.0f} MB/s  {r['vs_flight']:5.2f}x Flight  "
                            f"wire {r['wire_vs_flight']:.2f}x  CPU s/GB client "
                            f"{r['client_cpu_per_GB']:.2f} server {r['server_cpu_per_GB']:.2f}",
                            flush=True,
                        )
                results["arrow_bytes"][table] = expected[table]["bytes"]
            link.set_loss(0.0)
            link.set_rate(None)
        results["load_after"] = [round(x, 1) for x in os.getloadavg()]
    print_table(results)
    print_auto(results)
    print(
        f"({args.rows:,} rows per table, median of {args.repeat}; every variant's warm-up "
        "read was checked; vs Fl: against Flight, vs Fz: against Flight with zstd; wire: "
        "bytes the client's interface received per read)"
    )
    write_json(args.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
