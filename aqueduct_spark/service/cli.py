"""The ``aqueduct`` command: run the dataset service and work with its datasets.

Every client command takes ``--url`` (or ``AQUEDUCT_URL``), ``--token`` (``AQUEDUCT_TOKEN``)
and one way to trust the server: ``--cafile``, ``--fingerprint`` (``AQUEDUCT_FINGERPRINT``)
or ``--insecure``. ``docs/cli.md`` is the reference.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import multiprocessing
import os
import signal
import socket
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
from tqdm import tqdm

from aqueduct_core.engine import EngineConfig
from aqueduct_core.errors import AqueductError
from aqueduct_core.transport import ClientTLS, ServerTLS, TransportConfig
from aqueduct_core.transport.tls import file_fingerprint, format_fingerprint, make_dev_certificates

log = logging.getLogger("aqueduct")

DEFAULT_URL = "quic://127.0.0.1:4433"


# -- argument parsing ---------------------------------------------------------------------


def _client_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("connection")
    g.add_argument(
        "--url",
        default=os.environ.get("AQUEDUCT_URL", DEFAULT_URL),
        help="service address, quic://host:port (env AQUEDUCT_URL; default %(default)s)",
    )
    g.add_argument(
        "--token",
        default=os.environ.get("AQUEDUCT_TOKEN"),
        help="bearer token the service requires (env AQUEDUCT_TOKEN)",
    )
    trust = g.add_mutually_exclusive_group()
    trust.add_argument(
        "--cafile", help="CA certificate (PEM) that signed the service's certificate"
    )
    trust.add_argument(
        "--fingerprint",
        default=os.environ.get("AQUEDUCT_FINGERPRINT"),
        help="SHA-256 of the service certificate, as 'aqueduct serve' prints it "
        "(env AQUEDUCT_FINGERPRINT)",
    )
    trust.add_argument(
        "--insecure",
        action="store_true",
        help="do not verify the service certificate (local tests only)",
    )
    g.add_argument(
        "--backend",
        default="auto",
        choices=["auto", "aioquic", "qh3"],
        help="QUIC library (default: qh3 when installed)",
    )
    g.add_argument(
        "--transport",
        default="auto",
        choices=["auto", "quic", "tcp"],
        help="quic, tcp (TLS over TCP, where UDP is blocked) or auto: QUIC first, TCP 250 ms "
        "later if QUIC has not answered (env AQUEDUCT_TRANSPORT replaces auto; -v shows the "
        "one used)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="aqueduct", description="Aqueduct dataset service and client commands."
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log more")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    s = sub.add_parser("serve", help="run the dataset service")
    s.add_argument(
        "--root",
        default=os.environ.get("AQUEDUCT_ROOT", "./aqueduct-data"),
        help="directory (or object-store URI) holding the datasets (default %(default)s)",
    )
    s.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default %(default)s: this machine only)",
    )
    s.add_argument(
        "--port",
        type=int,
        default=4433,
        help="UDP and TCP port (default %(default)s; 0: any free)",
    )
    s.add_argument(
        "--transport",
        default="quic,tcp",
        type=_listen_transports,
        help="what to listen on: quic (UDP), tcp (TLS over TCP) or both on the same port "
        "(default %(default)s)",
    )
    s.add_argument(
        "--token",
        default=os.environ.get("AQUEDUCT_TOKEN"),
        help="require this bearer token from clients (env AQUEDUCT_TOKEN)",
    )
    s.add_argument("--cert", help="certificate chain (PEM); default: a development certificate")
    s.add_argument("--key", help="private key (PEM) of --cert")
    s.add_argument(
        "--workers",
        type=int,
        default=1,
        help="service processes sharing the port (default %(default)s)",
    )
    s.add_argument(
        "--storage-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="object-store option passed to Delta Lake (repeatable)",
    )
    s.add_argument(
        "--backend",
        default="auto",
        choices=["auto", "aioquic", "qh3"],
        help="QUIC library (default: qh3 when installed)",
    )
    s.add_argument(
        "--packet-size",
        type=int,
        default=None,
        help="QUIC packet size (default: largest on loopback, else the route's MTU "
        "less IP and UDP headers)",
    )
    s.add_argument(
        "--max-requests",
        type=_positive,
        default=64,
        metavar="N",
        help="requests of one connection served at once; more wait (default %(default)s)",
    )
    s.add_argument(
        "--max-scans",
        type=_positive,
        default=16,
        metavar="N",
        help="scans one connection may have open; more are refused, to be retried "
        "(default %(default)s)",
    )
    engine = EngineConfig()
    s.add_argument(
        "--max-message-gap",
        type=_positive,
        default=engine.max_message_gap,
        metavar="N",
        help="how far a peer's message number may run ahead of what was decided; beyond it "
        "the connection is closed (default %(default)s)",
    )
    s.add_argument(
        "--max-early-bytes",
        type=_positive,
        default=engine.max_early_bytes,
        metavar="BYTES",
        help="bytes a client may send before its connection headers (default %(default)s)",
    )
    s.add_argument(
        "--max-pending-bytes",
        type=_positive,
        default=engine.max_pending_bytes,
        metavar="BYTES",
        help="bytes one connection may hold in channels not attached yet and in unfinished "
        "messages no window covers (default %(default)s)",
    )
    s.add_argument(
        "--max-channels",
        type=_positive,
        default=engine.max_channels,
        metavar="N",
        help="live channels on one connection; a client that opens more is disconnected "
        "(default %(default)s)",
    )
    s.add_argument(
        "--max-pending-channels",
        type=_positive,
        default=engine.max_pending_channels,
        metavar="N",
        help="channels a client may create that are not attached yet (default %(default)s)",
    )

    c = sub.add_parser("cert", help="create a development CA and server certificate")
    c.add_argument(
        "--out", default="./aqueduct-tls", help="directory to write into (default %(default)s)"
    )
    c.add_argument(
        "--host",
        action="append",
        default=None,
        help="name or address the certificate is for (repeatable; default localhost, 127.0.0.1, ::1)",
    )
    c.add_argument("--days", type=int, default=365, help="validity in days (default %(default)s)")

    ls = sub.add_parser("ls", help="list datasets")
    _client_options(ls)
    d = sub.add_parser("describe", help="show a dataset's schema, version, size")
    d.add_argument("dataset")
    d.add_argument("--version", type=int, help="an older version (time travel)")
    _client_options(d)
    h = sub.add_parser("head", help="print the first rows of a dataset")
    h.add_argument("dataset")
    h.add_argument("-n", "--rows", type=int, default=10, help="rows to print (default %(default)s)")
    _read_options(h)
    _client_options(h)
    cat = sub.add_parser("cat", help="print every row of a dataset")
    cat.add_argument("dataset")
    cat.add_argument(
        "--format",
        choices=["table", "csv", "json"],
        default="table",
        help="output format (default %(default)s)",
    )
    _read_options(cat)
    _client_options(cat)
    hist = sub.add_parser("history", help="list a dataset's versions")
    hist.add_argument("dataset")
    _client_options(hist)
    drop = sub.add_parser("drop", help="delete a dataset and all its versions")
    drop.add_argument("dataset")
    drop.add_argument("--if-exists", action="store_true", help="no error if it does not exist")
    _client_options(drop)
    imp = sub.add_parser("import", help="load Parquet or CSV files into a dataset")
    imp.add_argument("dataset")
    imp.add_argument("files", nargs="+", help="Parquet or CSV files")
    imp.add_argument(
        "--mode",
        choices=["append", "overwrite"],
        default="append",
        help="add to the dataset or replace it (default %(default)s)",
    )
    imp.add_argument(
        "--format",
        choices=["auto", "parquet", "csv"],
        default="auto",
        help="file format (default: from the file extension)",
    )
    imp.add_argument(
        "--partition-by",
        action="append",
        default=[],
        help="partition column when the dataset is created (repeatable)",
    )
    _client_options(imp)
    exp = sub.add_parser("export", help="write a dataset to a Parquet or CSV file")
    exp.add_argument("dataset")
    exp.add_argument("file")
    exp.add_argument(
        "--format",
        choices=["auto", "parquet", "csv"],
        default="auto",
        help="file format (default: from the file extension)",
    )
    _read_options(exp)
    _client_options(exp)
    vac = sub.add_parser(
        "vacuum", help="delete files no version needs (run on the service's machine)"
    )
    vac.add_argument("dataset")
    vac.add_argument(
        "--root",
        default=os.environ.get("AQUEDUCT_ROOT", "./aqueduct-data"),
        help="the service's data directory (default %(default)s)",
    )
    vac.add_argument(
        "--retention-hours",
        type=float,
        default=168.0,
        help="keep files removed less than this long ago (default %(default)s = 7 days)",
    )
    vac.add_argument("--dry-run", action="store_true", help="only list what would be deleted")
    vac.add_argument(
        "--storage-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="object-store option passed to Delta Lake (repeatable)",
    )
    return parser


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, got {text!r}")
    return value


def _listen_transports(text: str) -> str:
    names = {n.strip().lower() for n in text.split(",") if n.strip()}
    if not names or not names <= {"quic", "tcp"}:
        raise argparse.ArgumentTypeError(f"expected quic, tcp or quic,tcp, got {text!r}")
    return "auto" if names == {"quic", "tcp"} else names.pop()


def _read_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--columns", help="comma-separated columns to read")
    p.add_argument(
        "--where",
        action="append",
        default=[],
        metavar="FILTER",
        help="filter 'column op value', op one of == != < <= > >= (repeatable, ANDed)",
    )
    p.add_argument("--version", type=int, help="read an older version (time travel)")


# -- commands -----------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("quic").setLevel(logging.WARNING)
    try:
        return int(COMMANDS[args.command](args) or 0)
    except AqueductError as exc:
        print(f"aqueduct {args.command}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    except (ValueError, FileNotFoundError) as exc:
        print(f"aqueduct {args.command}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def _client(args: argparse.Namespace) -> Any:
    from aqueduct_spark.client import Client

    if args.cafile:
        tls = ClientTLS(cafile=args.cafile)
    elif args.fingerprint:
        tls = ClientTLS(fingerprint=args.fingerprint)
    elif args.insecure:
        tls = ClientTLS(insecure=True)
    else:
        tls = ClientTLS()
    transport = TransportConfig(backend=args.backend, transport=args.transport)
    return Client(args.url, token=args.token, tls=tls, transport=transport)


def cmd_cert(args: argparse.Namespace) -> int:
    hosts = tuple(args.host or ("localhost", "127.0.0.1", "::1"))
    certs = make_dev_certificates(args.out, hosts, args.days)
    print(f"CA certificate:     {certs.ca_file}   (clients: --cafile)")
    print(f"server certificate: {certs.cert_file}   (aqueduct serve --cert)")
    print(f"server key:         {certs.key_file}   (aqueduct serve --key)")
    print(f"SHA-256 fingerprint: {format_fingerprint(certs.fingerprint)}")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    if (args.cert is None) != (args.key is None):
        raise ValueError("give both --cert and --key, or neither (for a development certificate)")
    root = args.root
    local = "://" not in root or root.startswith("file://")
    if args.cert:
        tls = ServerTLS(args.cert, args.key)
        ca = None
    else:
        tls_dir = Path(root.removeprefix("file://") if local else ".") / ".aqueduct-tls"
        if not (tls_dir / "server.pem").exists():
            make_dev_certificates(tls_dir)
        tls = ServerTLS(str(tls_dir / "server.pem"), str(tls_dir / "server.key"))
        ca = tls_dir / "ca.pem"
    if local:
        Path(root.removeprefix("file://")).mkdir(parents=True, exist_ok=True)
    port = args.port
    if args.workers > 1 and port == 0:
        port = _free_udp_port(args.host)
    options = dict(kv.split("=", 1) for kv in args.storage_option)
    spec = {
        "root": root,
        "host": args.host,
        "port": port,
        "token": args.token,
        "certfile": tls.certfile,
        "keyfile": tls.keyfile,
        "storage_options": options or None,
        "backend": args.backend,
        "packet_size": args.packet_size,
        "transport": args.transport,
        "max_requests": args.max_requests,
        "max_scans": args.max_scans,
        "engine": {
            "max_message_gap": args.max_message_gap,
            "max_early_bytes": args.max_early_bytes,
            "max_pending_bytes": args.max_pending_bytes,
            "max_pending_channels": args.max_pending_channels,
            "max_channels": args.max_channels,
        },
        "reuse_port": args.workers > 1,
    }
    fingerprint = format_fingerprint(file_fingerprint(tls.certfile))
    banner = {
        "url": f"quic://{args.host}:{port}",
        "fingerprint": fingerprint,
        "cafile": str(ca) if ca else None,
        "workers": args.workers,
        "root": root,
    }
    if args.workers <= 1:
        _run(_serve_forever(spec, banner))
        return 0
    ctx = multiprocessing.get_context("spawn")  # deltalake must not be used across fork
    ready = [ctx.Event() for _ in range(args.workers)]
    procs = [ctx.Process(target=_worker, args=(spec, ev), daemon=True) for ev in ready]
    for proc in procs:
        proc.start()
    deadline = time.monotonic() + 60
    while not all(ev.is_set() for ev in ready):  # announce only once every worker listens
        if time.monotonic() > deadline or not all(p.is_alive() for p in procs):
            for proc in procs:
                proc.terminate()
            raise AqueductServeError("a service worker failed to start; see the log above")
        time.sleep(0.05)
    _print_banner(banner)
    stop = {"now": False}

    def on_signal(*_: object) -> None:
        stop["now"] = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    while not stop["now"] and all(p.is_alive() for p in procs):
        time.sleep(0.5)
    died = not stop["now"]
    for proc in procs:
        proc.terminate()
    for proc in procs:
        proc.join(10)
    if died:
        print(
            "aqueduct serve: a worker process exited unexpectedly; stopped the others",
            file=sys.stderr,
        )
        return 1
    return 0


def _print_banner(banner: dict[str, Any]) -> None:
    print(
        f"aqueduct: serving {banner['root']} on {banner['url']} "
        f"({banner['workers']} worker{'s' if banner['workers'] != 1 else ''})",
        flush=True,
    )
    print(f"aqueduct: certificate fingerprint {banner['fingerprint']}", flush=True)
    if banner["cafile"]:
        print(
            f"aqueduct: development CA {banner['cafile']} (clients: --cafile or --fingerprint)",
            flush=True,
        )
    print("AQUEDUCT_READY " + json.dumps(banner), flush=True)


class AqueductServeError(AqueductError):
    """``aqueduct serve`` could not start."""


def _worker(spec: dict[str, Any], ready: Any) -> None:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("quic").setLevel(logging.WARNING)
    _run(_serve_forever(spec, None, ready))


def _run(main: Any) -> None:
    """Run the service on uvloop when it is installed (about 20-60% more throughput)."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(main)
        return
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(main)


