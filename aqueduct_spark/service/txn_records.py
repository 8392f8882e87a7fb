"""Transaction records on the store: which write transactions are alive, known to every
service process over one root, whichever process the writes went through, across restarts.

Before a write stages its first file, the transaction gets a record under the root::

    <root>/.aqueduct-txns/<txn>.<dataset>.live

Its modification time is the transaction's last activity: every write writes it again (when it
starts, when it ends, and every ``lifetime / 8`` while it streams), so does a commit, and a
commit or an abort deletes it. A transaction whose record has not been written for longer than
the lifetime is expired by whichever process sweeps first (:mod:`.transactions`): it leaves a
tombstone::

    <root>/.aqueduct-txns/<txn>.<dataset>.expired

deletes the transaction's staged files and its live record. The tombstone stays one lifetime
more, so that a late commit or write of that transaction is told it expired, not that its files
went missing; when it goes, the transaction's files are looked for once more (a writer that
was in the middle of a file when it expired removes its own, unless it died too).

**Clocks.** Ages are the store's: a record's modification time is set by the store (an object
store's server, the local kernel), and a sweep compares it with the modification time of a
probe it writes just then (:meth:`Records.store_now`), never with its own host's clock. Hosts
whose clocks disagree, with each other or with the store, therefore agree on every age. What
is assumed: the store's clock does not jump, and clocks run at the same rate (a host measures
``lifetime / 8`` between keep-alives with its own monotonic clock).

**No process deletes a live transaction's files.** Activity writes the live record, then looks
for a tombstone; a sweep writes the tombstone, then looks at the live record again and backs
off (removing its tombstone) if the record changed or went. With a store that shows every
completed write to every later read (S3, SeaweedFS, a local disk), either the activity sees
the tombstone (the commit or write is refused, as expired) or the sweep sees the new record
(nothing is deleted): never neither.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import re
import threading
import uuid
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.ipc as ipc

from aqueduct_spark.protocol import InvalidRequest

from .tables import Tables

DIR = ".aqueduct-txns"
LIVE, EXPIRED = "live", "expired"
_NAME_RE = re.compile(
    r"^(?P<txn>[A-Za-z0-9_]{1,64})\.(?P<dataset>[A-Za-z0-9][A-Za-z0-9_.-]{0,127})"
    r"\.(?P<kind>live|expired)$"
)
_PROBE = "clock-"
_KEY = b"aqueduct"


@dataclass(frozen=True)
class Record:
    """One record found under the root: a live transaction or a tombstone."""

    dataset: str
    txn: str
    kind: str
    mtime: dt.datetime
    """When it was last written, by the store's clock."""


def alive(tables: Tables, dataset: str, since: dt.datetime) -> set[str]:
    """The transactions of ``dataset`` active ``since`` then: a vacuum keeps their files."""
    return {
        r.txn
        for r in Records(tables).list()
        if r.kind == LIVE and r.dataset == dataset and r.mtime >= since
    }


def expired_error(dataset: str, txn: str, info: dict[str, Any]) -> InvalidRequest:
    """What a commit or write of an expired transaction is answered with (never retried:
    its staged files are gone)."""
    hours = info.get("lifetime_s")
    lifetime = f"{float(hours) / 3600:g} h" if isinstance(hours, int | float) else "its lifetime"
    return InvalidRequest(
        f"transaction {txn} of dataset {dataset!r} expired: nothing was written to it, "
        f"committed or aborted for longer than {lifetime}, so the service aborted it and "
        "deleted its staged files. Write the data again in a new transaction; to let "
        "transactions wait longer, raise aqueduct serve --txn-lifetime-hours "
        "(txn_lifetime_hours in its --config file)",
        {"reason": "transaction_expired", "dataset": dataset, "txn": txn},
    )


