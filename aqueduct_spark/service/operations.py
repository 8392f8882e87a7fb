"""The requests answered with one reply (``list``, ``describe``, ``create``, ``drop``,
``plan``, ``begin``, ``commit``, ``abort``, ``offsets``, ``changes``, ``feed``, and the
maintenance requests ``compact``, ``vacuum``, ``restore``, ``delete``; §5 of
``docs/dataset-protocol.md``): each reads its fields, calls the store and returns the result
the reply carries. They block, so the server runs them in worker threads; the streaming
requests (``scan``, ``write``, ``subscribe``) are the server's own.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import uuid
from collections.abc import Callable
from typing import Any

from aqueduct_spark import protocol as P
from aqueduct_spark.service import changes, delta_log, maintenance, staging
from aqueduct_spark.service.binding import Condition
from aqueduct_spark.service.store import Store
from aqueduct_spark.service.transactions import Transactions

log = logging.getLogger("aqueduct.service")

COMMITTING = frozenset({"commit", "compact", "restore", "delete"})
"""Requests whose result may be a new version (``committed``, ``version``): subscribers hear
of it, and the service's maintenance counts it."""


def field(req: dict[str, Any], key: str, kind: type | tuple[type, ...], default: Any = ...) -> Any:
    """Field ``key`` of a request, which must be a ``kind`` (or None); required unless a
    ``default`` is given."""
    value = req.get(key, default)
    if value is ...:
        raise P.InvalidRequest(f"request {req.get('op')!r} needs field {key!r}")
    if value is not None and not isinstance(value, kind):
        raise P.InvalidRequest(f"field {key!r} of {req.get('op')!r} has the wrong type")
    return value


def timestamp(value: Any) -> dt.datetime | None:
    """A ``timestamp`` field (§4): a datetime, ISO 8601 text or epoch milliseconds; no zone
    means UTC."""
    if value is None:
        return None
    if isinstance(value, dt.datetime):
        return value if value.tzinfo else value.replace(tzinfo=dt.UTC)
    if isinstance(value, int | float):
        return dt.datetime.fromtimestamp(value / 1000, dt.UTC)
    if isinstance(value, str):
        try:
            parsed = dt.datetime.fromisoformat(value)
        except ValueError:
            raise P.InvalidRequest(
                f"timestamp {value!r} is not ISO 8601; write it like 2026-01-31T12:00:00Z"
            ) from None
        return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.UTC)
    raise P.InvalidRequest(
        f"timestamp must be ISO 8601 text or epoch milliseconds, got {value!r}; write it like 2026-01-31T12:00:00Z"
    )


