"""What the service answers with, as values: descriptions, plans, transactions; and the
filter form requests carry."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from aqueduct_spark import protocol as P
from aqueduct_spark.protocol.filters import to_wire_filters

__all__ = ["DatasetDescription", "Plan", "Transaction", "to_wire_filters"]

DatasetInfo = P.DatasetInfo
"""What ``describe``, ``list`` and ``create`` answer: the protocol's own message class (the
name its ``repr`` shows, and the dataset protocol's)."""
DatasetDescription = DatasetInfo
"""The name the client used for :data:`DatasetInfo` before; the same class, kept so code
that imports it keeps working."""


@dataclass(frozen=True)
class Plan:
    """Splits of one pinned version; each split can be scanned independently. ``tasks``
    packs them (small files together) into units of about ``split_bytes``: scan the splits
    of one task with one ``scan`` call (:meth:`task_splits`)."""

    dataset: str
    version: int
    schema: pa.Schema
    splits: list[dict[str, Any]]
    rows: int
    bytes: int
    tasks: list[list[int]] | None = None
    """Indexes into ``splits``; None (a service without tasks): one task per split."""

    def task_splits(self) -> list[list[dict[str, Any]]]:
        """The splits of each task, in order."""
        if self.tasks is None:
            return [[s] for s in self.splits]
        return [[self.splits[i] for i in task] for task in self.tasks]


@dataclass(frozen=True)
class Transaction:
    """A write in progress: tasks stage data under ``txn``; one commit publishes it."""

    dataset: str
    txn: str
    mode: str
    schema: pa.Schema
    partition_by: tuple[str, ...]
    base_version: int | None
    merge_schema: bool = False
    """Add the data's new columns to the dataset (begin's ``merge_schema``)."""
    replace_where: str | None = None
    """Overwrite only the rows matching this SQL condition (begin's ``replace_where``)."""
    max_batch_bytes: int | None = None
    """The service's largest data message, as begin answered (None: it did not say)."""
    codecs: tuple[str, ...] | None = None
    """The codecs the service accepts in writes, as begin answered (None: it did not say;
    such a service decodes whatever an Arrow IPC message declares)."""
