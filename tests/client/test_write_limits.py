"""A row too large for one data message fails at once, naming the limit and what raises it,
instead of being sent and refused by the service (which looked like a lost connection: issue
17 item 5); with the limit raised on both sides, such a row goes through."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from aqueduct_spark import protocol as P
from aqueduct_spark.testing import ServiceProcess, start_service

SCHEMA = pa.schema([("id", pa.int64()), ("blob", pa.binary())])
MiB = 1 << 20


@pytest.fixture(scope="module")
def roomy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    """A service that accepts data messages of up to 128 MiB."""
    root = tmp_path_factory.mktemp("roomy-root")
    svc = start_service(root, args=["--max-batch-bytes", str(128 * MiB)])
    yield svc
    svc.stop()


def test_a_row_over_the_message_limit_fails_once_naming_the_limit(
    service: ServiceProcess,
) -> None:
    c = service.client()
    huge = pa.table({"id": [1, 2], "blob": [b"small", bytes(P.MAX_BATCH_BYTES)]}, schema=SCHEMA)
    started = time.monotonic()
    with pytest.raises(P.InvalidRequest, match=r"over this client's limit of 64 MiB") as e:
        c.write("huge_cell", huge)
    assert time.monotonic() - started < 10  # no retries, no connection lost and reopened
    assert "maxBatchBytes" in str(e.value) and "--max-batch-bytes" in str(e.value)
    # Nothing was committed, and the connection is fine: the next write goes through.
    c.write("huge_cell", pa.table({"id": [3], "blob": [b"ok"]}, schema=SCHEMA))
    assert c.read("huge_cell").column("id").to_pylist() == [3]


def test_a_row_over_the_services_limit_names_the_services_flag(service: ServiceProcess) -> None:
    """The client's limit raised, the service's not: the write fails at once, before the row
    is sent, naming the flag of the service (which told its limit when the write began)."""
    c = service.client(max_batch_bytes=128 * MiB)
    cell = pa.table({"id": [1], "blob": [bytes(70 * MiB)]}, schema=SCHEMA)
    with pytest.raises(P.InvalidRequest, match=r"over the service's limit of 64 MiB") as e:
        c.write("over_service", cell)
    assert "aqueduct serve --max-batch-bytes" in str(e.value)


def test_a_compressed_row_counts_at_its_decompressed_size(service: ServiceProcess) -> None:
    """zstd makes a 70 MiB cell of zeros a few KiB on the wire, but decoding it would hold
    70 MiB: the client counts it as the service does, and refuses it before sending."""
    c = service.client(compression="zstd")
    cell = pa.table({"id": [1], "blob": [bytes(70 * MiB)]}, schema=SCHEMA)
    with pytest.raises(P.InvalidRequest, match=r"70.0 MiB once encoded.*this client's limit"):
        c.write("compressed_cell", cell)


def test_a_read_arrives_within_the_readers_limit_and_a_row_over_it_is_named(
    service: ServiceProcess,
) -> None:
    """The reader's limit travels with the scan: a batch over it arrives in pieces, and a
    row over it fails at once naming maxBatchBytes (it used to close the reader's
    connection: ConnectionLost, retried)."""
    writer = service.client()
    rows = pa.table({"id": list(range(8)), "blob": [bytes(300 * 1024)] * 8}, schema=SCHEMA)
    writer.write("cut_to_fit", rows)  # one 2.4 MiB batch when scanned
    small = service.client(max_batch_bytes=MiB)
    batches = list(small.read_batches("cut_to_fit"))
    assert len(batches) >= 3 and all(b.nbytes <= MiB for b in batches)
    assert sorted(i for b in batches for i in b.column("id").to_pylist()) == list(range(8))

    writer.write("cell_over", pa.table({"id": [1], "blob": [bytes(2 * MiB)]}, schema=SCHEMA))
    started = time.monotonic()
    with pytest.raises(P.InvalidRequest, match=r"over the reader's limit of 1 MiB") as e:
        small.read("cell_over")
    assert time.monotonic() - started < 10  # not retried
    assert "2.0 MiB once encoded" in str(e.value) and "maxBatchBytes" in str(e.value)


@pytest.mark.slow  # 100 MiB each way: about 12 s
def test_a_100_mib_cell_goes_through_with_the_limit_raised_on_both_sides(
    roomy: ServiceProcess, tmp_path: Path
) -> None:
    blob = bytes(range(256)) * (100 * MiB // 256)
    cell = pa.table({"id": [1], "blob": [blob]}, schema=SCHEMA)
    with pytest.raises(P.InvalidRequest, match=r"this client's limit"):
        roomy.client().write("big_cell", cell)  # the client's default still refuses it
    c = roomy.client(max_batch_bytes=128 * MiB)
    c.write("big_cell", cell)
    back = c.read("big_cell")
    assert back.column("id").to_pylist() == [1]
    assert back.column("blob")[0].as_py() == blob


def test_a_lower_batch_limit_leaves_the_connections_message_limit() -> None:
    """A client's or a service's lower batch limit is checked per data message, by name; the
    engine's limit for every message on the connection (requests, replies, plans) stays
    where it was, and only a higher batch limit raises it."""
    from aqueduct_core.engine import EngineConfig
    from aqueduct_core.wire.primitives import WireLimits
    from aqueduct_spark.client import ClientConfig
    from aqueduct_spark.service.admission import REQUEST_WINDOW, engine_config

    default = WireLimits().max_payload_bytes
    for limit, engine in ((MiB, default), (128 * MiB, 128 * MiB)):
        client = ClientConfig("quic://127.0.0.1:4433", max_batch_bytes=limit)
        assert client.transport.engine.limits.max_payload_bytes == engine
        service = engine_config(EngineConfig(), REQUEST_WINDOW, limit)
        assert service.limits.max_payload_bytes == engine
