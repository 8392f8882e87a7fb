"""The values requests and replies carry (§4 of ``docs/dataset-protocol.md``), typed, with
their wire forms: what the service's store returns and what the client reads back.

``to_dict``/``from_dict`` (splits and staged files, which clients hand back unchanged) and
``to_wire``/``from_wire`` give and take plain CBOR values; ``from_*`` check what they are given
and raise :class:`~.errors.InvalidRequest` for anything malformed.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import pyarrow as pa

from .arrow import schema_from_bytes, schema_to_bytes
from .errors import InvalidRequest

CHANGE_FIELDS = (
    pa.field("_change_type", pa.string()),
    pa.field("_commit_version", pa.int64()),
    pa.field("_commit_timestamp", pa.timestamp("us", tz="UTC")),
)
"""The columns a scan of a change-feed split adds after the dataset's (the ``feed`` request):
Delta's change data feed columns."""


def require_int(v: Any, what: str) -> int:
    """``v`` if it is an integer (not a bool), else :class:`InvalidRequest` naming ``what``."""
    if isinstance(v, bool) or not isinstance(v, int):
        raise InvalidRequest(f"{what} must be an integer, got {v!r}")
    return v


def _fields(cls: type, d: Mapping[str, Any]) -> dict[str, Any]:
    what = _wire_noun(cls)
    if not isinstance(d, Mapping):
        raise InvalidRequest(f"{what} must be a map of its fields, got {d!r:.100}")
    names = [f.name for f in dataclasses.fields(cls)]
    missing = [n for n in names if n not in d]
    if missing:
        raise InvalidRequest(f"{what} is missing fields {missing}")
    return {n: d[n] for n in names}


def _wire_noun(cls: type) -> str:
    """What the protocol calls a value of ``cls`` (``StagedFile``: ``a staged file``)."""
    words = re.sub(r"(?<!^)(?=[A-Z])", " ", cls.__name__).lower()
    return f"a {words}"


def _to_plain(v: Any) -> Any:
    """A typed partition value as a CBOR/JSON-friendly value, tagged when not native."""
    if v is None or isinstance(v, bool | int | float | str | bytes):
        return v
    if isinstance(v, dt.datetime):
        return {"timestamp": v.isoformat()}
    if isinstance(v, dt.date):
        return {"date": v.isoformat()}
    if isinstance(v, Decimal):
        return {"decimal": str(v)}
    raise TypeError(f"unsupported partition value {v!r}")


def _from_plain(v: Any) -> Any:
    if not isinstance(v, dict):
        return v
    parse = {
        "timestamp": dt.datetime.fromisoformat,
        "date": dt.date.fromisoformat,
        "decimal": Decimal,
    }
    try:
        ((kind, text),) = v.items()
        return parse[kind](text)  # type: ignore[operator]
    except (ValueError, TypeError, KeyError, ArithmeticError) as exc:
        raise InvalidRequest(f"invalid partition value {v!r}") from exc


@dataclass(frozen=True)
class DatasetInfo:
    """A dataset as ``describe`` and ``list`` answer: the latest version, or the one time travel
    selected. ``bytes`` and ``files`` count its live data files."""

    name: str
    version: int
    schema: pa.Schema
    partition_by: tuple[str, ...]
    rows: int
    bytes: int
    files: int
    created: dt.datetime | None
    updated: dt.datetime | None

    def to_wire(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "version": self.version,
            "schema": schema_to_bytes(self.schema),
            "partition_by": list(self.partition_by),
            "rows": self.rows,
            "bytes": self.bytes,
            "files": self.files,
            "created": self.created,
            "updated": self.updated,
        }

    @classmethod
    def from_wire(cls, d: Mapping[str, Any]) -> DatasetInfo:
        """A ``describe`` result (or an entry of ``list``) as the service sent it."""
        return cls(
            name=d["name"],
            version=d["version"],
            schema=schema_from_bytes(d["schema"]),
            partition_by=tuple(d.get("partition_by") or ()),
            rows=d["rows"],
            bytes=d["bytes"],
            files=d.get("files", 0),
            created=d.get("created"),
            updated=d.get("updated"),
        )


