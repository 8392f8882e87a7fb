"""Run every benchmark in one go and write the report: ``docs/benchmarks.md`` with tables,
ratios against each target, and plots in ``docs/benchmarks/``.

    python -m benchmarks.run_all [--quick] [--only NAME ...]

Each script runs in its own process (``--json`` into docs/benchmarks/results/). The machine is
noisy: every comparison is a ratio measured within one script run, and the report says so.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "benchmarks"
RESULTS = OUT / "results"
REPORT = ROOT / "docs" / "benchmarks.md"

SCRIPTS = {
    "codec": "benchmarks.bench_codec",
    "transport": "benchmarks.bench_transport",
    "service": "benchmarks.bench_service",
    "spark": "benchmarks.bench_spark",
    "streaming": "benchmarks.bench_streaming_latency",
}


def run(name: str, quick: bool) -> tuple[dict[str, Any] | None, str]:
    out = RESULTS / f"{name}.json"
    args = [sys.executable, "-m", SCRIPTS[name], "--json", str(out)]
    if quick and name != "codec":
        args.append("--quick")
    print(f"== {name}: {' '.join(args[1:])}", flush=True)
    start = time.perf_counter()
    proc = subprocess.run(args, cwd=ROOT, capture_output=True, text=True)
    log = proc.stdout + proc.stderr
    (RESULTS / f"{name}.log").write_text(log)
    print(
        f"   {'ok' if proc.returncode == 0 else f'FAILED ({proc.returncode})'} in {time.perf_counter() - start:.0f} s",
        flush=True,
    )
    if proc.returncode != 0 or not out.exists():
        return None, log
    return json.loads(out.read_text()), log


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
    lines = [
        "## Transport: one Aqueduct channel vs a bare QUIC stream vs Arrow Flight (issues 4, 5)",
        "",
    ]
    rows = data.get("rows") or data.get("results") or []
    if isinstance(rows, dict):
        rows = [{"name": k, **v} for k, v in rows.items()]
    if rows:
        keys = [k for k in rows[0] if k != "name"]
        lines.append("| " + " | ".join(["path", *keys]) + " |")
        lines.append("|" + "---|" * (len(keys) + 1))
        for r in rows:
            lines.append(
                "| " + " | ".join([str(r.get("name", "")), *[_fmt(r.get(k)) for k in keys]]) + " |"
            )
        lines.append("")
        labels = [str(r.get("name")) for r in rows if isinstance(r.get("MBps"), int | float)]
        values = [float(r["MBps"]) for r in rows if isinstance(r.get("MBps"), int | float)]
        if labels:
            plot_bars(
                OUT / "transport.png", "Throughput on loopback (MB/s)", labels, values, "MB/s"
            )
            lines += ["![transport throughput](benchmarks/transport.png)", ""]
    for key, value in sorted((data.get("ratios") or {}).items()):
        lines.append(f"- {key}: **{_fmt(value)}**")
    lines.append("")
    return lines


def section_service(data: dict[str, Any]) -> list[str]:
    runs = data["runs"]
    lines = [
        "## Dataset service read vs Arrow Flight (issue 6)",
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
        "## Spark read and write vs Arrow Flight and the in-process floor (issue 7)",
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
    lines = ["## Streaming latency: append to arrival in a memory sink (issue 8)", ""]
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


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.2f}"
    return "" if value is None else str(value)


SECTIONS = {
    "codec": section_codec,
    "transport": section_transport,
    "service": section_service,
    "spark": section_spark,
    "streaming": section_streaming,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--quick", action="store_true", help="small sizes (a smoke run, not a report)"
    )
    parser.add_argument("--only", nargs="*", choices=list(SCRIPTS), help="run only these")
    args = parser.parse_args(argv)
    RESULTS.mkdir(parents=True, exist_ok=True)
    names = args.only or list(SCRIPTS)
    collected: dict[str, dict[str, Any] | None] = {}
    for name in names:
        collected[name], _ = run(name, args.quick)
    for name in SCRIPTS:  # keep earlier results of benchmarks not rerun
        if name not in collected and (RESULTS / f"{name}.json").exists():
            collected[name] = json.loads((RESULTS / f"{name}.json").read_text())
    machine = next((d["machine"] for d in collected.values() if d and "machine" in d), {})
    lines = [
        "# Benchmark report",
        "",
        f"Generated by `python -m benchmarks.run_all{' --quick' if args.quick else ''}` on "
        f"{time.strftime('%Y-%m-%d')}. Machine: {machine.get('cpus', '?')} CPUs ({machine.get('cpu', '?')}), "
        f"Python {machine.get('python', '?')}, aioquic {machine.get('aioquic', '?')}, qh3 {machine.get('qh3', '?')}, "
        f"pyarrow {machine.get('pyarrow', '?')}, deltalake {machine.get('deltalake', '?')}, pyspark {machine.get('pyspark', '?')}.",
        "",
        "Absolute figures on this 2-core machine swing by tens of percent between runs; every comparison "
        "below is a ratio measured within one run of one script, with the compared paths run back to back. "
        "Servers and clients share the 2 cores. Raw results and logs are in `docs/benchmarks/results/`.",
        "",
    ]
    for name in SCRIPTS:
        data = collected.get(name)
        if data is None:
            if name in names:
                lines += [
                    f"## {name}",
                    "",
                    f"The {name} benchmark failed in this run; see `docs/benchmarks/results/{name}.log`.",
                    "",
                ]
            continue
        try:
            lines += SECTIONS[name](data)
        except (KeyError, TypeError, ValueError) as exc:
            lines += [
                f"## {name}",
                "",
                f"Results could not be summarized ({exc}); see the JSON.",
                "",
            ]
    REPORT.write_text("\n".join(lines))
    print(f"wrote {REPORT.relative_to(ROOT)}")
    return 0 if all(collected.get(n) is not None for n in names) else 1


if __name__ == "__main__":
    sys.exit(main())
