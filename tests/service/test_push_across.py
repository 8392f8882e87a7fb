"""Push across service processes: a subscriber of process B hears of a version committed
through process A (over one object store root) within a fraction of a second."""

from __future__ import annotations

import random
import statistics
import threading
import time
import uuid
from collections.abc import Iterator

import pyarrow as pa
import pytest

from aqueduct_spark.testing import SeaweedS3, ServiceProcess, start_service

pytestmark = pytest.mark.quic


@pytest.fixture
def two_services(seaweed: SeaweedS3) -> Iterator[tuple[ServiceProcess, ServiceProcess]]:
    root = f"s3://{seaweed.bucket}/push-{uuid.uuid4().hex[:8]}"
    a = start_service(root, args=seaweed.serve_args())
    try:
        b = start_service(root, args=seaweed.serve_args())
        yield a, b
        b.stop()
    finally:
        a.stop()


def test_a_commit_on_one_process_is_pushed_by_another_within_a_second(
    two_services: tuple[ServiceProcess, ServiceProcess],
) -> None:
    a, b = two_services
    writer, reader = a.client(), b.client()
    schema = pa.schema([("id", pa.int64())])
    writer.create("pushed", schema)
    heard: dict[int, float] = {}
    alive = threading.Event()
    changed = threading.Condition()

    def on_version(version: int) -> None:
        with changed:
            heard.setdefault(version, time.monotonic())
            changed.notify_all()

    subscription = reader.subscribe(
        "pushed", on_version, lambda up: alive.set() if up else alive.clear()
    )
    try:
        assert alive.wait(30), "the subscription to process B never started"
        rng = random.Random(19)
        latencies = []
        for i in range(8):
            time.sleep(rng.uniform(0.05, 0.5))  # at random phases of B's polling
            version = writer.append("pushed", pa.table({"id": [i]}, schema=schema))["version"]
            committed = time.monotonic()
            with changed:
                assert changed.wait_for(lambda v=version: v in heard, timeout=10), heard
            latencies.append(max(0.0, heard[version] - committed))
    finally:
        subscription.cancel()
    median = statistics.median(latencies)
    print(
        f"\npush latency, commit on process A to a subscriber of process B: median "
        f"{median:.3f} s, max {max(latencies):.3f} s over {len(latencies)} commits"
    )
    assert median < 1.0, latencies
