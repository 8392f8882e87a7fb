"""One Spark session (local[2]) for every Spark test, and one dataset service process."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from aqueduct_spark.testing import ServiceProcess, start_service

# Spark's Python workers must run this interpreter (the virtual environment's), not
# whatever python3 is first on PATH; set before the JVM starts.
os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from pyspark.sql import SparkSession

    from aqueduct_spark.datasource import register

    session = (
        # local[2,2]: two cores, and a failed task is tried once more (retries are tested).
        SparkSession.builder.master("local[2,2]")
        .appName("aqueduct-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        # Skips Spark's per-row Arrow size check: 2-3x faster Python writers (pitfall 16).
        .config("spark.sql.execution.arrow.maxBytesPerBatch", "2147483647")
        .config("spark.driver.memory", "2g")
        # Catalog tables of the SQL tests go to a temporary directory, not ./spark-warehouse.
        .config("spark.sql.warehouse.dir", str(tmp_path_factory.mktemp("spark-warehouse")))
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    yield session
    session.stop()


@pytest.fixture(scope="session")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    svc = start_service(tmp_path_factory.mktemp("spark-service-root"))
    yield svc
    svc.stop()


@pytest.fixture(scope="session")
def secured_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    svc = start_service(tmp_path_factory.mktemp("spark-secured-root"), token="spark-token")
    yield svc
    svc.stop()
