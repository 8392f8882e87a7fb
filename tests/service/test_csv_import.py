"""``aqueduct import`` of CSV files as a user meets it: types from every value of the file, and
a value or row that does not fit named by file, line, column and value, with nothing written.

The import runs in-process (``cli.main``) against the session's real service; the reading
itself (chunks, line numbers) is also tested on its own with chunks far smaller than the
default, so that rows, blank lines and errors fall into later chunks.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from conftest import ServiceProcess

from aqueduct_spark import cli
from aqueduct_spark import protocol as P
from aqueduct_spark.cli import csv_import as ci

pytestmark = pytest.mark.quic


def write(path: Path, header: str, rows: list[str], newline: str = "\n") -> str:
    path.write_bytes((newline.join([header, *rows]) + newline).encode())
    return str(path)


def trips(n: int, bad: dict[int, str] | None = None) -> list[str]:
    """``n`` rows of ``trip_id,city,distance_km,ts``; ``bad`` replaces distances by row."""
    bad = bad or {}
    cities = ("Oslo", "Bergen", "Trondheim")
    return [
        f"{i},{cities[i % 3]},{bad.get(i, f'{(i * 7) % 300 / 10:.1f}')},"
        f"2026-01-{1 + i % 28:02d} {i % 24:02d}:00:00"
        for i in range(n)
    ]


HEADER = "trip_id,city,distance_km,ts"


@pytest.fixture
def aqueduct(service: ServiceProcess, capsys: pytest.CaptureFixture[str]):  # type: ignore[no-untyped-def]
    """``aqueduct(*argv)`` -> (exit status, stdout, stderr), in-process, pointed at the service."""

    def call(*argv: str) -> tuple[int, str, str]:
        conn = ["--url", service.url, "--fingerprint", service.fingerprint, "-q"]
        status = cli.main([*argv, *conn])
        out, err = capsys.readouterr()
        return status, out, err

    return call


def test_a_stray_value_fails_the_import_naming_its_place(
    service: ServiceProcess, aqueduct, tmp_path: Path
) -> None:
    """Was: exit 0, and the new dataset's distance_km was a string column."""
    messy = write(tmp_path / "messy.csv", HEADER, trips(5000, {3999: "3.2km"}))
    status, _, err = aqueduct("import", "csv_stray", messy)
    assert status == 2
    assert err.startswith(
        f"aqueduct import: {messy} line 4001, column 'distance_km': '3.2km' is not a number, "
        "though 4,999 of the column's 5,000 values are. Fix: correct the value; "
    )
    assert "--schema distance_km:string" in err and "--allow-strings" in err
    with pytest.raises(P.DatasetNotFound):
        service.client().describe("csv_stray")

    status, _out, err = aqueduct("import", "csv_stray", messy, "--allow-strings")
    assert status == 0, err
    assert service.client().describe("csv_stray").schema.field("distance_km").type == pa.string()

    status, _, err = aqueduct(
        "import", "csv_stray_schema", messy, "--schema", "distance_km:string, ts:timestamp"
    )
    assert status == 0, err
    schema = service.client().describe("csv_stray_schema").schema
    assert schema.field("distance_km").type == pa.string()
    assert schema.field("ts").type == pa.timestamp("us", tz="UTC")  # Spark's TIMESTAMP
    first = service.client().read("csv_stray_schema", filter="trip_id = 1").to_pylist()[0]
    assert str(first["ts"]) == "2026-01-02 01:00:00+00:00"  # written without zone: UTC


def test_types_come_from_every_value_not_a_first_block(
    service: ServiceProcess, aqueduct, tmp_path: Path
) -> None:
    """Integers for more than pyarrow's first block (1 MB), then a fraction: the column is
    double. Was: ``In CSV column #0: CSV conversion error to int64: invalid value '0.5'``."""
    n = 200_000
    rows = [f"{i},{i % 7}" for i in range(n)] + ["0.5,3"]
    path = write(tmp_path / "late.csv", "x,k", rows)
    assert Path(path).stat().st_size > 1 << 20
    status, out, err = aqueduct("import", "csv_late_double", path)
    assert status == 0, err
    assert out == f"csv_late_double: version 0, +{n + 1:,} rows\n"
    schema = service.client().describe("csv_late_double").schema
    assert schema.field("x").type == pa.float64() and schema.field("k").type == pa.int64()


