"""Schemas between Spark and Arrow: the exact Arrow schema Spark wants from a reader, the
Arrow schema of a DataFrame to write (with a clear error for types Delta cannot store), and
the check of a user-given read schema against the dataset's."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from pyspark.sql.types import StructType

from aqueduct_spark import protocol as P


def spark_to_arrow(schema: StructType) -> pa.Schema:
    """The exact Arrow schema Spark expects from ``read()`` (pitfall 4 of the API brief)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(schema, timezone="UTC", prefers_large_types=False)


def writable_arrow(schema: StructType) -> pa.Schema:
    """The Arrow schema of a DataFrame to write; SchemaMismatch naming the column for a type
    that has no Delta Lake equivalent (pyspark's own error would name neither)."""
    from pyspark.sql import types as T

    hints = {
        "DayTimeIntervalType": "e.g. a long of microseconds, or a string",
        "YearMonthIntervalType": "e.g. an int of months, or a string",
        "CalendarIntervalType": "e.g. a string",
        "NullType": "an all-null column still needs one: e.g. lit(None).cast('string')",
        "TimeType": "e.g. a string, or a long of microseconds since midnight",
    }

    def check(t: Any, where: str) -> Any:
        if isinstance(t, T.VariantType):
            # Spark would hand it over as a struct of two binary columns, which would be
            # stored as such: refused rather than silently changed
            raise P.SchemaMismatch(
                f"column {where!r} has Spark type variant, which the aqueduct service does not "
                "store (it would become a struct of two binary columns); write it as JSON "
                "text with to_json(...) and turn it back with parse_json(...) after reading"
            )
        return plain(t, where)

    def plain(t: Any, where: str) -> Any:
        if isinstance(t, T.CharType | T.VarcharType):
            return T.StringType()  # stored as strings (pyspark has no Arrow type for them)
        hint = hints.get(type(t).__name__)
        if hint is not None:
            raise P.SchemaMismatch(
                f"column {where!r} has Spark type {t.simpleString()}, which Delta Lake cannot "
                f"store; cast it to a supported type ({hint})"
            )
        if isinstance(t, T.StructType):
            return T.StructType(
                [
                    T.StructField(f.name, check(f.dataType, f"{where}.{f.name}"), f.nullable)
                    for f in t.fields
                ]
            )
        if isinstance(t, T.ArrayType):
            return T.ArrayType(check(t.elementType, f"{where}[]"), t.containsNull)
        if isinstance(t, T.MapType):
            return T.MapType(
                check(t.keyType, f"{where}.key"),
                check(t.valueType, f"{where}.value"),
                t.valueContainsNull,
            )
        return t

    fields = [
        T.StructField(f.name, check(f.dataType, f.name), f.nullable, f.metadata)
        for f in schema.fields
    ]
    return spark_to_arrow(T.StructType(fields))


def arrow_to_spark(schema: pa.Schema) -> StructType:
    from pyspark.sql.pandas.types import from_arrow_schema

    try:
        return from_arrow_schema(schema)
    except (TypeError, Exception) as exc:
        raise P.SchemaMismatch(
            f"the dataset has a column type Spark cannot represent: {exc}; read the other "
            "columns (option columns), or that one with the Python client"
        ) from exc


def check_user_schema(wanted: pa.Schema, have: pa.Schema, dataset: str) -> None:
    """A user-given schema must name existing columns with castable types."""
    problems = []
    for field in wanted:
        if field.name not in have.names:
            problems.append(f"{field.name}: not in the dataset")
            continue
        source = have.field(field.name).type
        if source != field.type and not _castable(source, field.type):
            problems.append(f"{field.name}: dataset has {source}, schema asks for {field.type}")
    if problems:
        raise P.SchemaMismatch(
            f"the schema given for dataset {dataset!r} does not fit it: "
            + "; ".join(problems)
            + ". Drop .schema(...) to use the dataset's own schema."
        )


def _castable(source: pa.DataType, target: pa.DataType) -> bool:
    try:
        pa.array([], type=source).cast(target)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return False
    return True
