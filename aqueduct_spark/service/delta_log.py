"""The Delta log, read directly, for what deltalake does not offer or gets wrong: commit times
for history and time travel, what a version added, and every file any version mentions (so
cleanup never deletes a file that a version needs).

Commit times are the commit files' modification times, made strictly increasing (each at least
1 ms after the one before), as Delta's own time travel defines them. deltalake's history()
reports commitInfo timestamps instead, taken before a commit's retries, so they are not in
version order when writers race, and it *labels versions by that order*: wrong versions. So
history and time travel are built from the listing of _delta_log and the commit files here.
Paths in the log are URL-encoded; on storage they are not.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import unquote

import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from aqueduct_spark.protocol import VersionNotFound

_LOG_JSON_RE = re.compile(r"^(\d{20})\.json$")
_CHECKPOINT_RE = re.compile(r"^\d{20}\.checkpoint(\.\d+\.\d+)?\.parquet$")
_LOG_THREADS = 8


def _log_listing(fs: pafs.FileSystem) -> list[pafs.FileInfo]:
    try:
        selector = pafs.FileSelector("_delta_log", allow_not_found=True)
        return fs.get_file_info(selector)  # type: ignore[no-any-return]
    except FileNotFoundError:
        return []


def commit_path(version: int) -> str:
    """The commit file of ``version``, relative to the table."""
    return f"_delta_log/{version:020d}.json"


def is_commit_file(name: str) -> bool:
    """Whether a file name in ``_delta_log`` is a commit (``<20 digits>.json``)."""
    return bool(_LOG_JSON_RE.match(name))


def commit_times(fs: pafs.FileSystem) -> dict[int, dt.datetime]:
    """Every version whose commit file is in the log, with its (monotonic) commit time."""
    found = []
    for info in _log_listing(fs):
        m = _LOG_JSON_RE.match(info.base_name)
        if m and info.mtime is not None:
            found.append((int(m.group(1)), info.mtime.astimezone(dt.UTC)))
    out: dict[int, dt.datetime] = {}
    last = None
    for version, mtime in sorted(found):
        if last is not None and mtime <= last:
            mtime = last + dt.timedelta(milliseconds=1)
        out[version] = last = mtime
    return out


def version_at(fs: pafs.FileSystem, dataset: str, ts: dt.datetime) -> int:
    """The last version committed at or before ``ts``."""
    times = commit_times(fs)
    before = [v for v, t in times.items() if t <= ts]
    if not before:
        first = min(times.values()).isoformat() if times else "unknown"
        raise VersionNotFound(
            f"dataset {dataset!r} has no version at {ts.isoformat()}: its oldest available "
            f"version was committed at {first}"
        )
    return max(before)


def read_log(fs: pafs.FileSystem, version: int) -> list[dict[str, Any]]:
    """The actions of one commit (none when its file is gone)."""
    try:
        with fs.open_input_stream(commit_path(version)) as f:
            text = f.read().decode()
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def read_logs(fs: pafs.FileSystem, versions: Sequence[int]) -> list[list[dict[str, Any]]]:
    if len(versions) <= 1:
        return [read_log(fs, v) for v in versions]
    with ThreadPoolExecutor(_LOG_THREADS) as pool:
        return list(pool.map(lambda v: read_log(fs, v), versions))


def commit_info(actions: Sequence[dict[str, Any]]) -> dict[str, Any]:
    for action in actions:
        info = action.get("commitInfo")
        if isinstance(info, dict):
            return info
    return {}


def num_records(add: dict[str, Any]) -> int:
    """numRecords from an add action's statistics (0 when it has none)."""
    try:
        return int(json.loads(add.get("stats") or "{}").get("numRecords") or 0)
    except (ValueError, TypeError, AttributeError):
        return 0


def added_by(actions: Sequence[dict[str, Any]]) -> tuple[int, int, int, bool]:
    """Rows, bytes and files a commit added, and whether it changed data, from its actions."""
    rows = nbytes = files = 0
    change = False
    for action in actions:
        for kind in ("add", "remove"):
            act = action.get(kind)
            if not isinstance(act, dict):
                continue
            change = change or bool(act.get("dataChange"))
            if kind == "add" and act.get("dataChange"):
                files += 1
                nbytes += int(act.get("size") or 0)
                rows += num_records(act)
    return rows, nbytes, files, change


def referenced_paths(fs: pafs.FileSystem) -> set[str]:
    """Every data file (storage path) that any version still in the log adds or removes."""
    versions = sorted(commit_times(fs))
    out: set[str] = set()
    for actions in read_logs(fs, versions):
        for action in actions:
            for kind in ("add", "remove"):
                act = action.get(kind)
                if isinstance(act, dict) and isinstance(act.get("path"), str):
                    out.add(unquote(act["path"]))
    if not versions or versions[0] > 0:
        # older commits were cleaned up: what they added survives only in checkpoints
        for info in _log_listing(fs):
            if _CHECKPOINT_RE.match(info.base_name):
                with fs.open_input_file(info.path) as f:
                    cp = pq.read_table(f, columns=["add", "remove"])
                for kind in ("add", "remove"):
                    paths = pc.struct_field(cp[kind], "path").to_pylist()
                    out.update(unquote(p) for p in paths if p is not None)
    return out
