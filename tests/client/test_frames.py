"""The Python client writes pandas and Polars frames and reads into them (issue 20, item 7),
and closes its connection as a context manager."""

from __future__ import annotations

import builtins
import datetime as dt
from typing import Any

import pandas as pd
import polars as pl
import pyarrow as pa
import pytest

from aqueduct_spark.client import frames
from aqueduct_spark.testing import ServiceProcess

pytestmark = pytest.mark.quic


def test_a_pandas_frame_is_written_without_its_index(service: ServiceProcess) -> None:
    df = pd.DataFrame(
        {"id": [1, 2, 3], "name": ["a", None, "c"], "when": pd.to_datetime(["2026-01-01"] * 3)},
        index=[10, 20, 30],
    )
    with service.client() as client:
        client.write("pandas_in", df)
        back = client.to_pandas("pandas_in")
    assert list(back.columns) == ["id", "name", "when"]  # no __index_level_0__
    assert back.sort_values("id")["name"].tolist() == ["a", None, "c"]
    assert back["when"].iloc[0] == pd.Timestamp("2026-01-01")


def test_a_polars_frame_round_trips(service: ServiceProcess) -> None:
    df = pl.DataFrame(
        {
            "id": [1, 2, None],
            "city": ["Oslo", "Lima", "Pune"],  # Polars sends string views: stored as strings
            "day": [dt.date(2026, 1, d) for d in (1, 2, 3)],
            "tags": [["x"], [], ["y", "z"]],
        }
    )
    with service.client() as client:
        client.write("polars_in", df)
        client.append("polars_in", df.head(1))
        assert client.describe("polars_in").schema.field("city").type == pa.string()
        back = client.to_polars("polars_in", filter=[("city", "==", "Oslo")])
    assert isinstance(back, pl.DataFrame)
    assert back.to_dicts() == [df.row(0, named=True)] * 2


def test_anything_with_an_arrow_stream_is_written(service: ServiceProcess) -> None:
    class Stream:  # e.g. a DuckDB relation or a nanoarrow stream: only the protocol
        def __arrow_c_stream__(self, requested_schema: Any = None) -> Any:
            return pa.table({"n": [1, 2]}).__arrow_c_stream__(requested_schema)

    with service.client() as client:
        assert client.write("stream_in", Stream())["rows"] == 2


def test_to_polars_without_polars_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    real_import = builtins.__import__

    def no_polars(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "polars":
            raise ModuleNotFoundError("No module named 'polars'", name="polars")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_polars)
    with pytest.raises(ModuleNotFoundError, match="pip install polars"):
        frames.to_polars(pa.table({"n": [1]}))


def test_a_polars_frame_crosses_without_copying_its_numbers() -> None:
    df = pl.DataFrame({"n": list(range(1000))})
    table = frames.to_arrow(df)
    assert table.column("n").chunk(0).buffers()[1].address == (
        df.to_arrow().column("n").chunk(0).buffers()[1].address
    )


def test_the_client_closes_its_connection_on_leaving_with(service: ServiceProcess) -> None:
    with service.client() as client:
        client.list()
        assert client.transport is not None
    assert client.transport is None  # the pooled connection is closed and unpooled


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (pl.DataFrame({"n": [1]}).lazy(), r"LazyFrame .* collect\(\) it first"),
        ({"n": [1]}, r"cannot write a dict: give a pyarrow Table"),
        (42, r"cannot write a int"),
    ],
)
def test_what_cannot_be_written_is_named_before_connecting(data: Any, message: str) -> None:
    with pytest.raises(TypeError, match=message):
        frames.to_arrow(data)
