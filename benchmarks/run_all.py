"""Run every benchmark in one go and write the report: ``docs/benchmarks.md`` with tables,
ratios against each target, and plots in ``docs/benchmarks/``.

    python -m benchmarks.run_all [--quick] [--only NAME ...]

Each script runs in its own process (``--json`` into docs/benchmarks/results/). The machine is
noisy: every comparison is a ratio measured within one script run, and the report says so.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks import (
    bench_browser,
    bench_burst,
    bench_scale,
    bench_versions,
    report_hand,
    report_runs,
)

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "benchmarks"
RESULTS = OUT / "results"
REPORT = ROOT / "docs" / "benchmarks.md"

SCRIPTS = {
    "realpath": "benchmarks.bench_realpath",
    "realpath_spark": "benchmarks.bench_realpath_spark",
    "codec": "benchmarks.bench_codec",
    "transport": "benchmarks.bench_transport",
    "service": "benchmarks.bench_service",
    "spark": "benchmarks.bench_spark",
    "streaming": "benchmarks.bench_streaming_latency",
    "commits": "benchmarks.bench_commits",
    "versions": "benchmarks.bench_versions",
    "burst": "benchmarks.bench_burst",
    "browser": "benchmarks.bench_browser",
    "scale": "benchmarks.bench_scale",
}


def run(name: str, quick: bool) -> tuple[dict[str, Any] | None, str]:
    """Run one benchmark script; a run that finished is stored (``report_runs.store``)."""
    out = RESULTS / f"{name}.new.json"
    out.unlink(missing_ok=True)
    args = [sys.executable, "-m", SCRIPTS[name], "--json", str(out)]
    if quick and name != "codec":
        args.append("--quick")
    print(f"== {name}: {' '.join(args[1:])}", flush=True)
    load_start = report_runs.settle()
    start = time.time()
    proc = subprocess.run(args, cwd=ROOT, capture_output=True, text=True)
    log = proc.stdout + proc.stderr
    (RESULTS / f"{name}.log").write_text(log)
    print(
        f"   {'ok' if proc.returncode == 0 else f'FAILED ({proc.returncode})'} in {time.time() - start:.0f} s",
        flush=True,
    )
    if proc.returncode != 0 or not out.exists():
        return None, log
    data: dict[str, Any] = json.loads(out.read_text())
    out.unlink()
    if quick:
        data["quick"] = True  # a smoke run: never the project's figures
    data["run"] = {  # measured here around the whole script, whatever it recorded itself
        "command": f"python -m {' '.join(args[2:])}",
        "started": report_runs.utc(start),
        "finished": report_runs.utc(time.time()),
        "load_start": round(load_start, 2),
        "load_end": round(os.getloadavg()[0], 2),
    }
    report_runs.store(RESULTS, name, data)
    return data, log


def plot_bars(
    path: Path,
    title: str,
    labels: list[str],
    values: list[float],
    unit: str,
    target: float | None = None,
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 0.45 * len(labels) + 1.2))
    ax.barh(labels, values, color="#3b75af")
    if target is not None:
        ax.axvline(target, color="#c44e52", linestyle="--", label="target")
        ax.legend(loc="lower right")
    ax.set_xlabel(unit)
    ax.set_title(title)
    ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def section_transport(data: dict[str, Any]) -> list[str]:
    mib = 1 << 20
    lines = [
        "## Loopback: one Aqueduct channel vs a bare QUIC stream vs Arrow Flight (issues 4, 5)",
        "",
        "Loopback (127.0.0.1), QUIC packets of the size in each row (1472 to 65507 bytes): "
        "no MTU, no loss, no NIC. The real-path section above is what a remote client sees.",
        "",
        "Server to client over loopback, server and client pinned to different cores; medians "
        f"over {data['plan']['main']['repeat']} rounds. Method and knobs: "
        "[benchmarks/transport.md](benchmarks/transport.md).",
        "",
        "| backend | packet | kind | message | MB/s | client CPU s/GB | server CPU s/GB |",
        "|---|---|---|---|---|---|---|",
    ]
    best: dict[str, float] = {}
    for r in data["results"]:
        lines.append(
            f"| {r['backend']} | {r['packet'] or ''} | {r['kind']} | {r['size'] // mib} MiB | "
            f"{r['MBps']:.0f} | {_fmt(r.get('client_cpu_s_per_GB'))} | "
            f"{_fmt(r.get('server_cpu_s_per_GB'))} |"
        )
        label = f"{r['backend']} {r['packet'] or ''} {r['kind']}".replace("  ", " ")
        best[label] = max(best.get(label, 0.0), float(r["MBps"]))
    lines += [
        "",
        "| ratio | config | message | median | per round | target | |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in data["ratios"]:
        if r["role"] == "info":
            verdict = "(context)"
        else:
            verdict = "met" if r["value"] >= r["target"] else "MISSED"
        lines.append(
            f"| {r['ratio']} | {r['config']} | {r['size'] // mib} MiB | {r['value']:.2f} | "
            f"{', '.join(f'{v:.2f}' for v in r['values'])} | >= {r['target']:.2f} | {verdict} |"
        )
    targets = data.get("targets", {})
    lines += [
        "",
        f"Targets met: **{targets.get('met', '?')} of {targets.get('total', '?')}**.",
        "",
    ]
    if best:
        plot_bars(
            OUT / "transport.png",
            "Best throughput on loopback over message sizes (MB/s)",
            list(best),
            list(best.values()),
            "MB/s",
        )
        lines += ["![transport throughput](benchmarks/transport.png)", ""]
    return lines


def section_realpath(data: dict[str, Any]) -> list[str]:
    """The figures users see: two namespaces joined by a veth pair (issues 14, 28)."""
    sizes = data["arrow_bytes"]
    if not isinstance(sizes, dict):  # a run before issue 28: one table
        sizes = {"bench": sizes}
    tables = ", ".join(f"{name} {size / 1e6:.0f} MB" for name, size in sizes.items())
    lines = [
        "## Real network path: dataset read between two hosts (issues 14, 28)",
        "",
        f"Two network namespaces joined by a veth pair (a real MTU, the kernel's offloads; "
        f"`benchmarks/bench_realpath.py`, root), unshaped or shaped to a link speed (`tc "
        f"tbf` on both ends). {data['rows']:,} rows per table (Arrow: {tables}; `taxi` has "
        "the shape and entropy of NYC taxi trips, `benchmarks/taxi.py`), TLS on every path, "
        "service and Flight servers in one namespace, Python client in the other; median of "
        "the timed reads; every variant's first read was checked. Flight is the faster of the "
        "project's Flight server and a plain one (deltalake + pyarrow's scanner); Flight zstd "
        "is the plain one with zstd IPC compression on. Wire: bytes the client's interface "
        "received per read. CPU s/GB: CPU seconds of the client and of the server process "
        "per GB of Arrow data. `aqueduct` is every client default (transport, compression "
        "and decode `auto`: row groups the service need not change travel as stored Parquet "
        "and the client decodes them, [operations](operations.md#parquet-as-stored)), "
        "`aqueduct-arrow` every default but `decode=service` (Arrow from the service, the "
        "default before), `aqueduct-none` the default transport and decode without "
        "compression, `aqueduct-tcp` the default compression over TLS/TCP, `-none|lz4|zstd` "
        "fixed.",
        "",
    ]
    if "command" in data:
        lines += [
            f"Command: `{data['command']}` (median of {data['repeat']}); load average (1, 5, "
            f"15 min) {', '.join(map(str, data['load_before']))} at the start and "
            f"{', '.join(map(str, data.get('load_after', [])))} at the end.",
            "",
        ]
    lines += [
        "| table | MTU | link | loss | path | s | MB/s | vs Flight | vs Flight zstd | wire MB "
        "| wire vs Flight | client CPU s/GB | server CPU s/GB |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in data["runs"]:
        for name, r in row["variants"].items():
            zstd = r.get("vs_flight_zstd")
            wire = r.get("wire_bytes")
            lines.append(
                f"| {row.get('table', 'bench')} | {row['mtu']} | {row.get('rate') or '-'} | "
                f"{row['loss']:.1%} | {name} | {r['seconds']:.2f} | {r['MBps']:.0f} | "
                f"{r['vs_flight']:.2f}x | {f'{zstd:.2f}x' if zstd else ''} | "
                f"{f'{wire / 1e6:.0f}' if wire is not None else ''} | "
                f"{_fmt(r.get('wire_vs_flight'))} | {r['client_cpu_per_GB']:.1f} | "
                f"{r['server_cpu_per_GB']:.1f} |"
            )
    lines += [
        "",
        "Packet sizes are found per connection, with no option on either end: from the "
        "route's MTU, then probed (RFC 8899): 1472 at MTU 1500, 8972 at 9000; UDP GSO/GRO on. "
        "Where the time goes, the profile and what is left: "
        "[benchmarks/transport.md](benchmarks/transport.md), section *Real network paths*.",
    ]
    return [*lines, ""]


def realpath_targets(data: dict[str, Any]) -> list[tuple[str, str, str, str, str]]:
    """Issue 14's acceptance targets against one run of the real-path benchmark."""
    rows = []
    for row in data["runs"]:
        if row.get("table", "bench") != "bench" or row.get("rate"):
            continue  # issue 14 set its targets on the bench table, unshaped
        v = row["variants"]
        flight = v.get("flight", {})
        flight_cpu = flight.get("client_cpu_per_GB", 0) + flight.get("server_cpu_per_GB", 0)
        for name, r in v.items():
            if name.startswith("flight") or name.startswith("aqueduct-tcp-") or name == "aqueduct":
                continue  # issue 14 compared each transport at its defaults
            cpu = r["client_cpu_per_GB"] + r["server_cpu_per_GB"]
            if row["loss"]:
                target, ok = "every byte intact", bool(r.get("intact"))
            elif row["mtu"] == 9000:
                target, ok = ">= 0.90x", r["vs_flight"] >= 0.9
            elif name.endswith("aioquic"):
                target, ok = ">= 0.15x", r["vs_flight"] >= 0.15
            else:
                target, ok = ">= 0.50x", r["vs_flight"] >= 0.5
            if row["mtu"] == 1500 and not row["loss"]:
                rows.append(
                    (
                        "14",
                        f"real path MTU 1500: {name} CPU per GB, client + server",
                        f"{cpu:.1f} s/GB = {cpu / flight_cpu:.1f}x Flight's {flight_cpu:.1f}",
                        "<= 3x Flight's",
                        "met" if cpu <= 3 * flight_cpu else "**behind**",
                    )
                )
            rows.append(
                (
                    "14",
                    f"real path MTU {row['mtu']}, loss {row['loss']:.1%}: {name} read",
                    f"{r['vs_flight']:.2f}x Flight, CPU {cpu:.1f} s/GB (Flight {flight_cpu:.1f})",
                    target,
                    "met" if ok else "**behind**",
                )
            )
    return rows + compression_targets(data)


