"""Appends the service commits itself: Delta's commit protocol, without listing the log.

deltalake's commit (``create_write_transaction``) lists ``_delta_log`` to find the latest
version (``get_latest_version`` in delta-rs's ``logstore/mod.rs``, through delta-kernel's
``LogSegment::for_table_changes``), again to update its snapshot after writing
(``PostCommit::run_post_commit_hook`` in ``kernel/transaction/mod.rs``: ``EagerSnapshot::
update``), and once more, with every entry's metadata, for its expired-log cleanup
(``cleanup_expired_logs_for`` in ``protocol/checkpoints.rs``, on every commit unless told
not to). On a local disk each listing reads the whole directory (``object_store``'s local
``list_with_offset`` filters after reading it), so a commit there costs a few microseconds
per commit file kept: 30 days of a stream's commits make it seconds. None of these calls can
be given the version the service already knows from its kept tail (:mod:`.log_tail`).

So on a local root (a directory or ``file://``) an append is committed here, as Delta's
protocol defines a commit and as deltalake and Spark make one on a local disk: the actions of
version v + 1 written to a temporary file in ``_delta_log`` and hard-linked to
``<v + 1>.json``, which fails if that name exists (put-if-absent), v being the latest version.
A writer that loses the race reads the winning commits into its tail, checks again what they
may have changed (the caller's checks: app transactions, schema, files), and tries the next
version: the outcomes deltalake gives a blind append (WriteSerializable). Only tables this
module can write correctly go this way (:func:`blocker`): a protocol and features it knows,
no invariants, CHECK constraints, generated or identity columns, column mapping, row
tracking or in-commit timestamps, which a writer must honour; the others use deltalake's
commit as before. A checkpoint follows every ``delta.checkpointInterval`` versions (100),
and the expired-log cleanup after it (``delta.logRetentionDuration``, 30 days), both made by
deltalake on a worker thread, off the commit's reply.

On an object store deltalake commits (its conditional put, ``If-None-Match``): its listings
there start after the version it knows (``start-after``), which keeps them flat; only its
cleanup lists everything, so it is turned off inside commits and run after checkpoints
instead (:func:`hooks`, :func:`after_commit`).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any
from urllib.parse import quote

from deltalake import DeltaTable, PostCommitHookProperties
from deltalake.transaction import AddAction

from .log_tail import FileKey, Tail

log = logging.getLogger("aqueduct.service")

try:
    _VERSION = importlib.metadata.version("aqueduct-spark")
except importlib.metadata.PackageNotFoundError:  # a source tree, not installed
    _VERSION = "dev"
ENGINE = f"aqueduct-spark/{_VERSION}"
"""The commitInfo's engineInfo of the commits made here."""
_LEGACY_FEATURES = {
    2: {"appendOnly", "invariants"},
    3: {"checkConstraints"},
    4: {"changeDataFeed", "generatedColumns"},
    5: {"columnMapping"},
    6: {"identityColumns"},
}
"""The writer features a legacy minWriterVersion implies, by the version that adds them."""
_KNOWN = {
    "appendOnly",  # appends are what it allows
    "invariants",  # checked below: none declared
    "checkConstraints",  # checked below: none declared
    "changeDataFeed",  # appends write no change files
    "generatedColumns",  # checked below: none declared
    "columnMapping",  # checked below: mode none
    "identityColumns",  # checked below: none declared
    "timestampNtz",
    "deletionVectors",  # new files carry none
    "domainMetadata",  # an append writes none
    "vacuumProtocolCheck",
}
"""Writer features an append written here honours (some only when unused)."""
_PATH_SAFE = "/!$&'()+,:;=@"
"""Characters deltalake leaves as they are in a log path (besides letters, digits, ``_.-~``)."""


def log_path(path: str) -> str:
    """A storage path as the log spells it: URL-encoded, as deltalake encodes it."""
    return quote(path, safe=_PATH_SAFE)


def writer_features(protocol: dict[str, Any]) -> set[str]:
    version = int(protocol.get("minWriterVersion") or 1)
    if version >= 7:
        return set(protocol.get("writerFeatures") or ())
    return {f for v, feats in _LEGACY_FEATURES.items() if v <= version for f in feats}


def _field_metadata(schema_string: str) -> list[dict[str, Any]]:
    """The metadata of every field, nested ones included, of a Delta schema string."""
    out: list[dict[str, Any]] = []

    def walk(kind: Any) -> None:
        if not isinstance(kind, dict):
            return
        for f in kind.get("fields") or ():
            out.append(f.get("metadata") or {})
            walk(f.get("type"))
        walk(kind.get("elementType"))
        walk(kind.get("keyType"))
        walk(kind.get("valueType"))

    walk(json.loads(schema_string))
    return out


