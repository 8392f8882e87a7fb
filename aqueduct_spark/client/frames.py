"""Data frames in and out of the client: pandas and Polars (and anything else that speaks the
Arrow PyCapsule stream protocol) become Arrow to be written; a read Arrow table becomes a
pandas or Polars frame.

Neither library is imported unless the data is one of its frames or the caller asks for one,
so neither is a dependency. Conversions do not copy where Arrow can avoid it: a Polars frame
hands its buffers over through ``__arrow_c_stream__``, and ``pl.from_arrow`` takes them back.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping
from typing import Any

import pyarrow as pa


def to_arrow(data: Any) -> Any:
    """``data`` as a ``pa.Table`` if it is a data frame; anything else unchanged (a Table, a
    RecordBatch or an iterable of batches is the writer's own business).

    A pandas frame's index is not written (as with ``to_parquet(index=False)``): call
    ``reset_index()`` first to keep it as a column. Any object with ``__arrow_c_stream__``
    (Polars, DuckDB relations, nanoarrow, pandas itself) is read through that protocol.
    """
    if isinstance(data, pa.Table | pa.RecordBatch | pa.RecordBatchReader):
        return data
    pandas = sys.modules.get("pandas")
    if pandas is not None and isinstance(data, pandas.DataFrame):
        # from_pandas rather than the stream protocol: it can leave the index out
        table = pa.Table.from_pandas(data, preserve_index=False)
        return table.replace_schema_metadata(None)
    if hasattr(data, "__arrow_c_stream__"):
        return pa.table(data)
    if type(data).__module__.startswith("polars"):
        if hasattr(data, "collect"):
            raise TypeError("a Polars LazyFrame cannot be written as it is: collect() it first")
        if hasattr(data, "to_arrow"):
            return data.to_arrow()  # an old Polars without the stream protocol
    if not isinstance(data, Iterable) or isinstance(data, str | bytes | Mapping):
        raise TypeError(
            f"cannot write a {type(data).__name__}: give a pyarrow Table or RecordBatch, an "
            "iterable of RecordBatches, a pandas or Polars DataFrame, or any object with "
            "__arrow_c_stream__"
        )
    return data


def to_pandas(table: pa.Table) -> Any:
    """``table`` as a pandas DataFrame (pandas comes with pyarrow's own ``to_pandas``)."""
    try:
        return table.to_pandas()
    except ModuleNotFoundError as exc:
        raise ModuleNotFoundError(
            "to_pandas() needs pandas, which is not installed: pip install pandas"
        ) from exc


def to_polars(table: pa.Table) -> Any:
    """``table`` as a Polars DataFrame, sharing the Arrow buffers where Polars can."""
    try:
        import polars as pl
    except ModuleNotFoundError as exc:
        raise ModuleNotFoundError(
            "to_polars() needs Polars, which is not installed: pip install polars"
        ) from exc
    return pl.from_arrow(table)
