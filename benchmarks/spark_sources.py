"""The baselines of the Spark benchmark, as Python data sources:

- ``flightbench``: a minimal Arrow Flight data source (do_get per endpoint, do_put per task, a
  commit action) against ``benchmarks.flight_server`` over the same Delta tables;
- ``deltafloor``: executors read the Delta files themselves (no network) and stage written
  files straight into the table; the driver commits through the same store: the floor.

Both cast batches to Spark's Arrow schema exactly, like the aqueduct source.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType


def _arrow(schema: StructType) -> pa.Schema:
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(schema, timezone="UTC", prefers_large_types=False)


def _spark(schema: pa.Schema) -> StructType:
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(schema)


@dataclass
class Staged(WriterCommitMessage):
    files: list[dict[str, Any]]


# -- Arrow Flight -------------------------------------------------------------------------


def _flight(options: dict[str, str]) -> Any:
    import pyarrow.flight as fl

    with open(options["ca"], "rb") as f:
        return fl.FlightClient(options["location"], tls_root_certs=f.read())


class FlightBench(DataSource):
    @classmethod
    def name(cls) -> str:
        return "flightbench"

    def schema(self) -> StructType:
        import pyarrow.flight as fl

        info = _flight(self.options).get_flight_info(
            fl.FlightDescriptor.for_path(self.options["path"])
        )
        return _spark(info.schema)

    def reader(self, schema: StructType) -> DataSourceReader:
        return FlightReader(dict(self.options), schema)

    def writer(self, schema: StructType, overwrite: bool) -> FlightWriter:
        return FlightWriter(dict(self.options), schema, overwrite)


class FlightReader(DataSourceReader):
    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        self.options, self.schema = options, schema

    def partitions(self) -> list[InputPartition]:
        import pyarrow.flight as fl

        info = _flight(self.options).get_flight_info(
            fl.FlightDescriptor.for_path(self.options["path"])
        )
        return [InputPartition(e.ticket.ticket) for e in info.endpoints]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        import pyarrow.flight as fl

        if partition.value is None:
            return
        target = _arrow(self.schema)
        for chunk in _flight(self.options).do_get(fl.Ticket(partition.value)):
            yield chunk.data.cast(target)


class FlightWriter(DataSourceArrowWriter):
    def __init__(self, options: dict[str, str], schema: StructType, overwrite: bool) -> None:
        self.options = options
        self.arrow = _arrow(schema)
        self.mode = "overwrite" if overwrite else "append"
        self.txn = uuid.uuid4().hex

    def write(self, iterator: Iterator[pa.RecordBatch]) -> Staged:
        import pyarrow.flight as fl

        cmd = json.dumps(
            {"dataset": self.options["path"], "txn": self.txn, "task": uuid.uuid4().hex[:8]}
        )
        codec = self.options.get("compression")  # as a user turns it on: IPC write options
        call = fl.FlightCallOptions(
            write_options=pa.ipc.IpcWriteOptions(compression=codec) if codec else None
        )
        writer, meta = _flight(self.options).do_put(
            fl.FlightDescriptor.for_command(cmd), self.arrow, options=call
        )
        for batch in iterator:
            writer.write_batch(batch)
        writer.done_writing()
        answer = meta.read()
        writer.close()
        return Staged(json.loads(answer.to_pybytes()) if answer is not None else [])

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        import pyarrow.flight as fl

        staged = [f for m in messages if isinstance(m, Staged) for f in m.files]
        body = json.dumps(
            {
                "dataset": self.options["path"],
                "mode": self.mode,
                "staged": staged,
                "schema": self.arrow.serialize().to_pybytes().hex(),
            }
        )
        list(_flight(self.options).do_action(fl.Action("commit", body.encode())))


# -- the in-process floor -------------------------------------------------------------------


class DeltaFloor(DataSource):
    @classmethod
    def name(cls) -> str:
        return "deltafloor"

    def schema(self) -> StructType:
        from aqueduct_spark.service.store import Store

        return _spark(Store(self.options["root"]).describe(self.options["path"]).schema)

    def reader(self, schema: StructType) -> DataSourceReader:
        return FloorReader(dict(self.options), schema)

    def writer(self, schema: StructType, overwrite: bool) -> FloorWriter:
        return FloorWriter(dict(self.options), schema, overwrite)


class FloorReader(DataSourceReader):
    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        self.options, self.schema = options, schema

    def partitions(self) -> list[InputPartition]:
        from aqueduct_spark.service.store import Store

        plan = Store(self.options["root"]).plan(self.options["path"])
        return [InputPartition(s.to_dict()) for s in plan.splits]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        from aqueduct_spark.protocol import Split
        from aqueduct_spark.service.store import Store

        if partition.value is None:
            return
        target = _arrow(self.schema)
        for batch in Store(self.options["root"]).scan(Split.from_dict(partition.value)):
            yield batch.cast(target)


class FloorWriter(DataSourceArrowWriter):
    def __init__(self, options: dict[str, str], schema: StructType, overwrite: bool) -> None:
        self.options = options
        self.arrow = _arrow(schema)
        self.mode = "overwrite" if overwrite else "append"
        self.txn = uuid.uuid4().hex

    def write(self, iterator: Iterator[pa.RecordBatch]) -> Staged:
        from aqueduct_spark.service.store import Store

        stage = Store(self.options["root"]).open_stage(
            self.options["path"], self.txn, uuid.uuid4().hex[:8], self.arrow
        )
        for batch in iterator:
            stage.write(batch)
        return Staged([f.to_dict() for f in stage.close()])

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        from aqueduct_spark.protocol import StagedFile
        from aqueduct_spark.service.store import Store

        staged = [
            StagedFile.from_dict(f) for m in messages if isinstance(m, Staged) for f in m.files
        ]
        Store(self.options["root"]).commit(self.options["path"], self.mode, self.arrow, [], staged)
