"""What each version did, in the words users use (``aqueduct history``, the ``offsets`` reply).

Delta names a commit by its engine's operation, which is not what a user did: an append and
an overwrite are both ``WRITE`` (``operationParameters.mode`` tells them apart), a delete
that rewrote files lists the rows it *kept* as added (so ``DELETE +7,802 rows`` for a delete
of 2,198), and a vacuum is two versions, ``VACUUM START`` and ``VACUUM END``. Each version
keeps Delta's name as ``operation`` (what streams and other Delta tools know) and gets:

- ``action``: ``create``, ``append``, ``overwrite``, ``delete``, ``compact``, ``restore``,
  ``vacuum start``/``vacuum end``, ``add columns``, ``merge``, ``update``; anything else is
  Delta's name in lower case. The service's own commits say what they were in their commit
  metadata (``mode``), other writers' are named from Delta's operation;
- ``rows_removed``: the rows it deleted, where the commit says (a delete's, a merge's, an
  update's metrics), else None;
- ``detail``: the condition of a delete or of an overwrite with replaceWhere, the version a
  restore went back to, the files a compaction rewrote or a vacuum deleted; else empty.

Rows, bytes and files *added* are what the version wrote, as before: a stream's backlog
counts them.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow.fs as pafs

from aqueduct_spark.protocol import VersionInfo

from . import delta_log
from .group_commit import METADATA_KEY

_DELTA_ACTIONS = {
    "CREATE TABLE": "create",
    "CREATE TABLE AS SELECT": "create",
    "CREATE OR REPLACE TABLE": "replace",
    "CREATE OR REPLACE TABLE AS SELECT": "replace",
    "STREAMING UPDATE": "append",  # Spark's streaming sink (outputMode append)
    "DELETE": "delete",
    "OPTIMIZE": "compact",
    "RESTORE": "restore",
    "ADD COLUMN": "add columns",  # deltalake's name
    "ADD COLUMNS": "add columns",  # Spark's
    "SET TBLPROPERTIES": "set properties",
}
"""Delta's operation names (deltalake's and Spark's) and what users call them; ``WRITE`` is
an append or an overwrite, by its mode."""
_ROWS_REMOVED = ("num_deleted_rows", "numDeletedRows", "numTargetRowsDeleted")
"""Metrics that count deleted rows: deltalake's delete, Spark's delete, a merge's."""


def history(
    fs: pafs.FileSystem, times: Mapping[int, dt.datetime], versions: Sequence[int]
) -> list[VersionInfo]:
    """The versions given (oldest first), read from their commit files; ``times`` are their
    commit times, the ones time travel uses."""
    out = []
    for v, actions in zip(versions, delta_log.read_logs(fs, versions), strict=True):
        info = delta_log.commit_info(actions)
        meta = info.get(METADATA_KEY)
        if isinstance(meta, dict) and {"rows", "bytes", "files"} <= meta.keys():
            added = (int(meta["rows"]), int(meta["bytes"]), int(meta["files"]))
            change = bool(meta.get("data_change", True))
        else:  # a commit made by another writer, or a delete, restore or compaction of ours
            *counts, change = delta_log.added_by(actions)
            added = (int(counts[0]), int(counts[1]), int(counts[2]))
        action, rows_removed, detail = described(info, actions)
        out.append(
            VersionInfo(
                version=v,
                timestamp=times[v],
                operation=str(info.get("operation", "")),
                rows_added=added[0],
                bytes_added=added[1],
                files_added=added[2],
                data_change=bool(change),
                action=action,
                rows_removed=rows_removed,
                detail=detail,
            )
        )
    return out


def described(
    info: Mapping[str, Any], actions: Sequence[Mapping[str, Any]]
) -> tuple[str, int | None, str]:
    """``(action, rows_removed, detail)`` of one commit (see the module's docstring)."""
    operation = str(info.get("operation", ""))
    params = _mapping(info.get("operationParameters"))
    metrics = _mapping(info.get("operationMetrics"))
    meta = _mapping(info.get(METADATA_KEY))
    mode = meta.get("mode")
    if isinstance(mode, str) and mode:
        action = mode  # the service's own commits say what they were
    elif operation == "WRITE":
        action = "overwrite" if str(params.get("mode", "")).lower() == "overwrite" else "append"
    else:
        action = _DELTA_ACTIONS.get(operation, operation.lower())
    rows_removed = next((_int(metrics[k]) for k in _ROWS_REMOVED if k in metrics), None)
    where = meta.get("replace_where") or params.get("predicate")
    detail = ""
    if action in ("delete", "overwrite", "update", "merge") and isinstance(where, str) and where:
        detail = f"where {where}"
    elif action == "restore" and params.get("version") is not None:
        detail = f"to version {params['version']}"
    elif action == "compact":
        removed = _int(metrics.get("numFilesRemoved", _count(actions, "remove")))
        detail = (
            f"{removed:,} files into {_int(metrics.get('numFilesAdded', _count(actions, 'add'))):,}"
        )
    elif operation == "VACUUM START" and "numFilesToDelete" in metrics:
        detail = f"{_int(metrics['numFilesToDelete']):,} files to delete"
    elif operation == "VACUUM END" and "numDeletedFiles" in metrics:
        detail = f"{_int(metrics['numDeletedFiles']):,} files deleted"
    return action, rows_removed, detail


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _int(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


def _count(actions: Sequence[Mapping[str, Any]], kind: str) -> int:
    return sum(1 for a in actions if isinstance(a.get(kind), Mapping))