async def _serve_forever(
    spec: dict[str, Any], banner: dict[str, Any] | None, ready: Any = None
) -> None:
    from aqueduct_spark.service.server import ServiceConfig, start

    config = ServiceConfig(
        spec["root"],
        token=spec["token"] or None,
        storage_options=spec["storage_options"],
        max_requests=spec["max_requests"],
        max_scans=spec["max_scans"],
    )
    transport = TransportConfig(
        backend=spec["backend"],
        packet_size=spec["packet_size"],
        transport=spec["transport"],
        engine=EngineConfig(**spec["engine"]),
    )
    _, server = await start(
        config,
        spec["host"],
        spec["port"],
        tls=ServerTLS(spec["certfile"], spec["keyfile"]),
        transport=transport,
        reuse_port=spec["reuse_port"],
    )
    if banner is not None:
        banner = {**banner, "url": f"quic://{spec['host']}:{server.port}"}
        _print_banner(banner)
    if ready is not None:
        ready.set()
    loop = asyncio.get_running_loop()
    stopped = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stopped.set)
    await stopped.wait()
    await server.close()


def _free_udp_port(host: str) -> int:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def cmd_ls(args: argparse.Namespace) -> int:
    datasets = _client(args).list()
    if not datasets:
        print("(no datasets)")
    for d in datasets:
        print(f"{d.name:30} v{d.version:<6} {d.rows:>12,} rows {_size(d.bytes):>10}")
    return 0


