"""Write transactions in the service: what they may stage, and a lifetime for those nobody
finishes.

A write transaction is begun, written by any number of tasks over any connections and service
processes, and committed or aborted once. Two things keep one from filling the store:

- **Quotas** (:mod:`.quota`): the staged, uncommitted bytes of one transaction, and of one
  token (one connection on a service without tokens), are bounded; a write past a bound is
  refused before it writes, and deletes what it staged.
- **A lifetime**: a transaction with no write, commit or abort for longer than
  ``lifetime`` is aborted by the service, its staged files deleted. Whether it is alive is
  read from the store (:mod:`.txn_records`), so it holds across restarts, crashes and the
  several processes serving one root: every process sweeps every ``sweep_interval``, and
  none deletes the files of a transaction another keeps writing.

:class:`Transactions` is the service's: the write path stages through :meth:`stage`, commits
and aborts tell it (:meth:`before_commit`, :meth:`finished`), and a background task keeps the
records of this process's open writes fresh and sweeps.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import os
import socket
import threading
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from prometheus_client import CollectorRegistry, Counter, Gauge

from aqueduct_spark.protocol import DatasetNotFound, InvalidRequest, StagedFile

from . import staging
from .access import Grant
from .quota import Charge, Key, Ledger
from .store import Store
from .txn_records import EXPIRED, LIVE, Record, Records

log = logging.getLogger("aqueduct.service")
ACCESS = logging.getLogger("aqueduct.access")

GiB = 1 << 30
KEEPALIVE = 8
"""An open write writes its transaction's record every ``lifetime / KEEPALIVE``."""
DEBOUNCE = 100
"""Activity within ``lifetime / DEBOUNCE`` of this process's last record of the transaction
writes none (a task's end right after its start, a commit right after the last task). A sweep
waits that much longer than the lifetime, so nothing expires early."""
_HOST = socket.gethostname()