class Records:
    """The transaction records under one root. Thread-safe; every call is a store request or
    two."""

    def __init__(self, tables: Tables) -> None:
        self._tables = tables
        self._fs: pafs.FileSystem | None = None
        self._lock = threading.Lock()

    @property
    def fs(self) -> pafs.FileSystem:
        with self._lock:
            if self._fs is None:
                self._fs = self._tables.root_filesystem()
            return self._fs

    @staticmethod
    def path(dataset: str, txn: str, kind: str) -> str:
        return f"{DIR}/{txn}.{dataset}.{kind}"

    def _write(self, path: str, info: dict[str, Any]) -> None:
        # Arrow's C++ stream writes the bytes: a Python write() to an object-store stream
        # hands it a buffer it refuses. The content rides in the schema's metadata.
        schema = pa.schema([], metadata={_KEY: json.dumps(info, default=str)})
        for attempt in range(3):
            try:
                with self.fs.open_output_stream(path) as out, ipc.new_stream(out, schema):
                    return
            except FileNotFoundError:
                if attempt == 2:
                    raise
                self.fs.create_dir(DIR, recursive=True)  # a local root's first record

    def read(self, dataset: str, txn: str, kind: str) -> dict[str, Any]:
        """What a record says (who wrote it, when it expired); {} if it is gone or torn."""
        try:
            with self.fs.open_input_file(self.path(dataset, txn, kind)) as f:
                metadata = ipc.open_stream(f).schema.metadata or {}
            found = json.loads(metadata.get(_KEY, b"{}"))
        except (OSError, ValueError, pa.ArrowInvalid):
            return {}
        return found if isinstance(found, dict) else {}

    def stat(self, dataset: str, txn: str, kind: str) -> dt.datetime | None:
        """When the record was last written, or None if there is none."""
        info = self.fs.get_file_info(self.path(dataset, txn, kind))
        return info.mtime if info.type == pafs.FileType.File else None

    def touch(self, dataset: str, txn: str, info: dict[str, Any], create: bool = True) -> None:
        """Activity of a transaction: write its live record, then look for a tombstone (in
        this order; see the module's docstring). The expired error if there is one. Without
        ``create``, a transaction with no record (finished, or never written) gets none."""
        if create:
            self.check(dataset, txn)  # an expired transaction gets no new record
        elif self.stat(dataset, txn, LIVE) is None:
            self.check(dataset, txn)
            return
        self._write(self.path(dataset, txn, LIVE), info)
        self.check(dataset, txn)

    def check(self, dataset: str, txn: str) -> None:
        """The expired error if the transaction has a tombstone (nothing written)."""
        if self.stat(dataset, txn, EXPIRED) is not None:
            raise expired_error(dataset, txn, self.read(dataset, txn, EXPIRED))

    def bury(self, dataset: str, txn: str, info: dict[str, Any]) -> None:
        """Write the transaction's tombstone."""
        self._write(self.path(dataset, txn, EXPIRED), info)

    def remove(self, dataset: str, txn: str, kind: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.fs.delete_file(self.path(dataset, txn, kind))

    def list(self) -> list[Record]:
        """Every record under the root (one listing), and the stale clock probes."""
        try:
            infos = self.fs.get_file_info(pafs.FileSelector(DIR, allow_not_found=True))
        except FileNotFoundError:
            return []
        out = []
        for info in infos:
            m = _NAME_RE.match(info.base_name)
            if m and info.type == pafs.FileType.File and info.mtime is not None:
                out.append(Record(m["dataset"], m["txn"], m["kind"], info.mtime))
            elif info.base_name.startswith(_PROBE) and info.mtime is not None:
                out.append(Record("", info.base_name, _PROBE, info.mtime))
        return out

    def store_now(self) -> dt.datetime:
        """The store's clock now: the modification time of a probe written for it."""
        probe = f"{DIR}/{_PROBE}{uuid.uuid4().hex}"
        self._write(probe, {})
        try:
            mtime = self.fs.get_file_info(probe).mtime
        finally:
            with contextlib.suppress(FileNotFoundError):
                self.fs.delete_file(probe)
        if not isinstance(mtime, dt.datetime):
            raise OSError("the store gave no modification time for a probe it was sent")
        return mtime

    def remove_probe(self, name: str) -> None:
        """A clock probe a process died before deleting."""
        with contextlib.suppress(FileNotFoundError):
            self.fs.delete_file(f"{DIR}/{name}")
