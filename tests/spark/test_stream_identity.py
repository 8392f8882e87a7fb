"""A stream's offsets belong to one table (Delta's metaData.id): a checkpoint of another
dataset, or a dataset dropped and created again under a running query, fails loudly instead
of silently skipping or re-reading versions (issue 17, item 1)."""

from __future__ import annotations

import re
import uuid
from pathlib import Path
from typing import Any

import pytest
from pyspark.errors import StreamingQueryException
from stream_helpers import SCHEMA, ids_of, rows, wait_rows, wait_until

from aqueduct_spark.datasource import aqueduct_error
from aqueduct_spark.datasource.stream_offsets import SourceTableChanged
from aqueduct_spark.testing import ServiceProcess

pytestmark = pytest.mark.spark


def fresh(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


def fill(svc: ServiceProcess, name: str, first_id: int, versions: int, per_version: int) -> None:
    c = svc.client()
    c.create(name, SCHEMA)
    for i in range(versions):
        c.append(name, rows(first_id + i * per_version, per_version))


def copy(
    spark: Any,
    svc: ServiceProcess,
    src: str,
    dst: str,
    checkpoint: Path,
    available_now: bool = False,
    **options: str,
) -> Any:
    """Start a stream src -> dst (both aqueduct datasets), reading from the earliest version."""
    df = (
        spark.readStream.format("aqueduct")
        .options(**svc.options, startingVersion="earliest", **options)
        .load(src)
    )
    writer = (
        df.writeStream.format("aqueduct")
        .options(**svc.options)
        .option("checkpointLocation", str(checkpoint))
    )
    if available_now:
        writer = writer.trigger(availableNow=True)
    return writer.start(dst)


def assert_table_changed(error: BaseException | None) -> None:
    text = str(error)
    assert isinstance(aqueduct_error(error), SourceTableChanged), text
    # our line first: no traceback of the source's driver-side runner before it
    assert "Traceback" not in text.partition("SourceTableChanged: ")[0], text
    assert "new checkpointLocation" in text and "failOnDataLoss=false" in text, text


def test_a_checkpoint_used_with_another_dataset_fails_and_can_start_over(
    spark: Any, service: ServiceProcess, tmp_path: Path
) -> None:
    src_a, src_b, dst_a, dst_b = (fresh(p) for p in ("id_a", "id_b", "id_dst_a", "id_dst_b"))
    fill(service, src_a, 0, 5, 10)  # versions 1..5: the checkpoint ends at version 6
    fill(service, src_b, 1000, 3, 10)  # versions 1..3 of another table
    checkpoint = tmp_path / "checkpoint"
    c = service.client()

    q = copy(spark, service, src_a, dst_a, checkpoint, available_now=True)
    assert q.awaitTermination(120)
    assert ids_of(c, dst_a) == list(range(50))

    # Same checkpoint, another dataset: its version 6 is not where src_a's ended.
    q = copy(spark, service, src_b, dst_b, checkpoint, available_now=True)
    with pytest.raises(StreamingQueryException) as failed:
        q.awaitTermination(120)
    assert_table_changed(failed.value)
    assert "another dataset" in str(failed.value)
    assert ids_of(c, dst_b) == []

    # failOnDataLoss=false starts over at the earliest version of the dataset's table.
    q = copy(spark, service, src_b, dst_b, checkpoint, available_now=True, failOnDataLoss="false")
    assert q.awaitTermination(120)
    assert q.exception() is None
    assert ids_of(c, dst_b) == list(range(1000, 1030))


def test_a_dataset_recreated_under_a_running_query_fails_the_query(
    spark: Any, service: ServiceProcess, tmp_path: Path
) -> None:
    src, dst = fresh("re_src"), fresh("re_dst")
    fill(service, src, 0, 4, 10)  # versions 1..4: the query waits at version 5
    c = service.client()
    q = copy(spark, service, src, dst, tmp_path / "checkpoint")
    try:
        wait_rows(c, dst, 40, q)
        # The new table's versions 5.. exist too: without table ids the query would read
        # them and silently skip the new versions 1..4.
        c.drop(src)
        fill(service, src, 1000, 7, 10)
        wait_until(lambda: not q.isActive, 60, "the query to fail")
    finally:
        q.stop()
    assert_table_changed(q.exception())
    # Seen re-created, or (a poll between the drop and the create) seen dropped.
    assert re.search(
        r"was dropped (and created again )?while this query read it", str(q.exception())
    )
    assert ids_of(c, dst) == list(range(40))  # nothing of the new table went through