@dataclass(frozen=True)
class StagingConfig:
    """Bounds on staged, uncommitted data (``aqueduct serve --max-staged-bytes-*``,
    ``--txn-lifetime-hours``, ``--txn-sweep-seconds``)."""

    max_txn_bytes: int = 64 * GiB
    """Staged bytes one transaction may have (through this process)."""
    max_token_bytes: int = 256 * GiB
    """Staged bytes of open transactions one token may have through this process; on a
    service without tokens, one connection."""
    lifetime: dt.timedelta = dt.timedelta(hours=24)
    """A transaction with no write, commit or abort for this long is aborted and its staged
    files deleted. Longer than any pause of a Spark job's write (a stage recomputed after a
    lost shuffle, executors waited for), short enough to give the disk back within a day."""
    sweep_interval: dt.timedelta = dt.timedelta(minutes=10)
    """How often each process looks for expired transactions (one listing of the records)."""

    def __post_init__(self) -> None:
        for name in ("max_txn_bytes", "max_token_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"StagingConfig.{name} must be at least 1")
        for name in ("lifetime", "sweep_interval"):
            if getattr(self, name) <= dt.timedelta(0):
                raise ValueError(f"StagingConfig.{name} must be positive")


class StagedWrite:
    """One write task staging through :meth:`Transactions.stage`: ``write``, then ``close``
    (the staged files) or ``abort`` (they are deleted), as a :class:`~.staging.StageWriter`."""

    def __init__(self, owner: Transactions, charge: Charge, user: str | None) -> None:
        self._txns = owner
        self.charge = charge
        self.user = user
        self.writer: staging.StageWriter | None = None

    def write(self, batch: pa.RecordBatch) -> None:
        assert self.writer is not None
        self.writer.write(batch)

    @property
    def buffered(self) -> int:
        return 0 if self.writer is None else self.writer.buffered

    def flush(self) -> None:
        assert self.writer is not None
        self.writer.flush()

    def close(self) -> list[StagedFile]:
        assert self.writer is not None
        staged = self.writer.close()
        try:
            self._txns.activity(*self.charge.key, self.user)  # expired meanwhile: refused
        except BaseException:
            self.abort()
            raise
        self._txns.unregister(self)
        return staged

    def abort(self) -> None:
        try:
            if self.writer is not None:
                self.writer.abort()
        finally:
            self.charge.release()
            self._txns.unregister(self)


class Transactions:
    """Quotas, liveness records and expiry for the write transactions of one service."""

    def __init__(
        self,
        store: Store,
        config: StagingConfig,
        pool: Any,
        per_token: bool,
    ) -> None:
        self.store = store
        self.config = config
        self._pool = pool
        self.records = Records(store)
        self._refused: Counter | None = None
        self._expired: Counter | None = None
        self._expired_bytes: Counter | None = None
        self.ledger = Ledger(
            config.max_txn_bytes, config.max_token_bytes, per_token, self._count_refusal
        )
        self._lock = threading.Lock()
        self._open: dict[Key, weakref.WeakSet[StagedWrite]] = {}
        self._touched: dict[Key, float] = {}
        self._lifetime = config.lifetime.total_seconds()
        self._task: asyncio.Task[None] | None = None
        self._keeper = object()  # the pool's owner of keep-alives (sweeps are ours)
        self.expired = 0
        self.expired_bytes = 0

    def observe(self, reg: CollectorRegistry) -> None:
        """Show the staging in the service's metrics (``/metrics``)."""
        Gauge(
            "aqueduct_staged_bytes",
            "Bytes staged through this process by transactions not yet committed, aborted or "
            "expired.",
            registry=reg,
        ).set_function(lambda: self.ledger.total)
        Gauge(
            "aqueduct_staged_transactions",
            "Transactions with bytes staged through this process, not yet finished.",
            registry=reg,
        ).set_function(lambda: self.ledger.transactions)
        self._refused = Counter(
            "aqueduct_staging_refused",
            "Writes refused by a staging quota, by limit (transaction, token or connection).",
            ["limit"],
            registry=reg,
        )
        for limit in ("transaction", "token", "connection"):
            self._refused.labels(limit)
        self._expired = Counter(
            "aqueduct_transactions_expired",
            "Transactions this process aborted for having no activity for their lifetime.",
            registry=reg,
        )
        self._expired_bytes = Counter(
            "aqueduct_expired_bytes",
            "Bytes of staged files deleted with expired transactions.",
            registry=reg,
        )

    def _count_refusal(self, limit: str) -> None:
        if self._refused is not None:
            self._refused.labels(limit).inc()

    # -- the write path (worker threads) -------------------------------------------------

    def stage(
        self,
        dataset: str,
        txn: str,
        task: str,
        schema: pa.Schema,
        partition_by: Sequence[str],
        grant: Grant,
        conn: object = None,
    ) -> StagedWrite:
        """Start staging one task of transaction ``txn`` for the holder of ``grant`` on
        connection ``conn``: its record is written (refused if it expired), and what it
        stages is charged to the transaction and to its owner (:meth:`owner`)."""
        self.store.validate_name(dataset)
        staging.check_txn(txn)
        charge = self.ledger.charge((dataset, txn), *self.owner(grant, conn))
        write = StagedWrite(self, charge, grant.name)
        with self._lock:  # before the record: a keep-alive must not miss it
            self._open.setdefault((dataset, txn), weakref.WeakSet()).add(write)
        try:
            self.activity(dataset, txn, grant.name)
            write.writer = self.store.open_stage(dataset, txn, task, schema, partition_by)
        except BaseException:
            self.unregister(write)
            raise
        write.writer.meter = write.charge.add
        return write

    def unregister(self, write: StagedWrite) -> None:
        key = write.charge.key
        with self._lock:
            writes = self._open.get(key)
            if writes is not None:
                writes.discard(write)
                if not writes:
                    del self._open[key]

    def owner(self, grant: Grant, conn: object) -> tuple[object, str]:
        """Whose staged bytes a write counts to, and its name in a refusal: the token's, or
        the connection's on a service without tokens (it cannot tell clients apart else)."""
        if self.ledger.per_token or conn is None:
            return grant, grant.name
        return conn, "this connection"

    def activity(
        self, dataset: str, txn: str, user: str | None, force: bool = False, create: bool = True
    ) -> None:
        """A write, commit or abort of the transaction: its record is written (unless this
        process wrote it just now; without ``create`` only if it has one), and the expired
        error raised if it expired."""
        key = (dataset, txn)
        now = time.monotonic()
        with self._lock:
            last = self._touched.get(key)
        if not force and last is not None and now - last < self._lifetime / DEBOUNCE:
            return
        info = {"user": user, "host": _HOST, "pid": os.getpid()}
        self.records.touch(dataset, txn, info, create)
        with self._lock:
            self._touched[key] = now

    def before_commit(
        self, dataset: str, staged: Sequence[StagedFile], user: str | None = None
    ) -> None:
        """A commit of ``staged`` is about to be made: activity of each of their transactions
        (the expired error for one that expired)."""
        for txn in self._txns_of(staged):
            # (no record for a transaction that has none: committed before, or staged some
            # other way; only its tombstone matters then)
            self.activity(dataset, txn, user, create=False)

    def finished(self, dataset: str, txns: Sequence[str]) -> None:
        """The transactions were committed or aborted here: their records go (a tombstone
        stays), their bytes are no longer staged data."""
        for txn in txns:
            self.records.remove(dataset, txn, LIVE)
            self.ledger.settle((dataset, txn))
            with self._lock:
                self._touched.pop((dataset, txn), None)

    @staticmethod
    def _txns_of(staged: Sequence[StagedFile]) -> list[str]:
        return sorted({t for f in staged if (t := staging.staged_txn(f.path)) is not None})

    def committed(self, dataset: str, staged: Sequence[StagedFile]) -> None:
        self.finished(dataset, self._txns_of(staged))

    def connection_closed(self, conn: object) -> None:
        if not self.ledger.per_token:
            self.ledger.forget(conn)

    # -- what status shows ---------------------------------------------------------------

    def status(self, grant: Grant, conn: object = None) -> dict[str, Any]:
        """The ``status`` request's answer: this process's staging and expiries."""
        return {
            "staged_bytes": self.ledger.total,
            "staged_transactions": self.ledger.transactions,
            "yours": self.ledger.owner_bytes(self.owner(grant, conn)[0]),
            "open_writes": sum(len(w) for w in list(self._open.values())),
            "expired_transactions": self.expired,
            "expired_bytes": self.expired_bytes,
            "max_staged_bytes_per_txn": self.config.max_txn_bytes,
            "max_staged_bytes_per_token": self.config.max_token_bytes,
            "limit_per": "token" if self.ledger.per_token else "connection",
            "txn_lifetime_s": self._lifetime,
        }

    # -- keep-alive and sweep ------------------------------------------------------------

    def start(self) -> None:
        """Start keeping this process's open writes alive and sweeping (on the running loop)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        sweep_every = self.config.sweep_interval.total_seconds()
        tick = min(sweep_every, self._lifetime / (2 * KEEPALIVE))
        swept = -float("inf")
        while True:
            await asyncio.sleep(tick)
            now = time.monotonic()
            with self._lock:
                due = [
                    (key, list(writes))
                    for key, writes in self._open.items()
                    if now - self._touched.get(key, 0.0) >= self._lifetime / KEEPALIVE
                ]
            try:
                if due:
                    await self._pool.run(self._keeper, self._keep_alive, due)
                if now - swept >= sweep_every:
                    swept = now
                    await self._pool.run(self, self.sweep)
            except Exception as exc:  # the store failed: next time again
                log.warning("sweeping the write transactions failed: %s", exc)

    def _keep_alive(self, due: list[tuple[Key, list[StagedWrite]]]) -> None:
        for (dataset, txn), writes in due:
            user = next((w.user for w in writes), None)
            try:
                self.activity(dataset, txn, user, force=True)
            except InvalidRequest as exc:  # expired: each of its writes fails at its next row group
                for write in writes:
                    write.charge.expired = exc

    def sweep(self) -> None:
        """Expire the transactions (of any process) whose records are older than the
        lifetime; remove tombstones a lifetime old; forget transactions finished elsewhere."""
        listed = time.monotonic()
        records = self.records.list()
        live = {(r.dataset, r.txn) for r in records if r.kind == LIVE}
        with self._lock:
            known = {*self.ledger.transaction_keys(), *self._touched}
            gone = [
                key
                for key in known
                if key not in live
                and key not in self._open
                and self._touched.get(key, 0.0) < listed
            ]
            for key in gone:
                self._touched.pop(key, None)
        for key in gone:  # committed, aborted or expired through another process
            self.ledger.settle(key)
        limit = dt.timedelta(seconds=self._lifetime * (1 + 1 / DEBOUNCE))
        old = [r for r in records if dt.datetime.now(dt.UTC) - r.mtime > limit]
        if not old:
            return
        now = self.records.store_now()  # ages by the store's clock, not this host's
        for r in old:
            if now - r.mtime <= limit:
                continue
            if r.kind == LIVE:
                with self._lock:
                    mine = (r.dataset, r.txn) in self._open  # kept alive here, if late
                if not mine:
                    self._expire(r, now, limit)
            elif r.kind == EXPIRED:
                self._delete_files(r.dataset, r.txn)  # a writer mid-file when it expired
                self.records.remove(r.dataset, r.txn, EXPIRED)
            else:
                self.records.remove_probe(r.txn)

    def _expire(self, r: Record, now: dt.datetime, limit: dt.timedelta) -> None:
        # Read the record's time the way it is read again below (a listing may give it
        # more precisely than a look at the one object does).
        first = self.records.stat(r.dataset, r.txn, LIVE)
        if first is None or now - first <= limit:
            return  # finished, or written, since the listing
        idle = (now - first).total_seconds()
        user = self.records.read(r.dataset, r.txn, LIVE).get("user")
        info = {"lifetime_s": self._lifetime, "idle_s": idle, "user": user, "at": now}
        self.records.bury(r.dataset, r.txn, info)
        if self.records.stat(r.dataset, r.txn, LIVE) != first:
            # written (or finished) meanwhile: alive after all (see txn_records)
            self.records.remove(r.dataset, r.txn, EXPIRED)
            return
        files, nbytes = self._delete_files(r.dataset, r.txn)
        self.records.remove(r.dataset, r.txn, LIVE)
        self.ledger.settle((r.dataset, r.txn))
        self.expired += 1
        self.expired_bytes += nbytes
        if self._expired is not None and self._expired_bytes is not None:
            self._expired.inc()
            self._expired_bytes.inc(nbytes)
        fields = {
            "dataset": r.dataset,
            "txn": r.txn,
            "user": user or "-",
            "files": files,
            "bytes": nbytes,
            "idle_s": round(idle, 1),
            "lifetime_s": self._lifetime,
        }
        ACCESS.info("transaction expired", extra={"fields": fields})

    def _delete_files(self, dataset: str, txn: str) -> tuple[int, int]:
        """Delete the transaction's staged files that no version references: (files, bytes)."""
        local = self.store.local_dir(dataset)
        if local is not None and not os.path.isdir(local):
            return 0, 0
        try:
            fs = self.store.filesystem(dataset)
        except DatasetNotFound:
            return 0, 0
        sizes = {
            i.path: i.size or 0
            for i in staging.staged_files(fs)
            if staging.staged_txn(i.path) == txn
        }
        deleted = self.store.delete_unreferenced(dataset, fs, set(sizes))
        return len(deleted), sum(sizes[p] for p in deleted)
