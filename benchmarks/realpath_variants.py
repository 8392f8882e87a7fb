"""What the real-path benchmark measures: the tables it reads, and each way of reading them
(a :class:`Variant`: the server it needs in the server namespace, and one full read in the
client namespace), checked value by value or by checksum."""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.realpath_link import Link, spawn_in

READY = "REALPATH_READY "
TABLES = ("bench", "taxi")
"""``bench``: id, x = id/2, "row-<id>", a timestamp (very regular: lz4 0.53, zstd 0.16 of
the Arrow bytes); ``taxi``: the shape and entropy of NYC taxi trips (``benchmarks.taxi``)."""


# -- the tables --------------------------------------------------------------------------


def make_table(root: Path, name: str, rows: int) -> dict[str, int]:
    """Write table ``name`` through the service's store; what a full read must add up to."""
    import uuid

    from aqueduct_spark.service.store import Store
    from benchmarks.common import sample_table
    from benchmarks.taxi import taxi_table

    def chunk(n: int, start: int) -> Any:
        return sample_table(n, start) if name == "bench" else taxi_table(n, start)

    store = Store(str(root))
    schema = chunk(1, 0).schema
    writer = store.open_stage(name, uuid.uuid4().hex, "setup", schema)
    expect = {"rows": rows, "sum_a": 0, "sum_b": 0}
    step = 1_000_000
    for start in range(0, rows, step):
        table = chunk(min(step, rows - start), start)
        for batch in table.to_batches(max_chunksize=65536):
            writer.write(batch)
            if name == "taxi":
                _, a, b = check_batch(name, batch)
                expect["sum_a"] += a
                expect["sum_b"] += b
    store.commit(name, "overwrite", schema, [], writer.close())
    if name == "bench":
        expect["sum_a"] = rows * (rows - 1) // 2
        expect["sum_b"] = (rows - 1) * rows * (2 * rows - 1) // 6
    return expect