def cmd_describe(args: argparse.Namespace) -> int:
    d = _client(args).describe(args.dataset, version=args.version)
    print(f"dataset   {d.name}")
    print(f"version   {d.version}")
    print(f"rows      {d.rows:,}")
    print(f"size      {_size(d.bytes)} in {d.files} files")
    if d.partition_by:
        print(f"partition {', '.join(d.partition_by)}")
    print("schema")
    for f in d.schema:
        print(f"  {f.name}: {f.type}{'' if f.nullable else ' not null'}")
    return 0


def _read_args(args: argparse.Namespace) -> dict[str, Any]:
    filters = [_parse_where(w) for w in args.where]
    return {
        "columns": args.columns.split(",") if args.columns else None,
        "filter": filters or None,
        "version": args.version,
    }


def _parse_where(text: str) -> tuple[str, str, Any]:
    for op in ("==", "!=", "<=", ">=", "<", ">", "="):
        if op in text:
            column, _, raw = text.partition(op)
            value: Any = raw.strip()
            try:
                value = json.loads(value)
            except ValueError:
                value = value.strip("'\"")
            return (column.strip(), "==" if op == "=" else op, value)
    raise ValueError(f"cannot read filter {text!r}: use 'column op value' with op == != < <= > >=")


def cmd_head(args: argparse.Namespace) -> int:
    batches = []
    taken = 0
    for batch in _client(args).read_batches(args.dataset, **_read_args(args)):
        batches.append(batch.slice(0, args.rows - taken))
        taken += batches[-1].num_rows
        if taken >= args.rows:
            break
    if not batches:
        print("(no rows)")
        return 0
    print(
        pa.Table.from_batches(batches).to_pandas().to_string()
        if _has_pandas()
        else pa.Table.from_batches(batches)
    )
    return 0


