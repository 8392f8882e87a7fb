"""Committing staged files: one atomic Delta commit per write, checked as deltalake does not.

deltalake (1.6) behaviours worked around here:

- ``create_write_transaction`` validates almost nothing: not that files exist, not an append's
  schema, not a change of partition columns (which commits a table nobody can open again).
  :func:`commit` checks all of it and recomputes every file's statistics from its footer.
- An overwrite that brings the first timestamp-without-time-zone column commits without the
  protocol feature it needs (again a table nobody can open): the feature is added first.
- Concurrent creates of one table with retries can land as versions 0 *and* 1, so creates use
  ``max_commit_retries=0`` and the losers append.
- Commits of staged files have no ``operationMetrics``, so commits made here record what they
  added in their custom metadata (:func:`commit_meta`), which ``Store.history`` reads back.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from urllib.parse import unquote

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, TableFeatures, Transaction
from deltalake import Field as DeltaField
from deltalake import Schema as DeltaSchema
from deltalake.exceptions import CommitFailedError, DeltaError
from deltalake.transaction import AddAction, RemoveAction, create_table_with_add_actions

from aqueduct_spark.protocol import (
    CommitResult,
    Conflict,
    DatasetExists,
    InvalidRequest,
    SchemaMismatch,
    StagedFile,
    VersionNotFound,
    require_int,
    staged_list,
)

from . import binding, constraints, delta_commit, delta_types, group_commit, own_overwrite, staging
from . import replace_where as replace_where_mod
from .changes import TABLE_PROPERTIES
from .group_commit import METADATA_KEY as METADATA_KEY
from .group_commit import already_applied as _already_applied
from .group_commit import backoff
from .group_commit import commit_meta as commit_meta
from .group_commit import find_commit as _find_commit
from .tables import Tables, delta_error

MODES = ("append", "overwrite", "create")
_APPEND_ATTEMPTS = group_commit.APPEND_ATTEMPTS


def check_mode(mode: str) -> None:
    if mode not in MODES:
        raise InvalidRequest(f"invalid write mode {mode!r}: use one of {list(MODES)}")


def check_options(mode: str, overwrite_schema: bool, merge_schema: bool, where: str | None) -> None:
    """The write options that cannot go together, refused before anything is staged."""
    check_mode(mode)
    if overwrite_schema and merge_schema:
        raise InvalidRequest(
            "give overwrite_schema (replace the schema) or merge_schema (add columns), not both"
        )
    if where is not None and mode != "overwrite":
        raise InvalidRequest(
            f"replace_where (replaceWhere) overwrites the rows it selects: write with mode "
            f"'overwrite', not {mode!r}"
        )
    if where is not None and overwrite_schema:
        raise InvalidRequest(
            "replace_where keeps the rows it does not select, so the schema cannot be "
            "replaced with it: drop overwrite_schema (merge_schema may add columns)"
        )


def check_schema(
    tables: Tables,
    name: str | None,
    schema: pa.Schema,
    mode: str,
    overwrite_schema: bool = False,
    merge_schema: bool = False,
    replace_where: str | None = None,
) -> pa.Schema:
    """The schema a write of ``schema`` in ``mode`` will store its batches with.

    An append (or an overwrite without ``overwrite_schema``) needs the dataset's column
    names and types, equal once large/view/unsigned types are normalised (nullability may
    differ). With ``merge_schema`` the data may also bring new columns, which the commit adds
    to the dataset, and lack nullable ones; the result is then the data's columns only.
    ``replace_where`` is checked against the schema the dataset will have. Creating an
    existing dataset is :class:`DatasetExists`. A missing dataset is created by the commit
    with the given schema. ``name=None`` only normalises.
    """
    check_options(mode, overwrite_schema, merge_schema, replace_where)
    given = delta_types.delta_schema(schema)
    if name is None or not tables.exists(name):
        if replace_where is not None:
            binding.bind(replace_where, given)
        return given
    if mode == "create":
        raise DatasetExists(
            f"dataset {name!r} already exists; write with mode 'append' or 'overwrite'"
        )
    latest = tables.snapshot(name)
    current, table_parts = latest.schema, latest.partition_by
    if mode == "overwrite" and overwrite_schema:
        lost = [c for c in table_parts if c not in given.names]
        if lost:
            raise SchemaMismatch(
                f"the new schema of dataset {name!r} lacks its partition columns {lost}; "
                "partitioning cannot change: keep them, or drop and recreate the dataset"
            )
        return given
    if merge_schema:
        write = _merge_write(name, current, given, table_parts)
        if replace_where is not None:
            binding.bind(replace_where, merged(current, write))
        return write
    if replace_where is not None:
        binding.bind(replace_where, current)
    diffs = delta_types.schema_differences(current, given)
    if diffs:
        fix = ", or overwrite with overwriteSchema (overwrite_schema=True)" * (mode == "overwrite")
        raise SchemaMismatch(
            f"the data does not match the schema of dataset {name!r}: {'; '.join(diffs)}. "
            f"Cast or rename the columns to match the dataset (aqueduct describe {name} shows "
            f"its schema){fix}"
        )
    return current


def _merge_write(
    name: str, current: pa.Schema, given: pa.Schema, partition_by: Sequence[str]
) -> pa.Schema:
    """The schema a merge_schema write stages with: the data's columns, the dataset's first
    (in its order and types), then the new ones. SchemaMismatch for a type that differs, a
    missing partition column, or a missing column that is NOT NULL."""
    problems = [
        f"{f.name}: dataset type {current.field(f.name).type} vs given type {f.type}"
        for f in given
        if f.name in current.names and not delta_types.same_type(current.field(f.name).type, f.type)
    ]
    problems += [
        f"{f.name}: {'a partition column' if f.name in partition_by else 'NOT NULL'} in the "
        "dataset, missing from the data"
        for f in current
        if f.name not in given.names and (f.name in partition_by or not f.nullable)
    ]
    if problems:
        raise SchemaMismatch(
            f"the data cannot be merged into the schema of dataset {name!r}: "
            f"{'; '.join(problems)}. merge_schema adds columns; it does not change types"
        )
    kept = [current.field(f.name) for f in current if f.name in given.names]
    return pa.schema(kept + [f for f in given if f.name not in current.names])


def merged(current: pa.Schema, write: pa.Schema) -> pa.Schema:
    """The dataset's schema after a merge_schema write: new columns at the end, nullable
    (the rows already there have none)."""
    return pa.schema(
        list(current) + [f.with_nullable(True) for f in write if f.name not in current.names]
    )


def _add_columns(tables: Tables, name: str, table: DeltaTable, write: pa.Schema) -> DeltaTable:
    """Add the columns a merge_schema write brings, in a commit of their own just before
    the data's (deltalake commits staged files with a new schema only in overwrite mode).
    A concurrent writer may add them first: then they must have the same types."""
    current = pa.schema(table.schema().to_arrow())
    new = merged(current, write)
    if new.names == current.names:
        return table
    fields = [DeltaField.from_arrow(f) for f in new if f.name not in current.names]
    try:
        table.alter.add_columns(fields, post_commithook_properties=tables.commit_hooks)
    except DeltaError as exc:
        reloaded = tables.open_table(name)
        check = pa.schema(reloaded.schema().to_arrow())
        if any(
            f.name not in check.names or not delta_types.same_type(check.field(f.name).type, f.type)
            for f in new
        ):
            raise delta_error(name, exc) from exc
    return tables.open_table(name)


def commit(
    tables: Tables,
    name: str,
    mode: str,
    schema: pa.Schema,
    partition_by: Sequence[str],
    staged: Sequence[StagedFile],
    app_id: str | None = None,
    app_version: int | None = None,
    overwrite_schema: bool = False,
    replaces: int | None = None,
    merge_schema: bool = False,
    replace_where: str | None = None,
) -> CommitResult:
    """Make all ``staged`` files visible in one atomic Delta commit.

    ``append`` adds them, ``overwrite`` replaces all data with them, ``create`` requires the
    dataset to be missing. Append and overwrite create a missing dataset; of several writers
    racing to create it, one creates and the others then append (or overwrite).

    Isolation is Delta's default, WriteSerializable. ``replaces`` is the version an
    overwrite's transaction began at (-1: the dataset did not exist then); the overwrite
    removes the data of that version only, so a blind append committed meanwhile is kept,
    as if it came after the overwrite. If a concurrent commit removed some of that data
    (another overwrite), or an append meanwhile has the schema the overwrite replaces, the
    overwrite is :class:`Conflict`. Without ``replaces`` an overwrite replaces whatever the
    latest version holds when it commits. With ``replace_where`` an overwrite replaces only
    the rows matching it, in the same commit (:mod:`.replace_where`); with ``merge_schema``
    the data's new columns are added to the dataset first (:func:`check_schema`). Every staged
    file must exist in this table, carry our name, and match the schema; its statistics are
    recomputed from its footer. With ``app_id``/``app_version`` the commit records a Delta
    app transaction; a commit whose ``app_version`` is not above the last one recorded for
    ``app_id`` is a no-op (``committed=False``; remove its files with ``Store.abort_txn``).
    """
    tables.validate_name(name)
    check_options(mode, overwrite_schema, merge_schema, replace_where)
    if (app_id is None) != (app_version is None):
        raise InvalidRequest("app_id and app_version go together: give both or neither")
    if app_id is not None and (not isinstance(app_id, str) or not app_id):
        raise InvalidRequest(
            f"app_id must be a non-empty string, got {app_id!r}; name the writing application, e.g. 'nightly-load'"
        )
    if app_version is not None and require_int(app_version, "app_version") < 0:
        raise InvalidRequest(
            f"app_version must be >= 0, got {app_version}; give the run's number, which grows with each run"
        )
    given = delta_types.delta_schema(schema)
    files = staged_list(staged)
    txns = None
    if app_id is not None and app_version is not None:
        txns = [Transaction(app_id, app_version)]
    commit_id = uuid.uuid4().hex
    fs = tables.filesystem(name, create=True)
    failure: CommitFailedError | None = None
    for attempt in range(_APPEND_ATTEMPTS):
        if failure is not None:
            time.sleep(backoff(attempt))
        if not tables.exists(name):
            parts = staging.check_partition_by(given, partition_by)
            adds = staging.verify_staged(name, fs, files, given, parts, set())
            if replace_where is not None:
                replace_where_mod.check_written(name, fs, adds, given, parts, replace_where)
            meta = commit_meta(mode, adds, commit_id)
            try:
                create_table_with_add_actions(
                    tables.uri(name),
                    DeltaSchema.from_arrow(given),
                    adds,
                    mode="error",
                    partition_by=list(parts),
                    configuration=TABLE_PROPERTIES,
                    storage_options=tables.delta_options(),
                    commit_properties=CommitProperties(
                        custom_metadata={METADATA_KEY: meta},
                        max_commit_retries=0,  # see the module docstring
                        app_transactions=txns,
                    ),
                    post_commithook_properties=tables.commit_hooks,
                )
                return CommitResult(0, meta["rows"], meta["bytes"], meta["files"], True)
            except DeltaError as exc:
                if not tables.exists(name):
                    raise delta_error(name, exc) from exc
                # lost the race to create it: write to the winner's table instead
        if mode == "create":
            raise DatasetExists(
                f"dataset {name!r} already exists; write with mode 'append' or 'overwrite'"
            )
        if mode == "overwrite" and not merge_schema and replace_where is None:
            own = own_overwrite.overwrite(  # a stream's complete mode: without loading the table
                tables, name, given, partition_by, files, app_id, app_version,
                overwrite_schema, replaces, commit_id, check_schema,
            )  # fmt: skip
            if own is not None:
                return own
        if mode == "append" and not merge_schema and group_commit.enabled():
            # shares a commit with the appends queued meanwhile (group_commit)
            grouped = group_commit.append(
                tables, name, given, partition_by, files, fs, app_id, app_version, check_schema
            )
            if grouped is not None:
                return grouped
        table = tables.open_table(name)
        done = _already_applied(table, app_id, app_version)
        if done is not None:
            return done
        table_parts = tuple(table.metadata().partition_columns)
        group_commit.check_partitioning(name, table_parts, partition_by)
        write_schema = check_schema(
            tables, name, given, mode, overwrite_schema, merge_schema, replace_where
        )
        if merge_schema:
            table = _add_columns(tables, name, table, write_schema)
        table_schema = pa.schema(table.schema().to_arrow()) if merge_schema else write_schema
        if delta_types.needs_timestamp_ntz(table_schema) and "timestampNtz" not in (
            table.protocol().reader_features or []
        ):
            # deltalake would commit the new schema without the feature: an unreadable table
            table.alter.add_feature(
                TableFeatures.TimestampWithoutTimezone, allow_protocol_versions_increase=True
            )
            table = tables.open_table(name)
        active = {unquote(p) for p in pa.table(table.get_add_actions()).column("path").to_pylist()}
        adds = staging.verify_staged(name, fs, files, write_schema, table_parts, active)
        config = dict(table.metadata().configuration)
        if mode == "overwrite":
            constraints.check_append_only(name, config, "an overwrite")
        rules = constraints.rules(config, table.schema().to_json())
        constraints.check(name, fs, adds, table_schema, rules)
        meta = commit_meta(mode, adds, commit_id)
        if replace_where is not None:  # history shows it: "overwrite where ..."
            meta["replace_where"] = replace_where
        before = table.version()
        actions: list[AddAction | RemoveAction] = [*adds]
        delta_mode = mode
        rewrites: list[AddAction] = []
        dvs = "deletionVectors" in (table.protocol().reader_features or [])
        if replace_where is not None and dvs:
            raise InvalidRequest(
                f"dataset {name!r} has deletion vectors, which a replace_where commit made "
                "here cannot name in its removes (its files would stay live): overwrite it "
                "with Spark, or purge them first (REORG TABLE ... APPLY (PURGE))"
            )
        if replace_where is not None:
            replace_where_mod.check_written(
                name, fs, adds, table_schema, table_parts, replace_where
            )
            began = _began(tables, name, table, replaces)
            txn = next((t for t in meta["txns"]), None) or uuid.uuid4().hex
            change = replace_where_mod.replacement(
                name, fs, began, active, table_schema, table_parts, replace_where, txn
            )
            rewrites = change.rewrites
            actions += [*rewrites, *change.removes]
            delta_mode = "append"
        elif mode == "overwrite" and replaces is not None:
            removes = _replaced(tables, name, table, replaces, active, table_schema, dvs)
            if removes is not None:
                # the data it began with, not what appends added meanwhile
                actions += removes
                delta_mode = "append"
        try:
            table.create_write_transaction(
                actions,
                mode=delta_mode,
                schema=DeltaSchema.from_arrow(table_schema),
                partition_by=list(table_parts),
                commit_properties=CommitProperties(
                    custom_metadata={METADATA_KEY: meta}, app_transactions=txns
                ),
                post_commithook_properties=delta_commit.hooks(tables.commit_hooks),
            )
        except CommitFailedError as exc:
            replace_where_mod.discard(fs, rewrites)
            failure = exc
            if delta_mode == "append":
                # A blind append rebases onto anything; an overwrite that names its
                # removes is checked again against what is there: reload and retry.
                continue
            done = _already_applied(tables.open_table(name), app_id, app_version)
            if done is not None:
                return done
            break
        except DeltaError as exc:
            replace_where_mod.discard(fs, rewrites)
            raise delta_error(name, exc) from exc
        version = _find_commit(tables, name, before, commit_id)
        delta_commit.after_commit(
            tables.uri(name),
            tables.delta_options(),
            config,
            version,
            tables.commit_hooks,
            checkpoint=False,
        )
        return CommitResult(version, meta["rows"], meta["bytes"], meta["files"], True)
    raise Conflict(
        f"the {mode} of dataset {name!r} conflicted with concurrent commits ({failure}); "
        "its staged files are kept: retry the commit"
    ) from failure


def _began(tables: Tables, name: str, table: DeltaTable, replaces: int | None) -> DeltaTable | None:
    """The version an overwrite began at (None: the dataset did not exist then)."""
    if replaces is None:
        return table
    if require_int(replaces, "replaces") < -1:
        raise InvalidRequest(f"replaces must be a version or -1, got {replaces}")
    if replaces > table.version():
        raise InvalidRequest(
            f"an overwrite of dataset {name!r} cannot begin at version {replaces}: the "
            f"latest is {table.version()}"
        )
    if replaces == -1:
        return None
    try:
        began = tables.open_table(name, replaces)
    except VersionNotFound as exc:
        raise Conflict(
            f"the overwrite of dataset {name!r} began at version {replaces}, which is no "
            "longer in its log; retry the overwrite"
        ) from exc
    if str(began.metadata().id) != str(table.metadata().id):
        raise Conflict(
            f"dataset {name!r} was dropped and created again while the overwrite ran; "
            "retry the overwrite"
        )
    return began


def _replaced(
    tables: Tables,
    name: str,
    table: DeltaTable,
    replaces: int,
    active: set[str],
    write_schema: pa.Schema,
    dvs: bool = False,
) -> list[RemoveAction] | None:
    """The removes of an overwrite that began at version ``replaces`` (WriteSerializable);
    None when it must replace everything there is (a new schema, nothing committed since).
    With deletion vectors (``dvs``) deltalake must write the removes, each naming its file's
    deletion vector (deltalake's RemoveAction cannot): None when nothing was committed
    since, Conflict otherwise."""
    if dvs:
        if replaces == table.version():
            return None
        raise Conflict(
            f"the overwrite of dataset {name!r} began at version {replaces}, and the dataset "
            "has deletion vectors and commits since; run the overwrite again (it replaces "
            "the latest version)"
        )
    base: dict[str, int] = {}
    began = _began(tables, name, table, replaces)
    if began is not None:
        adds = pa.table(began.get_add_actions(flatten=True))
        base = {
            unquote(p): int(n)
            for p, n in zip(
                adds.column("path").to_pylist(),
                adds.column("size_bytes").to_pylist(),
                strict=True,
            )
        }
    gone = sorted(set(base) - active)
    if gone:
        raise Conflict(
            f"the overwrite of dataset {name!r} conflicted with a concurrent commit: since "
            f"version {replaces}, where the overwrite began, {len(gone)} of the files it "
            f"replaces were removed (e.g. {gone[0]!r}: another overwrite won); its staged "
            "files are kept: retry the commit, or run the overwrite again"
        )
    current = pa.schema(table.schema().to_arrow())
    if delta_types.schema_differences(current, write_schema):
        if active - set(base):
            raise Conflict(
                f"the overwrite of dataset {name!r} replaces its schema, and rows appended "
                f"since version {replaces}, where it began, have the old one; retry the "
                "commit to replace them too, or append them again after the overwrite"
            )
        return None
    now = int(time.time() * 1000)
    return [RemoveAction(p, True, now, size) for p, size in sorted(base.items())]
