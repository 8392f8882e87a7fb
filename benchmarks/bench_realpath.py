"""Real-path benchmark (issue 14): the dataset service and Arrow Flight between two "hosts".

Two network namespaces joined by a veth pair stand in for two machines on one Ethernet link
(``shared/design/real-paths.md``): a real MTU (1500 and 9000), the kernel's offloads as on a
NIC, no loopback shortcuts. The service (``aqueduct serve``) and a pyarrow Flight server run
in the server namespace over the same Delta table, both with TLS from the same certificate;
the clients run in the other namespace. For every path it reports MB/s of Arrow data, the
ratio to Flight measured in the same run, and CPU seconds per GB at each end (from
``/proc/<pid>/stat`` of the server process and ``getrusage`` of the client process).

    sudo .venv/bin/python -m benchmarks.bench_realpath [--quick] [--rows N] [--repeat K]
        [--mtu 1500 9000] [--loss 0.001 0.01] [--variants aqueduct-qh3 ...] [--json out.json]

Root is required (namespaces, veth): without it the script says so and exits with status 2.
``--loss`` adds runs with that fraction of TCP and UDP packets dropped at random in both
directions (nftables ``numgen``; ``make nftables`` installs nft). Namespaces get unique names
per run and are deleted in a ``finally``. Only 198.18.0.0/15 (RFC 2544) addresses are used.

Clients are pluggable: a :class:`Variant` names how to start its server in the server
namespace and how to read the dataset once in the client namespace; add one to ``VARIANTS``
(e.g. another transport) and it is measured against Flight like the others.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DATASET = "bench"
READY = "REALPATH_READY "


# -- the two "hosts" ---------------------------------------------------------------------


@dataclass
class Link:
    """Two namespaces joined by a veth pair: ``server_ns`` has ``server_ip``."""

    server_ns: str
    client_ns: str
    server_if: str
    client_if: str
    server_ip: str
    client_ip: str
    loss: float = 0.0

    def run(self, ns: str, *cmd: str) -> None:
        subprocess.run(["ip", "netns", "exec", ns, *cmd], check=True, capture_output=True)

    def set_mtu(self, mtu: int) -> None:
        for ns, dev in ((self.server_ns, self.server_if), (self.client_ns, self.client_if)):
            subprocess.run(["ip", "-n", ns, "link", "set", dev, "mtu", str(mtu)], check=True)

    def set_loss(self, loss: float) -> None:
        """Drop ``loss`` of every TCP and UDP packet leaving either namespace."""
        for ns in (self.server_ns, self.client_ns):
            subprocess.run(
                ["ip", "netns", "exec", ns, "nft", "delete", "table", "inet", "aqloss"],
                capture_output=True,
            )
            if loss > 0:
                scale = 100_000
                rules = (
                    "table inet aqloss {\n chain out {\n"
                    "  type filter hook output priority 0; policy accept;\n"
                    f"  meta l4proto {{ tcp, udp }} numgen random mod {scale} "
                    f"< {round(loss * scale)} drop\n }}\n}}\n"
                )
                subprocess.run(
                    ["ip", "netns", "exec", ns, "nft", "-f", "-"],
                    input=rules,
                    text=True,
                    check=True,
                )
        self.loss = loss


def require_root(what: str) -> str | None:
    """None when namespaces can be made here, else the reason they cannot."""
    if os.geteuid() != 0:
        return f"{what} needs root (network namespaces and a veth pair); run it with sudo"
    if shutil.which("ip") is None:
        return f"{what} needs the 'ip' command (iproute2)"
    return None


@contextmanager
def veth_link(mtu: int = 1500, prefix: str = "aq") -> Iterator[Link]:
    """Two fresh namespaces joined by a veth pair at ``mtu``, deleted on exit."""
    token = secrets.token_hex(3)
    subnet = 1 + int(token, 16) % 250  # 198.18.<subnet>.0/24: readable, unique-ish per run
    link = Link(
        server_ns=f"{prefix}-{token}-srv",
        client_ns=f"{prefix}-{token}-cli",
        server_if=f"{prefix}{token}s"[:15],
        client_if=f"{prefix}{token}c"[:15],
        server_ip=f"198.18.{subnet}.1",
        client_ip=f"198.18.{subnet}.2",
    )
    made: list[str] = []
    try:
        for ns in (link.server_ns, link.client_ns):
            subprocess.run(["ip", "netns", "add", ns], check=True)
            made.append(ns)
        ip = ["ip"]
        subprocess.run(
            [*ip, "link", "add", link.server_if, "type", "veth", "peer", "name", link.client_if],
            check=True,
        )
        for ns, dev, addr in (
            (link.server_ns, link.server_if, link.server_ip),
            (link.client_ns, link.client_if, link.client_ip),
        ):
            subprocess.run([*ip, "link", "set", dev, "netns", ns], check=True)
            subprocess.run([*ip, "-n", ns, "addr", "add", f"{addr}/24", "dev", dev], check=True)
            subprocess.run([*ip, "-n", ns, "link", "set", dev, "mtu", str(mtu), "up"], check=True)
            subprocess.run([*ip, "-n", ns, "link", "set", "lo", "up"], check=True)
        yield link
    finally:
        for ns in made:  # deleting a namespace deletes its end of the veth, and so the pair
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def spawn_in(ns: str, args: list[str], ready: str, timeout: float = 120) -> tuple[Any, str]:
    """Start ``python args...`` inside namespace ``ns``; wait for its ``ready`` line.
    ``ip netns exec`` execs the command, so the process id is the Python process's."""
    proc = subprocess.Popen(
        ["ip", "netns", "exec", ns, sys.executable, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "AQUEDUCT_TOKEN": ""},
    )
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"{args[:3]} exited with {proc.wait()} in namespace {ns}")
        if line.startswith(ready):
            return proc, line[len(ready) :].strip()
    proc.kill()
    raise RuntimeError(f"{args[:3]} not ready in time")