def check_batch(table: str, batch: Any) -> tuple[int, int, int]:
    """(rows, a, b) of a batch, summed over a read and compared with what was written. The
    bench table is checked value by value against its rule (x = id/2, s = "row-<id>",
    ts = id + 1.7e15 µs; a, b: the sums of ids and of squared ids); the taxi table by the
    sums of its pickup zones and of its totals in cents."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if table == "taxi":
        zones = pc.sum(batch.column("PULocationID")).as_py() or 0
        total = pc.multiply(batch.column("total_amount"), 100)
        cents = pc.sum(pc.round(total).cast(pa.int64())).as_py() or 0
        return batch.num_rows, int(zones), int(cents)
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


# -- the ways of reading them --------------------------------------------------------------

Serve = Callable[[Link, Path, dict[str, str], argparse.Namespace], tuple[Any, dict[str, Any]]]


@dataclass
class Variant:
    """One way of reading a table: ``server`` names the server process it needs (variants
    naming the same one share it), ``serve`` starts that server in the server namespace
    (the process and what a client needs), ``read(info, table)`` reads the whole table once
    in the client namespace and yields its batches."""

    name: str
    server: str
    serve: Serve
    read: Callable[[dict[str, Any], str], Iterator[Any]]
    flight: bool = False


def flight_serve(kind: str) -> Serve:
    def serve(
        link: Link, root: Path, certs: dict[str, str], args: argparse.Namespace
    ) -> tuple[Any, dict[str, Any]]:
        cmd = ["-m", "benchmarks.bench_realpath", "--flight-server", kind, str(root)]
        cmd += [link.server_ip, certs["cert"], certs["key"]]
        proc, port = spawn_in(link.server_ns, cmd, READY)
        return proc, {"url": f"grpc+tls://{link.server_ip}:{port}", "ca": certs["ca"]}

    return serve


def flight_server(kind: str, root: str, host: str, cert: str, key: str) -> None:
    """Runs in the server namespace: ``flight`` (the project's Flight server over the
    service's store), ``plain`` (deltalake + pyarrow's scanner) or ``plain-zstd``."""
    from benchmarks.flight_server import DeltaFlightServer, PlainFlightServer

    with open(cert, "rb") as c, open(key, "rb") as k:
        where, pem, secret = f"grpc+tls://{host}:0", c.read(), k.read()
    if kind == "flight":
        server: Any = DeltaFlightServer(root, where, pem, secret)
    else:
        codec = kind.partition("-")[2] or None
        server = PlainFlightServer(root, where, pem, secret, compression=codec)
    print(f"{READY}{server.port}", flush=True)
    server.serve()


def read_flight(info: dict[str, Any], table: str) -> Iterator[Any]:
    import pyarrow.flight as fl

    client = fl.FlightClient(info["url"], tls_root_certs=Path(info["ca"]).read_bytes())
    try:
        flight = client.get_flight_info(fl.FlightDescriptor.for_path(table))
        for endpoint in flight.endpoints:
            for chunk in client.do_get(endpoint.ticket):
                yield chunk.data
    finally:
        client.close()


def aqueduct_serve(backend: str, old: bool = False, module: str = "aqueduct_spark.cli") -> Serve:
    """``old``: the service with the copying data path of before issue 28 (``realpath_oldpath``);
    ``module``: the service's entry point (``realpath_olddecode``: its scan cost before)."""

    def serve(
        link: Link, root: Path, certs: dict[str, str], args: argparse.Namespace
    ) -> tuple[Any, dict[str, Any]]:
        module_ = "benchmarks.realpath_oldpath" if old else module
        cmd = ["-m", module_, "serve", "--root", str(root)]
        cmd += ["--host", link.server_ip, "--port", "0", "--backend", backend]
        # a veth pair between two private namespaces: no one else can reach it, and Flight
        # runs without a token too (serve refuses a non-loopback host without one otherwise)
        # ``args.service_log`` (realpath_profile): the access lines go there (a scan's line
        # says which codec each of its batches went with)
        log = getattr(args, "service_log", None)
        level = getattr(args, "service_log_level", "info") if log else "warning"
        cmd += ["--allow-anonymous", "--log-level", level]
        cmd += ["--cert", certs["cert"], "--key", certs["key"]]
        if args.packet_size:
            cmd += ["--packet-size", str(args.packet_size)]
        if log:
            with open(log, "a") as stderr:
                proc, banner = spawn_in(link.server_ns, cmd, "AQUEDUCT_READY ", stderr=stderr)
        else:
            proc, banner = spawn_in(link.server_ns, cmd, "AQUEDUCT_READY ")
        info = json.loads(banner)
        return proc, {"url": info["url"], "fingerprint": info["fingerprint"]}

    return serve


def aqueduct_read(
    transport: str | None,
    backend: str,
    compression: str | None,
    old: bool = False,
    decode: str | None = None,
) -> Any:
    """A read with these client settings (None: the client's default); ``old``: with the
    copying data path of before issue 28 (``realpath_oldpath``)."""

    if old and decode is None:
        decode = "service"  # the copy work compared is the Arrow path's

    def read(info: dict[str, Any], table: str) -> Iterator[Any]:
        if old:
            from benchmarks.realpath_oldpath import old_path

            with old_path():
                yield from _read(info, table)
        else:
            yield from _read(info, table)

    def _read(info: dict[str, Any], table: str) -> Iterator[Any]:
        from aqueduct_core.transport import ClientTLS, TransportConfig
        from aqueduct_spark.client import Client

        os.environ.pop("AQUEDUCT_TRANSPORT", None)
        config = TransportConfig(backend=backend)  # type: ignore[arg-type]
        if transport is not None:
            config = TransportConfig(transport=transport, backend=backend)  # type: ignore[arg-type]
        extra = {"compression": compression} if compression else {}
        if decode is not None:
            extra["decode"] = decode
        tls = ClientTLS(fingerprint=info["fingerprint"])
        client = Client(info["url"], tls=tls, transport=config, **extra)
        try:
            yield from client.read_batches(table)
        finally:
            client.close()

    return read


