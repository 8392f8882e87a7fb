"""Arrow types through stage + commit and plan + scan, compared with the input and deltalake."""

from __future__ import annotations

import datetime as dt
import json
import os
from decimal import Decimal
from zoneinfo import ZoneInfo

import pyarrow as pa
import pytest
from delta_store_helpers import read, stage, write
from deltalake import DeltaTable

from aqueduct_spark.protocol import SchemaMismatch
from aqueduct_spark.service.delta_types import delta_schema
from aqueduct_spark.service.store import Store

UTC = dt.UTC
NY = ZoneInfo("America/New_York")

MATRIX = pa.schema(
    [
        ("id", pa.int64()),
        ("i8", pa.int8()),
        ("i16", pa.int16()),
        ("i32", pa.int32()),
        ("i64", pa.int64()),
        ("f32", pa.float32()),
        ("f64", pa.float64()),
        ("dec", pa.decimal128(38, 10)),
        ("s", pa.string()),
        ("bin", pa.binary()),
        ("b", pa.bool_()),
        ("day", pa.date32()),
        ("ts", pa.timestamp("us", "UTC")),
        ("ntz", pa.timestamp("us")),
        ("l", pa.list_(pa.field("element", pa.int64()))),
        ("m", pa.map_(pa.string(), pa.int64())),
        ("st", pa.struct([("a", pa.int32()), ("b", pa.string())])),
        (
            "ls",
            pa.list_(
                pa.field(
                    "element",
                    pa.struct(
                        [("x", pa.int64()), ("y", pa.list_(pa.field("element", pa.string())))]
                    ),
                )
            ),
        ),
    ]
)


def matrix_rows() -> list[dict]:
    big = Decimal("1234567890123456789012345678.0123456789")
    full = {
        "i8": -128,
        "i16": 32767,
        "i32": -(2**31),
        "i64": 2**63 - 1,
        "f32": 1.5,
        "f64": -2.25e300,
        "dec": big,
        "s": "héllo, 世界 🌍",
        "bin": b"\x00\xff\x10",
        "b": True,
        "day": dt.date(1969, 12, 31),
        "ts": dt.datetime(2024, 2, 29, 23, 59, 59, 999999, tzinfo=UTC),
        "ntz": dt.datetime(1900, 1, 1, 0, 0, 0, 1),
        "l": [1, None, 3],
        "m": [("a", 1), ("b", None)],
        "st": {"a": 1, "b": "x"},
        "ls": [{"x": 1, "y": ["p", None]}, None, {"x": None, "y": None}],
    }
    edge = {
        "i8": 0,
        "i16": -1,
        "i32": 7,
        "i64": -(2**63),
        "f32": -0.0,
        "f64": float("inf"),
        "dec": -big,
        "s": "",
        "bin": b"",
        "b": False,
        "day": dt.date(9999, 12, 31),
        "ts": dt.datetime(1970, 1, 1, tzinfo=UTC),
        "ntz": dt.datetime(2038, 1, 19, 3, 14, 8),
        "l": [],
        "m": [],
        "st": {"a": None, "b": None},
        "ls": [],
    }
    nulls = dict.fromkeys(full)
    return [
        {"id": i, **row}
        for i, row in enumerate(
            [full, edge, nulls, {**full, "s": None, "l": None}, {**edge, "st": None}]
        )
    ]


@pytest.fixture(params=["local", "file-uri"])
def store(request: pytest.FixtureRequest, tmp_path) -> Store:
    root = tmp_path / "root"
    return Store(str(root) if request.param == "local" else root.as_uri())


def test_type_matrix_round_trip(store: Store) -> None:
    data = pa.Table.from_pylist(matrix_rows() * 3, schema=MATRIX)
    data = data.set_column(0, "id", pa.array(range(data.num_rows), pa.int64()))
    write(store, "types", data, tasks=2, batch_rows=4)
    info = store.describe("types")
    assert info.schema == MATRIX and info.rows == data.num_rows
    got = read(store, "types").sort_by("id")
    assert got.schema == MATRIX
    assert got.equals(data)
    direct = DeltaTable(os.path.join(store._local_root or "", "types")).to_pyarrow_table()
    assert direct.sort_by("id").equals(data)
    # and once more by another route: partitioned on a few primitive columns
    write(store, "types_p", data, partition_by=["i8", "day", "b"])
    assert read(store, "types_p").sort_by("id").equals(data)


def test_all_null_columns_get_no_bounds(store: Store) -> None:
    data = pa.Table.from_pylist([{"id": i} for i in range(3)], schema=MATRIX)
    _, staged = stage(store, "n", data)
    stats = json.loads(staged[0].stats)
    assert stats["numRecords"] == 3
    assert stats["nullCount"]["s"] == 3 and "s" not in stats["minValues"]
    assert stats["minValues"]["id"] == 0 and stats["maxValues"]["id"] == 2


