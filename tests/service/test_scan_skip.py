"""A resumed scan's ``skip_rows`` on the store (issue 30): the rows left out are the first
rows of the scan's output, counted in rows whatever batches another process cut them into,
across a task's splits and through a filter; without a filter, row groups wholly inside the
skipped range are passed over from the footer, never decoded. Over a real connection:
tests/client/test_scan_resume.py."""

from __future__ import annotations

import os
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from delta_store_helpers import write

from aqueduct_spark.service.resume import MAX_SKIP_ROWS, Skip
from aqueduct_spark.service.store import Store

ROWS = 30_000


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> tuple[Store, list[int]]:
    """A table of one file of several row groups; the rows of each row group."""
    root = tmp_path_factory.mktemp("skip-root")
    store = Store(str(root))
    data = pa.table({"id": range(ROWS), "v": [str(i) for i in range(ROWS)]})
    write(store, "big", data, row_group_bytes=48 << 10, batch_rows=1_000)
    (path,) = {sp.path for sp in store.plan("big").splits}
    md = pq.read_metadata(os.path.join(root, "big", path))
    sizes = [md.row_group(i).num_rows for i in range(md.num_row_groups)]
    assert len(sizes) >= 4
    return store, sizes


def ids(batches: Any) -> list[int]:
    return [i for b in batches for i in b.column("id").to_pylist()]


@pytest.mark.parametrize("filtered", [False, True], ids=["no filter", "filter"])
def test_skip_leaves_out_the_first_rows_of_the_output_whatever_the_batches(
    big: tuple[Store, list[int]], filtered: bool
) -> None:
    store, sizes = big
    splits = store.plan("big", split_bytes=60 << 10).splits  # a task of several splits
    assert len(splits) >= 2
    where = ((pc.field("id") < 4_000) | (pc.field("id") >= 9_000)) if filtered else None
    full = ids(store.scan(splits, columns=["id"], filter=where, batch_rows=1_000))
    n = len(full)
    for skip in (0, 1, sizes[0], sizes[0] + 1, sizes[0] + sizes[1] + 17, n - 1, n, n + 5):
        for batch_rows in (700, 4_096):  # another process's batches: same rows, same order
            got = store.scan(
                splits, columns=["id"], filter=where, batch_rows=batch_rows, skip=Skip(skip)
            )
            assert ids(got) == full[skip:], (skip, batch_rows)


def test_without_a_filter_skipped_row_groups_are_never_decoded(
    big: tuple[Store, list[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    store, sizes = big
    (split,) = store.plan("big").splits
    read: list[Any] = []
    iter_batches = pq.ParquetFile.iter_batches

    def recording(self: pq.ParquetFile, *args: Any, **kwargs: Any) -> Any:
        read.append(kwargs.get("row_groups"))
        return iter_batches(self, *args, **kwargs)

    monkeypatch.setattr(pq.ParquetFile, "iter_batches", recording)
    skip = sizes[0] + sizes[1] + 5
    assert ids(store.scan(split, skip=Skip(skip))) == list(range(skip, ROWS))
    assert read == [list(range(2, len(sizes)))]  # the first two groups: footer only
    read.clear()
    assert ids(store.scan(split, skip=Skip(MAX_SKIP_ROWS))) == []
    assert read == []  # the largest skip reads footers, decodes nothing, sends nothing
    where = pc.field("id") >= 0
    assert ids(store.scan(split, filter=where, skip=Skip(skip))) == list(range(skip, ROWS))
    assert read == [None]  # a filter: every row decoded to know whether it is output
