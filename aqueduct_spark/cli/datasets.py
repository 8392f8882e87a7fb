"""The commands that work with a running service's datasets, as its client: ``ls``,
``describe``, ``head``, ``cat``, ``history``, ``drop``, ``import`` and ``export``."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
from collections.abc import Callable, Generator, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pyarrow as pa
from tqdm import tqdm

from aqueduct_core.transport import ClientTLS, TransportConfig
from aqueduct_spark.cli.output import rows_writer
from aqueduct_spark.client import Client, DatasetInfo


def _client(args: argparse.Namespace, **options: Any) -> Client:
    if args.cafile:
        tls = ClientTLS(cafile=args.cafile)
    elif args.fingerprint:
        tls = ClientTLS(fingerprint=args.fingerprint)
    elif args.insecure:
        tls = ClientTLS(insecure=True)
    else:
        tls = ClientTLS()
    transport = TransportConfig(backend=args.backend, transport=args.transport)
    return Client(args.url, token=args.token, tls=tls, transport=transport, **options)


def _print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, default=_plain))


def _plain(value: Any) -> Any:
    """JSON for what the service answers with beyond JSON's types (times, bytes)."""
    if isinstance(value, dt.datetime | dt.date):
        return value.isoformat()
    if isinstance(value, bytes):
        return value.hex()
    return str(value)


def _described(d: DatasetInfo) -> dict[str, Any]:
    return {
        "name": d.name,
        "version": d.version,
        "rows": d.rows,
        "bytes": d.bytes,
        "files": d.files,
        "partition_by": list(d.partition_by),
        "created": d.created,
        "updated": d.updated,
        "schema": [{"name": f.name, "type": str(f.type), "nullable": f.nullable} for f in d.schema],
    }


def _progress(args: argparse.Namespace, **kw: Any) -> tqdm[Any]:
    return tqdm(unit="rows", unit_scale=True, disable=getattr(args, "quiet", False), **kw)


def cmd_ls(args: argparse.Namespace) -> int:
    datasets = _client(args).list()
    if args.json:
        _print_json([_described(d) for d in datasets])
        return 0
    if not datasets:
        print("(no datasets)")
    for d in datasets:
        print(f"{d.name:30} v{d.version:<6} {d.rows:>12,} rows {_size(d.bytes):>10}")
    return 0


def cmd_describe(args: argparse.Namespace) -> int:
    d = _client(args).describe(args.dataset, version=args.version)
    if args.json:
        _print_json(_described(d))
        return 0
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
    return {
        "columns": args.columns.split(",") if args.columns else None,
        # SQL conditions, ANDed: the service parses them and binds literals to the columns'
        # types (docs/cli.md, "Conditions")
        "filter": list(args.where) or None,
        "version": args.version,
    }


def _plan_batches(
    client: Client, plan: Any, read: dict[str, Any]
) -> Generator[pa.RecordBatch, None, None]:
    """The batches of ``plan``'s splits in order, one task (a scan of its splits) at a time."""
    for splits in plan.task_splits():
        yield from client.scan(
            splits[0] if len(splits) == 1 else splits,
            schema=plan.schema,
            columns=read["columns"],
            filter=read["filter"],
        )


def cmd_head(args: argparse.Namespace) -> int:
    client = _client(args)
    read = _read_args(args)
    plan = client.plan(args.dataset, **read)
    out = rows_writer("table", plan.schema)
    left = args.rows
    batches = _plan_batches(client, plan, read)
    for batch in batches:
        if left <= 0:
            break
        out.write(batch.slice(0, left))
        left -= min(left, batch.num_rows)
    batches.close()  # the scan still running ends here
    out.close()
    return 0


def cmd_cat(args: argparse.Namespace) -> int:
    """Every row, streamed: a table on a terminal, CSV into a pipe (``--format``)."""
    client = _client(args)
    read = _read_args(args)
    plan = client.plan(args.dataset, **read)
    out = rows_writer(args.format, plan.schema)
    for batch in _plan_batches(client, plan, read):
        out.write(batch)
    out.close()
    return 0


def cmd_history(args: argparse.Namespace) -> int:
    offsets = _client(args).offsets(args.dataset)
    if args.json:
        _print_json(offsets["versions"])
        return 0
    for line in history_lines(offsets["versions"]):
        print(line)
    return 0


