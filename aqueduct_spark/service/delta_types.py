"""Delta Lake's types: the Arrow schema data is stored with, and how a batch is made to fit it.

Everything written is in Delta's types (:func:`delta_schema`): unsigned integers widen, large and
view types shrink to their plain forms, timestamps become microseconds (UTC when they carry a
zone). A type Delta cannot store is :class:`SchemaMismatch` naming the column and a type to cast
it to. :func:`schema_differences` says, column by column, why a write does not fit a dataset.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import Schema as DeltaSchema

from aqueduct_spark.protocol import InvalidRequest, SchemaMismatch


def _delta_type(t: pa.DataType, where: str) -> pa.DataType:
    """Map an Arrow type to the Arrow type Delta stores it as; raise for types it cannot."""
    if pa.types.is_dictionary(t):
        return _delta_type(t.value_type, where)
    if pa.types.is_run_end_encoded(t):
        return _delta_type(t.value_type, where)
    if pa.types.is_boolean(t) or t in (pa.int8(), pa.int16(), pa.int32(), pa.int64()):
        return t
    if pa.types.is_unsigned_integer(t):
        # widen: uint8 up to 255 does not fit Delta's signed byte
        return {8: pa.int16(), 16: pa.int32(), 32: pa.int64(), 64: pa.int64()}[t.bit_width]
    if pa.types.is_float16(t):
        return pa.float32()
    if pa.types.is_float32(t) or pa.types.is_float64(t):
        return t
    if pa.types.is_decimal(t):
        if t.precision > 38 or t.scale < 0 or t.scale > t.precision:
            raise SchemaMismatch(
                f"column {where!r} has type {t}, but Delta Lake stores decimals with precision "
                "up to 38 and 0 <= scale <= precision; cast it to decimal128(38, s) or float64"
            )
        return pa.decimal128(t.precision, t.scale)
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return pa.string()
    if (
        pa.types.is_binary(t)
        or pa.types.is_large_binary(t)
        or pa.types.is_binary_view(t)
        or pa.types.is_fixed_size_binary(t)
    ):
        return pa.binary()
    if pa.types.is_date(t):
        return pa.date32()
    if pa.types.is_timestamp(t):
        return pa.timestamp("us", "UTC" if t.tz is not None else None)
    if (
        pa.types.is_list(t)
        or pa.types.is_large_list(t)
        or pa.types.is_fixed_size_list(t)
        or pa.types.is_list_view(t)
        or pa.types.is_large_list_view(t)
    ):
        child = t.value_field
        return pa.list_(pa.field("element", _delta_type(child.type, f"{where}[]"), child.nullable))
    if pa.types.is_map(t):
        return pa.map_(
            _delta_type(t.key_type, f"{where}.key"),
            pa.field("value", _delta_type(t.item_type, f"{where}.value"), t.item_field.nullable),
        )
    if pa.types.is_struct(t):
        if t.num_fields == 0:
            raise SchemaMismatch(
                f"column {where!r} is a struct without fields, which Delta cannot store; drop the column or give the struct a field"
            )
        return pa.struct(
            [
                pa.field(f.name, _delta_type(f.type, f"{where}.{f.name}"), f.nullable)
                for f in (t.field(i) for i in range(t.num_fields))
            ]
        )
    hint = {
        "null": "give the column a real type (an all-null column still needs one)",
    }.get(str(t), "cast it to a supported type (for times and durations, int64 or a string)")
    raise SchemaMismatch(f"column {where!r} has type {t}, which Delta Lake cannot store; {hint}")


def delta_schema(schema: pa.Schema) -> pa.Schema:
    """The schema data of ``schema`` is written with: Delta types, as deltalake reports them."""
    if not isinstance(schema, pa.Schema):
        raise InvalidRequest(
            f"expected a pyarrow.Schema, got {type(schema).__name__}; pass e.g. pa.schema([('id', pa.int64())])"
        )
    if len(schema) == 0:
        raise SchemaMismatch("the schema has no columns; give the dataset at least one")
    names = schema.names
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes or "" in names:
        raise SchemaMismatch(
            f"column names must be unique and non-empty (duplicated: {dupes or ['']}); "
            "rename the columns"
        )
    mapped = pa.schema([pa.field(f.name, _delta_type(f.type, f.name), f.nullable) for f in schema])
    try:
        # the round trip gives exactly the field names and nullability a table reports
        return pa.schema(DeltaSchema.from_arrow(mapped).to_arrow())
    except Exception as exc:  # deltalake raises several unrelated classes here
        raise SchemaMismatch(f"Delta Lake rejects the schema: {exc}") from exc


def needs_timestamp_ntz(schema: pa.Schema) -> bool:
    """Whether a table of this schema needs Delta's timestampNtz feature."""

    def ntz(t: pa.DataType) -> bool:
        if pa.types.is_timestamp(t):
            return t.tz is None
        return any(ntz(t.field(i).type) for i in range(t.num_fields))

    return any(ntz(f.type) for f in schema)


