"""The batch limit at both ends of the service's data channels.

A data message counts at its length or, compressed, at the size it declares it decompresses
to (``protocol.arrow.read_data_message``). A write's messages are checked against the
service's own limit (``--max-batch-bytes``) before anything is decompressed; a scan's
batches are cut to the limit its reader sent (``max_batch_bytes`` of the request, the
client's ``maxBatchBytes``), so a reader never receives a message it must refuse, and a
single row over it is refused by name instead of closing the reader's connection (which
looked like a lost connection, and was retried).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from aqueduct_spark import protocol as P
from aqueduct_spark.service.operations import field

MIB = 2**20


def check_message(payload: Any, limit: int) -> P.DataMessage:
    """Parse one data message of a write and check it against ``limit``
    (``--max-batch-bytes``) at the size it declares, before anything is decompressed
    (tens of microseconds: no decoding). The write then waits for room for that size in the
    service's budget (``write_buffers``) and decodes it on a worker thread: the event loop
    never decompresses."""
    message = P.read_data_message(payload)
    if message.size > limit:
        raise P.InvalidRequest(
            f"a data message of {P.describe_size(message)} is over the service's limit of "
            f"{limit / MIB:g} MiB for one data message; split the data into smaller "
            "batches, or raise the limit (aqueduct serve --max-batch-bytes)"
        )
    return message


def reader_limit(req: dict[str, Any]) -> int | None:
    """The largest data message a scan's reader accepts (None: a client older than the
    field, sent whole batches as before)."""
    limit: int | None = field(req, "max_batch_bytes", int, None)
    if limit is not None and limit < 1:
        raise P.InvalidRequest(
            f"field 'max_batch_bytes' of 'scan' must be positive, got {limit}; send the "
            "client's limit (maxBatchBytes), or null for none"
        )
    return limit


def payloads_for_reader(
    batch: pa.RecordBatch, options: pa.ipc.IpcWriteOptions, limit: int | None
) -> Iterator[tuple[Any, pa.RecordBatch]]:
    """A scan's batch as data messages within its reader's limit, each with the slice of
    the batch it holds."""
    if limit is None:
        yield P.batch_to_payload(batch, options), batch
        return

    def too_large(size: int) -> P.DatasetError:
        return P.InvalidRequest(
            f"a row of this dataset is {size / MIB:.1f} MiB once encoded, over the reader's "
            f"limit of {limit / MIB:g} MiB for one data message; raise the reader's limit "
            "(Spark option maxBatchBytes, ClientConfig.max_batch_bytes) to read it"
        )

    for piece, payload in P.payloads_within(batch, options, limit, too_large):
        yield payload, piece
