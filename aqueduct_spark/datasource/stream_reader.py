"""Structured Streaming source: ``spark.readStream.format("aqueduct")``.

Offsets are positions in the dataset's history: ``{"version": v, "file": f, "tableId": t}``
means every file added by versions below ``v`` is consumed, plus the first ``f`` files version
``v`` added (a read limit may split a version between micro-batches). A position has one
spelling only (a version read to its end is ``{"version": v + 1, "file": 0, ...}``) and the
keys are always in this order, because Spark compares offsets as JSON text.

``tableId`` is the table's Delta ``metaData.id``, as in Delta's own source (its
``reservoirId``): version numbers mean nothing in another table. A checkpoint used with
another dataset, or a dataset dropped and created again under a running query, is
:class:`SourceTableChanged`, unless ``failOnDataLoss=false``, which starts over at the
earliest version of the table that is there now. The reader checks the id at least every
``pollInterval`` and in every file list the service sends. Offsets written before table ids
existed have no ``tableId`` and are taken to be of the current table.

The files of a version are the ``add`` actions of its own commit, in path order: fixed once
committed, so a micro-batch replayed after a failure reads exactly what it read before.
Versions that only rewrite data (compaction, ``dataChange=false``) add nothing, so a stream
never reads compacted rows twice. A version that removes data (an overwrite, a delete, a
restore) fails the query by default, or is skipped (``skipChangeCommits``, or
``ignoreDeletes`` for a version that only deletes); with ``readChangeFeed`` every version's
change feed is read instead, deletes as rows (:mod:`.changes`).

New versions are learned from a subscription on which the service pushes the newest version
after each commit (demand-driven: one note per change or heartbeat, never a backlog), with
polling every ``pollInterval`` as the fallback while no subscription is alive; so
``latestOffset`` usually reads only local state. This reader object lives in one long-running
process on the driver host and is never seen by executors (their copy is pickled before the
first trigger): everything a task needs is inside its partition.

Progress metrics: ``reportLatestOffset`` returns the offset after the latest version, plus
``latestVersion``, ``versionsBehind``, ``rowsBehind`` and ``bytesBehind`` (what is committed in
the dataset but not yet in a planned micro-batch); Spark shows it as
``query.lastProgress["sources"][0]["latestOffset"]``. (Python sources cannot report Spark
custom metrics in 4.3.)
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
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

from aqueduct_spark import protocol as P
from aqueduct_spark.datasource.changes import DataChanged, FilesPartition, admit, pack
from aqueduct_spark.datasource.notifications import Subscription
from aqueduct_spark.datasource.options import Options
from aqueduct_spark.datasource.schemas import spark_to_arrow
from aqueduct_spark.datasource.stream_offsets import SourceTableChanged, as_time, offset
from aqueduct_spark.datasource.task_errors import surfaced

log = logging.getLogger("aqueduct.stream")


class _TableMoved(Exception):
    """The table changed while a micro-batch was planned (failOnDataLoss=false): plan again."""


PREFETCH = 256
"""Versions whose file lists a read limit may look ahead for, fetched together."""
PREFETCH_THREADS = 8

IDLE_WAIT = 0.1
"""With push notifications flowing and nothing new, ``latestOffset`` waits up to this long
for a notification before answering "no data": Spark then asks again, so the query wakes
within a notification's latency without spinning."""


class AqueductStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batch source over a dataset's versions. Options: startingVersion,
    startingTimestamp, maxRowsPerTrigger, maxBytesPerTrigger, minRowsPerTrigger,
    maxTriggerDelay, failOnDataLoss, pushNotifications, pollInterval, readChangeFeed,
    skipChangeCommits, ignoreDeletes (docs/spark-options.md)."""

    def __init__(self, opts: Options, schema: StructType) -> None:
        self.opts = opts
        self.schema = spark_to_arrow(schema)
        self._reset()

    def _reset(self) -> None:
        # Driver-side state. Spark pickles this reader for the executors (before the first
        # trigger, from another process): none of it is needed there, and clients, threads
        # and locks cannot be pickled, so __getstate__ leaves all of it out.
        self._client_obj: Any = None
        self._subscription: Subscription | None = None
        self._target: int | None = None  # AvailableNow: never read past this version
        self._latest = -1
        self._latest_checked = float("-inf")
        self._files: dict[int, tuple[list[dict[str, Any]], frozenset[str]] | None] = {}
        self._last_batch = time.monotonic()
        self._last_end: dict[str, Any] | None = None
        self._behind: tuple[tuple[int, int, int], dict[str, int]] | None = None
        self._table_id: str | None = None  # the dataset's table now, as last seen
        self._table_checked = float("-inf")
        self._seen_ids: set[str] = set()  # tables this reader has read from

    def __getstate__(self) -> dict[str, Any]:
        return {"opts": self.opts, "schema": self.schema}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._reset()

    @property
    def _client(self) -> Any:
        if self._client_obj is None:
            self._client_obj = self.opts.client()
        return self._client_obj

    # -- offsets ------------------------------------------------------------------------

    @surfaced
    def initialOffset(self) -> dict[str, Any]:
        """Where a query without a checkpoint starts (not called on restart)."""
        opts = self.opts
        if opts.starting_timestamp is not None:
            history = self._client.offsets(opts.dataset)
            table_id = self._saw_table(history)
            for v in history["versions"]:
                if as_time(v["timestamp"]) >= opts.starting_timestamp:
                    return offset(v["version"], 0, table_id)
            return offset(int(history["latest"]) + 1, 0, table_id)
        if opts.starting_version == "earliest":
            return self._earliest()
        if opts.starting_version == "latest":
            latest = self._refresh(force=True)
            return offset(latest + 1, 0, self._table_id)
        return offset(int(opts.starting_version), 0, self._check_table(force=True))

    def _earliest(self) -> dict[str, Any]:
        """The oldest version of the current table still in its log."""
        history = self._client.offsets(self.opts.dataset)
        table_id = self._saw_table(history)
        versions = [int(v["version"]) for v in history["versions"]]
        return offset(min(versions) if versions else int(history["latest"]) + 1, 0, table_id)

    @surfaced
    def prepareForTriggerAvailableNow(self) -> None:
        """AvailableNow: fix the target (everything committed now) before anything else."""
        self._target = self._refresh(force=True)

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.opts.max_rows_per_trigger is not None:
            return ReadMaxRows(self.opts.max_rows_per_trigger)
        if self.opts.max_bytes_per_trigger is not None:
            return ReadMaxBytes(self.opts.max_bytes_per_trigger)
        return ReadAllAvailable()

    @surfaced
    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        given = start
        table_id = self._check_table()
        start = self._resolve_start(given, table_id)
        if self._target is not None:
            latest = self._target
        else:
            latest = self._refresh()
            if start["version"] > latest and self._wait_for_news(latest):
                latest = self._refresh()
        try:
            end, rows = self._plan_end(start, latest, limit)
        except _TableMoved:
            return given  # failOnDataLoss=false: the next trigger starts over at the new table
        end = self._admit(start, end, rows)
        if end == start and start.get("tableId") == given.get("tableId", start.get("tableId")):
            end = given  # nothing new: the very offset Spark gave (the same text)
        self._last_end = end
        return end

    def _resolve_start(self, start: dict[str, Any], table_id: str | None) -> dict[str, Any]:
        """``start`` in the current table; SourceTableChanged if it is of another table
        (failOnDataLoss=false: the earliest version of the current table)."""
        start_id = start.get("tableId")
        if start_id is None or table_id is None or start_id == table_id:
            return offset(start["version"], start["file"], table_id)
        if self.opts.fail_on_data_loss:
            raise self._changed(start_id, table_id)
        log.warning(
            "dataset %s is another table (id %s) than the query's checkpoint read (id %s); "
            "starting over at its earliest version (failOnDataLoss=false)",
            self.opts.dataset,
            table_id,
            start_id,
        )
        return self._earliest()

    def _changed(self, old: str, new: str | None) -> SourceTableChanged:
        name = self.opts.dataset
        if old in self._seen_ids and new is None:
            what = f"dataset {name!r} was dropped while this query read it (table id {old})"
        elif old in self._seen_ids:
            what = (
                f"dataset {name!r} was dropped and created again while this query read it "
                f"(table id {old}, now {new})"
            )
        else:
            what = (
                f"the query's checkpoint holds offsets of table id {old}, but dataset "
                f"{name!r} is table id {new}: the checkpoint was written by a query that read "
                "another dataset, or the dataset was dropped and created again since"
            )
        return SourceTableChanged(
            f"{what}. Versions of one table mean nothing in the other, so reading on would "
            "skip or repeat data. Start the query with a new checkpointLocation, or set "
            "failOnDataLoss=false to start over at the earliest version of the current table."
        )

    def _plan_end(
        self, start: dict[str, Any], latest: int, limit: ReadLimit
    ) -> tuple[dict[str, Any], int]:
        """The furthest position within ``limit`` (whole files; at least one file)."""
        max_rows = max_bytes = None
        if not isinstance(limit, ReadAllAvailable):
            if isinstance(limit, ReadMaxRows):
                max_rows = limit.max_rows
            elif isinstance(limit, ReadMaxBytes):
                max_bytes = limit.max_bytes
            # Both options together: Spark passes one limit; the source applies the other.
            if max_rows is None:
                max_rows = self.opts.max_rows_per_trigger
            if max_bytes is None:
                max_bytes = self.opts.max_bytes_per_trigger
        table_id = start.get("tableId")
        if start["version"] > latest:
            return start, 0
        if max_rows is None and max_bytes is None and self.opts.min_rows_per_trigger is None:
            return offset(latest + 1, 0, table_id), 0  # no limit: no need to list the files
        rows = size = 0
        v, f = start["version"], start["file"]
        while v <= latest:
            if v not in self._files:
                self._prefetch(v, min(v + PREFETCH - 1, latest))
            entry = self._version_files(v)
            files = entry[0] if entry is not None else []
            while f < len(files):
                n, b = int(files[f]["rows"]), int(files[f]["bytes"])
                over = (max_rows is not None and rows + n > max_rows) or (
                    max_bytes is not None and size + b > max_bytes
                )
                if over and (rows or size):
                    return offset(v, f, table_id), rows
                rows, size, f = rows + n, size + b, f + 1
            v, f = v + 1, 0
        return offset(v, f, table_id), rows

    def _admit(self, start: dict[str, Any], end: dict[str, Any], rows: int) -> dict[str, Any]:
        """minRowsPerTrigger: hold a small batch back until maxTriggerDelay has passed."""
        if end == start:
            return start
        wanted = self.opts.min_rows_per_trigger
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
        """The position after the latest version, and how far the query is behind it."""
        latest = self._latest
        end = self._last_end
        out: dict[str, Any] = offset(latest + 1, 0, self._table_id)
        out["latestVersion"] = latest
        if end is None:
            return out
        key = (end["version"], end["file"], latest)
        if self._behind is None or self._behind[0] != key:
            self._behind = (key, self._measure_behind(end, latest))
        out.update(self._behind[1])
        return out

    def _measure_behind(self, end: dict[str, Any], latest: int) -> dict[str, int]:
        if end["version"] > latest:
            return {"versionsBehind": 0, "rowsBehind": 0, "bytesBehind": 0}
        try:
            history = self._client.offsets(self.opts.dataset, since_version=end["version"])
        except Exception as exc:  # metrics never fail the query
            log.info("cannot measure the backlog of %s: %s", self.opts.dataset, exc)
            return {}
        versions = rows = size = 0
        for h in history["versions"]:
            v = int(h["version"])
            if v > latest:
                continue
            r, b = int(h["rows"]), int(h["bytes"])
            if v == end["version"] and end["file"]:
                entry = self._files.get(v)
                if entry is not None:
                    done = entry[0][: end["file"]]
                    r -= sum(int(x["rows"]) for x in done)
                    b -= sum(int(x["bytes"]) for x in done)
            if r > 0 or b > 0:
                versions += 1
            rows, size = rows + max(r, 0), size + max(b, 0)
        return {"versionsBehind": versions, "rowsBehind": rows, "bytesBehind": size}

    @surfaced
    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        """The files between two positions, packed into tasks of about splitSize bytes."""
        table_id = self._check_table()
        end_id = end.get("tableId")
        if end_id is not None and table_id is not None and end_id != table_id:
            # A micro-batch planned on another table (replayed from the checkpoint).
            if self.opts.fail_on_data_loss:
                raise self._changed(end_id, table_id)
            log.warning(
                "skipping a micro-batch planned on table %s: dataset %s is now table %s "
                "(failOnDataLoss=false)",
                end_id,
                self.opts.dataset,
                table_id,
            )
            return []
        if start.get("tableId", end_id) != end_id:
            start = self._earliest()  # failOnDataLoss=false moved to the current table
        try:
            return self._partitions(start, end)
        except _TableMoved:
            log.warning(
                "dataset %s was dropped and created again under this micro-batch; it reads "
                "nothing (failOnDataLoss=false)",
                self.opts.dataset,
            )
            return []

    def _partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        chosen: list[dict[str, Any]] = []
        v, f = int(start["version"]), int(start["file"])
        end_v, end_f = int(end["version"]), int(end["file"])
        self._prefetch(v, end_v if end_f else end_v - 1)
        while (v, f) < (end_v, end_f):
            entry = self._version_files(v)
            if entry is not None:
                files, missing = entry
                stop = end_f if v == end_v else len(files)
                for split in files[f:stop]:
                    if split["path"] in missing:
                        log.warning(
                            "skipping vacuumed file %s of %s version %d (failOnDataLoss=false)",
                            split["path"],
                            self.opts.dataset,
                            v,
                        )
                    else:
                        chosen.append(split)
            v, f = v + 1, 0
        return list(pack(self.opts, chosen, self.schema))

    @surfaced
    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """On an executor: stream the partition's files, cast to Spark's schema."""
        if not isinstance(partition, FilesPartition):
            return  # Spark reads an empty micro-batch as one partition of None
        opts = partition.opts
        client = opts.client()
        schema = P.schema_from_bytes(partition.schema)
        if opts.fail_on_data_loss and len(partition.splits) > 1:
            # one scan for all the files (their small batches merged by the service)
            yield from client.scan(
                partition.splits,
                schema=schema,
                columns=list(partition.columns),
                batch_rows=opts.batch_rows,
            )
            return
        for split in partition.splits:  # file by file, to skip the ones that vanished
            try:
                yield from client.scan(
                    split,
                    schema=schema,
                    columns=list(partition.columns),
                    batch_rows=opts.batch_rows,
                )
            except P.DataLoss:
                if opts.fail_on_data_loss:
                    raise
                log.warning(
                    "file %s of %s vanished before it was read; skipped (failOnDataLoss=false)",
                    split.get("path"),
                    opts.dataset,
                )

    def commit(self, end: dict[str, Any]) -> None:
        # Spark never asks for positions before a committed one again: forget their files.
        for v in [v for v in self._files if v < int(end["version"])]:
            del self._files[v]

    def stop(self) -> None:
        # Spark 4.3 does not call this (its runner is killed with SIGTERM): nothing here may
        # be needed for correctness. The subscription ends with the process.
        if self._subscription is not None:
            self._subscription.close()
            self._subscription = None

    # -- learning about versions --------------------------------------------------------

    def _subscribed(self) -> Subscription | None:
        if self._subscription is None and self.opts.push_notifications and self._target is None:
            self._subscription = Subscription(self._client, self.opts.dataset)
        return self._subscription

    def _refresh(self, force: bool = False) -> int:
        """The latest version: pushed, or polled every pollInterval while push is down."""
        sub = self._subscribed()
        if sub is not None and sub.alive and not force:
            self._latest = max(self._latest, sub.latest)
            return self._latest
        if force or time.monotonic() - self._latest_checked >= self.opts.poll_interval:
            self._poll()
        return self._latest

    def _check_table(self, force: bool = False) -> str | None:
        """The current table id, asked for at least every pollInterval (push notifications
        carry versions only, and a re-created table may never reach the query's version)."""
        if force or time.monotonic() - self._table_checked >= self.opts.poll_interval:
            self._poll()
        return self._table_id

    def _poll(self) -> None:
        try:
            answer = self._client.offsets(self.opts.dataset, since_version=self._latest + 1)
        except P.DatasetNotFound:
            if self._table_id is None:
                raise  # never there: the name is wrong
            # Dropped under the query (and perhaps about to be created again): no new data
            # from it; unless failOnDataLoss=false waits for the next table, the query fails.
            if self.opts.fail_on_data_loss:
                raise self._changed(self._table_id, None) from None
            return
        self._saw_table(answer)

    def _saw_table(self, answer: dict[str, Any]) -> str | None:
        """Take the latest version and table id of an ``offsets`` answer."""
        now = time.monotonic()
        latest = int(answer["latest"])
        table_id = answer.get("table_id")
        if table_id is not None and self._table_id is not None and table_id != self._table_id:
            self._new_table(str(table_id), latest)
        else:
            self._latest = max(self._latest, latest)
        if table_id is not None:
            self._table_id = str(table_id)
            self._seen_ids.add(self._table_id)
        self._latest_checked = self._table_checked = now
        return self._table_id

    def _new_table(self, table_id: str, latest: int) -> None:
        """The dataset is another table now: nothing known about the old one holds."""
        log.warning(
            "dataset %s is a new table (id %s, was %s): it was dropped and created again",
            self.opts.dataset,
            table_id,
            self._table_id,
        )
        self._table_id = table_id
        self._latest = latest
        self._files.clear()
        self._behind = None
        if self._subscription is not None:
            # the service pushes a subscriber only versions above those it has sent
            self._subscription.close()
            self._subscription = None

    def _wait_for_news(self, latest: int) -> bool:
        """Wait briefly for a pushed version newer than ``latest`` (only while push works)."""
        sub = self._subscription
        if sub is None or not sub.alive:
            return False
        return sub.wait_newer(latest, IDLE_WAIT)

    def _prefetch(self, first: int, last: int) -> None:
        """List the files of versions ``first..last`` not known yet: ranges of up to
        ``PREFETCH`` versions per request (a backlog of many small versions would otherwise
        cost one round trip each). What a range cannot answer (a version or file gone, a
        service that predates ranges) is asked version by version, several at a time."""
        todo = [v for v in range(first, last + 1) if v not in self._files]
        if len(todo) <= 1:
            return
        runs: list[list[int]] = []
        for v in todo:
            if runs and runs[-1][-1] == v - 1 and len(runs[-1]) < PREFETCH:
                runs[-1].append(v)
            else:
                runs.append([v])
        for run in runs:
            if len(run) > 1:
                self._fetch_range(run[0], run[-1])
        todo = [v for v in todo if v not in self._files]
        if len(todo) > 1:
            with ThreadPoolExecutor(min(PREFETCH_THREADS, len(todo))) as pool:
                list(pool.map(self._version_files, todo))

    def _fetch_range(self, first: int, last: int) -> None:
        expected = self._table_id
        try:
            result = self._client.changes(
                self.opts.dataset,
                first,
                to_version=last,
                missing_ok=not self.opts.fail_on_data_loss,
                change_feed=self.opts.read_change_feed,
            )
        except (P.DataLoss, P.VersionNotFound, P.InvalidRequest):
            return  # version by version, which tells which one is the matter and how
        entries = result.get("versions")
        if entries is None:
            return  # a service without ranges answered for ``first`` alone
        found = result.get("table_id")
        if found is not None and expected is not None and found != expected:
            self._moved(expected, str(found))
        for e in entries:
            try:
                files = admit(e, self.opts)
            except DataChanged:
                return  # raised when that version is reached, as one by one
            self._keep(int(e["version"]), (files, frozenset(e.get("missing") or ())))

    def _version_files(self, version: int) -> tuple[list[dict[str, Any]], frozenset[str]] | None:
        """The files ``version`` added and those of them already vacuumed; None when the
        whole version is gone and failOnDataLoss is false."""
        if version in self._files:
            return self._files[version]
        dataset = self.opts.dataset
        entry: tuple[list[dict[str, Any]], frozenset[str]] | None
        expected = self._table_id
        try:
            result = self._client.changes(
                dataset,
                version,
                missing_ok=not self.opts.fail_on_data_loss,
                change_feed=self.opts.read_change_feed,
            )
            # a version that removes data: fail, skip, or (change feed) read it (.changes)
            entry = (admit(result, self.opts), frozenset(result.get("missing") or ()))
            found = result.get("table_id")
            if found is not None and expected is not None and found != expected:
                self._moved(expected, str(found))
        except P.VersionNotFound:
            # A version the query knew of is not there: was the table re-created?
            if expected is not None and self._check_table(force=True) != expected:
                self._moved(expected, self._table_id)
            raise
        except P.DataLoss as exc:
            if self.opts.fail_on_data_loss:
                raise P.DataLoss(
                    f"the stream from dataset {dataset!r} needs version {version}, which is "
                    f"no longer available ({exc}). The data between the checkpoint and the "
                    "oldest available version is lost: set failOnDataLoss=false to skip it, "
                    "or start a new query (new checkpoint) from a version that exists."
                ) from None
            log.warning(
                "version %d of %s is gone; skipping it (failOnDataLoss=false)", version, dataset
            )
            entry = None
        self._keep(version, entry)
        return entry

    def _keep(
        self, version: int, entry: tuple[list[dict[str, Any]], frozenset[str]] | None
    ) -> None:
        if entry is not None and entry[1]:
            log.warning(
                "%d files of %s version %d were vacuumed; they will be skipped "
                "(failOnDataLoss=false)",
                len(entry[1]),
                self.opts.dataset,
                version,
            )
        self._files[version] = entry

    def _moved(self, old: str, new: str | None) -> None:
        """The table changed under a micro-batch being planned."""
        if new != self._table_id:
            self._check_table(force=True)
        if self.opts.fail_on_data_loss:
            raise self._changed(old, self._table_id)
        raise _TableMoved()
