"""replace_where and merge_schema through the real service (issue 20, item 6): option ->
protocol -> one Delta commit, with the isolation of a whole overwrite."""

from __future__ import annotations

import datetime as dt
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from aqueduct_spark.protocol import Conflict, InvalidRequest, SchemaMismatch
from aqueduct_spark.testing import ServiceProcess

pytestmark = pytest.mark.quic


def _name() -> str:
    return f"w{uuid.uuid4().hex[:10]}"


def _rows(client: object, name: str) -> list[dict[str, object]]:
    table = client.read(name)  # type: ignore[attr-defined]
    return sorted(table.to_pylist(), key=lambda r: (str(r.get("day")), r["id"]))


DAYS = [dt.date(2026, 1, 1), dt.date(2026, 1, 2)]


def test_replace_where_replaces_one_partition_in_one_commit(service: ServiceProcess) -> None:
    name = _name()
    with service.client() as c:
        c.write("x" + name, pa.table({"id": [0]}))  # another dataset: versions are per dataset
        c.write(
            name,
            pa.table({"id": [1, 2, 3], "day": [DAYS[0], DAYS[1], DAYS[1]]}),
            partition_by=["day"],
        )
        result = c.overwrite(
            name, pa.table({"id": [9], "day": [DAYS[1]]}), replace_where="day = '2026-01-02'"
        )
        assert result["version"] == 1  # the removes and the new data: one version
        assert _rows(c, name) == [{"id": 1, "day": DAYS[0]}, {"id": 9, "day": DAYS[1]}]
        assert c.read(name, version=0).num_rows == 3  # time travel still sees the old rows
    # a plain Delta table: deltalake reads the same
    table = DeltaTable(str(Path(service.root) / name)).to_pyarrow_table()
    assert sorted(table.column("id").to_pylist()) == [1, 9]


def test_replace_where_keeps_the_other_rows_of_a_file_it_rewrites(service: ServiceProcess) -> None:
    name = _name()
    with service.client() as c:
        c.write(name, pa.table({"id": [1, 2, 3, 4], "kind": ["a", "b", None, "b"]}))
        c.overwrite(
            name, pa.table({"id": [5], "kind": ["b"]}), replace_where="kind = 'b' OR id > 100"
        )
        got = sorted(c.read(name).to_pylist(), key=lambda r: r["id"])
        assert got == [
            {"id": 1, "kind": "a"},
            {"id": 3, "kind": None},  # NULL does not match: kept, as in SQL
            {"id": 5, "kind": "b"},
        ]
        assert c.describe(name).version == 1


def test_replace_where_refuses_rows_outside_its_condition(service: ServiceProcess) -> None:
    name = _name()
    with service.client() as c:
        c.write(name, pa.table({"id": [1, 2]}))
        with pytest.raises(InvalidRequest, match=r"1 of the rows .* do not match replaceWhere"):
            c.overwrite(name, pa.table({"id": [2, 7]}), replace_where="id >= 2 AND id < 5")
        assert c.describe(name).version == 0 and c.describe(name).rows == 2


@pytest.mark.parametrize(
    ("mode", "where", "message"),
    [
        ("append", "id = 1", r"write with mode 'overwrite', not 'append'"),
        ("overwrite", "id = ", r"replaceWhere 'id = ': cannot read it .*something is missing"),
        ("overwrite", "nope = 1", r"no column 'nope' in the dataset; name one of its columns: id"),
        ("overwrite", "id = 'x'", r"cannot compare column 'id' \(int64\) with 'x': not a number"),
    ],
)
def test_a_bad_replace_where_fails_at_begin(
    service: ServiceProcess, mode: str, where: str, message: str
) -> None:
    name = _name()
    with service.client() as c:
        c.write(name, pa.table({"id": [1]}))
        with pytest.raises(InvalidRequest, match=message):
            c.begin(name, pa.schema([("id", pa.int64())]), mode=mode, replace_where=where)


ID = pa.schema([("id", pa.int64())])


def _staged_replacement(c: Any, name: str) -> tuple[Any, dict[str, Any]]:
    """Dataset ``name`` holding ids 1 and 2, and an overwrite of ``id >= 2`` with id 20,
    staged and not yet committed."""
    c.write(name, pa.table({"id": [1, 2]}, schema=ID))
    txn = c.begin(name, ID, mode="overwrite", replace_where="id >= 2")
    return txn, c.write_task(txn, [pa.record_batch({"id": [20]}, schema=ID)])