def cmd_cat(args: argparse.Namespace) -> int:
    import pyarrow.csv as pcsv

    for batch in _client(args).read_batches(args.dataset, **_read_args(args)):
        if args.format == "csv":
            pcsv.write_csv(pa.Table.from_batches([batch]), sys.stdout.buffer)
        elif args.format == "json":
            for row in batch.to_pylist():
                print(json.dumps(row, default=str))
        else:
            print(pa.Table.from_batches([batch]))
    return 0


def cmd_history(args: argparse.Namespace) -> int:
    offsets = _client(args).offsets(args.dataset)
    for v in offsets["versions"]:
        print(
            f"v{v['version']:<6} {v['timestamp']}  {v['operation']:20} +{v['rows']:,} rows +{_size(v['bytes'])}"
        )
    return 0


def cmd_drop(args: argparse.Namespace) -> int:
    dropped = _client(args).drop(args.dataset, if_exists=args.if_exists)
    print(f"dropped {args.dataset}" if dropped else f"{args.dataset} did not exist")
    return 0


def _format_of(path: str, given: str) -> str:
    if given != "auto":
        return given
    suffix = Path(path).suffix.lower()
    if suffix in (".parquet", ".pq"):
        return "parquet"
    if suffix in (".csv", ".tsv"):
        return "csv"
    raise ValueError(f"cannot tell the format of {path!r}: use --format parquet or --format csv")