def same_type(a: pa.DataType, b: pa.DataType) -> bool:
    """Equal types, ignoring nullability and the names of list/map child fields."""
    if pa.types.is_list(a) and pa.types.is_list(b):
        return same_type(a.value_type, b.value_type)
    if pa.types.is_map(a) and pa.types.is_map(b):
        return same_type(a.key_type, b.key_type) and same_type(a.item_type, b.item_type)
    if pa.types.is_struct(a) and pa.types.is_struct(b):
        fa = [a.field(i) for i in range(a.num_fields)]
        fb = [b.field(i) for i in range(b.num_fields)]
        return [f.name for f in fa] == [f.name for f in fb] and all(
            same_type(x.type, y.type) for x, y in zip(fa, fb, strict=True)
        )
    return bool(a == b)


def schema_differences(dataset: pa.Schema, given: pa.Schema) -> list[str]:
    """Human-readable differences between a dataset's schema and a (normalised) write schema."""
    out = []
    for f in dataset:
        if f.name not in given.names:
            out.append(f"{f.name}: {f.type} in the dataset, missing from the data")
        elif not same_type(f.type, given.field(f.name).type):
            out.append(f"{f.name}: dataset type {f.type} vs given type {given.field(f.name).type}")
    out += [
        f"{f.name}: not in the dataset (given type {f.type})"
        for f in given
        if f.name not in dataset.names
    ]
    return out


def conform_batch(batch: pa.RecordBatch, target: pa.Schema, dataset: str) -> pa.RecordBatch:
    """Reorder and cast ``batch`` to ``target`` (a :func:`delta_schema` result)."""
    if batch.schema.names != target.names:
        if sorted(batch.schema.names) != sorted(target.names):
            diffs = schema_differences(target, batch.schema)
            raise SchemaMismatch(
                f"a batch for dataset {dataset!r} does not have the write schema's columns: "
                + "; ".join(diffs)
                + ". Send batches with exactly the columns the write was opened with"
            )
        batch = batch.select(target.names)
    if batch.schema.equals(target, check_metadata=False):
        return batch
    columns = []
    for field, column in zip(target, batch.columns, strict=True):
        if not field.nullable and column.null_count:
            raise SchemaMismatch(
                f"column {field.name!r} of dataset {dataset!r} is NOT NULL, but a batch has "
                f"{column.null_count} null values; fill them or write to a nullable column"
            )
        if column.type != field.type:
            try:
                # ns -> us truncates like Spark and write_deltalake do; overflow still raises
                column = pc.cast(
                    column, options=pc.CastOptions(field.type, allow_time_truncate=True)
                )
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                raise SchemaMismatch(
                    f"column {field.name!r} of type {column.type} cannot be written as "
                    f"{field.type} in dataset {dataset!r}: {exc}. Cast the data first"
                ) from exc
        columns.append(column)
    return pa.RecordBatch.from_arrays(columns, schema=target)