_NO_NEW_ROWS = frozenset({"restore", "compact", "vacuum", "vacuum start", "vacuum end"})


def history_lines(versions: list[dict[str, Any]]) -> list[str]:
    """One line per version, as users name what it did (``append +1,000 rows (12.3 KB)``,
    ``delete -2,198 rows where ...``); a vacuum's two versions (start and end) are one line.
    A service older than ``action`` shows Delta's operation and the rows added."""
    lines = []
    i = 0
    while i < len(versions):
        v = versions[i]
        action, label = v.get("action") or v["operation"], f"v{v['version']}"
        then = versions[i + 1] if i + 1 < len(versions) else {}
        if action == "vacuum start" and then.get("action") == "vacuum end":
            v, action, label = then, "vacuum", f"v{v['version']}-{then['version']}"
            i += 1
        size = _size(v["bytes"])
        if v.get("rows_removed") is not None:
            what = f"-{v['rows_removed']:,} rows"
        elif action == "overwrite":
            what = f"wrote {v['rows']:,} rows ({size})"
        elif action in _NO_NEW_ROWS or not (v["rows"] or action == "append"):
            what = ""  # a restore or compaction adds files of rows that were there before
        else:
            what = f"+{v['rows']:,} rows ({size})"
        text = "  ".join(t for t in (what, v.get("detail") or "") if t)
        lines.append(f"{label:<8} {v['timestamp']}  {action:<12} {text}".rstrip())
        i += 1
    return lines


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
    sources: list[tuple[pa.Schema, int | None, Callable[[], Iterator[pa.RecordBatch]]]] = []
    for path in args.files:
        fmt = _format_of(path, args.format)
        if fmt == "parquet":
            pf = pq.ParquetFile(path)
            sources.append((pf.schema_arrow, pf.metadata.num_rows, partial(pf.iter_batches, 65536)))
        else:
            delimiter = "\t" if path.lower().endswith(".tsv") else ","
            reader = pcsv.open_csv(path, parse_options=pcsv.ParseOptions(delimiter=delimiter))
            sources.append((reader.schema, None, partial(iter, reader)))
    schema = sources[0][0]
    known = [n for _, n, _ in sources if n is not None]
    total = sum(known) if len(known) == len(sources) else None
    txn = client.begin(args.dataset, schema, mode=args.mode, partition_by=args.partition_by)
    with _progress(args, total=total, desc=f"import {args.dataset}") as bar:

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
    """Write to a temporary file beside FILE, renamed to FILE once complete: an export that
    fails or is interrupted leaves FILE as it was."""
    client = _client(args)
    fmt = _format_of(args.file, args.format)
    target = Path(args.file)
    if target.exists() and not args.force:
        raise FileExistsError(f"{args.file} exists: give --force to replace it")
    read = _read_args(args)
    plan = client.plan(args.dataset, **read)
    part = target.with_name(f".{target.name}.{os.getpid()}.part")
    try:
        written = _export_to(part, fmt, client, plan, read, args)
        if target.exists() and not args.force:  # made while we exported
            raise FileExistsError(f"{args.file} exists: give --force to replace it")
        os.replace(part, target)
    finally:
        part.unlink(missing_ok=True)
    print(f"{args.file}: {written:,} rows of {args.dataset} version {plan.version}")
    return 0


def _export_to(
    path: Path, fmt: str, client: Client, plan: Any, read: dict[str, Any], args: argparse.Namespace
) -> int:
    import pyarrow.csv as pcsv
    import pyarrow.parquet as pq

    writer: Any = (
        pq.ParquetWriter(path, plan.schema)
        if fmt == "parquet"
        else pcsv.CSVWriter(path, plan.schema)
    )  # made first: an empty dataset still gives a file with the schema
    written = 0
    with _progress(args, total=plan.rows, desc=f"export {args.dataset}") as bar:
        try:
            for batch in _plan_batches(client, plan, read):
                writer.write_batch(batch)
                written += batch.num_rows
                bar.update(batch.num_rows)
        finally:
            writer.close()
    return written


def _size(n: int) -> str:
    size = float(n)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if size < 1000 or unit == "TB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{n} B"
