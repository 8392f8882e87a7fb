"""Structured Streaming source: ``spark.readStream.format("aqueduct")``.

Offsets are positions in the dataset's history: ``{"version": v, "file": f}`` means every
file added by versions below ``v`` is consumed, plus the first ``f`` files version ``v``
added (a read limit may split a version between micro-batches). They are built with a
fixed key order because Spark compares offsets as JSON text.

New versions are learned from a subscription channel on which the service pushes a
notification per commit (demand-driven: the service sends the newest version when the
reader is ready, never a backlog), with polling as the fallback; ``latestOffset`` then only
reads local state. Everything an executor needs is inside each partition: this reader
object lives in a long-running process on the driver and is never seen by executors.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from aqueduct_spark import options as O
from aqueduct_spark import protocol as P
from aqueduct_spark.datasource import SplitPartition, _client, spark_to_arrow

log = logging.getLogger("aqueduct.stream")


def offset(version: int, file: int = 0) -> dict[str, int]:
    return {"version": int(version), "file": int(file)}


class AqueductStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batch source over a dataset's versions. Options: startingVersion,
    startingTimestamp, maxRowsPerTrigger, maxBytesPerTrigger, minRowsPerTrigger,
    maxTriggerDelay, failOnDataLoss, pushNotifications, pollInterval."""

    def __init__(self, opts: O.Options, schema: StructType) -> None:
        self.opts = opts
        self.schema = spark_to_arrow(schema)
        self._client = _client(opts)
        self._target: int | None = None  # AvailableNow: never read past this version
        self._latest = -1
        self._latest_checked = 0.0
        self._files: dict[int, list[dict[str, Any]]] = {}
        self._versions: dict[int, dict[str, Any]] = {}
        self._last_batch = time.monotonic()
        self._subscription: _Subscription | None = None
        if opts.push_notifications:
            self._subscription = _Subscription(self._client, opts.dataset)

    # -- offsets ------------------------------------------------------------------------

    def initialOffset(self) -> dict[str, int]:
        opts = self.opts
        if opts.starting_timestamp is not None:
            versions = self._client.offsets(opts.dataset)["versions"]
            for v in versions:
                if _as_time(v["timestamp"]) >= opts.starting_timestamp:
                    return offset(v["version"])
            return offset(self._refresh(force=True) + 1)
        if opts.starting_version == "earliest":
            return offset(0)
        if opts.starting_version == "latest":
            return offset(self._refresh(force=True) + 1)
        return offset(int(opts.starting_version))

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._refresh(force=True)

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.opts.max_rows_per_trigger is not None:
            return ReadMaxRows(self.opts.max_rows_per_trigger)
        if self.opts.max_bytes_per_trigger is not None:
            return ReadMaxBytes(self.opts.max_bytes_per_trigger)
        return ReadAllAvailable()

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        latest = self._refresh()
        if self._target is not None:
            latest = min(latest, self._target)
        version, file = int(start["version"]), int(start["file"])
        max_rows = (
            getattr(limit, "max_rows", None) if not isinstance(limit, ReadAllAvailable) else None
        )
        max_bytes = self.opts.max_bytes_per_trigger
        if isinstance(limit, ReadMaxBytes):
            max_bytes = limit.max_bytes
        if isinstance(limit, ReadAllAvailable):
            max_bytes = None
        rows = size = 0
        end_v, end_f = version, file
        while end_v <= latest:
            files = self._version_files(end_v)
            if files is None:  # vacuumed: data loss
                end_v, end_f = end_v + 1, 0
                continue
            while end_f < len(files):
                f = files[end_f]
                over = (max_rows is not None and rows + f["rows"] > max_rows) or (
                    max_bytes is not None and size + f["bytes"] > max_bytes
                )
                if over and (rows or size):
                    return self._admit(start, offset(end_v, end_f), rows)
                rows, size, end_f = rows + f["rows"], size + f["bytes"], end_f + 1
            end_v, end_f = end_v + 1, 0
        return self._admit(start, offset(end_v, end_f), rows)

    def _admit(self, start: dict[str, int], end: dict[str, int], rows: int) -> dict[str, int]:
        """minRowsPerTrigger: hold a small batch back until maxTriggerDelay passed."""
        wanted = self.opts.min_rows_per_trigger
        if end == start:
            return start
        if (
            wanted is not None
            and self._target is None
            and rows < wanted
            and time.monotonic() - self._last_batch < self.opts.max_trigger_delay
        ):
            return start
        self._last_batch = time.monotonic()
        return end

    def reportLatestOffset(self) -> dict[str, Any]:
        latest = self._refresh()
        return offset(latest + 1)

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[InputPartition]:
        schema = P.schema_to_bytes(self.schema)
        out: list[InputPartition] = []
        v, f = int(start["version"]), int(start["file"])
        end_v, end_f = int(end["version"]), int(end["file"])
        while (v, f) < (end_v, end_f):
            files = self._version_files(v)
            if files is None:
                v, f = v + 1, 0
                continue
            stop = end_f if v == end_v else len(files)
            for split in files[f:stop]:
                out.append(SplitPartition(self.opts, split, schema, tuple(self.schema.names), None))
            v, f = v + 1, 0
        return out

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, SplitPartition):
            return
        client = _client(partition.opts)
        yield from client.scan(
            partition.split,
            schema=P.schema_from_bytes(partition.schema),
            columns=list(partition.columns),
            batch_rows=partition.opts.batch_rows,
        )

    def commit(self, end: dict[str, int]) -> None:
        # Forget file lists of versions wholly behind the committed offset.
        for v in [v for v in self._files if v < int(end["version"])]:
            del self._files[v]

    def stop(self) -> None:
        if self._subscription is not None:
            self._subscription.close()

    # -- learning about versions --------------------------------------------------------

    def _refresh(self, force: bool = False) -> int:
        sub = self._subscription
        if sub is not None and sub.alive and not force:
            if sub.latest > self._latest:
                self._latest = sub.latest
            return self._latest
        now = time.monotonic()
        if force or now - self._latest_checked >= self.opts.poll_interval:
            self._latest = self._client.offsets(self.opts.dataset, since_version=self._latest + 1)[
                "latest"
            ]
            self._latest_checked = now
        return self._latest

    def _version_files(self, version: int) -> list[dict[str, Any]] | None:
        files = self._files.get(version)
        if files is not None:
            return files
        try:
            result = self._client.changes(self.opts.dataset, version)
        except P.DataLoss:
            if self.opts.fail_on_data_loss:
                raise P.DataLoss(
                    f"version {version} of dataset {self.opts.dataset!r} is no longer available "
                    "(vacuumed). Restart from a newer version, or set failOnDataLoss=false to "
                    "skip what is gone."
                ) from None
            log.warning(
                "version %d of %s is gone; skipping it (failOnDataLoss=false)",
                version,
                self.opts.dataset,
            )
            return None
        files = self._files[version] = result["files"]
        return files


def _as_time(value: Any) -> Any:
    import datetime as dt

    if isinstance(value, dt.datetime):
        return value if value.tzinfo else value.replace(tzinfo=dt.UTC)
    return dt.datetime.fromtimestamp(float(value) / 1000, dt.UTC)


class _Subscription:
    """Keeps ``latest`` current from the service's push channel, on the client's loop."""

    def __init__(self, client: Any, dataset: str) -> None:
        self.latest = -1
        self.alive = False
        self._stop = threading.Event()
        self._future = client.subscribe(dataset, self._on_version, self._on_state)

    def _on_version(self, version: int) -> None:
        if version > self.latest:
            self.latest = version

    def _on_state(self, alive: bool) -> None:
        self.alive = alive

    def close(self) -> None:
        self._future.cancel()
