"""Overwrite racing appends: WriteSerializable, Delta's default isolation (issue 17, item 2).

An overwrite replaces the data of the version its transaction began at. A blind append that
commits while the overwrite is in flight is kept, in either commit order, as if it came after
the overwrite; it never makes either of them fail. Two overwrites racing each other cannot
both win: the later one fails with Conflict and can be retried.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pytest
from delta_store_helpers import read, stage, write

from aqueduct_spark.protocol import Conflict
from aqueduct_spark.service.store import Store
from aqueduct_spark.testing import ServiceProcess

SCHEMA = pa.schema([("id", pa.int64()), ("s", pa.string())])


def rows(ids: range) -> pa.Table:
    return pa.table({"id": list(ids), "s": [f"r{i}" for i in ids]}, schema=SCHEMA)


def ids(store: Store, name: str) -> list[int]:
    return sorted(read(store, name).column("id").to_pylist())


@pytest.fixture
def local(tmp_path: Any) -> Store:
    return Store(str(tmp_path / "root"))


def begin_overwrite(store: Store, name: str, data: pa.Table) -> Callable[[], Any]:
    """Stage an overwrite now (its transaction begins at the current version); the returned
    function commits it."""
    base = store.latest_version(name)
    schema, staged = stage(store, name, data, mode="overwrite")
    return lambda: store.commit(name, "overwrite", schema, (), staged, replaces=base)


def begin_append(store: Store, name: str, data: pa.Table) -> Callable[[], Any]:
    schema, staged = stage(store, name, data)
    return lambda: store.commit(name, "append", schema, (), staged)


def test_an_append_committed_while_an_overwrite_runs_is_kept(local: Store) -> None:
    write(local, "d", rows(range(10)))
    overwrite = begin_overwrite(local, "d", rows(range(100, 105)))
    begin_append(local, "d", rows(range(200, 205)))()  # commits first
    overwrite()  # then the overwrite that began before it
    assert ids(local, "d") == [*range(100, 105), *range(200, 205)]


def test_an_append_begun_before_an_overwrite_and_committed_after_it_is_kept(
    local: Store,
) -> None:
    write(local, "d", rows(range(10)))
    append = begin_append(local, "d", rows(range(200, 205)))
    begin_overwrite(local, "d", rows(range(100, 105)))()  # commits first
    append()
    assert ids(local, "d") == [*range(100, 105), *range(200, 205)]


def race(*commits: Callable[[], Any]) -> list[Any]:
    """Run the commits in threads released at the same instant; results or exceptions."""
    gate = threading.Barrier(len(commits))
    out: list[Any] = [None] * len(commits)

    def run(i: int) -> None:
        gate.wait()
        try:
            out[i] = commits[i]()
        except Exception as exc:
            out[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(commits))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return out


def test_appends_racing_an_overwrite_are_all_kept(local: Store) -> None:
    """Real races at the commit itself: whatever order Delta's log puts them in."""
    write(local, "d", rows(range(10)))
    for round_ in range(4):
        base = round_ * 1000
        new = rows(range(base + 100, base + 105))
        appended = [rows(range(base + 200 + 10 * a, base + 205 + 10 * a)) for a in range(3)]
        commits = [begin_overwrite(local, "d", new)]
        commits += [begin_append(local, "d", t) for t in appended]
        results = race(*commits)
        assert not [r for r in results if isinstance(r, Exception)], results
        expected = sorted(i for t in (new, *appended) for i in t.column("id").to_pylist())
        assert ids(local, "d") == expected


def test_racing_overwrites_cannot_both_win(local: Store) -> None:
    write(local, "d", rows(range(10)))
    first = begin_overwrite(local, "d", rows(range(100, 105)))
    second = begin_overwrite(local, "d", rows(range(300, 305)))
    results = race(first, second)
    lost = [r for r in results if isinstance(r, Exception)]
    assert len(lost) == 1 and isinstance(lost[0], Conflict), results
    assert "retry" in str(lost[0])
    winner = range(100, 105) if not isinstance(results[0], Exception) else range(300, 305)
    assert ids(local, "d") == list(winner)


def test_through_the_service_an_overwrite_replaces_only_what_it_began_with(
    service: ServiceProcess,
) -> None:
    """The client's transaction carries its begin version to the commit."""
    c = service.client()
    name = "isolation_wire"
    c.overwrite(name, rows(range(10)))
    txn = c.begin(name, SCHEMA, mode="overwrite")
    staged = c.write_task(txn, rows(range(100, 105)).to_batches())
    c.append(name, rows(range(200, 205)))  # lands while the overwrite is in flight
    c.commit(txn, [staged])
    got = sorted(c.read(name).column("id").to_pylist())
    assert got == [*range(100, 105), *range(200, 205)]