def stop(proc: Any) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    for pipe in (proc.stdin, proc.stdout):
        if pipe is not None:
            pipe.close()


def proc_cpu(pid: int) -> float:
    """CPU seconds (user + system, all threads) used so far by process ``pid``."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# -- what is measured --------------------------------------------------------------------


@dataclass
class Variant:
    """One way of reading the dataset: ``serve(link, root, certs)`` starts its server in the
    server namespace (returns the process and what the client needs); ``read(info)`` reads
    the whole dataset once in the client namespace and returns its batches' iterator."""

    name: str
    serve: Callable[[Link, Path, dict[str, str], argparse.Namespace], tuple[Any, dict[str, Any]]]
    read: Callable[[dict[str, Any]], Iterator[Any]]
    baseline: bool = False


def serve_flight(
    link: Link, root: Path, certs: dict[str, str], args: argparse.Namespace
) -> tuple[Any, dict[str, Any]]:
    cmd = ["-m", "benchmarks.bench_realpath", "--flight-server", str(root), link.server_ip]
    proc, port = spawn_in(link.server_ns, [*cmd, certs["cert"], certs["key"]], READY)
    return proc, {"url": f"grpc+tls://{link.server_ip}:{port}", "ca": certs["ca"]}


def read_flight(info: dict[str, Any]) -> Iterator[Any]:
    import pyarrow.flight as fl

    client = fl.FlightClient(info["url"], tls_root_certs=Path(info["ca"]).read_bytes())
    try:
        flight = client.get_flight_info(fl.FlightDescriptor.for_path(DATASET))
        for endpoint in flight.endpoints:
            for chunk in client.do_get(endpoint.ticket):
                yield chunk.data
    finally:
        client.close()