def compression_targets(data: dict[str, Any]) -> list[tuple[str, str, str, str, str]]:
    """Issue 28's targets on each table at MTU 1500: at 1 Gbit/s, the default read against
    Flight and Flight with zstd, and its bytes on the wire; unshaped, the default
    compression against none on the same transport (``aqueduct`` / ``aqueduct-none``,
    ``aqueduct-tcp`` / ``aqueduct-tcp-none``)."""
    rows = []
    for row in data["runs"]:
        if row["mtu"] != 1500 or row["loss"]:
            continue
        v, rate, table = row["variants"], row.get("rate"), row.get("table", "bench")
        for name in ("aqueduct", "aqueduct-tcp"):
            r = v.get(name)
            if r is None:
                continue
            if rate == "1gbit":
                rows.append(
                    (
                        "28",
                        f"1 Gbit/s link, {table}: {name} (default compression) read",
                        f"{r['vs_flight']:.2f}x Flight, {r.get('vs_flight_zstd', 0):.2f}x "
                        "Flight zstd",
                        ">= 2x Flight, >= 1.2x Flight zstd",
                        "met"
                        if r["vs_flight"] >= 2 and r.get("vs_flight_zstd", 0) >= 1.2
                        else "**behind**",
                    )
                )
                rows.append(
                    (
                        "28",
                        f"1 Gbit/s link, {table}: {name} bytes on the wire per read",
                        f"{r['wire_vs_flight']:.2f}x Flight's",
                        "<= 0.6x Flight's",
                        "met" if r["wire_vs_flight"] <= 0.6 else "**behind**",
                    )
                )
            none = v.get(f"{name}-none")
            if rate is None and none is not None:
                ratio = r["MBps"] / none["MBps"]
                rows.append(
                    (
                        "28",
                        f"unshaped, {table}: {name} (compression auto) against "
                        "compression=none, same transport",
                        f"{ratio:.2f}x (server CPU {r['server_cpu_per_GB']:.2f} against "
                        f"{none['server_cpu_per_GB']:.2f} s/GB)",
                        ">= 0.95x",
                        "met" if ratio >= 0.95 else "**behind**",
                    )
                )
    return rows


