"""A Spark read whose row groups travel as stored Parquet (issue 28): with the default
options the Python workers decode them, and the DataFrame is the one written; the service's
access log shows the rows went that way. (``decode=service``, Arrow from the service, is what
every other Spark read test does with small row groups.) A real ``aqueduct serve`` process
with its log in a file."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import functions as F

from aqueduct_spark.testing import ServiceProcess, start_service

pytestmark = pytest.mark.spark

ROWS = 40_000
"""One file of one row group of ~3 MiB (hashes do not compress): above the 1 MiB from which a
row group goes as stored."""


@pytest.fixture(scope="module")
def logged(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServiceProcess, Path]]:
    root = tmp_path_factory.mktemp("pq-spark")
    log = root.parent / "pq-spark-service.log"
    svc = start_service(root / "data", log=log, args=["--log-level", "info"])
    yield svc, log
    svc.stop()


def scan_codecs(log: Path) -> list[str]:
    """Each scan's data messages by codec, from the service's access lines."""
    lines = [x for x in log.read_text().splitlines() if "aqueduct.access" in x and " op=scan " in x]
    return [m.group(1) for x in lines if (m := re.search(r" compression=(\S+)", x))]


def test_spark_reads_row_groups_sent_as_stored(
    spark: Any, logged: tuple[ServiceProcess, Path]
) -> None:
    svc, log = logged
    df = spark.range(0, ROWS, numPartitions=1).selectExpr(
        "id", "cast(id as double) * 0.5 as x", "sha2(cast(id as string), 512) as s"
    )
    df.write.format("aqueduct").options(**svc.options).mode("overwrite").save("pq")
    expect = df.agg(F.count("*"), F.sum("id"), F.sum("x"), F.sum(F.length("s"))).first()
    got = spark.read.format("aqueduct").options(**svc.options).load("pq")
    assert got.agg(F.count("*"), F.sum("id"), F.sum("x"), F.sum(F.length("s"))).first() == (expect)
    time.sleep(0.5)  # a scan's access line is written as its task ends
    codecs = scan_codecs(log)
    assert codecs and all("parquet" in c for c in codecs), codecs
