"""Helpers for the Delta store tests: write through stage + commit, read through plan + scan."""

from __future__ import annotations

import os
import uuid
from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from aqueduct_spark.protocol import CommitResult, StagedFile
from aqueduct_spark.service.store import Store


def stage(
    store: Store,
    name: str,
    data: pa.Table,
    *,
    mode: str = "append",
    partition_by: Sequence[str] = (),
    txn: str | None = None,
    tasks: int = 1,
    batch_rows: int = 1000,
    overwrite_schema: bool = False,
    **stage_kw: Any,
) -> tuple[pa.Schema, list[StagedFile]]:
    """Stage ``data`` as ``tasks`` write tasks would (each its slice, in small batches)."""
    schema = store.check_schema(name, data.schema, mode, overwrite_schema=overwrite_schema)
    txn = txn or uuid.uuid4().hex
    staged: list[StagedFile] = []
    step = -(-data.num_rows // tasks) if data.num_rows else 0
    for t in range(tasks):
        writer = store.open_stage(name, txn, f"task-{t}", schema, partition_by, **stage_kw)
        for batch in data.slice(t * step, step).to_batches(max_chunksize=batch_rows):
            writer.write(batch)
        staged += writer.close()
    return schema, staged


def write(
    store: Store,
    name: str,
    data: pa.Table,
    *,
    mode: str = "append",
    partition_by: Sequence[str] = (),
    app_id: str | None = None,
    app_version: int | None = None,
    overwrite_schema: bool = False,
    **kw: Any,
) -> CommitResult:
    schema, staged = stage(
        store,
        name,
        data,
        mode=mode,
        partition_by=partition_by,
        overwrite_schema=overwrite_schema,
        **kw,
    )
    return store.commit(
        name,
        mode,
        schema,
        partition_by,
        staged,
        app_id=app_id,
        app_version=app_version,
        overwrite_schema=overwrite_schema,
    )


def read(store: Store, name: str, **kw: Any) -> pa.Table:
    """All rows of a scan, through plan and scan of every split."""
    columns, filter = kw.pop("columns", None), kw.pop("filter", None)
    plan = store.plan(name, columns=columns, filter=filter, **kw)
    batches = []
    for split in plan.splits:
        for batch in store.scan(split, columns=columns, filter=filter):
            assert batch.schema == plan.schema
            batches.append(batch)
    return pa.Table.from_batches(batches, schema=plan.schema)


def data_files(root: str | os.PathLike[str]) -> list[str]:
    """Every file and directory under a table directory, outside the Delta log."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        if rel.split(os.sep)[0] == "_delta_log":
            continue
        out += [os.path.normpath(os.path.join(rel, n)) for n in filenames + dirnames]
    return sorted(p for p in out if p.split(os.sep)[0] != "_delta_log")


def sorted_by(table: pa.Table, key: str = "id") -> pa.Table:
    return table.sort_by(key)
