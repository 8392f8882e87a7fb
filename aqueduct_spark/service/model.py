"""The store's vocabulary: its errors (one per service status code) and value classes.

Split out of :mod:`.store`; ``store`` re-exports every name, so ``store.Split`` and
``store.DatasetNotFound`` keep working.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import pyarrow as pa

from aqueduct_core.errors import AqueductError

# ---------------------------------------------------------------------------------------------
# Errors: one class per service status code


class StoreError(AqueductError):
    """Base class of store errors. ``code`` is the service status that crosses the wire."""

    code = "INTERNAL"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class DatasetNotFound(StoreError):
    """No dataset of that name (never created, or dropped)."""

    code = "NOT_FOUND"


class DatasetExists(StoreError):
    """A create found the dataset already there."""

    code = "ALREADY_EXISTS"


class SchemaMismatch(StoreError):
    """The data's schema does not fit the dataset, or Delta Lake cannot store it."""

    code = "SCHEMA_MISMATCH"


class Conflict(StoreError):
    """Concurrent commits changed the table in a way this commit cannot be rebased onto.
    The staged files are kept; retrying the commit is safe."""

    code = "CONFLICT"


class InvalidRequest(StoreError):
    """The request itself is wrong (a name, version, filter, path, id...). Not retryable."""

    code = "INVALID_REQUEST"


class VersionNotFound(StoreError):
    """Time travel to a version or time the table does not have (or no longer has)."""

    code = "VERSION_NOT_FOUND"


class DataLoss(StoreError):
    """Files a version needs are gone (vacuumed, or deleted outside the service)."""

    code = "DATA_LOSS"


# ---------------------------------------------------------------------------------------------
# Values


def _int(v: Any, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise InvalidRequest(f"{what} must be an integer, got {v!r}")
    return v


def _fields(cls: type, d: Mapping[str, Any]) -> dict[str, Any]:
    if not isinstance(d, Mapping):
        raise InvalidRequest(f"expected a mapping for {cls.__name__}, got {type(d).__name__}")
    names = [f.name for f in dataclasses.fields(cls)]
    missing = [n for n in names if n not in d]
    if missing:
        raise InvalidRequest(f"{cls.__name__} is missing fields {missing}")
    return {n: d[n] for n in names}


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
    name: str
    version: int
    schema: pa.Schema
    partition_by: tuple[str, ...]
    rows: int
    bytes: int
    files: int
    created: dt.datetime | None
    updated: dt.datetime | None


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
            version=_int(f["version"], "version"),
            path=str(f["path"]),
            row_groups=None if rgs is None else tuple(_int(i, "row group") for i in rgs),
            partition={str(k): _from_plain(v) for k, v in partition.items()},
            rows=_int(f["rows"], "rows"),
            bytes=_int(f["bytes"], "bytes"),
        )


@dataclass(frozen=True)
class ScanPlan:
    dataset: str
    version: int
    schema: pa.Schema
    splits: list[Split]
    rows: int
    bytes: int


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
            size=_int(f["size"], "size"),
            rows=_int(f["rows"], "rows"),
            partition_values=dict(pv),
            stats=str(f["stats"]),
            modification_time=_int(f["modification_time"], "modification_time"),
        )


@dataclass(frozen=True)
class CommitResult:
    version: int
    rows: int
    bytes: int
    files: int
    committed: bool  # False: the app transaction was already applied; nothing was written


@dataclass(frozen=True)
class VersionInfo:
    version: int
    timestamp: dt.datetime
    operation: str
    rows_added: int
    bytes_added: int
    files_added: int
    data_change: bool


def _staged(files: Sequence[StagedFile | Mapping[str, Any]]) -> list[StagedFile]:
    if isinstance(files, Mapping | str | bytes):
        raise InvalidRequest("staged must be a list of staged files")
    return [f if isinstance(f, StagedFile) else StagedFile.from_dict(f) for f in files]


# ---------------------------------------------------------------------------------------------
# The store