def _variants() -> dict[str, Variant]:
    found = {
        "flight": Variant("flight", "flight", flight_serve("flight"), read_flight, True),
        "flight-plain": Variant("flight-plain", "plain", flight_serve("plain"), read_flight, True),
        "flight-zstd": Variant(
            "flight-zstd", "plain-zstd", flight_serve("plain-zstd"), read_flight, True
        ),
    }
    qh3 = aqueduct_serve("qh3")
    found["aqueduct"] = Variant("aqueduct", "aqueduct", qh3, aqueduct_read(None, "auto", None))
    # every default but the decode: the service decodes all and sends Arrow (the default
    # before row groups went as stored Parquet)
    found["aqueduct-arrow"] = Variant(
        "aqueduct-arrow", "aqueduct", qh3, aqueduct_read(None, "auto", None, decode="service")
    )
    # the default transport without compression: what compression=auto costs where it sends
    # nothing compressed (unshaped) is aqueduct against this one
    found["aqueduct-none"] = Variant(
        "aqueduct-none", "aqueduct", qh3, aqueduct_read(None, "auto", "none")
    )
    for compression in (None, "none", "lz4", "zstd"):
        name = "aqueduct-tcp" + (f"-{compression}" if compression else "")
        found[name] = Variant(name, "aqueduct", qh3, aqueduct_read("tcp", "auto", compression))
    # The copy work of issue 28 against the path before it, per transport, no compression
    # (and lz4 over TCP): server and client both switched (realpath_oldpath).
    copies = aqueduct_serve("qh3", old=True)
    for transport, compression in (("tcp", "none"), ("quic", "none"), ("tcp", "lz4")):
        name = f"aqueduct-{transport}-{compression}"
        if name not in found:
            found[name] = Variant(
                name, "aqueduct", qh3, aqueduct_read(transport, "auto", compression)
            )
        # the same settings on today's path with Arrow only: the copy work compared is the
        # Arrow path's (the named variant decodes stored Parquet at the client now)
        found[f"{name}-arrow"] = Variant(
            f"{name}-arrow",
            "aqueduct",
            qh3,
            aqueduct_read(transport, "auto", compression, decode="service"),
        )
        found[f"{name}-copies"] = Variant(
            f"{name}-copies",
            "aqueduct-copies",
            copies,
            aqueduct_read(transport, "auto", compression, old=True),
        )
    # The service's scan cost before issue 28's decode and cipher work (realpath_olddecode),
    # the client as it is
    before = aqueduct_serve("qh3", module="benchmarks.realpath_olddecode")
    found["aqueduct-tcp-none-before"] = Variant(
        "aqueduct-tcp-none-before",
        "aqueduct-before",
        before,
        aqueduct_read("tcp", "auto", "none", decode="service"),
    )
    for backend in ("qh3", "aioquic"):
        name = f"aqueduct-{backend}"
        serve = qh3 if backend == "qh3" else aqueduct_serve("aioquic")
        server = "aqueduct" if backend == "qh3" else "aqueduct-aioquic"
        found[name] = Variant(name, server, serve, aqueduct_read("quic", backend, None))
    return found


VARIANTS = _variants()
"""Every variant. ``aqueduct`` is the client with every default (transport, compression,
decode: row groups the service can send as stored Parquet are decoded by the client);
``aqueduct-arrow`` every default but ``decode=service`` (Arrow only, the default before);
``aqueduct-none`` the default transport without compression; ``-tcp`` over TLS/TCP with default compression, ``-tcp-none|lz4|zstd`` fixed; ``-qh3`` and
``-aioquic`` over QUIC; ``-copies`` the same client settings with the copying data path of
before issue 28 at both ends, beside ``-arrow``, those settings on today's Arrow path (``benchmarks/realpath_oldpath.py``); ``-before`` the service's
scan cost before issue 28's decode and cipher work (``benchmarks/realpath_olddecode.py``). ``flight`` is the project's Flight server, ``flight-plain`` the plain
one users would write (the faster of the two is the baseline), ``flight-zstd`` the plain one
with zstd IPC compression turned on."""
DEFAULT_VARIANTS = [
    v
    for v in VARIANTS
    if v != "aqueduct-aioquic"
    and not v.endswith(("-copies", "-before"))
    and not (v.endswith("-arrow") and v != "aqueduct-arrow")
]
COPIES_VARIANTS = [
    v
    for name in VARIANTS
    if name.endswith("-copies")
    for v in (name.removesuffix("-copies") + "-arrow", name)
]
"""``--copies``: each path of issue 28's copy work beside the same path before it."""
