"""A Spark read of a closed port fails within 5 s beyond what Spark itself takes to fail a
read, with the client's message: the URL and how to start a service."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from aqueduct_spark.testing import closed_port

pytestmark = pytest.mark.spark


def failing_read(spark: Any, **options: str) -> tuple[float, str]:
    started = time.monotonic()
    with pytest.raises(Exception) as failed:
        spark.read.format("aqueduct").options(**options).load("trips").collect()
    return time.monotonic() - started, str(failed.value)


def test_a_spark_read_of_a_wrong_port_fails_within_5_s(spark: Any, tmp_path: Path) -> None:
    url = f"quic://127.0.0.1:{closed_port()}"
    # What Spark takes to fail a read in the data source without any connection (it starts
    # a Python process to ask the source for its schema): not the client's to shorten.
    failing_read(spark, url=url, cafile=str(tmp_path / "missing.pem"))  # warm-up
    spark_alone, _ = failing_read(spark, url=url, cafile=str(tmp_path / "missing.pem"))
    took, message = failing_read(spark, url=url, fingerprint="AB" * 32)
    print(
        f"a Spark read of a wrong port failed after {took:.2f} s (Spark alone {spark_alone:.2f} s)"
    )
    assert url in message and "aqueduct serve" in message, message
    assert took - spark_alone <= 5.0