def cmd_import(args: argparse.Namespace) -> int:
    import pyarrow.csv as pcsv
    import pyarrow.parquet as pq

    client = _client(args)
    sources = []
    for path in args.files:
        fmt = _format_of(path, args.format)
        if fmt == "parquet":
            pf = pq.ParquetFile(path)
            sources.append(
                (pf.schema_arrow, pf.metadata.num_rows, lambda pf=pf: pf.iter_batches(65536))
            )
        else:
            delimiter = "\t" if path.lower().endswith(".tsv") else ","
            reader = pcsv.open_csv(path, parse_options=pcsv.ParseOptions(delimiter=delimiter))
            sources.append((reader.schema, None, lambda r=reader: iter(r)))
    schema = sources[0][0]
    total = sum(n for _, n, _ in sources) if all(n is not None for _, n, _ in sources) else None
    txn = client.begin(args.dataset, schema, mode=args.mode, partition_by=args.partition_by)
    with tqdm(total=total, unit="rows", unit_scale=True, desc=f"import {args.dataset}") as bar:

        def batches() -> Any:
            for _, _, make in sources:
                for batch in make():
                    bar.update(batch.num_rows)
                    yield batch

        try:
            staged = client.write_task(txn, batches())
        except BaseException:
            client.abort(txn)
            raise
    result = client.commit(txn, [staged])
    print(f"{args.dataset}: version {result['version']}, +{result['rows']:,} rows")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    import pyarrow.csv as pcsv
    import pyarrow.parquet as pq

    client = _client(args)
    fmt = _format_of(args.file, args.format)
    read = _read_args(args)
    plan = client.plan(args.dataset, **read)
    writer: Any = None
    written = 0
    with tqdm(total=plan.rows, unit="rows", unit_scale=True, desc=f"export {args.dataset}") as bar:
        try:
            for split in plan.splits:
                for batch in client.scan(
                    split, schema=plan.schema, columns=read["columns"], filter=read["filter"]
                ):
                    if writer is None:
                        writer = (
                            pq.ParquetWriter(args.file, plan.schema)
                            if fmt == "parquet"
                            else pcsv.CSVWriter(args.file, plan.schema)
                        )
                    writer.write_batch(batch)
                    written += batch.num_rows
                    bar.update(batch.num_rows)
            if writer is None:  # an empty dataset still gives a file with the schema
                writer = (
                    pq.ParquetWriter(args.file, plan.schema)
                    if fmt == "parquet"
                    else pcsv.CSVWriter(args.file, plan.schema)
                )
        finally:
            if writer is not None:
                writer.close()
    print(f"{args.file}: {written:,} rows of {args.dataset} version {plan.version}")
    return 0


def cmd_vacuum(args: argparse.Namespace) -> int:
    from datetime import timedelta

    from aqueduct_spark.service.store import Store

    options = dict(kv.split("=", 1) for kv in args.storage_option)
    removed = Store(args.root, options or None).vacuum(
        args.dataset, retention=timedelta(hours=args.retention_hours), dry_run=args.dry_run
    )
    verb = "would delete" if args.dry_run else "deleted"
    print(f"{verb} {len(removed)} files")
    for path in removed:
        print(f"  {path}")
    return 0


def _size(n: int) -> str:
    size = float(n)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if size < 1000 or unit == "TB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{n} B"


def _has_pandas() -> bool:
    try:
        import pandas  # noqa: F401
    except ImportError:
        return False
    return True


COMMANDS = {
    "serve": cmd_serve,
    "cert": cmd_cert,
    "ls": cmd_ls,
    "describe": cmd_describe,
    "head": cmd_head,
    "cat": cmd_cat,
    "history": cmd_history,
    "drop": cmd_drop,
    "import": cmd_import,
    "export": cmd_export,
    "vacuum": cmd_vacuum,
}

if __name__ == "__main__":
    sys.exit(main())