def blocker(tail: Tail) -> str | None:
    """Why an append to the table of ``tail`` cannot be committed here (None: it can)."""
    protocol = tail.protocol
    if int(protocol.get("minWriterVersion") or 1) > 7:
        return f"writer version {protocol.get('minWriterVersion')}"
    unknown = writer_features(protocol) - _KNOWN
    if unknown:
        return f"writer features {sorted(unknown)}"
    config = tail.configuration
    if any(k.startswith("delta.constraints.") for k in config):
        return "CHECK constraints"
    if config.get("delta.columnMapping.mode", "none") != "none":
        return "column mapping"
    for key in ("delta.enableRowTracking", "delta.enableInCommitTimestamps"):
        if config.get(key, "false").lower() == "true":
            return key
    for meta in _field_metadata(tail.metadata["schemaString"]):
        for key in meta:
            if key in ("delta.invariants", "delta.generationExpression") or key.startswith(
                ("delta.identity.", "delta.columnMapping.")
            ):
                return f"a column with {key}"
    return None


def actions(
    tail: Tail,
    adds: Sequence[AddAction],
    txns: Sequence[tuple[str, int]],
    meta: dict[str, Any],
    key: str,
    removes: Mapping[str, tuple[int, int]] | None = None,
    schema_string: str | None = None,
) -> list[dict[str, Any]]:
    """The actions of an append of ``adds`` to the table of ``tail``: its commitInfo (as
    deltalake's and Spark's, with our record under ``key``), app transactions, adds. With
    ``removes`` (storage path -> (size, rows) of files of an unpartitioned table) an
    overwrite: those files removed, and with ``schema_string`` the table's new schema."""
    now = int(time.time() * 1000)
    mode = "Append" if removes is None else "Overwrite"
    info = {
        "timestamp": now,
        "operation": "WRITE",
        "operationParameters": {"mode": mode, "partitionBy": json.dumps(tail.partition_by)},
        "readVersion": tail.version,
        "isolationLevel": "WriteSerializable",
        "isBlindAppend": removes is None,
        "operationMetrics": {
            "numFiles": str(len(adds)),
            "numOutputRows": str(
                sum(json.loads(a.stats or "{}").get("numRecords", 0) for a in adds)
            ),
            "numOutputBytes": str(sum(a.size for a in adds)),
        },
        "engineInfo": ENGINE,
        "txnId": uuid.uuid4().hex,
        key: meta,
    }
    out: list[dict[str, Any]] = [{"commitInfo": info}]
    if schema_string is not None:
        out.append({"metaData": {**tail.metadata, "schemaString": schema_string}})
    out += [{"txn": {"appId": a, "version": v, "lastUpdated": now}} for a, v in txns]
    out += [
        {
            "remove": {
                "path": log_path(path),
                "deletionTimestamp": now,
                "dataChange": True,
                "extendedFileMetadata": True,
                "partitionValues": {},
                "size": size,
            }
        }
        for path, (size, _) in sorted((removes or {}).items())
    ]
    out += [
        {
            "add": {
                "path": log_path(a.path),
                "partitionValues": dict(a.partition_values),
                "size": a.size,
                "modificationTime": a.modification_time,
                "dataChange": a.data_change,
                "stats": a.stats,
            }
        }
        for a in adds
    ]
    return out


def put_if_absent(table_dir: str, version: int, body: bytes) -> FileKey:
    """Write ``body`` as the commit file of ``version`` unless it exists (None: it did).
    Returns the new file's (size, mtime): the link keeps the temporary file's inode."""
    log_dir = os.path.join(table_dir, "_delta_log")
    tmp = os.path.join(log_dir, f"_commit_{uuid.uuid4().hex}.json.tmp")
    with open(tmp, "wb") as f:
        f.write(body)
    try:
        st = os.stat(tmp)
        try:
            os.link(tmp, os.path.join(log_dir, f"{version:020d}.json"))
        except FileExistsError:
            return None
        return (st.st_size, st.st_mtime_ns)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


Putter = Callable[[int, bytes], FileKey]
"""Writes the commit file of a version unless it exists: its key, or None when it did."""


def putter(tables: Any, name: str) -> Putter | None:
    """How to put dataset ``name``'s next commit file if absent: on a local root a hard
    link (:func:`put_if_absent`); on S3 a conditional put (``If-None-Match``, as deltalake's
    own commit makes it) when the store options say the store has them
    (``AWS_CONDITIONAL_PUT``) and name no other locking (a DynamoDB lock table, unsafe
    renames), through ``obstore``, the same Rust ``object_store`` deltalake writes with.
    None: deltalake commits (other stores, or options ``obstore`` does not take)."""
    local = tables.local_dir(name)
    if local is not None:
        return lambda version, body: put_if_absent(local, version, body)
    options = {k.upper(): v for k, v in (tables.storage_options or {}).items()}
    uri = tables.uri(name)
    if not uri.startswith(("s3://", "s3a://")) or "AWS_CONDITIONAL_PUT" not in options:
        return None
    if "AWS_S3_LOCKING_PROVIDER" in options or options.get(
        "AWS_S3_ALLOW_UNSAFE_RENAME", ""
    ).lower() in ("true", "1"):
        return None
    store = _object_store(uri, tuple(sorted(options.items())))
    if store is None:
        return None
    fs = tables.filesystem(name)

    def put(version: int, body: bytes) -> FileKey:
        import obstore

        try:
            obstore.put(store, f"_delta_log/{version:020d}.json", body, mode="create")
        except obstore.exceptions.AlreadyExistsError:
            return None
        from .log_tail import file_key

        return file_key(fs.get_file_info(f"_delta_log/{version:020d}.json"))

    return put