def test_a_value_that_does_not_fit_the_dataset_names_file_line_column_value(
    service: ServiceProcess, aqueduct, tmp_path: Path
) -> None:
    """Was: ``distance_km: dataset type double vs given type string``, nothing else."""
    good = write(tmp_path / "good.csv", HEADER, trips(100))
    assert aqueduct("import", "csv_typed", good)[0] == 0
    messy = write(tmp_path / "more.csv", HEADER, trips(100, {41: "far"}))
    status, _, err = aqueduct("import", "csv_typed", messy)
    assert status == 2
    assert err == (
        f"aqueduct import: {messy} line 43, column 'distance_km': 'far' is not a number "
        "(double), the column's type in dataset 'csv_typed'. Fix: correct the value, or "
        "import into a dataset whose column is of another type\n"
    )
    assert service.client().describe("csv_typed").rows == 100  # nothing appended


def test_a_short_row_names_file_and_line(service: ServiceProcess, aqueduct, tmp_path: Path) -> None:
    """Was: ``CSV parse error: Expected 4 columns, got 3: 500,Oslo,3.2``, no file or line."""
    rows = trips(5000)
    rows[2999] = "500,Oslo,3.2"
    short = write(tmp_path / "short.csv", HEADER, rows)
    status, _, err = aqueduct("import", "csv_short", short)
    assert status == 2
    assert err == (
        f"aqueduct import: {short} line 3001: 3 fields where the header has 4 "
        "('500,Oslo,3.2'). Fix: give every line 4 fields separated by commas; quote a field "
        "that contains one\n"
    )


def test_schema_option_mistakes_name_the_fix(aqueduct, tmp_path: Path) -> None:
    path = write(tmp_path / "t.csv", HEADER, trips(3))
    status, _, err = aqueduct("import", "csv_x", path, "--schema", "distance_km:dobule")
    assert status == 2 and "unknown type 'dobule' for column 'distance_km' (did you mean " in err
    status, _, err = aqueduct("import", "csv_x", path, "--schema", "distnce_km:double")
    assert status == 2
    assert "--schema names 'distnce_km', which is no column of the CSV files (did you mean " in err
    status, _, err = aqueduct("import", "csv_x", path, "--schema", "trip_id")
    assert status == 2 and "'trip_id' is not COLUMN:TYPE" in err


# -- the reading on its own, in small chunks ---------------------------------------------------


def test_line_numbers_count_blank_lines_and_chunks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ci, "CHUNK_BYTES", 256)
    rows = trips(300, {250: "n/a", 260: "12 km"})  # n/a is a null, as pyarrow reads it
    rows[100:100] = ["", ""]  # two blank lines, which pyarrow skips
    path = write(tmp_path / "crlf.csv", HEADER, rows, newline="\r\n")
    assert len(list(ci.chunks(path))) > 40  # the errors fall in later chunks
    f = ci.CsvFile(path, ",")
    with pytest.raises(ci.CsvError, match=r"line 264, column 'distance_km': '12 km' is not a num"):
        ci.infer([f], {}, allow_strings=False)
    inferred = ci.infer([f], {"distance_km": pa.string()}, allow_strings=False)
    assert inferred.rows == 300
    with pytest.raises(ci.CsvError, match=r"crlf.csv line 264, column 'distance_km': '12 km' is"):
        list(ci.batches(f, pa.schema({**inferred.types, "distance_km": pa.float64()})))


def test_text_columns_stay_text_and_empty_columns_are_text(tmp_path: Path) -> None:
    path = write(
        tmp_path / "mixed.csv",
        "sku,note,empty,at,when",
        ["AB-1,hello,,12:30:00,2026-01-01", "42,17,,08:00:00,2026-01-02 10:00", "CD-7,x,,,"],
    )
    types = ci.infer([ci.CsvFile(path, ",")], {}, allow_strings=False).types
    assert types == {
        "sku": pa.string(),  # mostly text, one number: a text column
        "note": pa.string(),
        "empty": pa.string(),
        "at": pa.string(),  # a time of day: Delta has no such type
        "when": pa.timestamp("us"),  # a date and a timestamp make a timestamp
    }


def test_schema_names(tmp_path: Path) -> None:
    assert ci.parse_schema("a:bigint, b:decimal(10, 2),c:timestamp_ntz,d:STRING") == {
        "a": pa.int64(),
        "b": pa.decimal128(10, 2),
        "c": pa.timestamp("us"),
        "d": pa.string(),
    }
