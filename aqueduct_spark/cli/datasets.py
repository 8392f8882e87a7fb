"""The commands that work with a running service's datasets, as its client: ``ls``,
``describe``, ``head``, ``cat``, ``history``, ``drop``, ``import`` and ``export``."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa

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


def _progress(args: argparse.Namespace, **kw: Any) -> Any:
    """A tqdm progress bar on stderr (none with -q), imported only where one is shown."""
    from tqdm import tqdm

    kw.setdefault("unit", "rows")
    return tqdm(unit_scale=True, disable=getattr(args, "quiet", False), **kw)


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
    import pyarrow.parquet as pq

    from aqueduct_spark.cli import csv_import as ci

    client = _client(args)
    given = ci.parse_schema(args.schema) if args.schema else {}
    formats = [(path, _format_of(path, args.format)) for path in args.files]
    csvs = {p: ci.CsvFile(p, ci.delimiter_of(p)) for p, fmt in formats if fmt == "csv"}
    parquets = {p: pq.ParquetFile(p) for p, fmt in formats if fmt == "parquet"}
    _check_given(given, [*csvs.values()])
    dataset = _dataset_schema(client, args.dataset)
    known = {f.name: f.type for f in dataset or ()}  # the dataset's types, or the first file's
    origin = (
        f"the column's type in dataset {args.dataset!r}",
        "correct the value, or import into a dataset whose column is of another type",
    )
    if dataset is None and formats[0][1] == "parquet":
        known = {f.name: f.type for f in parquets[formats[0][0]].schema_arrow}
        origin = (
            f"its type in {formats[0][0]}",
            "correct the value (the first file's types are the dataset's)",
        )
    origins = dict.fromkeys(known, origin)
    known.update(given)
    origins.update(dict.fromkeys(given, ("as --schema says", "correct the value or --schema")))
    for f in csvs.values():
        f.origins = origins
    rows: int | None = sum(pf.metadata.num_rows for pf in parquets.values())
    types = dict(known)
    if any(n not in known for f in csvs.values() for n in f.names):  # types from every value
        with _progress(args, unit="B", desc="reading types", total=ci.file_size([*csvs])) as bar:
            inferred = ci.infer(
                [*csvs.values()], known, allow_strings=args.allow_strings, progress=bar.update
            )
        types, rows = inferred.types, (rows or 0) + inferred.rows
    elif csvs:
        rows = None  # a CSV file's rows are known once read

    def schema_of(path: str) -> pa.Schema:
        if path in parquets:
            return parquets[path].schema_arrow
        return pa.schema([(n, types[n]) for n in csvs[path].names])

    def source(path: str) -> Iterator[pa.RecordBatch]:
        if path in parquets:
            return iter(parquets[path].iter_batches(65536))
        return ci.batches(csvs[path], schema_of(path))

    schema = dataset if dataset is not None else schema_of(formats[0][0])
    txn = client.begin(args.dataset, schema, mode=args.mode, partition_by=args.partition_by)
    with _progress(args, total=rows, desc=f"import {args.dataset}") as bar:

        def batches() -> Any:
            for path, _ in formats:
                for batch in source(path):
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


def _dataset_schema(client: Client, name: str) -> pa.Schema | None:
    """The dataset's schema, or None where it does not exist yet."""
    from aqueduct_spark import protocol as P

    try:
        return client.describe(name).schema
    except P.DatasetNotFound:
        return None


def _check_given(given: dict[str, Any], files: list[Any]) -> None:
    """Every ``--schema`` column is a column of the CSV files."""
    import difflib

    names = list(dict.fromkeys(n for f in files for n in f.names))
    for name in given:
        if name not in names:
            near = difflib.get_close_matches(name, names, n=1, cutoff=0.6)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            raise ValueError(
                f"--schema names {name!r}, which is no column of the CSV files{hint}; "
                f"their columns are {', '.join(names)}"
            )


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
