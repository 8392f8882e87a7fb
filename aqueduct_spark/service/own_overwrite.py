"""Overwrites the service commits itself on a local root, as appends are (:mod:`.delta_commit`):
what a streaming query in complete mode commits every micro-batch.

deltalake's way costs two table loads per overwrite (the latest version, and the version the
overwrite began at), each a listing of ``_delta_log`` and a replay from the last checkpoint,
then its commit's listings: all growing with the log. Here the overwrite is checked and
written from the log's kept tail (:mod:`.log_tail`) when that tail is the version it began
at (nothing committed since its ``begin``, the usual case) and the table is unpartitioned (a
remove action of a partitioned file carries its partition values as strings, which the tail
does not keep): the files it replaces are the tail's live files, and a new schema a
``metaData`` action. Anything else takes deltalake's path (:func:`.commits.commit`), tables
with deletion vectors too (a remove names the file's deletion vector as its add did, or the
file stays live; the tail does not keep them).

A version taken meanwhile is read and checked as Delta's WriteSerializable isolation asks,
as the deltalake path does: if a concurrent commit removed a file the overwrite replaces
(another overwrite won), or appended rows with the schema the overwrite replaces, it is
:class:`Conflict`; a blind append committed meanwhile is kept, as if after the overwrite.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa
from deltalake import Schema as DeltaSchema

from aqueduct_spark.protocol import CommitResult, Conflict, InvalidRequest, StagedFile

from . import constraints, delta_commit, delta_types, log_tail, staging
from .group_commit import METADATA_KEY, REBASES, check_partitioning, commit_meta, tail_applied
from .tables import Tables


def overwrite(
    tables: Tables,
    name: str,
    given: pa.Schema,
    partition_by: Sequence[str],
    files: Sequence[StagedFile],
    app_id: str | None,
    app_version: int | None,
    overwrite_schema: bool,
    replaces: int | None,
    commit_id: str,
    check_schema: Callable[..., pa.Schema],
) -> CommitResult | None:
    """The overwrite of dataset ``name`` by ``files``, committed here; None: it takes
    deltalake's path (see the module docstring)."""
    put = delta_commit.putter(tables, name)
    if put is None:
        return None
    with tables.latest_state(name, fresh=True) as state:
        tail = state.tail
        assert tail is not None
        if tail.partition_by or delta_commit.blocker(tail) is not None:
            return None
        if "deletionVectors" in (tail.protocol.get("readerFeatures") or ()):
            return None  # a remove must name a file's deletion vector, which the tail lacks
        constraints.check_append_only(name, tail.configuration, "an overwrite")
        if replaces is not None and replaces != tail.version:
            return None  # commits since it began: deltalake's path works out what it replaces
        done = tail_applied(state, app_id, app_version)
        if done is not None:
            return done
        check_partitioning(name, tail.partition_by, partition_by)
        schema = check_schema(tables, name, given, "overwrite", overwrite_schema)
        readers = tail.protocol.get("readerFeatures") or []
        if delta_types.needs_timestamp_ntz(schema) and "timestampNtz" not in readers:
            return None  # the feature must be added first: deltalake's path does
        fs = tables.filesystem(name)
        adds = staging.verify_staged(name, fs, files, schema, (), set())
        if any(a.path in tail.live for a in adds):
            raise InvalidRequest(
                f"staged files of this overwrite are already part of dataset {name!r}: it "
                "was committed before (give a commit an app_id and app_version to make "
                "repeating it safe)"
            )
        began_schema, replaced = tail.schema, dict(tail.live)
        new = DeltaSchema.from_arrow(schema).to_json()
        changed = bool(delta_types.schema_differences(tail.schema, schema))
        meta = commit_meta("overwrite", adds, commit_id)
        txns = [(app_id, app_version)] if app_id is not None and app_version is not None else []
        for _ in range(REBASES):
            version = tail.version + 1
            actions = delta_commit.actions(
                tail, adds, txns, meta, METADATA_KEY, replaced, new if changed else None
            )
            key = put(version, delta_commit.encode(actions))
            if key is not None:
                tail.apply(version, key, actions)
                delta_commit.after_commit(
                    tables.uri(name),
                    tables.delta_options(),
                    tail.configuration,
                    version,
                    tables.commit_hooks,
                    checkpoint=True,
                )
                return CommitResult(version, meta["rows"], meta["bytes"], meta["files"], True)
            try:
                read = log_tail.advance(tail, fs)  # the versions taken meanwhile
            except log_tail.Reload as exc:
                raise Conflict(_lost(name, f"its log moved on ({exc})")) from exc
            if any("metaData" in a or "protocol" in a for _, taken in read for a in taken):
                # as Delta's MetadataChanged / ProtocolChanged: checked against another table
                raise Conflict(_lost(name, "a concurrent commit changed the table's metadata"))
            done = tail_applied(state, app_id, app_version)
            if done is not None:
                return done
            _check_since(name, tail, began_schema, replaced, changed, replaces is None)
            if replaces is None:  # it replaces whatever is there when it commits
                replaced = dict(tail.live)
        raise Conflict(_lost(name, f"{REBASES} versions in a row were taken by other writers"))


def _check_since(
    name: str,
    tail: log_tail.Tail,
    began_schema: pa.Schema,
    replaced: dict[str, Any],
    changed: bool,
    everything: bool,
) -> None:
    """What commits made since the overwrite began may not have done (WriteSerializable)."""
    if tail.partition_by or tail.schema != began_schema:
        raise Conflict(
            f"the overwrite of dataset {name!r} conflicted with a concurrent change of its "
            "schema; its staged files are kept: retry the commit, or run the overwrite again"
        )
    if everything:
        return
    gone = sorted(set(replaced) - tail.live.keys())
    if gone:
        raise Conflict(
            f"the overwrite of dataset {name!r} conflicted with a concurrent commit: "
            f"{len(gone)} of the files it replaces were removed (e.g. {gone[0]!r}: another "
            "overwrite won); its staged files are kept: retry the commit, or run the "
            "overwrite again"
        )
    if changed and tail.live.keys() - replaced.keys():
        raise Conflict(
            f"the overwrite of dataset {name!r} replaces its schema, and rows appended since "
            "it began have the old one; retry the commit to replace them too, or append "
            "them again after the overwrite"
        )


def _lost(name: str, why: str) -> str:
    return (
        f"the overwrite of dataset {name!r} conflicted with concurrent commits ({why}); its "
        "staged files are kept: retry the commit"
    )
