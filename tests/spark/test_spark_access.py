"""A read-only token in Spark: the read works, the write fails naming the rights it lacks."""

from __future__ import annotations

from collections.abc import Iterator
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