class Operations:
    """The one-reply requests of one service, by name (:attr:`by_op`)."""

    def __init__(
        self, store: Store, split_bytes: int, max_batch_bytes: int, transactions: Transactions
    ) -> None:
        self.store = store
        self.transactions = transactions
        """Write transactions: a commit or abort is their activity, and ends them."""
        self.split_bytes = split_bytes
        """Target size of one scan split when the request does not say."""
        self.max_batch_bytes = max_batch_bytes
        """Largest data message a write may send: begin tells the client."""
        self.codecs: list[str] = list(P.CODECS)
        """The codecs writers may compress with (``auto`` chooses among them): begin says."""
        self.by_op: dict[str, Callable[[dict[str, Any]], Any]] = {
            "list": self.list_datasets,
            "describe": self.describe,
            "create": self.create,
            "drop": self.drop,
            "plan": self.plan,
            "begin": self.begin,
            "commit": self.commit,
            "abort": self.abort,
            "offsets": self.offsets,
            "changes": self.changes,
            "feed": self.feed,
            "compact": self.compact,
            "vacuum": self.vacuum,
            "restore": self.restore,
            "delete": self.delete,
        }

    def list_datasets(self, req: dict[str, Any]) -> Any:
        return {"datasets": [i.to_wire() for i in self.store.list()]}

    def describe(self, req: dict[str, Any]) -> Any:
        info = self.store.describe(
            field(req, "dataset", str),
            version=field(req, "version", int, None),
            timestamp=timestamp(req.get("timestamp")),
        )
        return info.to_wire()

    def create(self, req: dict[str, Any]) -> Any:
        schema = P.schema_from_bytes(field(req, "schema", bytes))
        info = self.store.create(
            field(req, "dataset", str),
            schema,
            partition_by=field(req, "partition_by", list, []),
            exist_ok=bool(req.get("exist_ok", False)),
        )
        return info.to_wire()

    def drop(self, req: dict[str, Any]) -> Any:
        name = field(req, "dataset", str)
        if not self.store.exists(name):
            if req.get("if_exists"):
                return {"dropped": False}
            raise P.DatasetNotFound(f"dataset {name!r} does not exist")
        self.store.drop(name)
        return {"dropped": True}

    def plan(self, req: dict[str, Any]) -> Any:
        plan = self.store.plan(
            field(req, "dataset", str),
            version=field(req, "version", int, None),
            timestamp=timestamp(req.get("timestamp")),
            columns=field(req, "columns", list, None),
            filter=Condition.from_wire(req.get("filters")),
            split_bytes=field(req, "split_bytes", int, None) or self.split_bytes,
            **({} if req.get("open_cost") is None else {"open_cost": field(req, "open_cost", int)}),
            min_tasks=field(req, "min_tasks", int, None) or 1,
        )
        return plan.to_wire()

    def begin(self, req: dict[str, Any]) -> Any:
        # one look at the log for the whole request (Tables.one_look)
        with self.store.one_look():
            name = field(req, "dataset", str)
            mode = field(req, "mode", str)
            if mode not in ("append", "overwrite", "create"):
                raise P.InvalidRequest(
                    f"unknown write mode {mode!r}: use append, overwrite or create"
                )
            schema = P.schema_from_bytes(field(req, "schema", bytes))
            target = self.store.check_schema(
                name,
                schema,
                mode,
                overwrite_schema=bool(req.get("overwrite_schema", False)),
                merge_schema=bool(req.get("merge_schema", False)),
                replace_where=field(req, "replace_where", str, None),
            )
            # version and partitioning from the one kept snapshot (check_schema just brought
            # it to the latest version), not from listings of the log
            snap = self.store.snapshot(name) if self.store.exists(name) else None
            return {
                "txn": uuid.uuid4().hex,
                "schema": P.schema_to_bytes(target),
                "version": None if snap is None else snap.version,
                "partition_by": list(
                    tuple(field(req, "partition_by", list, []))
                    if snap is None
                    else snap.partition_by
                ),
                "max_batch_bytes": self.max_batch_bytes,
                "codecs": self.codecs,
            }

    def commit(self, req: dict[str, Any]) -> Any:
        # one look at the log, but for the commit's own (Tables.one_look)
        with self.store.one_look():
            staged = [P.StagedFile.from_dict(d) for d in field(req, "staged", list)]
            name = field(req, "dataset", str)
            self.store.validate_name(name)
            finish = field(req, "finish", str, None)
            if finish is not None:
                staging.check_txn(finish)  # refused before anything is committed
            self.transactions.before_commit(name, staged)  # an expired transaction is refused
            result = self.store.commit(
                name,
                field(req, "mode", str),
                P.schema_from_bytes(field(req, "schema", bytes)),
                field(req, "partition_by", list, []),
                staged,
                app_id=field(req, "app_id", str, None),
                app_version=field(req, "app_version", int, None),
                overwrite_schema=bool(req.get("overwrite_schema", False)),
                replaces=field(req, "replaces", int, None),
                merge_schema=bool(req.get("merge_schema", False)),
                replace_where=field(req, "replace_where", str, None),
            )
            self.transactions.committed(name, staged)
            wire = result.to_wire()
            if finish is not None:
                wire["finishing"] = True  # the server runs finish() once it has answered
            return wire

    def finish(self, req: dict[str, Any], result: dict[str, Any]) -> int:
        """After a commit's answer, for one with ``finish``: what ``abort`` of that transaction
        with no files would do (its other staged files deleted, the transaction ended),
        without reading the log when nothing else was staged. Returns the files deleted."""
        name, txn = field(req, "dataset", str), field(req, "finish", str)
        published = set()
        if result.get("committed"):
            published = {P.StagedFile.from_dict(d).path for d in field(req, "staged", list)}
        store = self.store
        local = store.local_dir(name)
        removed = 0
        try:
            if local is None or os.path.isdir(local):
                fs = store.filesystem(name)
                found = staging.staged_files(fs)
                rest = {i.path for i in found if staging.staged_txn(i.path) == txn} - published
                removed = len(store.delete_unreferenced(name, fs, rest)) if rest else 0
        except Exception as exc:  # answered already: what is left, vacuum removes
            log.warning("clean-up of transaction %s of %s failed: %s", txn, name, exc)
        self.transactions.finished(name, [txn])
        return removed

    def abort(self, req: dict[str, Any]) -> Any:
        staged = [P.StagedFile.from_dict(d) for d in field(req, "staged", list, [])]
        name = field(req, "dataset", str)
        txn = field(req, "txn", str)
        # (a dataset a write was to create has only the staged files, and no log yet)
        removed = self.store.abort_txn(name, txn, staged)
        self.transactions.finished(name, [txn])
        return {"removed": removed}

    def offsets(self, req: dict[str, Any]) -> Any:
        name = field(req, "dataset", str)
        since = field(req, "since_version", int, None)
        versions = self.store.history(name, since_version=since)
        return {
            "latest": self.store.latest_version(name),
            "table_id": self.store.table_id(name),
            "versions": [v.to_wire() for v in versions],
        }

    def changes(self, req: dict[str, Any]) -> Any:
        name = field(req, "dataset", str)
        version = field(req, "version", int)
        # missing_ok: files already vacuumed are listed under "missing" instead of failing
        # (a stream with failOnDataLoss=false skips just those, keeping file positions stable)
        missing: list[str] | None = [] if req.get("missing_ok") else None
        last = field(req, "to_version", int, None)
        if last is not None:
            return self._changes_range(name, version, last, req, missing is not None)
        if req.get("change_feed"):
            # the change feed of one version: its change files, or its adds and removes
            found = changes.feed(
                self.store, name, version, version, change_feed=True, missing_ok=True
            )
            entry = found["versions"][0] if found["versions"] else {"files": [], "removes": 0}
            if found["missing"] and missing is None:
                raise P.DataLoss(
                    f"{len(found['missing'])} files of dataset {name!r} version {version} are "
                    f"gone (vacuumed), e.g. {found['missing'][0]!r}"
                )
            files, removes = entry["files"], entry["removes"]
            missing = found["missing"]
            operation = entry.get("operation", "")
        else:
            files = [f.to_dict() for f in self.store.version_files(name, version, missing)]
            actions = delta_log.read_log(self.store.filesystem(name), version)
            removes = changes.removed_by(actions)
            operation = str(delta_log.commit_info(actions).get("operation", ""))
        return {
            "version": version,
            "files": files,
            "removes": removes,
            "operation": operation,
            "missing": missing or [],
            # after the files: a table re-created meanwhile shows as another id, never as
            # the new table's files under the old id
            "table_id": self.store.table_id(name),
        }

    def _changes_range(
        self, name: str, first: int, last: int, req: dict[str, Any], missing_ok: bool
    ) -> Any:
        """``changes`` of every version ``first..last``: each version's files, read from
        those versions' commits alone (a stream catching up asks once per range)."""
        if req.get("change_feed"):
            if last < first:
                raise P.InvalidRequest(
                    f"to_version must be >= version {first}, got {last}; give a range that ends at or after its start"
                )
            found = changes.feed(
                self.store, name, first, last, change_feed=True, missing_ok=missing_ok
            )
            gone = set(found["missing"])
            entries = [
                {
                    "version": e["version"],
                    "files": e["files"],
                    "adds": e["adds"],
                    "removes": e["removes"],
                    "operation": e["operation"],
                    "missing": [f["path"] for f in e["files"] if f["path"] in gone],
                }
                for e in found["versions"]
            ]
        else:
            lost: dict[int, list[str]] | None = {} if missing_ok else None
            removes: dict[int, int] = {}
            by_version = self.store.versions_files(name, first, last, lost, removes)
            entries = [
                {
                    "version": v,
                    "files": [f.to_dict() for f in files],
                    "removes": removes[v],
                    "missing": (lost or {}).get(v, []),
                }
                for v, files in by_version.items()
            ]
        return {
            "version": first,
            "to_version": last,
            "versions": entries,
            "table_id": self.store.table_id(name),  # after the files, as for one version
        }

    def feed(self, req: dict[str, Any]) -> Any:
        result = changes.feed(
            self.store,
            field(req, "dataset", str),
            starting_version=field(req, "starting_version", int, None),
            ending_version=field(req, "ending_version", int, None),
            starting_timestamp=timestamp(req.get("starting_timestamp")),
            ending_timestamp=timestamp(req.get("ending_timestamp")),
            change_feed=bool(req.get("change_feed", False)),
            missing_ok=bool(req.get("missing_ok", False)),
        )
        return {**result, "schema": P.schema_to_bytes(result["schema"])}

    # -- maintenance on request ----------------------------------------------------------

    def compact(self, req: dict[str, Any]) -> Any:
        return maintenance.compact(
            self.store,
            field(req, "dataset", str),
            field(req, "target_bytes", int, None)
            or maintenance.MaintenanceConfig.compact_target_bytes,
        )

    def vacuum(self, req: dict[str, Any]) -> Any:
        hours = field(req, "retention_hours", (int, float), None)
        retention = (
            maintenance.MaintenanceConfig.vacuum_retention
            if hours is None
            else dt.timedelta(hours=hours)
        )
        removed = self.store.vacuum(
            field(req, "dataset", str),
            retention=retention,
            dry_run=bool(req.get("dry_run", False)),
        )
        return {"removed": removed}

    def restore(self, req: dict[str, Any]) -> Any:
        return maintenance.restore(
            self.store, field(req, "dataset", str), field(req, "version", int)
        )

    def delete(self, req: dict[str, Any]) -> Any:
        return maintenance.delete(
            self.store, field(req, "dataset", str), field(req, "predicate", str)
        )