def section_realpath_spark(data: dict[str, Any]) -> list[str]:
    """Spark in one namespace, the service and Flight in the other (issues 15, 28)."""
    gb = data["arrow_bytes"] / 1e9
    lines = [
        "## Real network path: Spark read and write against the Flight data source (issues 15, 28)",
        "",
        f"Spark (local[2]) in one namespace, the service and the Flight servers in the other, "
        f"veth at MTU 1500, unshaped and shaped (`tc tbf`); {data['rows']:,} rows; median of "
        f"{data['repeat']}. Ratio: time / Flight's time (below 1 is faster). Wire: bytes the "
        "Spark namespace received (read) or sent (write). CPU s/GB: Spark's whole process tree "
        "/ the server process, per GB of Arrow data.",
        "",
        "| link | path | op | s | vs Flight | wire MB | Spark CPU s/GB | server CPU s/GB |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for run in data["runs"]:
        base = run["paths"]["flight-tls"]
        for label, r in run["paths"].items():
            for op in ("write", "read"):
                x = r[op]
                lines.append(
                    f"| {run['rate'] or '-'} | {label} | {op} | {x['seconds']:.2f} | "
                    f"{x['seconds'] / base[op]['seconds']:.2f}x | {x['wire'] / 1e6:.0f} | "
                    f"{x['client_cpu'] / gb:.1f} | {x['server_cpu'] / gb:.1f} |"
                )
    return [*lines, ""]


def section_service(data: dict[str, Any]) -> list[str]:
    runs = data["runs"]
    lines = [
        "## Loopback: dataset service read vs Arrow Flight (issue 6)",
        "",
        "Loopback (127.0.0.1): QUIC packets of 65507 bytes (qh3) and 16384 (aioquic), the "
        "largest each backend can send; see the real-path section for Ethernet MTUs.",
        "",
        f"{data['rows']:,} rows, {data['arrow_bytes'] / 1e9:.2f} GB of Arrow, Python client, TLS on both paths.",
        "",
        "| path | s | MB/s | vs Flight TLS |",
        "|---|---|---|---|",
    ]
    for name, run_ in runs.items():
        lines.append(
            f"| {name} | {run_['seconds']:.2f} | {run_['MBps']:.0f} | {run_['vs_flight']:.2f}x |"
        )
    best = data["best_vs_flight"]
    lines += [
        "",
        f"Best Aqueduct / Flight TLS: **{best:.2f}x** (target >= 0.80x: {'met' if best >= 0.8 else 'MISSED'}).",
        "",
    ]
    plot_bars(
        OUT / "service.png",
        "Dataset read (MB/s)",
        list(runs),
        [r["MBps"] for r in runs.values()],
        "MB/s",
    )
    lines += ["![service read](benchmarks/service.png)", ""]
    return lines


def section_spark(data: dict[str, Any]) -> list[str]:
    lines = [
        "## Loopback: Spark read and write vs Arrow Flight and the in-process floor (issue 7)",
        "",
        f"{data['rows']:,} rows (int64, double, string, timestamp), local[2], "
        "`spark.sql.execution.arrow.maxBytesPerBatch=2147483647`; medians; lower time is better.",
        "",
    ]
    for kind in ("read", "write"):
        times = data[kind]
        flight, floor = times["flight-tls"], times["floor (in-executor Delta)"]
        lines += [f"### {kind}", "", "| path | s | vs Flight | vs floor |", "|---|---|---|---|"]
        for label, t in times.items():
            lines.append(f"| {label} | {t:.2f} | {t / flight:.2f}x | {t / floor:.2f}x |")
        bf, bfl = data[f"{kind}_best_vs_flight"], data[f"{kind}_best_vs_floor"]
        lines += [
            "",
            f"Best Aqueduct {kind}: **{bf:.2f}x** Flight's time (target <= 1.10: {'met' if bf <= 1.1 else 'MISSED'}), "
            f"**{bfl:.2f}x** the floor (target <= 1.50: {'met' if bfl <= 1.5 else 'MISSED'}).",
            "",
        ]
        plot_bars(
            OUT / f"spark_{kind}.png",
            f"Spark {kind}, seconds",
            list(times),
            list(times.values()),
            "seconds",
        )
        lines += [f"![spark {kind}](benchmarks/spark_{kind}.png)", ""]
    return lines


def section_streaming(data: dict[str, Any]) -> list[str]:
    lines = [
        "## Loopback: streaming latency, append to arrival in a memory sink (issue 8)",
        "",
    ]
    modes = data.get("modes") or data.get("results") or {}
    if modes:
        lines += ["| mode | median s | p95 s | samples |", "|---|---|---|---|"]
        for name, m in modes.items():
            lines.append(
                f"| {name} | {_fmt(m.get('median'))} | {_fmt(m.get('p95'))} | {m.get('samples', m.get('n', ''))} |"
            )
        lines.append("")
        labels = list(modes)
        plot_bars(
            OUT / "streaming.png",
            "Append-to-arrival latency (median, s)",
            labels,
            [float(modes[k].get("median") or 0) for k in labels],
            "seconds",
        )
        lines += ["![streaming latency](benchmarks/streaming.png)", ""]
    if data.get("notes"):
        lines += [str(data["notes"]), ""]
    return lines


def section_commits(data: dict[str, Any]) -> list[str]:
    lines = [
        "## Commits per second against writers (issue 19)",
        "",
        f"One `aqueduct serve` over an `s3://` root on SeaweedFS (all on this machine); N writing "
        f"processes, each a Python client appending {data['rows_per_append']} rows at a time "
        f"to one dataset for {data['seconds']:.0f} s. *grouped*: group commit (the default); "
        "*naive*: `AQUEDUCT_GROUP_COMMIT=0`, every append its own Delta commit. commits/s = "
        "appends acknowledged per second; the count check compares the rows in the dataset "
        "with the rows acknowledged.",
        "",
        "| mode | writers | commits/s | Delta versions/s | median append s | rows lost | load |",
        "|---|---|---|---|---|---|---|",
    ]
    for mode, points in data["modes"].items():
        for p in points:
            lines.append(
                f"| {mode} | {p['writers']} | {p['commits_per_s']:.1f} | "
                f"{p['versions_per_s']:.1f} | {p['median_latency_s'] or 0:.2f} | {p['lost']} | "
                f"{p['load']:.1f} |"
            )
    lines += [
        "",
        f"Group commit, 8 writers against 1: {data['speedup_8_vs_1']:.2f}x. The naive ceiling "
        f"on this store and machine: {data['naive_ceiling']:.1f} commits/s; grouped best "
        f"{data['grouped_best']:.1f}. Count check: {data['count_check']}.",
        "",
    ]
    return lines


def section_codec(data: dict[str, Any]) -> list[str]:
    lines = [
        "## Wire codec (issue 2)",
        "",
        "MESSAGE frames with a 1 MiB payload, next to a plain copy of the payload.",
        "",
        "| operation | GB/s | vs copy |",
        "|---|---|---|",
    ]
    for name, r in data["results"].items():
        lines.append(f"| {name} | {r['GBps']:.2f} | {r['vs_copy']:.2f} |")
    return [*lines, ""]


def target_rows(
    collected: dict[str, dict[str, Any] | None],
) -> list[tuple[str, str, str, str, str]]:
    """(issue, comparison, figure, target, verdict) of every target the issues set, as the
    runs in ``collected`` met it."""
    rows: list[tuple[str, str, str, str, str]] = []
    for data in collected.values():  # runs transcribed from a record: their rows as given
        for row in (data or {}).get("summary_rows", []):
            rows.append(tuple(row))  # type: ignore[arg-type]
    collected = {k: d for k, d in collected.items() if d and "summary_rows" not in d}

    def verdict(ok: bool) -> str:
        return "met" if ok else "**behind**"

    realpath = collected.get("realpath")
    if realpath:
        rows += realpath_targets(realpath)
    spark_rp = collected.get("realpath_spark")
    if spark_rp:
        for run in spark_rp["runs"]:
            base = run["paths"]["flight-tls"]
            for label in ("aqueduct", "aqueduct-tcp"):
                r = run["paths"].get(label)
                if r is None:
                    continue
                for op in ("read", "write"):
                    ratio = base[op]["seconds"] / r[op]["seconds"]
                    rows.append(
                        (
                            "28",
                            f"Spark {op} across namespaces, link {run['rate'] or 'unshaped'}: "
                            f"{label}",
                            f"{ratio:.2f}x Flight's speed (time ratio)",
                            ">= 1.15x",
                            "met" if ratio >= 1.15 else "**behind**",
                        )
                    )
    codec = collected.get("codec")
    if codec:
        for name, r in codec["results"].items():
            if name.startswith(("encode: message_parts", "decode: decode_frame")):
                rows.append(
                    (
                        "2",
                        f"codec {name}, 1 MiB payload",
                        f"{r['GBps']:.1f} GB/s = {r['vs_copy']:.2f}x a copy",
                        "report",
                        "reported",
                    )
                )
    transport = collected.get("transport")
    if transport:
        for ratio, target, issue in (
            ("aqueduct/bare", 0.85, "4"),
            ("aqueduct-noflow/bare", 0.85, "4"),
            ("aqueduct/aqueduct-noflow", 0.90, "5"),
            ("best-aqueduct/flight-tls", 1.00, "4"),
        ):
            found = [r for r in transport["ratios"] if r["ratio"] == ratio and r["role"] == "main"]
            if found:
                values = [r["value"] for r in found]
                ok = sum(v >= target for v in values)
                rows.append(
                    (
                        issue,
                        f"transport {ratio} (each backend x packet size x message size)"
                        if ratio != "best-aqueduct/flight-tls"
                        else "transport best Aqueduct / Flight TLS (each message size)",
                        f"{min(values):.2f}-{max(values):.2f}",
                        f">= {target:.2f}",
                        f"{ok} of {len(values)} met" if ok < len(values) else "met",
                    )
                )
    service = collected.get("service")
    if service:
        best = service["best_vs_flight"]
        rows.append(
            (
                "6",
                "dataset read, Python client / Flight TLS",
                f"{best:.2f}x",
                ">= 0.80x",
                verdict(best >= 0.8),
            )
        )
    spark = collected.get("spark")
    if spark:
        for kind in ("read", "write"):
            bf, bfl = spark[f"{kind}_best_vs_flight"], spark[f"{kind}_best_vs_floor"]
            rows.append(
                (
                    "7",
                    f"Spark {kind} time / Flight source",
                    f"{bf:.2f}x",
                    "<= 1.10x",
                    verdict(bf <= 1.1),
                )
            )
            rows.append(
                (
                    "7",
                    f"Spark {kind} time / in-process floor",
                    f"{bfl:.2f}x",
                    "<= 1.50x",
                    verdict(bfl <= 1.5),
                )
            )
    streaming = collected.get("streaming")
    if streaming:
        for name, m in streaming.get("modes", {}).items():
            rows.append(
                (
                    "8",
                    f"streaming latency, {name}",
                    f"median {m['median']:.2f} s, p95 {m['p95']:.2f} s",
                    "report",
                    "reported",
                )
            )
    commits = collected.get("commits")
    if commits:
        speedup = commits["speedup_8_vs_1"]
        rows.append(
            (
                "19",
                "commits/s, 8 writing processes / 1 (group commit, SeaweedFS)",
                f"{speedup:.2f}x; count check {commits['count_check']}",
                ">= 3x, no append lost",
                verdict(speedup >= 3 and commits["count_check"] == "ok"),
            )
        )
    if collected.get("versions"):
        rows += bench_versions.summary_rows(collected["versions"] or {})
    if collected.get("burst"):
        rows += bench_burst.summary_rows(collected["burst"] or {})
    if collected.get("browser"):
        rows += bench_browser.summary_rows(collected["browser"] or {})
    if collected.get("scale"):
        rows += bench_scale.summary_rows(collected["scale"] or {})
    return rows


SUMMARY = "## Summary: every target, from the most recent quiet run"
LOADED = "## Runs on a loaded machine (not the project's figures)"


def summary(quiet: dict[str, Any], other: dict[str, Any]) -> list[str]:
    """The table of every target, each benchmark's row from its most recent quiet run."""
    lines = [
        SUMMARY,
        "",
        f"Quiet: the 1-minute load average was at most {report_runs.QUIET_LOAD:g} when the run "
        "started (the load at its end, shown too, is mostly the benchmark's own processes). A "
        "run on a busier machine never replaces these rows: it is listed under *Runs on a "
        "loaded machine* below.",
        "",
        "| issue | comparison | figure | target | verdict | run (UTC, load) |",
        "|---|---|---|---|---|---|",
    ]
    behind = []
    for name in SCRIPTS:
        if name in quiet:
            for r in target_rows({name: quiet[name]}):
                lines.append(f"| {' | '.join(r)} | {report_runs.label(quiet[name])} |")
                if r[4] not in ("met", "reported"):
                    behind.append(r)
    lines.append("")
    missing = [name for name in SCRIPTS if name not in quiet]
    if missing:
        lines += [
            "No quiet run recorded yet: "
            + ", ".join(f"{name} (`python -m {SCRIPTS[name]}`)" for name in missing)
            + ". Their latest runs are under *Runs on a loaded machine*; "
            f"`python -m benchmarks.run_all --only {' '.join(missing)}` on a quiet machine "
            "puts them here.",
            "",
        ]
    if behind:
        lines += [
            "Where we are behind: "
            + "; ".join(f"{r[1]} ({r[2]} against {r[3]}, {r[4]})" for r in behind)
            + ". The sections below and [benchmarks/transport.md](benchmarks/transport.md) "
            "say where the time goes and what would close the gap.",
            "",
        ]
    return lines


def loaded(other: dict[str, Any]) -> list[str]:
    """Each benchmark's latest run where it was not quiet: labelled, apart from the summary."""
    lines = [
        LOADED,
        "",
        "The latest run of these benchmarks shared the cores with other work (or did not record "
        "its load): every process got a fraction of a core, so absolute figures are long and "
        "even ratios can move by tens of percent. Kept to show the trend, not as the project's "
        "figures.",
        "",
    ]
    if not other:
        return [*lines, "None: every benchmark's latest run was quiet.", ""]
    lines += [
        "| issue | comparison | figure | target | in that run | run (UTC, load) |",
        "|---|---|---|---|---|---|",
    ]
    for name in SCRIPTS:
        if name in other:
            for r in target_rows({name: other[name]}):
                lines.append(f"| {' | '.join(r)} | {report_runs.label(other[name])} |")
    return [*lines, ""]


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.2f}"
    return "" if value is None else str(value)