def test_replace_where_keeps_an_append_committed_while_it_ran(service: ServiceProcess) -> None:
    """The isolation of a whole overwrite: rows appended after it began stay, even matching."""
    name = _name()
    with service.client() as c:
        txn, staged = _staged_replacement(c, name)
        c.append(name, pa.table({"id": [3]}, schema=ID))
        c.commit(txn, [staged])
        assert sorted(c.read(name).column("id").to_pylist()) == [1, 3, 20]


def test_replace_where_conflicts_with_an_overwrite_that_won(service: ServiceProcess) -> None:
    name = _name()
    with service.client() as c:
        txn, staged = _staged_replacement(c, name)
        c.overwrite(name, pa.table({"id": [7]}, schema=ID))
        with pytest.raises(Conflict, match="another overwrite won"):
            c.commit(txn, [staged])
        assert c.read(name).column("id").to_pylist() == [7]


def test_merge_schema_adds_a_column_on_append(service: ServiceProcess) -> None:
    name = _name()
    with service.client() as c:
        c.write(name, pa.table({"id": [1], "name": ["a"]}))
        with pytest.raises(SchemaMismatch, match="score: not in the dataset"):
            c.append(name, pa.table({"id": [2], "score": [0.5]}))
        c.append(name, pa.table({"score": [0.5], "id": [2]}), merge_schema=True)
        assert c.describe(name).schema.names == ["id", "name", "score"]
        assert sorted(c.read(name).to_pylist(), key=lambda r: r["id"]) == [
            {"id": 1, "name": "a", "score": None},
            {"id": 2, "name": None, "score": 0.5},
        ]
        with pytest.raises(SchemaMismatch, match="it does not change types"):
            c.append(name, pa.table({"id": ["three"]}), merge_schema=True)


def test_merge_schema_with_replace_where(service: ServiceProcess) -> None:
    name = _name()
    with service.client() as c:
        c.write(name, pa.table({"id": [1, 2]}))
        c.overwrite(
            name, pa.table({"id": [2], "note": ["new"]}), merge_schema=True, replace_where="id = 2"
        )
        got = sorted(c.read(name).to_pylist(), key=lambda r: r["id"])
        assert got == [{"id": 1, "note": None}, {"id": 2, "note": "new"}]


def test_replace_where_opens_only_files_the_statistics_leave(service: ServiceProcess) -> None:
    """Files whose min/max cannot match are not read: one deleted from disk goes unnoticed."""
    name = _name()
    with service.client() as c:
        c.write(name, pa.table({"id": [1, 2]}, schema=ID))
        (low,) = [f["path"] for f in c.changes(name, 0)["files"]]
        c.append(name, pa.table({"id": [10, 11]}, schema=ID))
        (Path(service.root) / name / low).unlink()  # only the statistics say what it held
        c.overwrite(name, pa.table({"id": [12]}, schema=ID), replace_where="id >= 11")
        assert c.describe(name).rows == 4  # 1, 2 (never read), 10 (kept by the copy), 12


def test_replace_where_on_data_and_partition_columns(service: ServiceProcess) -> None:
    name = _name()
    data = pa.table({"id": [1, 2, 3, 4], "day": [DAYS[0], DAYS[0], DAYS[1], DAYS[1]]})
    with service.client() as c:
        c.write(name, data, partition_by=["day"])
        c.overwrite(
            name,
            pa.table({"id": [0], "day": [DAYS[1]]}),
            replace_where="day = DATE '2026-01-02' AND id <= 3",
        )
        assert _rows(c, name) == [
            {"id": 1, "day": DAYS[0]},
            {"id": 2, "day": DAYS[0]},
            {"id": 0, "day": DAYS[1]},
            {"id": 4, "day": DAYS[1]},  # copied, still in its partition
        ]
        assert c.describe(name).files == 3  # day 1 untouched, day 2's copy, the new file


def test_merge_schema_on_overwrite_keeps_the_old_columns(service: ServiceProcess) -> None:
    """As in Delta: the dataset's schema becomes the union, the old rows are gone."""
    name = _name()
    with service.client() as c:
        c.write(name, pa.table({"id": [1], "old": ["x"]}))
        c.overwrite(name, pa.table({"id": [2], "new": [True]}), merge_schema=True)
        assert c.describe(name).schema.names == ["id", "old", "new"]
        assert c.read(name).to_pylist() == [{"id": 2, "old": None, "new": True}]


def test_replace_where_creates_a_missing_dataset_with_matching_rows(
    service: ServiceProcess,
) -> None:
    name = _name()
    with service.client() as c:
        with pytest.raises(InvalidRequest, match="do not match replaceWhere"):
            c.overwrite(name, pa.table({"id": [1, 5]}), replace_where="id < 3")
        assert name not in [d.name for d in c.list()]
        c.overwrite(name, pa.table({"id": [1, 2]}), replace_where="id < 3")
        assert c.describe(name).rows == 2