@functools.lru_cache(maxsize=64)
def _object_store(uri: str, options: tuple[tuple[str, str], ...]) -> Any:
    """An ``obstore`` store of the table at ``uri`` (None if it cannot make one)."""
    try:
        from obstore.store import from_url
    except ImportError:
        return None
    config = dict(options)
    allow_http = config.pop("AWS_ALLOW_HTTP", "false").lower() in ("true", "1")
    config.pop("AWS_CONDITIONAL_PUT", None)  # a create is If-None-Match by itself
    if "AWS_ENDPOINT_URL" in config:
        config["AWS_ENDPOINT"] = config.pop("AWS_ENDPOINT_URL")
    try:
        return from_url(uri, config=config, client_options={"allow_http": allow_http})  # type: ignore[call-overload]
    except Exception as exc:  # an option only deltalake knows: deltalake commits
        log.info("commits to %s go through deltalake: %s", uri, exc)
        return None


def encode(actions_: Sequence[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(a, separators=(",", ":")) + "\n" for a in actions_).encode()


# -- after a commit: checkpoints and log cleanup, as deltalake's post-commit hook -------------

_POOL = ThreadPoolExecutor(max_workers=1, thread_name_prefix="aqueduct-checkpoint")
_PENDING: dict[tuple[str, str], Future[None]] = {}
_PENDING_LOCK = threading.Lock()


def hooks(given: PostCommitHookProperties | None) -> PostCommitHookProperties:
    """deltalake's post-commit hooks for a commit it makes for us: checkpoints as given,
    its expired-log cleanup never inside the commit (:func:`after_commit` runs it after a
    checkpoint)."""
    checkpoint = True if given is None else bool(given.create_checkpoint)
    return PostCommitHookProperties(create_checkpoint=checkpoint, cleanup_expired_logs=False)


def checkpoint_due(configuration: dict[str, str], version: int) -> bool:
    """Whether ``version`` is one deltalake writes a checkpoint at (every
    ``delta.checkpointInterval`` versions, 100 by default)."""
    try:
        interval = max(1, int(configuration.get("delta.checkpointInterval", "100")))
    except ValueError:
        interval = 100
    return (version + 1) % interval == 0


def after_commit(
    uri: str,
    storage_options: dict[str, str] | None,
    configuration: dict[str, str],
    version: int,
    given: PostCommitHookProperties | None,
    *,
    checkpoint: bool,
) -> Future[None] | None:
    """After a commit at ``version``: when a checkpoint is due there, write it (when
    ``checkpoint``: deltalake already did inside its own commits) and clean up the expired
    log behind it as the hooks ``given`` and the table's ``delta.enableExpiredLogCleanup``
    say; on a worker thread, one table at a time. Returns the work's future (tests wait)."""
    if not checkpoint_due(configuration, version):
        return None
    checkpoint = checkpoint and (given is None or bool(given.create_checkpoint))
    cleanup = given.cleanup_expired_logs if given is not None else None
    if cleanup is None:
        cleanup = configuration.get("delta.enableExpiredLogCleanup", "true").lower() == "true"
    if not (checkpoint or cleanup):
        return None

    def run() -> None:
        try:
            table = DeltaTable(uri, version=version, storage_options=storage_options)
            if checkpoint:
                table.create_checkpoint()
            if cleanup:
                table.cleanup_metadata()
        except Exception as exc:  # the next interval tries again; readers still read
            log.warning("checkpoint of %s at version %d failed: %s", uri, version, exc)

    with _PENDING_LOCK:
        future = _POOL.submit(run)
        _PENDING[(uri, str(version))] = future
        future.add_done_callback(lambda _: _forget(uri, version))
    return future


def _forget(uri: str, version: int) -> None:
    with _PENDING_LOCK:
        _PENDING.pop((uri, str(version)), None)


def wait_checkpoints(timeout: float = 60) -> None:
    """Wait for the checkpoints under way (tests, and a store closing)."""
    with _PENDING_LOCK:
        pending = list(_PENDING.values())
    for future in pending:
        future.result(timeout=timeout)