SECTIONS = {
    "realpath": section_realpath,
    "realpath_spark": section_realpath_spark,
    "codec": section_codec,
    "transport": section_transport,
    "service": section_service,
    "spark": section_spark,
    "streaming": section_streaming,
    "commits": section_commits,
    "versions": bench_versions.section,
    "burst": bench_burst.section,
    "browser": bench_browser.section,
    "scale": bench_scale.section,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--quick", action="store_true", help="small sizes (a smoke run, not a report)"
    )
    parser.add_argument("--only", nargs="*", choices=list(SCRIPTS), help="run only these")
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="run nothing; rewrite the report from the results already in docs/benchmarks/results",
    )
    args = parser.parse_args(argv)
    RESULTS.mkdir(parents=True, exist_ok=True)
    names = [] if args.report_only else (args.only or list(SCRIPTS))
    failed = [name for name in names if run(name, args.quick)[0] is None]
    quiet, other = report_runs.stored(RESULTS, list(SCRIPTS))
    machine: dict[str, Any] = {}
    for d in [*quiet.values(), *other.values()]:  # the scripts record overlapping sets of facts
        machine = {**d.get("machine", {}), **machine}
    lines = [
        "# Benchmark report",
        "",
        f"Generated by `python -m benchmarks.run_all{' --quick' if args.quick else ''}` on "
        f"{time.strftime('%Y-%m-%d')} from the runs stored in `docs/benchmarks/results/`. "
        f"Machine: {machine.get('cpus', machine.get('nproc', '?'))} CPUs ({machine.get('cpu', '?')}), "
        f"Python {machine.get('python', '?')}, aioquic {machine.get('aioquic', '?')}, qh3 {machine.get('qh3', '?')}, "
        f"pyarrow {machine.get('pyarrow', '?')}, deltalake {machine.get('deltalake', '?')}, pyspark {machine.get('pyspark', '?')}.",
        "",
        "Absolute figures on this 2-core machine swing by tens of percent between runs; every comparison "
        "below is a ratio measured within one run of one script, with the compared paths run back to back. "
        "Servers and clients share the 2 cores. Raw results and logs are in `docs/benchmarks/results/` "
        "(`NAME.json` the latest run, `NAME.quiet.json` the latest quiet one).",
        "",
        *summary(quiet, other),
    ]
    for name in failed:
        lines += [
            f"The {name} benchmark failed in this run; see `docs/benchmarks/results/{name}.log`.",
            "",
        ]
    for name in SCRIPTS:
        if name in quiet:
            lines += _section(name, quiet[name], "")
    lines += loaded(other)
    for name in SCRIPTS:
        if name in other:
            lines += _section(name, other[name], "Loaded run: ")
    old = REPORT.read_text() if REPORT.exists() else ""
    REPORT.write_text("\n".join(report_hand.keep(old, lines)))  # hand-written parts stay
    print(f"wrote {REPORT.relative_to(ROOT)}")
    return 1 if failed else 0


def _section(name: str, data: dict[str, Any], prefix: str) -> list[str]:
    """A benchmark's section of the report, its heading prefixed, its run named under it."""
    try:
        lines = SECTIONS[name](data) if "summary_rows" not in data else _transcribed(data)
    except (KeyError, TypeError, ValueError) as exc:
        lines = [f"## {name}", "", f"Results could not be summarized ({exc}); see the JSON.", ""]
    quiet = "quiet" if report_runs.is_quiet(data) else "not quiet"
    return [
        f"## {prefix}{lines[0].removeprefix('## ')}",
        "",
        f"Run: {report_runs.label(data)} ({quiet}).",
        *lines[1:],
    ]


def _transcribed(data: dict[str, Any]) -> list[str]:
    """The section of a run transcribed from a hand-written record: its source, its rows."""
    return [
        f"## {data['heading']}",
        "",
        f"From a record, not a stored run: {data['source']}",
        "",
        "| comparison | figure | target | verdict |",
        "|---|---|---|---|",
        *[f"| {' | '.join(row[1:])} |" for row in data["summary_rows"]],
        "",
    ]


if __name__ == "__main__":
    sys.exit(main())
