"""A Spark job past a staging quota (issue 32): many tasks write into one transaction over
many connections, the token's quota holds across them, and the job fails once, with the
service's error first, leaving nothing staged and the committed data as it was."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from test_task_errors import ours_first

from aqueduct_spark import protocol as P
from aqueduct_spark.datasource import aqueduct_error
from aqueduct_spark.testing import ServiceProcess, start_service

pytestmark = [pytest.mark.spark, pytest.mark.quic, pytest.mark.slow]

QUOTA = 4 << 20


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    flags = ["--max-staged-bytes-per-token", str(QUOTA)]
    svc = start_service(tmp_path_factory.mktemp("quota-spark"), token="spark-quota", args=flags)
    yield svc
    svc.stop()


def test_a_spark_job_past_the_token_quota_fails_once_and_leaves_nothing(
    spark: Any, small: ServiceProcess
) -> None:
    small.client().write("quota_job", pa.table({"id": [-1], "r": [0.5]}))
    before = sorted(Path(small.root, "quota_job").rglob("*.parquet"))
    # Eight tasks of random doubles, about 1.6 MB each on disk: more than the token's 4 MiB.
    df = spark.range(0, 1_600_000, numPartitions=8).selectExpr("id", "rand(7) as r")
    with pytest.raises(Exception) as e:
        df.write.format("aqueduct").options(**small.options).mode("append").save("quota_job")
    line = ours_first(str(e.value), "InvalidRequest")
    assert "--max-staged-bytes-per-token" in line and "the --token token" in line
    assert isinstance(aqueduct_error(e.value), P.InvalidRequest)
    assert small.client().read("quota_job").num_rows == 1  # the committed row, alone
    assert sorted(Path(small.root, "quota_job").rglob("*.parquet")) == before
    assert small.client().status()["yours"] == 0  # the abort gave every byte back
