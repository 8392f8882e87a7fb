"""Datasets of many small versions, built fast: the Delta log and the data files written
directly (what a streaming sink committing every few seconds leaves behind), for
:mod:`benchmarks.bench_versions` and the tests that need a long log.

Version 0 is created with ``deltalake`` (so protocol and metadata are its own); every later
version is one commit file ``_delta_log/<v>.json`` holding a ``commitInfo`` and one ``add`` of
a new Parquet file, with the statistics the service itself computes from the footer. Writing
the commit files directly is what makes 10,000 versions take seconds: each ``deltalake``
append would first load the log since its last checkpoint. A commit file is linked into place
(never overwriting), as Delta's own writers do on a local disk, so building beside a running
service is safe.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import DeltaTable
from deltalake import Schema as DeltaSchema

from aqueduct_spark.service.delta_stats import stats_from_metadata


def build_versions(
    table_dir: Path | str,
    schema: pa.Schema,
    batches: list[pa.Table],
) -> int:
    """Create a Delta table at ``table_dir`` and commit each of ``batches`` as its own version
    (1, 2, ...). Returns the last version."""
    table_dir = Path(table_dir)
    DeltaTable.create(str(table_dir), DeltaSchema.from_arrow(schema))
    for v, batch in enumerate(batches, start=1):
        name = f"part-{v:06d}.parquet"
        pq.write_table(batch.cast(schema), table_dir / name)
        _commit(table_dir, v, name, stats_from_metadata(pq.read_metadata(table_dir / name), schema))
    return len(batches)


def append_versions(
    table_dir: Path | str,
    batch: pa.Table,
    count: int,
    *,
    checkpoint: bool = False,
    checkpoint_every: int = 0,
) -> int:
    """Commit ``count`` more versions to an existing table, each adding a copy of one Parquet
    file of ``batch`` (fast for very long logs); with ``checkpoint``, ``deltalake`` writes a
    checkpoint at the last one, and with ``checkpoint_every`` at every such multiple of
    versions on the way too (each a load from the one before: far fewer than a writer's
    every 100, which is what a reader's load depends on, not the length of the log).
    Returns the last version."""
    table_dir = Path(table_dir)
    table = DeltaTable(str(table_dir))
    schema = pa.schema(table.schema().to_arrow())
    first = table.version() + 1
    template = table_dir / f"bulk-{first:06d}.parquet"
    pq.write_table(batch.cast(schema), template)
    data = template.read_bytes()
    stats = stats_from_metadata(pq.read_metadata(template), schema)
    for v in range(first, first + count):
        name = f"bulk-{v:06d}.parquet"
        if v != first:
            (table_dir / name).write_bytes(data)
        _commit(table_dir, v, name, stats)
        if checkpoint_every and v % checkpoint_every == 0 and v != first + count - 1:
            DeltaTable(str(table_dir), version=v).create_checkpoint()
    if checkpoint:
        DeltaTable(str(table_dir)).create_checkpoint()
    return first + count - 1


def _commit(table_dir: Path, version: int, name: str, stats: str) -> None:
    """Version ``version``: a commitInfo and one add of data file ``name``, written atomically."""
    now = int(time.time() * 1000)
    actions = [
        {
            "commitInfo": {
                "timestamp": now,
                "operation": "WRITE",
                "operationParameters": {"mode": "Append"},
            }
        },
        {
            "add": {
                "path": name,
                "partitionValues": {},
                "size": os.path.getsize(table_dir / name),
                "modificationTime": now,
                "dataChange": True,
                "stats": stats,
            }
        },
    ]
    log_dir = table_dir / "_delta_log"
    tmp = log_dir / f".{version:020d}.json.tmp"
    tmp.write_text("\n".join(json.dumps(a) for a in actions) + "\n")
    os.link(tmp, log_dir / f"{version:020d}.json")  # fails if the version exists
    tmp.unlink()