def aqueduct_variant(backend: str) -> Variant:
    def serve(
        link: Link, root: Path, certs: dict[str, str], args: argparse.Namespace
    ) -> tuple[Any, dict[str, Any]]:
        cmd = ["-m", "aqueduct_spark.cli", "serve", "--root", str(root)]
        cmd += ["--host", link.server_ip, "--port", "0", "--backend", backend]
        # a veth pair between two private namespaces: no one else can reach it, and Flight
        # runs without a token too (serve refuses a non-loopback host without one otherwise)
        cmd += ["--allow-anonymous"]
        cmd += ["--cert", certs["cert"], "--key", certs["key"]]
        if args.packet_size:
            cmd += ["--packet-size", str(args.packet_size)]
        proc, banner = spawn_in(link.server_ns, cmd, "AQUEDUCT_READY ")
        info = json.loads(banner)
        return proc, {
            "url": info["url"],
            "fingerprint": info["fingerprint"],
            "backend": backend,
            "packet_size": args.packet_size,
        }

    def read(info: dict[str, Any]) -> Iterator[Any]:
        from aqueduct_core.transport import ClientTLS, TransportConfig
        from aqueduct_spark.client import Client

        os.environ["AQUEDUCT_TRANSPORT"] = "quic"  # where TCP exists too: measure QUIC here
        transport = TransportConfig(backend=info["backend"], packet_size=info["packet_size"])
        client = Client(
            info["url"], tls=ClientTLS(fingerprint=info["fingerprint"]), transport=transport
        )
        try:
            yield from client.read_batches(DATASET)
        finally:
            client.close()

    return Variant(f"aqueduct-{backend}", serve, read)


def aqueduct_tcp_variant() -> Variant:
    """Aqueduct over TLS/TCP (issue 15): the same service, the client on transport=tcp."""

    def read(info: dict[str, Any]) -> Iterator[Any]:
        from aqueduct_core.transport import ClientTLS, TransportConfig
        from aqueduct_spark.client import Client

        tls = ClientTLS(fingerprint=info["fingerprint"])
        client = Client(info["url"], tls=tls, transport=TransportConfig(transport="tcp"))
        try:
            yield from client.read_batches(DATASET)
        finally:
            client.close()

    return Variant("aqueduct-tcp", aqueduct_variant("qh3").serve, read)


VARIANTS: dict[str, Variant] = {
    "flight": Variant("flight", serve_flight, read_flight, baseline=True),
    "aqueduct-qh3": aqueduct_variant("qh3"),
    "aqueduct-aioquic": aqueduct_variant("aioquic"),
    "aqueduct-tcp": aqueduct_tcp_variant(),
}
"""Every client variant; ``flight`` is the baseline every ratio is taken against."""


def check_batch(batch: Any) -> tuple[int, int, int]:
    """Verify every value of a batch of the benchmark table against its generating rule
    (``benchmarks.common.sample_table``: x = id/2, s = "row-<id>", ts = id + 1.7e15 µs);
    returns (rows, sum of ids, sum of squared ids) for the whole-table check."""
    import pyarrow as pa
    import pyarrow.compute as pc

    ids = batch.column("id")
    expect_s = pc.binary_join_element_wise("row-", pc.cast(ids, pa.string()), "")
    ok = (
        pc.all(pc.equal(batch.column("x"), pc.multiply(ids.cast(pa.float64()), 0.5))).as_py()
        and pc.all(pc.equal(batch.column("s"), expect_s)).as_py()
        and pc.all(
            pc.equal(batch.column("ts").cast(pa.int64()), pc.add(ids, 1_700_000_000_000_000))
        ).as_py()
    )
    if not ok:
        raise AssertionError("a batch arrived with values that differ from the table")
    # Exact at any size: squares summed as 38-digit decimals (float64 loses the last digits
    # past 2**53, int64 overflows past ~3M rows).
    squares = pc.sum(pc.multiply_checked(ids, ids).cast(pa.decimal128(38, 0))).as_py() or 0
    return batch.num_rows, pc.sum(ids).as_py() or 0, int(squares)


