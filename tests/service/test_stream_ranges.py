"""A stream catching up on many versions (issue 18, item 2): its micro-batch lists the files of
the versions it covers a range at a time, from a real service, and reads a task's files with
one scan. The stream reader runs here without Spark (its planning is plain Python)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pyarrow as pa
from pyspark.sql.types import LongType, StringType, StructField, StructType

from aqueduct_spark.datasource import stream_reader
from aqueduct_spark.datasource.options import parse
from aqueduct_spark.datasource.reader import driver_cores
from aqueduct_spark.datasource.stream_offsets import offset
from aqueduct_spark.testing import ServiceProcess
from benchmarks.versions_data import build_versions

SCHEMA = StructType([StructField("id", LongType()), StructField("s", StringType())])


class Counting:
    """A client that counts the requests the stream reader makes."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.calls: Counter[str] = Counter()

    def __getattr__(self, name: str) -> Any:
        real = getattr(self.client, name)

        def call(*args: Any, **kw: Any) -> Any:
            kind = f"{name}-range" if kw.get("to_version") is not None else name
            self.calls[kind] += 1
            return real(*args, **kw)

        return call


def test_a_backlog_of_versions_is_listed_by_ranges(service: ServiceProcess) -> None:
    name = "stream_backlog"
    rows = 20
    data = pa.table({"id": pa.array(range(600 * rows), pa.int64())})
    data = data.append_column("s", pa.array([str(i) for i in range(data.num_rows)]))
    build_versions(
        service.root / name, data.schema, [data.slice(i * rows, rows) for i in range(600)]
    )
    opts = parse({**service.options, "path": name, "startingVersion": "earliest"})
    reader = stream_reader.AqueductStreamReader(opts, SCHEMA)
    counting = Counting(service.client())
    reader._client_obj = counting
    start = reader.initialOffset()
    end = reader.latestOffset(start, reader.getDefaultReadLimit())
    assert (start["version"], end["version"]) == (0, 601)
    parts = reader.partitions(start, end)
    # 600 versions: ceil(601 / PREFETCH) range requests, no request per version
    assert counting.calls["changes-range"] == -(-601 // stream_reader.PREFETCH)
    assert counting.calls["changes"] == 0
    files = [s for p in parts for s in p.splits]
    assert len(files) == 600
    # packed like a batch plan: far below the 128 MiB target (64 KiB per file), so spread
    # evenly over the driver's cores
    sizes = [len(p.splits) for p in parts]
    assert len(sizes) == min(600, driver_cores()) and max(sizes) - min(sizes) <= 1
    got = [i for p in parts for b in reader.read(p) for i in b.column("id").to_pylist()]
    assert sorted(got) == list(range(600 * rows))
    assert len(got) == len(set(got))


def test_a_range_the_service_cannot_answer_falls_back_to_versions(
    service: ServiceProcess,
) -> None:
    name = "stream_gap"
    data = pa.table({"id": pa.array(range(40), pa.int64()), "s": [str(i) for i in range(40)]})
    build_versions(service.root / name, data.schema, [data.slice(i * 4, 4) for i in range(10)])
    (service.root / name / "part-000004.parquet").unlink()  # vacuumed under the stream
    opts = parse(
        {**service.options, "path": name, "startingVersion": "0", "failOnDataLoss": "false"}
    )
    reader = stream_reader.AqueductStreamReader(opts, SCHEMA)
    counting = Counting(service.client())
    reader._client_obj = counting
    start = reader.initialOffset()
    parts = reader.partitions(start, offset(11, 0, start["tableId"]))
    assert counting.calls["changes-range"] == 1  # missing files are listed, not an error
    got = [i for p in parts for b in reader.read(p) for i in b.column("id").to_pylist()]
    assert sorted(got) == [i for i in range(40) if not 12 <= i < 16]
