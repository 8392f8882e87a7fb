"""Delta statistics (numRecords, minValues, maxValues, nullCount) from a Parquet footer alone,
so a commit never reads the data again and readers can skip files (:mod:`.scan`).

A statistic is left out whenever it could mislead: a bound must hold for every row. Strings
longer than 64 characters get no maximum (a truncated maximum is not an upper bound);
timestamps are rounded outwards to the milliseconds Delta keeps; floats, decimals, booleans
and binary get null counts only.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

# Longer strings get no max statistic (a truncated max is not an upper bound).
_MAX_STAT_CHARS = 64


def _leaves(t: pa.DataType) -> int:
    """How many Parquet leaf columns a field of this type takes."""
    if pa.types.is_struct(t):
        return sum(_leaves(t.field(i).type) for i in range(t.num_fields))
    if pa.types.is_map(t):
        return _leaves(t.key_type) + _leaves(t.item_type)
    if pa.types.is_list(t):
        return _leaves(t.value_type)
    return 1


def _ms(v: dt.datetime, up: bool) -> dt.datetime:
    """Round to whole milliseconds: Delta statistics carry timestamps with ms precision."""
    floor = v.replace(microsecond=v.microsecond - v.microsecond % 1000)
    if up and floor != v:
        return floor + dt.timedelta(milliseconds=1)
    return floor


def _stat(v: Any, t: pa.DataType, up: bool) -> Any:
    """A Parquet statistic as a Delta statistic JSON value, or None to leave it out."""
    if v is None:
        return None
    if pa.types.is_timestamp(t) and isinstance(v, dt.datetime):
        utc = v.tzinfo is not None
        if utc:
            v = v.astimezone(dt.UTC).replace(tzinfo=None)
        try:
            bound = _ms(v, up)
        except OverflowError:
            return None  # above 9999-12-31 23:59:59.999: no millisecond bound exists
        # isoformat, not strftime: %Y gives "1", not "0001", for the year 1 on Linux
        return bound.isoformat(timespec="milliseconds") + ("Z" if utc else "")
    if pa.types.is_date(t) and isinstance(v, dt.date):
        return v.isoformat()
    if pa.types.is_integer(t) and isinstance(v, int):
        return v
    if pa.types.is_string(t) and isinstance(v, str):
        if len(v) <= _MAX_STAT_CHARS:
            return v
        return None if up else v[:_MAX_STAT_CHARS]  # a prefix is still a lower bound
    # floats (NaN is not in Parquet min/max but other engines order it), decimals (JSON numbers
    # would round), booleans and binary: null counts only
    return None


def stats_from_metadata(md: pq.FileMetaData, file_schema: pa.Schema) -> str:
    """Delta statistics JSON for a Parquet file, from its footer alone."""
    mins: dict[str, Any] = {}
    maxs: dict[str, Any] = {}
    nulls: dict[str, int] = {}
    leaf = 0
    for field in file_schema:
        ci, leaf = leaf, leaf + _leaves(field.type)
        if pa.types.is_nested(field.type):
            continue
        lo = hi = None
        nc = 0
        known = bounded = True
        for rg in range(md.num_row_groups):
            n = md.row_group(rg).num_rows
            st = md.row_group(rg).column(ci).statistics
            if n == 0:
                continue
            if st is None or not st.has_null_count:
                known = False
                break
            nc += st.null_count
            if st.null_count == n:
                continue  # all null: nothing to bound
            a = _stat(st.min, field.type, False) if st.has_min_max else None
            b = _stat(st.max, field.type, True) if st.has_min_max else None
            if a is None or b is None:
                bounded = False
                continue
            lo = a if lo is None else min(lo, a)
            hi = b if hi is None else max(hi, b)
        if not known:
            continue
        nulls[field.name] = nc
        if bounded and lo is not None and hi is not None:
            mins[field.name] = lo
            maxs[field.name] = hi
    return json.dumps(
        {"numRecords": md.num_rows, "minValues": mins, "maxValues": maxs, "nullCount": nulls}
    )