def client_worker() -> None:
    """Runs in the client namespace: one JSON request per stdin line, one answer each."""
    print(READY, flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        variant = VARIANTS[req["variant"]]
        before = resource.getrusage(resource.RUSAGE_SELF)
        start = time.perf_counter()
        nbytes = rows = ids = squares = 0
        try:
            for batch in variant.read(req["info"]):
                nbytes += batch.nbytes
                if req["verify"]:
                    n, s, q = check_batch(batch)
                    rows, ids, squares = rows + n, ids + s, squares + q
                else:
                    rows += batch.num_rows
            error = None
        except Exception as exc:  # reported to the parent, which fails the run
            error = f"{type(exc).__name__}: {exc}"
        seconds = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_SELF)
        cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
        answer = {"seconds": seconds, "bytes": nbytes, "rows": rows, "cpu": cpu, "error": error}
        if req["verify"]:
            answer.update(id_sum=ids, id_squares=squares)
        print(json.dumps(answer), flush=True)


def flight_server(root: str, host: str, cert: str, key: str) -> None:
    """Runs in the server namespace: Flight over the same Delta store, on ``host``."""
    from benchmarks.flight_server import DeltaFlightServer

    with open(cert, "rb") as c, open(key, "rb") as k:
        server = DeltaFlightServer(root, f"grpc+tls://{host}:0", c.read(), k.read())
    print(f"{READY}{server.port}", flush=True)
    server.serve()


@dataclass
class Session:
    """The servers of every variant on one link, and one client worker process."""

    link: Link
    servers: dict[str, tuple[Any, dict[str, Any]]] = field(default_factory=dict)
    client: Any = None

    def read(self, name: str, verify: bool = False) -> dict[str, Any]:
        proc, info = self.servers[name]
        assert self.client.stdin is not None and self.client.stdout is not None
        cpu0 = proc_cpu(proc.pid)
        self.client.stdin.write(json.dumps({"variant": name, "info": info, "verify": verify}))
        self.client.stdin.write("\n")
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
    link: Link, root: Path, certs: dict[str, str], args: argparse.Namespace, expect: dict[str, int]
) -> dict[str, Any]:
    """Every variant on the current link settings: a verified warm-up read each, then
    ``repeat`` timed reads, interleaved so that noise hits every variant alike."""
    session = Session(link)
    out: dict[str, Any] = {}
    try:
        for name in args.variants:
            session.servers[name] = VARIANTS[name].serve(link, root, certs, args)
        session.client, _ = spawn_in(
            link.client_ns, ["-m", "benchmarks.bench_realpath", "--client-worker"], READY
        )
        for name in args.variants:
            check = session.read(name, verify=True)
            expect.setdefault("bytes", check["bytes"])  # Arrow bytes as the baseline counts them
            for key in ("bytes", "rows", "id_sum", "id_squares"):
                if check[key] != expect[key]:
                    raise AssertionError(f"{name}: {key} {check[key]} != {expect[key]}")
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name in args.variants}
        for _ in range(args.repeat):
            for name in args.variants:
                runs[name].append(session.read(name))
        for name, rs in runs.items():
            gb = expect["bytes"] / 1e9
            secs = statistics.median(r["seconds"] for r in rs)
            out[name] = {
                "seconds": secs,
                "all_seconds": [round(r["seconds"], 3) for r in rs],
                "MBps": expect["bytes"] / secs / 1e6,
                "client_cpu_per_GB": statistics.median(r["cpu"] for r in rs) / gb,
                "server_cpu_per_GB": statistics.median(r["server_cpu"] for r in rs) / gb,
                "intact": True,
            }
    finally:
        if session.client is not None:
            stop(session.client)
        for proc, _ in session.servers.values():
            stop(proc)
    base = out["flight"]["MBps"]
    for run in out.values():
        run["vs_flight"] = run["MBps"] / base
    return out


