"""Datasets of many small versions, built fast: the Delta log and the data files written
directly (what a streaming sink committing every few seconds leaves behind), for
:mod:`benchmarks.bench_versions` and the tests that need a long log.

Version 0 is created with ``deltalake`` (so protocol and metadata are its own); every later
version is one commit file ``_delta_log/<v>.json`` holding a ``commitInfo`` and one ``add`` of
a new Parquet file, with the statistics the service itself computes from the footer. Writing
the commit files directly is what makes 10,000 versions take seconds: each ``deltalake``
append would first load the whole log, so building that way is quadratic.
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
    *,
    one_data_file: bool = False,
) -> int:
    """Create a Delta table at ``table_dir`` and commit each of ``batches`` as its own version
    (1, 2, ...); with ``one_data_file`` all versions after the first reuse one Parquet file's
    bytes under new names (fast for very long logs). Returns the last version."""
    table_dir = Path(table_dir)
    DeltaTable.create(str(table_dir), DeltaSchema.from_arrow(schema))
    log_dir = table_dir / "_delta_log"
    template: tuple[bytes, str] | None = None
    for v, batch in enumerate(batches, start=1):
        name = f"part-{v:06d}.parquet"
        path = table_dir / name
        if one_data_file and template is not None:
            path.write_bytes(template[0])
            stats = template[1]
        else:
            pq.write_table(batch.cast(schema), path)
            stats = stats_from_metadata(pq.read_metadata(path), schema)
            if one_data_file:
                template = (path.read_bytes(), stats)
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
                    "size": os.path.getsize(path),
                    "modificationTime": now,
                    "dataChange": True,
                    "stats": stats,
                }
            },
        ]
        tmp = log_dir / f".{v:020d}.json.tmp"
        tmp.write_text("\n".join(json.dumps(a) for a in actions) + "\n")
        os.rename(tmp, log_dir / f"{v:020d}.json")
    return len(batches)