@dataclass(frozen=True)
class Split:
    """One unit of a scan: a data file (or some of its row groups) of one pinned version.
    ``path`` is relative to the table; ``partition`` holds typed partition values."""

    dataset: str
    version: int
    path: str
    row_groups: tuple[int, ...] | None
    partition: dict[str, object]
    rows: int
    bytes: int

    def to_dict(self) -> dict[str, Any]:
        """Plain values only; dates, timestamps and decimals become one-key tagged dicts."""
        return {
            "dataset": self.dataset,
            "version": self.version,
            "path": self.path,
            "row_groups": None if self.row_groups is None else list(self.row_groups),
            "partition": {k: _to_plain(v) for k, v in self.partition.items()},
            "rows": self.rows,
            "bytes": self.bytes,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Split:
        f = _fields(cls, d)
        rgs, partition = f["row_groups"], f["partition"]
        if not isinstance(partition, Mapping) or not isinstance(rgs, list | tuple | None):
            raise InvalidRequest(f"invalid split {dict(d)!r}")
        return cls(
            dataset=str(f["dataset"]),
            version=require_int(f["version"], "version"),
            path=str(f["path"]),
            row_groups=None if rgs is None else tuple(require_int(i, "row group") for i in rgs),
            partition={str(k): _from_plain(v) for k, v in partition.items()},
            rows=require_int(f["rows"], "rows"),
            bytes=require_int(f["bytes"], "bytes"),
        )


@dataclass(frozen=True)
class ScanPlan:
    """Splits of one pinned version, and ``tasks``: the splits packed into units of work
    (indexes into ``splits``, consecutive, each split in exactly one task). A client that
    does not know tasks scans each split on its own, as before tasks existed."""

    dataset: str
    version: int
    schema: pa.Schema
    splits: list[Split]
    rows: int
    bytes: int
    tasks: list[tuple[int, ...]] | None = None
    """None: one task per split."""

    def to_wire(self) -> dict[str, Any]:
        tasks = self.tasks if self.tasks is not None else [(i,) for i in range(len(self.splits))]
        return {
            "dataset": self.dataset,
            "version": self.version,
            "schema": schema_to_bytes(self.schema),
            "splits": [s.to_dict() for s in self.splits],
            "rows": self.rows,
            "bytes": self.bytes,
            "tasks": [list(t) for t in tasks],
        }


def pack_tasks(
    sizes: Sequence[int], target_bytes: int, open_cost: int, min_tasks: int = 1
) -> list[tuple[int, ...]]:
    """Splits of the given byte ``sizes`` grouped into tasks: indexes, consecutive, each split
    in exactly one task, a task always with at least one (how a plan's ``tasks`` are made).

    A split costs its bytes plus ``open_cost``, and a task at most ``target_bytes`` (Spark's
    ``maxPartitionBytes`` and ``openCostInBytes``). There are as many tasks as that needs, but
    at least ``min_tasks`` (the cores that will read them, as Spark's ``minPartitionNum``), and
    they share the cost evenly: 2,000 small files in two tasks are 1,000 each, not 1,950 and
    50, and a table too small to fill the cores is spread over them rather than left in one."""
    costs = [size + open_cost for size in sizes]
    total = sum(costs)
    target = max(1, target_bytes)
    share = total / max(1, min_tasks, -(-total // target))  # each task's even share
    tasks: list[tuple[int, ...]] = []
    group: list[int] = []
    cost = before = 0
    for i, c in enumerate(costs):
        # close the task at the target, or where this split's middle passes the task's share
        if group and (cost + c > target or before + cost + c / 2 > share * (len(tasks) + 1)):
            tasks.append(tuple(group))
            before += cost
            group, cost = [], 0
        group.append(i)
        cost += c
    if group:
        tasks.append(tuple(group))
    return tasks


@dataclass(frozen=True)
class StagedFile:
    """A Parquet file a write task staged; invisible until a commit names it.
    ``partition_values`` are Delta partition strings; ``stats`` is Delta statistics JSON."""

    path: str
    size: int
    rows: int
    partition_values: dict[str, str | None]
    stats: str
    modification_time: int

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> StagedFile:
        f = _fields(cls, d)
        pv = f["partition_values"]
        if not isinstance(pv, Mapping) or not all(
            isinstance(k, str) and (v is None or isinstance(v, str)) for k, v in pv.items()
        ):
            raise InvalidRequest(f"invalid partition values {pv!r} in a staged file")
        return cls(
            path=str(f["path"]),
            size=require_int(f["size"], "size"),
            rows=require_int(f["rows"], "rows"),
            partition_values=dict(pv),
            stats=str(f["stats"]),
            modification_time=require_int(f["modification_time"], "modification_time"),
        )


@dataclass(frozen=True)
class CommitResult:
    version: int
    rows: int
    bytes: int
    files: int
    committed: bool  # False: the app transaction was already applied; nothing was written

    def to_wire(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "rows": self.rows,
            "bytes": self.bytes,
            "files": self.files,
            "committed": self.committed,
        }


@dataclass(frozen=True)
class VersionInfo:
    version: int
    timestamp: dt.datetime
    operation: str
    rows_added: int
    bytes_added: int
    files_added: int
    data_change: bool
    action: str = ""
    """What the version did as users name it: ``append``, ``overwrite``, ``delete``,
    ``vacuum start``, ... (``operation`` is Delta's name: ``WRITE``, ``DELETE``, ...)."""
    rows_removed: int | None = None
    """Rows the version deleted, where its commit says (a delete's); else None."""
    detail: str = ""
    """A delete's or replaceWhere's condition, a restore's version, a vacuum's files."""

    def to_wire(self) -> dict[str, Any]:
        """One entry of the ``offsets`` reply's ``versions``."""
        return {
            "version": self.version,
            "timestamp": self.timestamp,
            "operation": self.operation,
            "rows": self.rows_added,
            "bytes": self.bytes_added,
            "data_change": self.data_change,
            "action": self.action,
            "rows_removed": self.rows_removed,
            "detail": self.detail,
        }


def staged_list(files: Sequence[StagedFile | Mapping[str, Any]]) -> list[StagedFile]:
    """Staged files given as objects or as their wire maps, as objects."""
    if isinstance(files, Mapping | str | bytes):
        raise InvalidRequest("staged must be a list of staged files")
    return [f if isinstance(f, StagedFile) else StagedFile.from_dict(f) for f in files]
