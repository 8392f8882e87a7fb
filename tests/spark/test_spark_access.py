"""Tokens in Spark: a read-only token reads and cannot write, naming the rights it lacks; a
token limited to dataset globs (issue 27) reads, streams and writes a dataset stored in
several files inside its globs, and reaches nothing outside them. The Python client and CLI
cases of the rights matrix are in ``tests/service/test_access.py``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from conftest import ServiceProcess, start_service

pytestmark = [pytest.mark.spark, pytest.mark.quic]

CONFIG = """
[[tokens]]
name = "loader"
token = "rw-spark-51c2"
rights = "read-write"

[[tokens]]
name = "dashboards"
token = "ro-spark-0b7e"
rights = "read"

[[tokens]]
name = "reader"
token = "ro-glob-7a21"
rights = "read"
datasets = ["trips_*", "cities"]

[[tokens]]
name = "writer"
token = "rw-glob-c3d9"
rights = "read-write"
datasets = ["trips_*", "cities"]
"""


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    here = tmp_path_factory.mktemp("spark-access")
    (here / "aqueduct.toml").write_text(CONFIG)
    (here / "aqueduct.toml").chmod(0o600)
    svc = start_service(here / "root", args=["--config", str(here / "aqueduct.toml")])
    yield svc
    svc.stop()


def test_a_read_only_token_reads_and_cannot_write(spark: Any, guarded: ServiceProcess) -> None:
    guarded.client(token="rw-spark-51c2").overwrite("kpis", pa.table({"id": [1, 2, 3]}))
    options = {**guarded.options, "token": "ro-spark-0b7e"}
    kpis = spark.read.format("aqueduct").options(**options).load("kpis")
    assert sorted(r.id for r in kpis.collect()) == [1, 2, 3]
    with pytest.raises(Exception, match=r"PermissionDenied|dashboards may only read"):
        spark.range(2).write.format("aqueduct").options(**options).mode("append").save("kpis")
    assert guarded.client(token="rw-spark-51c2").describe("kpis").rows == 3


def test_glob_tokens_reach_every_dataset_inside_and_none_outside(
    spark: Any, guarded: ServiceProcess, tmp_path: Path
) -> None:
    """``cities`` (inside the globs) and ``trips`` (outside: not ``trips_*``) are stored in
    three files each, so each read scans a task of several splits."""
    admin = guarded.client(token="rw-spark-51c2")
    for name in ("cities", "trips"):
        admin.overwrite(name, pa.table({"id": [0, 1]}))
        admin.append(name, pa.table({"id": [2, 3]}))
        admin.append(name, pa.table({"id": [4, 5]}))
        assert admin.describe(name).files == 3
    reader = {**guarded.options, "token": "ro-glob-7a21"}
    writer = {**guarded.options, "token": "rw-glob-c3d9"}

    cities = spark.read.format("aqueduct").options(**reader).load("cities")
    assert sorted(r.id for r in cities.collect()) == list(range(6))
    with pytest.raises(Exception, match="reader has no rights on dataset 'trips': reader may"):
        spark.read.format("aqueduct").options(**reader).load("trips").collect()

    stream = spark.readStream.format("aqueduct").options(**reader)
    stream = stream.option("startingVersion", "earliest").load("cities")
    query = stream.writeStream.format("memory").queryName("glob_cities").trigger(availableNow=True)
    query = query.option("checkpointLocation", str(tmp_path / "ck")).start()
    assert query.awaitTermination(120) and query.exception() is None
    assert sorted(r.id for r in spark.table("glob_cities").collect()) == list(range(6))

    more = spark.range(6, 8).selectExpr("cast(id as long) as id")
    more.write.format("aqueduct").options(**writer).mode("append").save("cities")
    with pytest.raises(Exception, match="writer has no rights on dataset 'trips': writer may"):
        more.write.format("aqueduct").options(**writer).mode("append").save("trips")
    assert sorted(admin.read("cities")["id"].to_pylist()) == list(range(8))
    assert admin.describe("trips").rows == 6
