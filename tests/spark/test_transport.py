"""Spark over Aqueduct's TLS/TCP transport (issue 15): a service that listens on TCP only
(as behind a firewall that drops UDP, here refused outright), read, write and stream from
Spark executors. With the default ``transport=auto`` each executor process races QUIC, gets
nothing, and connects over TCP; ``transport=tcp`` goes there directly."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from stream_helpers import ids_of, rows, wait_rows
from test_batch import numbers, read, write
from test_streaming import backlog, fresh, source, to_aqueduct

from aqueduct_spark.testing import ServiceProcess, start_service

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def tcp_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    svc = start_service(tmp_path_factory.mktemp("tcp-only-root"), args=["--transport", "tcp"])
    yield svc
    svc.stop()


@pytest.mark.parametrize("transport", ["tcp", "auto"])
def test_batch_write_and_read_over_tcp(
    spark: Any, tcp_service: ServiceProcess, transport: str
) -> None:
    name = f"tcp_batch_{transport}"
    df = numbers(spark, 20_000, partitions=4)
    write(df, tcp_service, name, mode="overwrite", transport=transport)
    back = read(spark, tcp_service, name, transport=transport)
    assert back.count() == 20_000
    assert sorted(r.id for r in back.select("id").collect()) == list(range(20_000))
    client = tcp_service.client()
    assert client.read(name).num_rows == 20_000 and client.transport == "tcp"


def test_a_stream_over_tcp(spark: Any, tcp_service: ServiceProcess, tmp_path: Path) -> None:
    src, dst = fresh("tcp_src"), fresh("tcp_dst")
    backlog(tcp_service, src, 2, 50)
    c = tcp_service.client()
    q = to_aqueduct(
        source(spark, tcp_service, src, startingVersion="earliest", transport="tcp"),
        tcp_service,
        dst,
        tmp_path,
    )
    try:
        for i in range(2, 5):
            c.append(src, rows(i * 50, 50))
            time.sleep(0.2)
        wait_rows(c, dst, 250, q)
    finally:
        q.stop()
    assert ids_of(c, dst) == list(range(250))