def test_types_are_normalised_to_delta(tmp_path) -> None:
    store = Store(str(tmp_path))
    ns = pa.array([1_000_000_001_999, None], pa.timestamp("ns"))  # sub-microsecond part
    data = pa.table(
        {
            "u8": pa.array([255, None], pa.uint8()),
            "u64": pa.array([2**63 - 1, 0], pa.uint64()),
            "ls": pa.array(["a", None], pa.large_string()),
            "sv": pa.array(["v", "w"], pa.string_view()),
            "lb": pa.array([b"x", None], pa.large_binary()),
            "fb": pa.array([b"ab", b"cd"], pa.binary(2)),
            "dict": pa.array(["k", "k"]).dictionary_encode(),
            "ns": ns,
            "ny": pa.array(
                [dt.datetime(2024, 1, 1, 12, tzinfo=NY)] * 2, pa.timestamp("ms", str(NY))
            ),
            "d64": pa.array([dt.date(2024, 1, 1), None], pa.date64()),
            "f16": pa.array([1.5, None], pa.float16()),
            "ll": pa.array([[1], None], pa.large_list(pa.int32())),
            "fl": pa.array([[1, 2], [3, 4]], pa.list_(pa.int8(), 2)),
        }
    )
    write(store, "norm", data)
    info = store.describe("norm")
    assert info.schema == delta_schema(data.schema)
    assert [str(f.type) for f in info.schema] == [
        "int16",
        "int64",
        "string",
        "string",
        "binary",
        "binary",
        "string",
        "timestamp[us]",
        "timestamp[us, tz=UTC]",
        "date32[day]",
        "float",
        "list<element: int32>",
        "list<element: int8>",
    ]
    row = read(store, "norm").to_pylist()[0]
    assert row["u8"] == 255 and row["u64"] == 2**63 - 1 and row["dict"] == "k"
    assert row["ns"] == dt.datetime(1970, 1, 1, 0, 16, 40, 1)  # 1.999 us truncated
    assert row["ny"] == dt.datetime(2024, 1, 1, 17, tzinfo=UTC)  # the same instant, in UTC
    assert row["fb"] == b"ab" and row["fl"] == [1, 2] and row["f16"] == 1.5
    # appending with the original (non-Delta) types is compatible
    write(store, "norm", data)
    assert store.describe("norm").rows == 4


@pytest.mark.parametrize(
    ("arrow_type", "needle"),
    [
        (pa.time64("us"), "time64"),
        (pa.duration("s"), "duration"),
        (pa.null(), "real type"),
        (pa.decimal256(50, 2), "precision"),
        (pa.struct([]), "struct without fields"),
        (pa.list_(pa.time32("s")), "time32"),
    ],
)
def test_unsupported_types(tmp_path, arrow_type: pa.DataType, needle: str) -> None:
    store = Store(str(tmp_path))
    schema = pa.schema([("id", pa.int64()), ("bad", arrow_type)])
    with pytest.raises(SchemaMismatch, match=needle) as e:
        store.check_schema("d", schema, "append")
    assert "'bad" in str(e.value)
    with pytest.raises(SchemaMismatch):
        store.create("d", schema)


def test_values_that_do_not_fit(tmp_path) -> None:
    store = Store(str(tmp_path))
    schema = store.check_schema("d", pa.schema([("u", pa.uint64())]), "append")
    w = store.open_stage("d", "t", "0", schema)
    with pytest.raises(
        SchemaMismatch, match="column 'u' of type uint64 cannot be written as int64"
    ):
        w.write(pa.record_batch({"u": pa.array([2**64 - 1], pa.uint64())}))
    with pytest.raises(SchemaMismatch, match="columns"):
        w.write(pa.record_batch({"v": [1]}))
    w.abort()


def test_bad_schemas(tmp_path) -> None:
    store = Store(str(tmp_path))
    with pytest.raises(SchemaMismatch, match="no columns"):
        store.create("d", pa.schema([]))
    with pytest.raises(SchemaMismatch, match="unique"):
        store.create("d", pa.schema([("a", pa.int8()), ("a", pa.int8())]))
    with pytest.raises(SchemaMismatch, match="not in the schema"):
        store.create("d", pa.schema([("a", pa.int8())]), partition_by=["b"])
    with pytest.raises(SchemaMismatch, match="primitive"):
        store.create(
            "d", pa.schema([("a", pa.int8()), ("l", pa.list_(pa.int8()))]), partition_by=["l"]
        )
    with pytest.raises(SchemaMismatch, match="must not be a partition column"):
        store.create("d", pa.schema([("a", pa.int8())]), partition_by=["a"])
    assert not store.exists("d")


def test_files_roll_at_target_size(tmp_path) -> None:
    store = Store(str(tmp_path))
    data = pa.table({"id": range(50_000), "v": [f"value-{i}" for i in range(50_000)]})
    schema, staged = stage(
        store, "d", data, target_file_bytes=64 << 10, row_group_bytes=32 << 10, batch_rows=2000
    )
    assert len(staged) > 3
    assert sum(f.rows for f in staged) == 50_000
    assert all(json.loads(f.stats)["numRecords"] == f.rows for f in staged)
    r = store.commit("d", "append", schema, (), staged)
    assert r.rows == 50_000 and r.files == len(staged)
    assert sorted(read(store, "d")["id"].to_pylist()) == list(range(50_000))
