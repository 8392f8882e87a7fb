"""Transport benchmark (issues 4 and 5): one Aqueduct channel against a bare QUIC stream of
the same backend and settings, and against Arrow Flight ``do_get`` over TLS, in one run.

Run it as ``python -m benchmarks.bench_transport [--quick] [--json out.json]`` (a script,
not a test). For every backend and packet size (aioquic 16384 and, for context, 1472; qh3
16384 and 65507) a server process and a client process, pinned to different cores, measure:

- ``aqueduct``: one ORDERED channel with the raw codec carrying messages of 1, 4 and 8 MiB,
  default engine configuration (flow control negotiated, default window);
- ``aqueduct-noflow``: the same with ``EngineConfig(flow_window=None)`` on both sides;
- ``aqueduct-w16m``: the same with a 16 MiB window, as a receiver sized to its traffic
  advertises (the Spark connector's ``flowWindow`` default);
- ``bare``: one QUIC unidirectional stream carrying the same bytes, with the same
  QuicConfiguration, socket, socket buffers, pacing, event loop and slice feeding
  (``stream_high_water``) as the Aqueduct adapter;

and ``flight-tls``: pyarrow.flight ``do_get`` over gRPC+TLS with the same development
certificate, one record batch (one binary value) per message.

Data flows server -> client, as a Spark reader pulls from the service. Throughput is payload
bytes over the client's time from its request to the last byte (MB/s = 10**6 bytes/s); CPU
seconds per GB of both processes are printed next to it. The run is ``--repeat`` rounds; each
round measures every configuration once, the kinds of one message size back to back. Figures
are medians over the rounds, and every ratio is the median of the per-round ratios, so a
noisy moment on this shared 2-core machine moves both sides of a ratio.

Targets: Aqueduct/bare >= 0.85 per backend and packet size (with the default configuration,
and without flow control: the engine's own cost); best Aqueduct/Flight-TLS >= 1.0;
flow-on/flow-off >= 0.90 (within 10%, issue 5).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from aqueduct_core.transport import make_dev_certificates
from benchmarks.common import machine

MiB = 1 << 20
TARGET_BARE = 0.85
TARGET_FLIGHT = 1.0
TARGET_FLOW = 0.90

CONFIGS = [
    # (backend, packet size, role): "main" configurations count for the targets.
    ("aioquic", 16384, "main"),
    ("aioquic", 1472, "context"),
    ("qh3", 16384, "main"),
    ("qh3", 65507, "main"),
]
KINDS = ["bare", "aqueduct", "aqueduct-noflow", "aqueduct-w16m"]


class Worker:
    """A worker process: prints ``READY {json}`` (servers) or ``RESULT {json}`` (clients)."""

    def __init__(self, module: str, args: list[str], cpu: int | None) -> None:
        env = dict(os.environ)
        if cpu is not None:
            env["BENCH_PIN_CPU"] = str(cpu)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", module, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            cwd=Path(__file__).resolve().parent.parent,
        )

    def line(self, prefix: str, timeout: float) -> Any:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"worker exited with code {self.proc.wait()}")
            if line.startswith(prefix + " "):
                return json.loads(line[len(prefix) + 1 :])
        raise RuntimeError(f"worker did not print {prefix} within {timeout} s")

    def stop(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def run_pair(
    module: str, server_args: list[str], client_args: list[str], plan: dict[str, Any], pin: bool
) -> list[dict[str, Any]]:
    server = Worker(module, ["server", *server_args], 0 if pin else None)
    try:
        ready = server.line("READY", 60)
        ports = ready["ports"] if "ports" in ready else ready["port"]
        client = Worker(
            module,
            ["client", *client_args, json.dumps(ports), str(ready["pid"]), json.dumps(plan)],
            1 if pin else None,
        )
        try:
            samples: list[dict[str, Any]] = client.line("RESULT", 900)
        finally:
            client.stop()
    finally:
        server.stop()
    return samples


def median(samples: list[dict[str, Any]], key: str) -> float:
    return statistics.median(s[key] for s in samples)


def summarize(samples: list[dict[str, Any]]) -> dict[tuple[str, int, str, int], dict[str, Any]]:
    groups: dict[tuple[str, int, str, int], list[dict[str, Any]]] = {}
    for s in samples:
        groups.setdefault((s["backend"], s["packet"], s["kind"], s["size"]), []).append(s)
    return {
        key: {
            "MBps": median(group, "MBps"),
            "MBps_samples": [round(s["MBps"], 1) for s in group],
            "client_cpu_s_per_GB": median(group, "client_cpu_s_per_GB"),
            "server_cpu_s_per_GB": median(group, "server_cpu_s_per_GB"),
        }
        for key, group in groups.items()
    }


def paired(
    samples: list[dict[str, Any]], a: tuple[str, int, str], b: tuple[str, int, str], size: int
) -> list[float]:
    """Per repetition, MB/s of ``a`` over MB/s of ``b`` (each a (backend, packet, kind)) for
    messages of ``size``: both were measured in the same round, seconds apart, so a noisy
    moment moves both."""
    by: dict[tuple[str, int, str, int, int], float] = {
        (s["backend"], s["packet"], s["kind"], s["size"], s["rep"]): s["MBps"] for s in samples
    }
    reps = sorted({s["rep"] for s in samples})
    out = []
    for rep in reps:
        x, y = by.get((*a, size, rep)), by.get((*b, size, rep))
        if x is not None and y:
            out.append(x / y)
    return out


def ratios(
    samples: list[dict[str, Any]],
    summary: dict[tuple[str, int, str, int], dict[str, Any]],
    configs: list[tuple[str, int, str]],
) -> list[dict[str, Any]]:
    """The target ratios: medians of per-repetition ratios (see :func:`paired`)."""
    out: list[dict[str, Any]] = []
    sizes = sorted({key[3] for key in summary})
    kinds = {key[2] for key in summary}

    def add(name: str, config: str, role: str, size: int, values: list[float], target: float):
        if values:
            out.append(
                {
                    "ratio": name,
                    "config": config,
                    "role": role,
                    "size": size,
                    "value": statistics.median(values),
                    "values": [round(v, 3) for v in values],
                    "target": target,
                }
            )

    for backend, packet, role in configs:
        name = f"{backend} {packet}"
        for size in sizes:
            for kind in ("aqueduct", "aqueduct-noflow", *sorted(k for k in kinds if "-w" in k)):
                add(
                    f"{kind}/bare",
                    name,
                    role if kind in ("aqueduct", "aqueduct-noflow") else "info",
                    size,
                    paired(samples, (backend, packet, kind), (backend, packet, "bare"), size),
                    TARGET_BARE,
                )
            for kind in ("aqueduct", *sorted(k for k in kinds if "-w" in k)):
                add(
                    f"{kind}/aqueduct-noflow",
                    name,
                    role if kind == "aqueduct" else "info",
                    size,
                    paired(
                        samples, (backend, packet, kind), (backend, packet, "aqueduct-noflow"), size
                    ),
                    TARGET_FLOW,
                )
    for size in sizes:
        candidates = [
            (summary[(b, p, "aqueduct", size)]["MBps"], b, p)
            for b, p, role in configs
            if role == "main" and (b, p, "aqueduct", size) in summary
        ]
        if candidates and ("flight", 0, "flight-tls", size) in summary:
            _, b, p = max(candidates)
            add(
                "best-aqueduct/flight-tls",
                f"{b} {p}",
                "main",
                size,
                paired(samples, (b, p, "aqueduct"), ("flight", 0, "flight-tls"), size),
                TARGET_FLIGHT,
            )
    return out


def print_report(
    info: dict[str, Any],
    summary: dict[tuple[str, int, str, int], dict[str, Any]],
    table: list[dict[str, Any]],
    plan: dict[str, Any],
    elapsed: float,
) -> None:
    print(
        f"machine: nproc={info['nproc']} ({info['cpu']}), Python {info['python']}, "
        f"aioquic {info['aioquic']}, qh3 {info['qh3']}, pyarrow {info['pyarrow']}, "
        f"uvloop {info['uvloop']}; load average {info['loadavg'][0]:.2f} at start, "
        f"{info['loadavg_end'][0]:.2f} at end"
    )
    print(
        f"plan: {plan['main']['bytes'] // MiB} MiB per measurement, {plan['main']['repeat']} "
        "rounds (medians); server pinned to CPU 0, client to CPU 1; data flows server -> "
        f"client; total {elapsed:.0f} s"
    )
    print()
    order = {k: i for i, k in enumerate([*KINDS, "flight-tls"])}
    header = (
        f"{'backend':<8} {'packet':>6} {'msg':>4} {'kind':<16} {'MB/s':>7} "
        f"{'CPU s/GB cli/srv':>16}  MB/s per round"
    )
    print(header)
    print("-" * len(header))
    for (backend, packet, kind, size), entry in sorted(
        summary.items(),
        key=lambda kv: (kv[0][0] == "flight", kv[0][0], -kv[0][1], kv[0][3], order.get(kv[0][2])),
    ):
        cpu = f"{entry['client_cpu_s_per_GB']:.2f}/{entry['server_cpu_s_per_GB']:.2f}"
        print(
            f"{backend:<8} {packet or '-':>6} {f'{size // MiB}M':>4} {kind:<16} "
            f"{entry['MBps']:7.1f} {cpu:>16}  {entry['MBps_samples']}"
        )
    print()
    print("ratios (median of the per-round ratios; 'info' rows are not issue targets)")
    header = f"{'ratio':<30} {'config':<14} {'msg':>4} {'value':>6} {'target':>8}  verdict"
    print(header)
    print("-" * len(header))
    for r in table:
        msg = f"{r['size'] // MiB}M"
        verdict = "met" if r["value"] >= r["target"] else "MISSED"
        if r["role"] != "main":
            verdict = f"({r['role']}: {verdict.lower()})"
        print(
            f"{r['ratio']:<30} {r['config']:<14} {msg:>4} "
            f"{r['value']:6.2f} {'>= ' + format(r['target'], '.2f'):>8}  {verdict}"
        )
    targets = [r for r in table if r["role"] == "main"]
    missed = [r for r in targets if r["value"] < r["target"]]
    print()
    print(f"targets: {len(targets) - len(missed)} of {len(targets)} met")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smaller run (about a minute)")
    parser.add_argument("--json", help="also write every sample and ratio here")
    parser.add_argument("--repeat", type=int, help="rounds (default 4; quick 2)")
    parser.add_argument("--mib", type=int, help="MiB per measurement (default 256; quick 64)")
    parser.add_argument(
        "--only", help="comma-separated configurations to run, e.g. 'qh3:65507,flight'"
    )
    parser.add_argument(
        "--kinds",
        help=f"comma-separated QUIC kinds (default {','.join(KINDS)}; also aqueduct-wNm: "
        "an N MiB receive window)",
    )
    parser.add_argument("--no-pin", action="store_true", help="do not pin processes to CPUs")
    args = parser.parse_args(argv)

    repeat = args.repeat or (2 if args.quick else 4)
    total = (args.mib or (64 if args.quick else 256)) * MiB
    sizes = [1 * MiB, 4 * MiB, 8 * MiB]
    kinds = args.kinds.split(",") if args.kinds else KINDS
    plan = {
        "main": {"sizes": sizes, "bytes": total, "repeat": repeat, "kinds": kinds},
        # aioquic at Ethernet packets is ~5-8x slower: context only, one size, 1/8 the bytes.
        "context": {
            "sizes": [4 * MiB],
            "bytes": total // 8,
            "repeat": repeat,
            "kinds": [k for k in kinds if "-w" not in k],
        },
        "flight": {"sizes": sizes, "bytes": total, "repeat": repeat},
    }
    if args.quick:
        plan["context"]["kinds"] = []
    only = set(args.only.split(",")) if args.only else None
    configs = [
        c
        for c in CONFIGS
        if (only is None or f"{c[0]}:{c[1]}" in only) and plan[c[2]].get("kinds", True)
    ]

    info = machine()
    started = time.perf_counter()
    samples: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-transport-") as tmp:
        make_dev_certificates(tmp)
        # Rounds outermost: every configuration (and Flight) is measured once per round, so
        # the ratios below compare figures taken within about a minute of each other.
        for rep in range(repeat):
            for backend, packet, role in configs:
                print(f"... round {rep + 1}/{repeat}: {backend} {packet}", file=sys.stderr)
                got = run_pair(
                    "benchmarks.bench_transport_quic",
                    [backend, str(packet), tmp, json.dumps(plan[role]["kinds"])],
                    [backend, str(packet), tmp],
                    {**plan[role], "repeat": 1},
                    not args.no_pin,
                )
                samples += [{**s, "backend": backend, "packet": packet, "rep": rep} for s in got]
            if only is None or "flight" in only:
                print(f"... round {rep + 1}/{repeat}: flight", file=sys.stderr)
                got = run_pair(
                    "benchmarks.bench_transport_flight",
                    [tmp],
                    [tmp],
                    {**plan["flight"], "repeat": 1},
                    not args.no_pin,
                )
                samples += [{**s, "backend": "flight", "packet": 0, "rep": rep} for s in got]
    elapsed = time.perf_counter() - started
    info["loadavg_end"] = os.getloadavg()
    summary = summarize(samples)
    table = ratios(samples, summary, configs)
    print_report(info, summary, table, plan, elapsed)
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "benchmark": "transport",
                    "machine": info,
                    "plan": plan,
                    "seconds": elapsed,
                    "results": [
                        {"backend": k[0], "packet": k[1], "kind": k[2], "size": k[3], **v}
                        for k, v in sorted(summary.items())
                    ],
                    "ratios": table,
                    "targets": {
                        "met": sum(
                            1 for r in table if r["role"] == "main" and r["value"] >= r["target"]
                        ),
                        "total": sum(1 for r in table if r["role"] == "main"),
                        "missed": [
                            f"{r['ratio']} {r['config']} {r['size'] // MiB}M: {r['value']:.2f}"
                            for r in table
                            if r["role"] == "main" and r["value"] < r["target"]
                        ],
                    },
                    "samples": samples,
                },
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
