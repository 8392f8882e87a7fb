"""Version ranges and the change feed: what versions did, as files to scan with their change.

Delta's change data feed (CDF) describes each version's row changes with three columns:
``_change_type`` (``insert``, ``delete``, ``update_preimage``, ``update_postimage``),
``_commit_version`` and ``_commit_timestamp``. Per version, as Delta and deltalake's
``load_cdf`` read it: when the commit wrote change files (``cdc`` actions, in
``_change_data/``; a delete or update that rewrote files writes them), those files are the
changes, with ``_change_type`` stored per row; otherwise its data-changing ``add`` actions are
inserts and its data-changing ``remove`` actions deletes (every row of the removed file).
Commits with ``dataChange=false`` (compaction) change nothing.

Datasets the service creates have ``delta.enableChangeDataFeed=true`` (:data:`TABLE_PROPERTIES`),
so deletes record their change files; an older dataset gets the property before its first
delete through the service (:func:`ensure_change_feed`). The change feed of versions written
while the property was off is refused, as Delta refuses it.

Files are planned here (:func:`feed`, :func:`version_entry`) as split dicts with three more
keys, ``change_type`` (None for a change file: the type is in its rows), ``commit_version``
and ``commit_timestamp``; the service's ``scan`` reads such a split with :func:`scan_change`.
A removed file is read at the version before its removal (its schema then). Commit
timestamps are the ones history and time travel use (the commit files' times, made
increasing); deltalake's ``load_cdf`` shows the ``commitInfo`` time, a few ms earlier.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator, Sequence
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.fs as pafs
from deltalake import DeltaTable

from aqueduct_spark.protocol import (
    CHANGE_FIELDS,
    DataLoss,
    InvalidRequest,
    Split,
    VersionNotFound,
    require_int,
)

from . import delta_log, scan, staging
from .tables import Tables

TABLE_PROPERTIES = {"delta.enableChangeDataFeed": "true"}
"""Table properties of every dataset the service creates."""
CDF_KEY = "delta.enableChangeDataFeed"
CHANGE_DIR = "_change_data/"
CHANGE_NAMES = tuple(f.name for f in CHANGE_FIELDS)


def ensure_change_feed(tables: Tables, name: str) -> DeltaTable:
    """The latest table, with the change feed turned on first if it was off."""
    table = tables.open_table(name)
    if table.metadata().configuration.get(CDF_KEY) != "true":
        table.alter.set_table_properties(TABLE_PROPERTIES, raise_if_not_exists=False)
        table = tables.open_table(name)
    return table


def _data_changes(actions: Sequence[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [
        a[kind]
        for a in actions
        if isinstance(a.get(kind), dict) and (kind == "cdc" or a[kind].get("dataChange", True))
    ]


def removed_by(actions: Sequence[dict[str, Any]]) -> int:
    """How many files a commit removed as a change of data (not a compaction's rewrite)."""
    return len(_data_changes(actions, "remove"))


def _typed(schema: pa.Schema, values: dict[str, str | None]) -> dict[str, object]:
    """Delta partition strings as typed values of the partition columns."""
    out: dict[str, object] = {}
    for column, text in (values or {}).items():
        if text is None or column not in schema.names:
            out[column] = None
            continue
        kind = schema.field(column).type
        if pa.types.is_timestamp(kind):  # "2026-01-31 12:00:00" (ISO with a T and Z too)
            when = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
            if kind.tz is not None:
                when = when.replace(tzinfo=dt.UTC) if when.tzinfo is None else when
            else:
                when = when.astimezone(dt.UTC).replace(tzinfo=None) if when.tzinfo else when
            out[column] = when
        else:
            out[column] = pa.scalar(text).cast(kind).as_py()
    return out


def version_entry(
    tables: Tables,
    name: str,
    version: int,
    actions: Sequence[dict[str, Any]],
    timestamp: dt.datetime,
    change_feed: bool,
    read_at: tuple[int, int],
) -> dict[str, Any]:
    """What ``version`` did: its files to read (the change feed's, or the rows it added) in a
    stable order, how many files it added and removed as data changes, and its operation.
    ``read_at`` are the versions whose schema the version's own files and the files it
    removed are read with (the version itself and the one before, or any version with the
    same metadata: a table load each is what makes long ranges slow)."""
    adds = _data_changes(actions, "add")
    removes = _data_changes(actions, "remove")
    cdc = _data_changes(actions, "cdc")
    now, before = read_at
    planned: list[tuple[dict[str, Any], str | None, int]] = []  # action, change, read at
    if change_feed and cdc:
        planned = [(a, None, now) for a in cdc]
    else:
        planned = [(a, "insert", now) for a in adds]
        if change_feed:
            planned += [(a, "delete", before) for a in removes]
    files = []
    for action, change, at in planned:
        schema, _ = tables.pinned(name, at)
        split = Split(
            dataset=name,
            version=at,
            path=unquote(action["path"]),
            row_groups=None,
            partition=_typed(schema, action.get("partitionValues") or {}),
            rows=delta_log.num_records(action),
            bytes=int(action.get("size") or 0),
        ).to_dict()
        split.update(change_type=change, commit_version=version, commit_timestamp=timestamp)
        files.append(split)
    files.sort(key=lambda f: (f["change_type"] or "", f["path"]))
    return {
        "version": version,
        "timestamp": timestamp,
        "operation": str(delta_log.commit_info(actions).get("operation", "")),
        "files": files,
        "adds": len(adds),
        "removes": len(removes),
    }


def _check_enabled(
    tables: Tables, name: str, start: int, logs: Sequence[Sequence[dict[str, Any]]]
) -> None:
    config = tables.open_table(name, start).metadata().configuration
    enabled = config.get(CDF_KEY) == "true"
    for offset, actions in enumerate(logs):
        for a in actions:
            if isinstance(a.get("metaData"), dict):
                enabled = (a["metaData"].get("configuration") or {}).get(CDF_KEY) == "true"
        if not enabled:
            raise InvalidRequest(
                f"dataset {name!r} did not record its change feed at version "
                f"{start + offset} ({CDF_KEY} was off: datasets created before the service "
                "turned it on get it at their first delete). Read the change feed from a later "
                "startingVersion, or read the versions without readChangeFeed"
            )


def feed(
    tables: Tables,
    name: str,
    starting_version: int | None = None,
    ending_version: int | None = None,
    starting_timestamp: dt.datetime | None = None,
    ending_timestamp: dt.datetime | None = None,
    change_feed: bool = False,
    missing_ok: bool = False,
) -> dict[str, Any]:
    """The versions from a start to an end (inclusive; by number or by commit time) with
    :func:`version_entry` for each. The start defaults to the oldest version in the log, the
    end to the latest version, and the end is clamped to it; a start after the latest version is :class:`VersionNotFound`; a start before the
    oldest version still in the log is :class:`DataLoss`."""
    if starting_version is not None and starting_timestamp is not None:
        raise InvalidRequest("give a starting version or a starting timestamp, not both")
    if ending_version is not None and ending_timestamp is not None:
        raise InvalidRequest("give an ending version or an ending timestamp, not both")
    if not tables.exists(name):
        tables.latest_version(name)  # DatasetNotFound
    fs = tables.filesystem(name)
    times = delta_log.commit_times(fs)
    if not times:
        raise VersionNotFound(f"dataset {name!r} has no versions")
    first, latest = min(times), max(times)
    if starting_timestamp is not None:
        after = [v for v, t in times.items() if t >= starting_timestamp]
        start = min(after) if after else latest + 1
    elif starting_version is None:
        start = first  # the earliest version still in the log
    else:
        start = require_int(starting_version, "starting_version")
        if start < 0:
            raise InvalidRequest(
                f"starting_version must be >= 0, got {start}; pick one from aqueduct history {name}"
            )
        if start > latest:
            raise VersionNotFound(
                f"dataset {name!r} has no version {start} yet (the latest is {latest})"
            )
    end = latest
    if ending_version is not None:
        end = min(require_int(ending_version, "ending_version"), latest)
    elif ending_timestamp is not None:
        end = max((v for v, t in times.items() if t <= ending_timestamp), default=-1)
    if start < first and end >= start:
        raise DataLoss(
            f"versions {start} to {first - 1} of dataset {name!r} are no longer in its log "
            f"(cleaned up); the oldest version available is {first}"
        )
    versions = list(range(start, end + 1))
    logs = delta_log.read_logs(fs, versions)
    if change_feed and versions:
        _check_enabled(tables, name, start, logs)
    entries = []
    # The schema changes only at versions with a metaData action: files are read at the last
    # such version (or the start), so a range loads the table a few times, not once a version.
    before, now = max(start - 1, first), start
    for v, actions in zip(versions, logs, strict=True):
        if v > start and any(isinstance(a.get("metaData"), dict) for a in actions):
            now = v
        entries.append(
            version_entry(tables, name, v, actions, times[v], change_feed, (now, before))
        )
        before = now
    paths = [f["path"] for e in entries for f in e["files"]]
    gone = [i.path for i in fs.get_file_info(paths) if i.type == pafs.FileType.NotFound]
    if gone and not missing_ok:
        raise DataLoss(
            f"{len(gone)} data files of dataset {name!r} in versions {start} to {end} are gone "
            f"(vacuumed), e.g. {gone[0]!r}"
        )
    schema, _, table_id = tables.pinned_meta(name, max(end, first))
    return {
        "latest": latest,
        "table_id": table_id,
        "schema": schema,
        "versions": entries,
        "missing": gone,
    }


def check_change_path(path: str, change_type: Any) -> str:
    """The path of a change split: a data file, or a change file under ``_change_data/``."""
    if change_type is None:
        if not isinstance(path, str) or not path.startswith(CHANGE_DIR):
            raise InvalidRequest(
                f"a change split without change_type must be a change file, not {path!r}"
            )
        staging.check_relative_path(path[len(CHANGE_DIR) :])
        return path
    if change_type not in ("insert", "delete"):
        raise InvalidRequest(f"change_type must be insert, delete or absent, got {change_type!r}")
    return staging.check_relative_path(path)


def scan_change(
    tables: Tables,
    raw: dict[str, Any],
    columns: Sequence[str] | None = None,
    batch_rows: int = 65536,
) -> Iterator[pa.RecordBatch]:
    """The rows of one change split with ``_change_type``, ``_commit_version`` and
    ``_commit_timestamp`` (any of the columns may be asked for, in any order)."""
    split = Split.from_dict(raw)
    change = raw.get("change_type")
    check_change_path(split.path, change)
    version = require_int(raw.get("commit_version"), "commit_version")
    stamp = raw.get("commit_timestamp")
    if not isinstance(stamp, dt.datetime):
        raise InvalidRequest(f"commit_timestamp must be a timestamp, got {stamp!r}")
    if require_int(batch_rows, "batch_rows") <= 0:
        raise InvalidRequest(
            f"batch_rows must be positive, got {batch_rows}; leave it out for the default"
        )
    schema, parts = tables.pinned(split.dataset, split.version)
    wanted = list(columns) if columns is not None else [*schema.names, *CHANGE_NAMES]
    unknown = [c for c in wanted if c not in schema.names and c not in CHANGE_NAMES]
    if unknown:
        raise InvalidRequest(
            f"unknown columns {unknown}; choose from the change feed's {[*schema.names, *CHANGE_NAMES]}"
        )
    data = [c for c in wanted if c in schema.names]
    read = data + (["_change_type"] if change is None else [])
    file_schema = schema.append(CHANGE_FIELDS[0]) if change is None else schema
    fs = tables.filesystem(split.dataset)
    if fs.get_file_info(split.path).type != pafs.FileType.File:
        raise DataLoss(
            f"file {split.path!r} of dataset {split.dataset!r} (version {version}'s changes) is "
            "gone: it was vacuumed. Read the change feed from a later version"
        )
    out_schema = pa.schema([*(schema.field(c) for c in data), *CHANGE_FIELDS])
    out_schema = pa.schema([out_schema.field(c) for c in wanted])
    for batch in scan.read_split(
        fs=fs,
        schema=file_schema,
        partition_by=parts,
        split=split,
        columns=read,
        out_schema=pa.schema([file_schema.field(c) for c in read]),
        filter=None,
        batch_rows=batch_rows,
    ):
        n = batch.num_rows
        extra = {
            "_change_type": batch.column("_change_type")
            if change is None
            else pa.array([change] * n, pa.string()),
            "_commit_version": pa.array([version] * n, pa.int64()),
            "_commit_timestamp": pa.array([stamp] * n, CHANGE_FIELDS[2].type),
        }
        arrays = [batch.column(c) if c in data else extra[c] for c in wanted]
        yield pa.RecordBatch.from_arrays(arrays, schema=out_schema)
