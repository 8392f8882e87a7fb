"""Finding versions other processes commit: one adaptive poll of each watched dataset's log.

A commit made through this process notifies its subscribers at once. A commit made by
another service process over the same root (or by any Delta writer) shows up only in the
log, so the datasets that have subscribers here are watched: for each, the next commit file
(``_delta_log/<latest + 1>.json``) is looked for, one small request, however many
subscribers the dataset has. Right after a change (and when watching starts) a dataset is
looked at every ``fast`` seconds; each look that finds nothing stretches its interval by
half, up to ``slow``: a busy dataset is pushed across processes within a few tens of
milliseconds, an idle one costs a request every ``slow`` seconds. Every ``resync`` seconds
the latest version is read from a listing of the log instead, which also notices a dataset
dropped and created again.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

import pyarrow.fs as pafs

from aqueduct_spark.protocol import DatasetError

from .tables import Tables

Runner = Callable[..., Awaitable[Any]]
"""Runs a blocking call in a worker thread: ``await run(fn, *args)``."""


@dataclass
class _Watched:
    latest: int = -1  # -1: not read yet
    interval: float = 0.0
    due: float = 0.0
    resync: float = 0.0
    fs: Any = None


class LogWatch:
    """Watches the datasets ``names()`` returns while it returns any; calls
    ``notify(name, version)`` with each newer version found."""

    def __init__(
        self,
        tables: Tables,
        run: Runner,
        notify: Callable[[str, int], None],
        fast: float = 0.05,
        slow: float = 0.5,
        resync: float = 10.0,
    ) -> None:
        self.tables = tables
        self.run = run
        self.notify = notify
        self.fast = min(fast, slow)
        self.slow = slow
        self.resync = resync
        self._watched: dict[str, _Watched] = {}

    async def watch(self, names: Callable[[], Iterable[str]]) -> None:
        while True:
            wanted = set(names())
            if not wanted:
                return
            for gone in set(self._watched) - wanted:
                del self._watched[gone]
            now = time.monotonic()
            for name in wanted:
                w = self._watched.setdefault(name, _Watched(interval=self.fast, due=now))
                if w.due <= now:
                    await self._look(name, w)
            nearest = min(w.due for w in self._watched.values())
            await asyncio.sleep(max(0.0, min(nearest - time.monotonic(), self.slow)))

    async def _look(self, name: str, w: _Watched) -> None:
        now = time.monotonic()
        try:
            if w.latest < 0 or now >= w.resync:
                latest = await self.run(self.tables.latest_version, name)
                w.resync = now + self.resync
            else:
                latest = await self.run(self._next, name, w)
        except (DatasetError, OSError):
            latest = -1  # missing for now: read it afresh next time
        changed = latest > w.latest >= 0
        w.latest = latest
        if changed:
            self.notify(name, latest)
        w.interval = self.fast if changed else min(self.slow, w.interval * 1.5)
        w.due = time.monotonic() + w.interval

    def _next(self, name: str, w: _Watched) -> int:
        """The latest version, looking for the commit files after the one known."""
        if w.fs is None:
            w.fs = self.tables.filesystem(name)
        version = w.latest
        while True:
            info = w.fs.get_file_info(f"_delta_log/{version + 1:020d}.json")
            if info.type != pafs.FileType.File:
                return version
            version += 1
