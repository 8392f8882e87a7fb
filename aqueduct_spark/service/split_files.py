"""Which files a scan may read: the committed files of the dataset its splits name.

A split names its file by a path relative to its dataset's table directory, and
:func:`~.staging.check_relative_path` keeps it there (no ``..``, no absolute path, nothing
under ``_delta_log``), so a split of one dataset cannot reach another's files; the rights
check covers the dataset every split names (:func:`~.access.datasets_named`). Inside the
directory, though, lie files no version shows: the staged files of writes not yet committed
(or never to be: a failed task's, an aborted job's before its cleanup). A client that may
read the dataset must not read those by naming them, so every path of a scan is checked
against the log before its first batch (:func:`check`):

- a plain split (a plan's, or a version's added file from ``changes``) names a file the
  latest version has, a file its version's commit added, or a file of its version;
- a change split (``feed``, ``changes`` with the change feed) names a change file, an added
  file or a removed file of its ``commit_version``'s commit, as its ``change_type`` says.

The cheap answers come first: the latest version's files when the store keeps its state
(a plan made here: no file read at all), then the commits of the splits' versions (one
small file each: a stream's files, without loading the table), then the latest version's
files and those of the split's version (time travel: the snapshot its plan loaded, kept in
the store's cache). A path none of them has is refused as
:class:`~aqueduct_spark.protocol.InvalidRequest`, before any row is read.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import unquote

from aqueduct_spark.protocol import DataLoss, InvalidRequest, require_int

from . import delta_log, staging
from .changes import check_change_path
from .tables import Tables

_KIND = {None: "cdc", "insert": "add", "delete": "remove"}
"""The log action that holds a change split's file, by its ``change_type``."""


def check(tables: Tables, name: str, splits: Sequence[Mapping[str, Any]]) -> None:
    """Raise unless every split names a committed file of dataset ``name`` (see above);
    the splits' own ``dataset`` is ``name`` (the rights check made sure)."""
    plain: dict[int, set[str]] = {}
    changed: dict[tuple[int, str], set[str]] = {}
    for raw in splits:
        path: str = raw.get("path", "")  # its shape is checked below
        if "change_type" in raw:
            change = raw["change_type"]
            check_change_path(path, change)
            version = require_int(raw.get("commit_version"), "commit_version")
            changed.setdefault((version, _KIND[change]), set()).add(path)
        else:
            staging.check_relative_path(path)
            plain.setdefault(require_int(raw.get("version"), "version"), set()).add(path)
    kept = tables.kept_latest(name)  # a plan here just made it: no file read at all
    if kept is not None:
        plain = {v: left for v, paths in plain.items() if (left := paths - kept.paths)}
    elif not tables.exists(name):
        tables.latest_version(name)  # DatasetNotFound
    versions = sorted({v for v in plain} | {v for v, _ in changed})
    logs = dict(zip(versions, delta_log.read_logs(tables.filesystem(name), versions), strict=True))
    for v, paths in plain.items():
        left = paths - _paths(logs[v], "add")  # a stream's files: its versions' commits
        if left and kept is None:
            left -= tables.snapshot(name).paths
        if left:
            left -= tables.snapshot(name, v).paths  # time travel: the plan's version
        if left:
            raise _foreign(name, v, left)
    for (v, kind), paths in changed.items():
        if not logs[v]:
            raise DataLoss(
                f"version {v} of dataset {name!r} is no longer in its log (cleaned up); read "
                "the change feed from a later version"
            )
        left = paths - _paths(logs[v], kind)
        if left:
            raise _foreign(name, v, left)


def _paths(actions: Sequence[dict[str, Any]], kind: str) -> set[str]:
    """The storage paths of a commit's actions of one kind (the log's are URL-encoded)."""
    return {
        unquote(a[kind]["path"])
        for a in actions
        if isinstance(a.get(kind), dict) and isinstance(a[kind].get("path"), str)
    }


def _foreign(name: str, version: int, paths: set[str]) -> InvalidRequest:
    path = min(paths)
    return InvalidRequest(
        f"a split of dataset {name!r} version {version} names {path!r}, which is not one of "
        "its files (a staged file no commit made visible, or a file of nothing the log "
        "shows); scan the splits a plan or changes gave, unchanged",
        {"dataset": name, "version": version, "path": path},
    )
