"""Planning and scanning: projection, exact filters, file skipping, row-group splits, partitions."""

from __future__ import annotations

import datetime as dt
import os
import pickle
from decimal import Decimal
from pathlib import Path

import cbor2
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from delta_store_helpers import read, write
from deltalake import DeltaTable

from aqueduct_spark.protocol import DataLoss, InvalidRequest, Split
from aqueduct_spark.service.store import Store

UTC = dt.UTC
T0 = dt.datetime(2024, 1, 1, tzinfo=UTC)
N = 1000


def sample(lo: int, hi: int) -> pa.Table:
    """Rows lo..hi-1 with nulls, unicode, timestamps (sub-ms), dates, floats incl. NaN."""
    ids = list(range(lo, hi))
    return pa.table(
        {
            "id": ids,
            "n": [None if i % 7 == 0 else i % 100 for i in ids],
            "s": [
                None if i % 11 == 0 else ("" if i % 13 == 0 else f"{'éñ'[i % 2]}-{i:04d}")
                for i in ids
            ],
            "f": [float("nan") if i % 17 == 0 else i / 4 for i in ids],
            "ts": [T0 + dt.timedelta(minutes=i, microseconds=i % 1000) for i in ids],
            "d": [dt.date(2024, 1, 1) + dt.timedelta(days=i // 50) for i in ids],
            "p": [None if i % 5 == 0 else ["eu", "us"][i % 2] for i in ids],
        },
        schema=pa.schema(
            [
                ("id", pa.int64()),
                ("n", pa.int32()),
                ("s", pa.string()),
                ("f", pa.float64()),
                ("ts", pa.timestamp("us", "UTC")),
                ("d", pa.date32()),
                ("p", pa.string()),
            ]
        ),
    )


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> tuple[Store, pa.Table]:
    """One dataset of N rows in 4 commits (so 4 x 3 partition files), read by many tests."""
    store = Store(str(tmp_path_factory.mktemp("scan") / "root"))
    for k in range(4):
        write(store, "t", sample(k * N // 4, (k + 1) * N // 4), partition_by=["p"])
    return store, sample(0, N)


x, n, s, f, ts, d, p = (ds.field(c) for c in ("id", "n", "s", "f", "ts", "d", "p"))
FILTERS = {
    "eq": x == 500,
    "ne": x != 500,
    "lt": x < 250,
    "le": x <= 250,
    "gt": x > 900,
    "ge": x >= 900,
    "ge-int32": n >= 95,
    "le-int32": n <= 3,
    "is_null": n.is_null(),
    "is_valid": n.is_valid(),
    "not-is_null": ~n.is_null(),
    "isin": x.isin([1, 500, 999, 5000]),
    "isin-str": s.isin(["é-0002", "ñ-0003", "nope"]),
    "starts_with": pc.starts_with(s, "ñ-00"),
    "ends_with": pc.ends_with(s, "7"),
    "contains": pc.match_substring(s, "-09"),
    "str-eq-empty": s == "",
    "str-lt": s < "é-0100",
    "float-ne": f != 2.5,  # NaN rows match
    "float-gt": f > 200.0,
    "ts-ge": ts
    >= pa.scalar(T0 + dt.timedelta(minutes=700, microseconds=700), pa.timestamp("us", "UTC")),
    "ts-lt": ts
    < pa.scalar(T0 + dt.timedelta(minutes=100, microseconds=100), pa.timestamp("us", "UTC")),
    "date-eq": d == pa.scalar(dt.date(2024, 1, 5)),
    "part-eq": p == "eu",
    "part-ne": p != "eu",
    "part-null": p.is_null(),
    "part-isin": p.isin(["us"]),
    "and": (x > 100) & (p == "us") & n.is_valid(),
    "or": (x < 10) | (s == "ñ-0991") | p.is_null(),
    "not": ~((x >= 100) & (x < 900)),
    "empty": x > 10_000,
    "all": x >= 0,
}


@pytest.mark.parametrize("name", FILTERS)
def test_filters_match_pyarrow(shared: tuple[Store, pa.Table], name: str) -> None:
    store, data = shared
    flt = FILTERS[name]
    got = read(store, "t", filter=flt).sort_by("id")
    want = data.filter(flt).sort_by("id")
    assert got.column("id").to_pylist() == want.column("id").to_pylist()
    assert got.select(["id", "n", "s", "ts", "d", "p"]).equals(
        want.select(["id", "n", "s", "ts", "d", "p"])
    )


def test_ge_is_not_le(shared: tuple[Store, pa.Table]) -> None:
    """The comparison operators reach the scan (and file skipping) with their direction."""
    store, _ = shared
    assert sorted(read(store, "t", filter=x >= 990)["id"].to_pylist()) == list(range(990, 1000))
    assert sorted(read(store, "t", filter=x <= 9)["id"].to_pylist()) == list(range(10))
    assert read(store, "t", filter=x > 998)["id"].to_pylist() == [999]
    assert read(store, "t", filter=x < 1)["id"].to_pylist() == [0]
    # the 4 commits hold ids [0,250), [250,500), ...: only the last has rows >= 990
    assert {sp.path for sp in store.plan("t", filter=x >= 990).splits} == {
        sp.path for sp in store.plan("t", filter=x >= 750).splits
    }
    assert len(store.plan("t", filter=x >= 990).splits) == 3
    assert len(store.plan("t", filter=x <= 9).splits) == 3


def test_file_skipping(shared: tuple[Store, pa.Table]) -> None:
    store, data = shared
    assert len(store.plan("t").splits) == 12
    cases = [
        (x >= 750, 3),  # one commit, three partitions
        (x < 0, 0),
        (x.is_null(), 0),  # no file has null ids
        (p == "eu", 4),
        (p.is_null(), 4),
        ((p == "eu") & (x < 250), 1),
        (n.is_null(), 12),  # every file has some nulls in n
        (n > 200, 0),  # n is at most 99, in files that also have nulls
        (ts < pa.scalar(T0 + dt.timedelta(minutes=10), pa.timestamp("us", "UTC")), 3),
        (d == pa.scalar(dt.date(2030, 1, 1)), 0),
        (s > "ÿ", 0),  # all strings sort below y-diaeresis
        (pc.starts_with(s, "zzz"), 12),  # not skippable: still exact at scan time
        (f > 1e9, 12),  # floats are never skipped on (NaN)
    ]
    for flt, splits in cases:
        plan = store.plan("t", filter=flt)
        assert len(plan.splits) == splits, flt
        assert read(store, "t", filter=flt).num_rows == data.filter(flt).num_rows, flt


def test_projection(shared: tuple[Store, pa.Table]) -> None:
    store, data = shared
    plan = store.plan("t", columns=["s", "id", "p"])
    assert plan.schema.names == ["s", "id", "p"]
    assert plan.version == 3 and plan.rows == N and plan.bytes > 0
    got = read(store, "t", columns=["s", "id", "p"], filter=(x < 100) & (n > 50))
    assert got.schema == plan.schema
    want = data.filter((x < 100) & (n > 50)).select(["s", "id", "p"])
    assert got.sort_by("id").equals(want.sort_by("id"))
    counted = read(store, "t", columns=[], filter=p == "us")
    assert counted.num_columns == 0 and counted.num_rows == data.filter(p == "us").num_rows
    with pytest.raises(InvalidRequest, match="unknown columns \\['nope'\\]"):
        store.plan("t", columns=["id", "nope"])
    with pytest.raises(InvalidRequest, match="duplicates"):
        store.plan("t", columns=["id", "id"])


def test_bad_filters(shared: tuple[Store, pa.Table]) -> None:
    store, _ = shared
    split = store.plan("t").splits[0]
    for bad in (ds.field("nope") > 1, x, s > 1, "id > 1"):
        with pytest.raises(InvalidRequest, match="filter"):
            store.plan("t", filter=bad)  # type: ignore[arg-type]
        with pytest.raises(InvalidRequest, match="filter"):
            store.scan(split, filter=bad)  # type: ignore[arg-type]


def test_scan_streams_in_batches(shared: tuple[Store, pa.Table]) -> None:
    store, _ = shared
    split = max(store.plan("t").splits, key=lambda sp: sp.rows)
    batches = list(store.scan(split, batch_rows=16))
    assert len(batches) > 3 and all(0 < b.num_rows <= 16 for b in batches)
    assert sum(b.num_rows for b in batches) == split.rows


def test_splits_by_row_groups(tmp_path) -> None:
    store = Store(str(tmp_path))
    data = pa.table({"id": range(200_000), "v": [str(i) for i in range(200_000)]})
    write(store, "big", data, row_group_bytes=256 << 10, batch_rows=10_000)
    (path,) = {sp.path for sp in store.plan("big").splits}
    md = pq.read_metadata(os.path.join(tmp_path, "big", path))
    assert md.num_row_groups >= 8
    plan = store.plan("big", split_bytes=md.serialized_size + 600_000)
    assert len(plan.splits) >= 3 and all(sp.path == path for sp in plan.splits)
    groups = [rg for sp in plan.splits for rg in sp.row_groups or ()]
    assert groups == list(range(md.num_row_groups))  # every row group once, in order
    assert sum(sp.rows for sp in plan.splits) == plan.rows == 200_000
    ids = [
        i for sp in plan.splits for b in store.scan(sp, columns=["id"]) for i in b["id"].to_pylist()
    ]
    assert sorted(ids) == list(range(200_000)) and len(set(ids)) == 200_000
    filtered = [
        i
        for sp in plan.splits
        for b in store.scan(
            sp, columns=["id"], filter=x.isin(range(0, 200_000, 1000)) | (x > 199_990)
        )
        for i in b["id"].to_pylist()
    ]
    assert sorted(filtered) == [*range(0, 200_000, 1000), *range(199_991, 200_000)]
    assert len(store.plan("big", split_bytes=1 << 40).splits) == 1


def test_partition_values_round_trip(tmp_path) -> None:
    store = Store(str(tmp_path))
    weird = ["us west/1=x", "a b", "100%", "é/ü", "x=y=z", "=", "/", "a%2Fb", None, ""]
    data = pa.table(
        {
            "id": range(len(weird) * 3),
            "region": weird * 3,
            "day": [dt.date(2024, 1, 1 + i % 2) for i in range(len(weird) * 3)],
        }
    )
    write(store, "pt", data, partition_by=["region", "day"], tasks=2)
    # Delta stores an empty string partition value as null (as Spark does)
    want = data.set_column(
        1, "region", pc.if_else(pc.equal(data["region"], ""), None, data["region"])
    )
    got = read(store, "pt").sort_by("id")
    assert got.equals(want)
    direct = DeltaTable(os.path.join(tmp_path, "pt")).to_pyarrow_table().sort_by("id")
    assert direct.select(["id", "region", "day"]).equals(want)
    for path in (sp.path for sp in store.plan("pt").splits):
        assert not any(part.startswith(("_", ".")) for part in path.split("/"))
        assert os.path.isfile(os.path.join(tmp_path, "pt", path))
    assert os.path.isdir(os.path.join(tmp_path, "pt", "region=us%20west%2F1%3Dx", "day=2024-01-01"))
    assert os.path.isdir(os.path.join(tmp_path, "pt", "region=__HIVE_DEFAULT_PARTITION__"))
    for value in ("us west/1=x", "a%2Fb", "/"):
        flt = ds.field("region") == value
        assert read(store, "pt", filter=flt).num_rows == 3
        assert len(store.plan("pt", filter=flt).splits) == 2  # two days, one file each
    assert read(store, "pt", filter=ds.field("region").is_null()).num_rows == 6


def test_typed_partitions_and_split_dicts(tmp_path) -> None:
    store = Store(str(tmp_path))
    data = pa.table(
        {
            "id": [1, 2, 3],
            "i": pa.array([7, None, -3], pa.int16()),
            "t": pa.array(
                [dt.datetime(2024, 5, 6, 7, 8, 9, 123456, tzinfo=UTC), None, T0],
                pa.timestamp("us", "UTC"),
            ),
            "k": pa.array(
                [dt.datetime(2024, 5, 6, 7, 8, 9, 5), None, dt.datetime(1999, 1, 1)],
                pa.timestamp("us"),
            ),
            "m": pa.array([Decimal("1.50"), Decimal("-2.25"), None], pa.decimal128(10, 2)),
            "b": [True, False, None],
        }
    )
    write(store, "tp", data, partition_by=["i", "t", "k", "m", "b"])
    assert read(store, "tp").sort_by("id").equals(data)
    for split in store.plan("tp").splits:
        for copy in (
            Split.from_dict(split.to_dict()),
            Split.from_dict(cbor2.loads(cbor2.dumps(split.to_dict()))),
            pickle.loads(pickle.dumps(split)),
        ):
            assert copy == split
            assert [b.to_pylist() for b in store.scan(copy)] == [
                b.to_pylist() for b in store.scan(split)
            ]
    got = read(
        store, "tp", filter=ds.field("k") == pa.scalar(dt.datetime(1999, 1, 1), pa.timestamp("us"))
    )
    assert got["id"].to_pylist() == [3]


def test_bad_splits(shared: tuple[Store, pa.Table]) -> None:
    store, _ = shared
    split = store.plan("t").splits[0].to_dict()
    for path in (
        "../../etc/passwd",
        "/etc/passwd",
        "_delta_log/00000000000000000000.json",
        "a/../b.parquet",
    ):
        with pytest.raises(InvalidRequest, match="invalid data file path"):
            store.scan(Split.from_dict({**split, "path": path}))
    with pytest.raises(DataLoss):
        store.scan(Split.from_dict({**split, "path": "p=eu/part-x-0-" + "0" * 32 + ".parquet"}))
    with pytest.raises(InvalidRequest, match="partition"):
        store.scan(Split.from_dict({**split, "partition": {"q": "x"}}))
    for groups in ([99], [-1]):
        with pytest.raises(InvalidRequest, match="row groups"):
            list(store.scan(Split.from_dict({**split, "row_groups": groups})))
    with pytest.raises(InvalidRequest, match="missing fields"):
        Split.from_dict({"path": "x"})
    with pytest.raises(InvalidRequest, match="integer"):
        Split.from_dict({**split, "version": "3"})
    with pytest.raises(InvalidRequest, match="invalid dataset name"):
        store.scan(Split.from_dict({**split, "dataset": "../t"}))


def test_a_file_deleted_during_its_scan_is_read_to_the_end(tmp_path: Path) -> None:
    """Local files are scanned memory-mapped (issue 28): a file vacuumed or deleted after
    its scan began still yields every row, as an open file would."""
    store = Store(str(tmp_path))
    write(store, "t", sample(0, N), mode="overwrite")
    (split,) = store.plan("t").splits
    batches = store.scan(split, batch_rows=100)
    first = next(batches)
    os.unlink(tmp_path / "t" / split.path)
    rows = first.num_rows + sum(b.num_rows for b in batches)
    assert rows == N


def test_large_splits_decode_on_threads_only_while_a_core_is_free() -> None:
    from aqueduct_spark.service.scan import decode_threads

    assert decode_threads(0, cores=2)  # one scan alone on two cores: Arrow's threads
    assert not decode_threads(1, cores=2)  # a second scan takes the other core
    assert not decode_threads(0, cores=1)
    assert decode_threads(7, cores=4)  # above two cores, as before


def test_a_scan_stops_counting_as_decoding_when_finished_or_abandoned(
    shared: tuple[Store, pa.Table], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An abandoned scan that kept counting would keep every later scan off the threads."""
    from aqueduct_spark.service import scan as scan_module

    monkeypatch.setattr(scan_module, "THREADS_FROM", 0)  # every split counts as large
    store, _ = shared
    splits = store.plan("t").splits
    finished = list(store.scan(splits[0]))
    assert finished and scan_module.DECODING.now == 0
    open_scans = [iter(store.scan(split)) for split in splits[:2]]
    for scan in open_scans:
        next(scan)
    del scan
    assert scan_module.DECODING.now == 2
    open_scans[0].close()  # type: ignore[attr-defined]
    del open_scans[:]  # the other is dropped unfinished
    assert scan_module.DECODING.now == 0
