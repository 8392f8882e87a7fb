"""A row too large for one data message fails at once, naming the limit, instead of being
sent and refused by the service (which looked like a lost connection: issue 17 item 5)."""

from __future__ import annotations

import time

import pyarrow as pa
import pytest

from aqueduct_spark import protocol as P
from aqueduct_spark.testing import ServiceProcess


def test_a_row_over_the_message_limit_fails_once_naming_the_limit(
    service: ServiceProcess,
) -> None:
    c = service.client()
    schema = pa.schema([("id", pa.int64()), ("blob", pa.binary())])
    huge = pa.table({"id": [1, 2], "blob": [b"small", bytes(P.MAX_BATCH_BYTES)]}, schema=schema)
    started = time.monotonic()
    with pytest.raises(P.InvalidRequest, match=r"over the 64 MiB one data message may carry"):
        c.write("huge_cell", huge)
    assert time.monotonic() - started < 10  # no retries, no connection lost and reopened
    # Nothing was committed, and the connection is fine: the next write goes through.
    c.write("huge_cell", pa.table({"id": [3], "blob": [b"ok"]}, schema=schema))
    assert c.read("huge_cell").column("id").to_pylist() == [3]
