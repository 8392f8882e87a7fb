"""Positions in a dataset's history, as the streaming source writes them in Spark's
checkpoint: ``{"version": v, "file": f, "tableId": t}`` means every file added by versions
below ``v`` is consumed, plus the first ``f`` files version ``v`` added. A position has one
spelling only and its keys are always in this order, because Spark compares offsets as JSON
text. ``tableId`` is the table's Delta ``metaData.id``: version numbers mean nothing in
another table (:class:`SourceTableChanged`)."""

from __future__ import annotations

import datetime as dt
from typing import Any

from aqueduct_spark import protocol as P


class SourceTableChanged(P.DatasetError):
    """The stream's offsets belong to another table than the dataset is now: the checkpoint
    was written by a query that read another dataset, or the dataset was dropped and created
    again. Version numbers of one table mean nothing in the other, so reading on would skip
    or repeat data. Start the query with a new ``checkpointLocation``, or set
    ``failOnDataLoss=false`` to start over at the earliest version of the current table."""

    code = "SOURCE_TABLE_CHANGED"
    remedy = (
        "start the query with a new checkpointLocation, or set failOnDataLoss=false to start "
        "over at the earliest version of the current table"
    )


class DataChanged(P.DatasetError):
    """A version of the dataset removes or rewrites data (an overwrite, a delete, a restore),
    which a read of appended rows cannot apply: its rows were already delivered. Set
    ``skipChangeCommits=true`` (skip such versions), ``ignoreDeletes=true`` (skip versions
    that only delete) or ``readChangeFeed=true`` (read the changes as rows)."""

    code = "DATA_CHANGED"
    remedy = (
        "set skipChangeCommits=true (skip versions that rewrite data), ignoreDeletes=true "
        "(skip versions that only delete) or readChangeFeed=true (read the changes as rows)"
    )


def offset(version: int, file: int = 0, table_id: str | None = None) -> dict[str, Any]:
    """The one spelling of a position (fixed key order: Spark compares offsets as text)."""
    out: dict[str, Any] = {"version": int(version), "file": int(file)}
    if table_id is not None:
        out["tableId"] = table_id
    return out


def as_time(value: Any) -> dt.datetime:
    """A version's commit time as the service sends it (a datetime, ISO 8601 text or epoch
    milliseconds), in UTC."""
    if isinstance(value, dt.datetime):
        return value if value.tzinfo else value.replace(tzinfo=dt.UTC)
    if isinstance(value, str):
        parsed = dt.datetime.fromisoformat(value)
        return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.UTC)
    return dt.datetime.fromtimestamp(float(value) / 1000, dt.UTC)