def make_dataset(root: Path, rows: int) -> dict[str, int]:
    """Write the table through the service's store; returns what a full read must see."""
    import uuid

    from aqueduct_spark.service.store import Store
    from benchmarks.common import sample_table

    store = Store(str(root))
    txn = uuid.uuid4().hex
    first = sample_table(0)
    writer = store.open_stage(DATASET, txn, "setup", first.schema)
    chunk = 1_000_000
    for start in range(0, rows, chunk):
        for batch in sample_table(min(chunk, rows - start), start).to_batches(max_chunksize=65536):
            writer.write(batch)
    store.commit(DATASET, "overwrite", first.schema, [], writer.close())
    return {
        "rows": rows,
        "id_sum": rows * (rows - 1) // 2,
        "id_squares": (rows - 1) * rows * (2 * rows - 1) // 6,
    }


def print_table(results: dict[str, Any]) -> None:
    print(
        f"\n{'MTU':>5} {'loss':>6} {'variant':18} {'s':>7} {'MB/s':>7} {'vs Flight':>9}"
        f" {'client CPU s/GB':>15} {'server CPU s/GB':>15}"
    )
    for row in results["runs"]:
        for name, r in row["variants"].items():
            print(
                f"{row['mtu']:>5} {row['loss']:>6.3%} {name:18} {r['seconds']:7.2f} {r['MBps']:7.0f}"
                f" {r['vs_flight']:8.2f}x {r['client_cpu_per_GB']:15.2f} {r['server_cpu_per_GB']:15.2f}"
            )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--rows",
        type=int,
        default=2_000_000,
        help="rows (2M ~ 78 MB of Arrow; aioquic at MTU 1500 reads it in tens of seconds here)",
    )
    parser.add_argument("--repeat", type=int, default=3, help="timed reads per variant (median)")
    parser.add_argument("--quick", action="store_true", help="500k rows, 2 reads, MTU 1500 only")
    parser.add_argument("--mtu", type=int, nargs="+", default=[1500, 9000])
    parser.add_argument(
        "--loss",
        type=float,
        nargs="*",
        default=[0.001, 0.01],
        help="extra runs at MTU 1500 with this fraction of packets dropped (none: --loss)",
    )
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--packet-size", type=int, help="set the QUIC packet size on both ends")
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--client-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--flight-server", nargs=4, help=argparse.SUPPRESS)
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
            "bench_realpath: --loss needs nftables (as root: make nftables, or "
            "apt-get install -y nftables); no figures were measured",
            file=sys.stderr,
        )
        return 2
    if args.quick:
        args.rows, args.repeat, args.mtu = 500_000, 2, [1500]
    if "flight" not in args.variants:
        args.variants.insert(0, "flight")
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
    }
    with tempfile.TemporaryDirectory(prefix="aqueduct-realpath-") as tmp:
        root = Path(tmp) / "root"
        print(f"writing {args.rows:,} rows ...", flush=True)
        expect = make_dataset(root, args.rows)
        with veth_link() as link:
            tls = make_dev_certificates(Path(tmp) / "tls", ("localhost", link.server_ip))
            certs = {"cert": str(tls.cert_file), "key": str(tls.key_file), "ca": str(tls.ca_file)}
            plan = [(mtu, 0.0) for mtu in args.mtu] + [(1500, loss) for loss in args.loss]
            for mtu, loss in plan:
                link.set_mtu(mtu)
                link.set_loss(loss)
                print(f"== MTU {mtu}, loss {loss:.1%}", flush=True)
                variants = measure(link, root, certs, args, expect)
                results["runs"].append({"mtu": mtu, "loss": loss, "variants": variants})
                for name, r in variants.items():
                    print(
                        f"   {name:18} {r['MBps']:7.0f} MB/s  {r['vs_flight']:5.2f}x Flight  "
                        f"CPU s/GB client {r['client_cpu_per_GB']:.2f} server {r['server_cpu_per_GB']:.2f}",
                        flush=True,
                    )
            link.set_loss(0.0)
        results["arrow_bytes"] = expect["bytes"]
        results["load_after"] = [round(x, 1) for x in os.getloadavg()]
    print_table(results)
    print(
        f"({expect['bytes'] / 1e6:.0f} MB of Arrow, {args.rows:,} rows, median of {args.repeat}; "
        "every variant's warm-up read was checked value by value)"
    )
    write_json(args.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
