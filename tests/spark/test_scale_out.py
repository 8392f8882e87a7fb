"""Scale-out: three ``aqueduct serve`` processes over one ``s3://`` root (SeaweedFS), used by
Spark through endpoint lists: a batch job writes through one and reads through another, a
streaming query reads its source through a second process while its sink commits through a
third, and the source's process is SIGKILLed mid-run. Every row lands exactly once, nothing
uncommitted is visible, and the query finishes on the survivors.

Both forms are slow (the short one a minute at load 12: three services, SeaweedFS, Spark). The
fast suite covers the parts: two processes over one s3:// root (tests/service/test_push_across.py),
a service over s3:// (test_s3_root.py), endpoint lists tried in order and the next address
after a dead one (tests/client/test_client_urls.py, test_unreachable.py), and streams exactly
once across restarts (tests/spark/test_streaming.py)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable
from stream_helpers import SCHEMA, Appender, ids_of, wait_until

from aqueduct_spark.testing import SeaweedS3, ServiceProcess, start_service

pytestmark = [pytest.mark.spark, pytest.mark.fault, pytest.mark.quic]


@pytest.fixture
def three(seaweed: SeaweedS3) -> Iterator[list[ServiceProcess]]:
    root = f"s3://{seaweed.bucket}/scale-{uuid.uuid4().hex[:8]}"
    with ThreadPoolExecutor(3) as pool:
        started = [pool.submit(start_service, root, args=seaweed.serve_args()) for _ in range(3)]
    services = [s.result() for s in started]
    yield services
    for svc in services:
        svc.stop()


def endpoints(services: list[ServiceProcess], first: int) -> dict[str, str]:
    """Spark options reaching the services through one list, starting at ``first`` (every
    process has the same certificate, as behind one name)."""
    order = services[first:] + services[:first]
    return {
        "url": ",".join(s.url for s in order),
        "fingerprint": services[0].fingerprint,
        "idleTimeout": "10s",
        "connectTimeout": "10s",
    }


def run(
    spark: Any, seaweed: SeaweedS3, services: list[ServiceProcess], tmp: Path, size: int
) -> None:
    from pyspark.sql import functions as F

    a, b, _ = services
    client = a.client(retries=3)

    # a batch job: written through the list that starts at A, read through the one at B
    batch = f"batch_{uuid.uuid4().hex[:6]}"
    df = spark.range(size * 10, numPartitions=4).select(
        F.col("id"), F.concat(F.lit("row-"), F.col("id").cast("string")).alias("s")
    )
    df.write.format("aqueduct").options(**endpoints(services, 0)).mode("append").save(batch)
    back = spark.read.format("aqueduct").options(**endpoints(services, 1)).load(batch)
    counts = back.agg(F.count("*").alias("n"), F.countDistinct("id").alias("d")).first()
    assert (counts["n"], counts["d"]) == (size * 10, size * 10)

    # a stream: source served by B, sink committed through C, appends through A
    src, dst = f"src_{uuid.uuid4().hex[:6]}", f"dst_{uuid.uuid4().hex[:6]}"
    client.create(src, SCHEMA)
    appender = Appender(client, src, 0, pause=0.1)
    query = (
        spark.readStream.format("aqueduct")
        .options(**endpoints(services, 1), startingVersion="earliest")
        .load(src)
        .writeStream.format("aqueduct")
        .options(**endpoints(services, 2))
        .option("checkpointLocation", str(tmp / "checkpoint"))
        .trigger(processingTime="0.5 seconds")
        .start(dst)
    )
    try:

        def sink_rows() -> int:
            if not query.isActive:
                raise AssertionError(f"the query failed: {query.exception()}")
            return len(ids_of(client, dst))

        limit = 120 + size // 5  # appends run at about 20-30 rows/s on a loaded machine
        wait_until(lambda: sink_rows() >= size, limit, f"{size} rows in the sink", step=0.3)
        b.kill()  # SIGKILL the process serving the source, mid-run
        before = sink_rows()
        wait_until(lambda: sink_rows() > before + size // 2, limit, "the stream to go on", step=0.3)
        appender.stop()
        want = ids_of(client, src)
        assert appender.appended > 0 and len(want) == len(set(want))
        wait_until(lambda: sink_rows() >= len(want), limit, "the sink to catch up", step=0.3)
        assert query.isActive, query.exception()
    finally:
        appender.stop()
        query.stop()
    got = ids_of(client, dst)
    assert got == want, f"{len(got)} rows in the sink for {len(want)} in the source"
    # what any Delta reader of the root sees: the same rows, nothing uncommitted
    table = DeltaTable(f"{a.root}/{dst}", storage_options=seaweed.storage_options)
    assert sorted(table.to_pyarrow_table(columns=["id"]).column("id").to_pylist()) == want
    print(f"\nscale-out: {size * 10} batch rows; {len(want)} streamed rows exactly once")


@pytest.mark.slow
def test_three_services_one_root_spark_and_a_kill(
    spark: Any, seaweed: SeaweedS3, three: list[ServiceProcess], tmp_path: Path
) -> None:
    run(spark, seaweed, three, tmp_path, size=100)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_three_services_one_root_spark_and_a_kill_long(
    spark: Any, seaweed: SeaweedS3, three: list[ServiceProcess], tmp_path: Path
) -> None:
    run(spark, seaweed, three, tmp_path, size=2000)


@pytest.mark.slow
def test_scans_and_writes_spread_over_the_list_and_survive_a_sigkill(
    three: list[ServiceProcess],
) -> None:
    """The Python client given the three endpoints: six concurrent write tasks land on all
    three (least outstanding bytes), and six concurrent scans, one host SIGKILLed while a
    scan is mid-way on it, deliver every row exactly once (the cut scan resumes on another
    host from its first row not delivered)."""
    import asyncio

    import pyarrow as pa

    from aqueduct_core.transport import ClientTLS
    from aqueduct_spark.client import AsyncClient, ClientConfig

    config = ClientConfig(
        endpoints(three, 0)["url"], tls=ClientTLS(fingerprint=three[0].fingerprint), retries=3
    )
    n = 120_000
    table = pa.table(
        {"id": pa.array(range(n), pa.int64()), "s": pa.array([f"row-{i}" for i in range(n)])}
    )

    async def run() -> None:
        async with AsyncClient(config) as client:
            spreader = client._spreader
            assert spreader is not None
            name = f"spread_{uuid.uuid4().hex[:6]}"
            txn = await client.begin(name, table.schema)
            part = n // 6
            staged = await asyncio.gather(
                *(
                    client.write_task(txn, table.slice(i * part, part).to_batches(5000))
                    for i in range(6)
                )
            )
            await client.commit(txn, staged)
            assert all(done >= 1 for done in spreader.spread.done()), spreader.spread.done()

            plan = await client.plan(name, min_tasks=6)
            victim = three[1]

            async def scan(task: list[dict[str, Any]], home: int) -> list[int]:
                got: list[int] = []
                batches = client.scan(task, schema=plan.schema, batch_rows=500, endpoint=home)
                async for batch in batches:
                    got += batch.column("id").to_pylist()
                    if home == 1 and victim.proc.poll() is None:
                        victim.kill()  # mid-scan, on the host this scan reads from
                    await asyncio.sleep(0.01)  # slow enough that every scan is under way
                return got

            tasks = plan.task_splits()
            read = await asyncio.gather(*(scan(t, i % 3) for i, t in enumerate(tasks)))
            assert victim.proc.poll() is not None
            rows = sorted(r for part in read for r in part)
            assert rows == list(range(n)), f"{len(rows)} rows for {n}"

    asyncio.run(run())
