"""Row groups sent as stored Parquet (issue 28, ``protocol.parquet``): the store yields a row
group that needs nothing done to it as a piece of the file (its footer and the byte ranges of
its column chunks), and the reader's decode of that piece gives exactly the rows the Arrow path
gives, in the same order. What needs work (a filter, a cast, a partition column, a resumed
scan's first rows, a small row group) still comes as Arrow, in order with the pieces. A piece
whose header or bytes lie is refused by name before anything is decoded. Over a real
connection: tests/client/test_parquet_reads.py."""

from __future__ import annotations

from typing import Any

import cbor2
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from delta_store_helpers import write

from aqueduct_spark.protocol import InvalidRequest
from aqueduct_spark.protocol import parquet as PQ
from aqueduct_spark.service import pass_parquet
from aqueduct_spark.service.resume import Skip
from aqueduct_spark.service.store import Store

ROWS = 40_000
LIMIT = 64 << 20


def table(start: int, rows: int) -> pa.Table:
    ids = pa.array(range(start, start + rows), pa.int64())
    return pa.table(
        {
            "id": ids,
            "s": pa.array([f"row-{i}" for i in range(start, start + rows)]),
            "tags": pa.array([[i, i * 7919 % 1_000_003] for i in range(start, start + rows)]),
            "point": pa.array(
                [
                    {"x": float(i), "y": None if i % 5 else "five"}
                    for i in range(start, start + rows)
                ]
            ),
            "day": pa.array([i % 3 for i in range(start, start + rows)], pa.int32()),
        }
    )


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Store:
    """``big``: one file of several row groups of ~100 KiB; ``parts``: partitioned by day;
    ``mixed``: a big file between two small ones."""
    root = tmp_path_factory.mktemp("pq-root")
    store = Store(str(root))
    write(store, "big", table(0, ROWS), row_group_bytes=400 << 10, batch_rows=4_000)
    write(store, "parts", table(0, ROWS), partition_by=["day"], row_group_bytes=400 << 10)
    write(store, "mixed", table(0, 50))
    write(store, "mixed", table(50, ROWS), row_group_bytes=400 << 10, batch_rows=4_000)
    write(store, "mixed", table(ROWS + 50, 50))
    return store


@pytest.fixture(autouse=True)
def small_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    # row groups of this test's small tables count as large (the default is 1 MiB)
    monkeypatch.setattr(pass_parquet, "PASS_FROM", 16 << 10)


def over_the_wire(item: Any, schema: pa.Schema, batch_rows: int = 5_000) -> list[pa.RecordBatch]:
    """What a reader decodes of a piece: its header and its payload as received."""
    header = item.header()[1]
    message = PQ.read_parquet_message(header, bytes(item.payload()), LIMIT)
    return list(message.decode(schema, batch_rows, LIMIT))


def rows_of(items: list[Any], schema: pa.Schema) -> pa.Table:
    batches = []
    for item in items:
        batches += over_the_wire(item, schema) if isinstance(item, PQ.ParquetPiece) else [item]
    return pa.Table.from_batches(batches, schema=schema)


@pytest.mark.parametrize(
    "columns", [None, ["point", "id"], ["tags"]], ids=["all", "projected, reordered", "a list"]
)
def test_row_groups_go_as_stored_and_decode_to_the_rows_of_the_arrow_path(
    store: Store, columns: list[str] | None
) -> None:
    plan = store.plan("big", columns=columns)
    schema = plan.schema
    arrow = pa.Table.from_batches(list(store.scan(plan.splits, columns=columns)), schema=schema)
    items = list(store.scan(plan.splits, columns=columns, passing=True))
    pieces = [i for i in items if isinstance(i, PQ.ParquetPiece)]
    assert len(pieces) >= 3 and len(pieces) == len(items)
    assert rows_of(items, schema).equals(arrow)
    # fewer bytes than the Arrow they decode to, and only the columns asked for
    assert sum(p.nbytes for p in pieces) < arrow.nbytes
    assert all(p.columns == tuple(schema.names) for p in pieces)


def test_what_needs_work_comes_as_arrow_in_order_with_the_pieces(store: Store) -> None:
    plan = store.plan("big")
    schema = plan.schema
    full = pa.Table.from_batches(list(store.scan(plan.splits)), schema=schema)
    # a filter: every row must be looked at here
    where = pc.field("id") >= 10
    filtered = list(store.scan(plan.splits, filter=where, passing=True))
    assert not any(isinstance(i, PQ.ParquetPiece) for i in filtered)
    # a resumed scan: its first split's rows are cut here; a later split's may go as stored
    skipped = list(store.scan(plan.splits, skip=Skip(12_345), passing=True))
    assert rows_of(skipped, schema).equals(full.slice(12_345))
    # a partition column is filled here, so its row groups come as Arrow; without it, stored
    parts = store.plan("parts")
    assert not any(isinstance(i, PQ.ParquetPiece) for i in store.scan(parts.splits, passing=True))
    plan_id = store.plan("parts", columns=["id", "s"])
    ided = list(store.scan(plan_id.splits, columns=["id", "s"], passing=True))
    assert any(isinstance(i, PQ.ParquetPiece) for i in ided)
    # small files of a task are merged into Arrow batches, in order around the pieces
    mixed = store.plan("mixed")
    items = list(store.scan(mixed.splits, passing=True))
    kinds = ["piece" if isinstance(i, PQ.ParquetPiece) else "arrow" for i in items]
    assert "piece" in kinds and kinds[0] == "arrow" and kinds[-1] == "arrow", kinds
    ids = rows_of(items, mixed.schema).column("id").to_pylist()
    assert sorted(ids) == list(range(ROWS + 100)) and len(ids) == ROWS + 100
    arrow_ids = pa.Table.from_batches(list(store.scan(mixed.splits)), schema=mixed.schema)
    assert ids == arrow_ids.column("id").to_pylist()


def piece(store: Store) -> tuple[Any, pa.Schema]:
    plan = store.plan("big")
    return next(iter(store.scan(plan.splits, passing=True))), plan.schema


def tampered(item: Any, **changes: Any) -> dict[str, Any]:
    fields = cbor2.loads(item.header()[1])
    fields.update(changes)
    return fields


@pytest.mark.parametrize(
    "change, says",
    [
        ({"rows": 1}, "row count 1 is not its row group's"),
        ({"row_group": 99}, "row group 99 is not in its footer's"),
        ({"footer": 3}, "footer of 3 bytes does not fit"),
        ({"ranges": "all"}, "header field 'ranges'"),
        ({"ranges": [[0, 10]]}, "add up to"),
        ({"size": 5}, "leaves the file"),
        ({"columns": ["id", 3]}, "column names are not all text"),
    ],
)
def test_a_lying_header_is_refused_before_anything_is_decoded(
    store: Store, change: dict[str, Any], says: str
) -> None:
    item, _ = piece(store)
    with pytest.raises(InvalidRequest, match=says) as info:
        PQ.read_parquet_message(cbor2.dumps(tampered(item, **change)), bytes(item.payload()), LIMIT)
    assert "decode=service" in str(info.value)


def test_bytes_nobody_sent_are_never_read(store: Store) -> None:
    item, schema = piece(store)
    # the header keeps half of the first range only (the payload likewise): the decoder
    # needs the rest, and is refused rather than shown other bytes
    start, data = item.ranges[0]
    length = len(data)
    cut = [[start, length // 2]]
    payload = bytes(item.footer) + bytes(data)[: length // 2]
    message = PQ.read_parquet_message(cbor2.dumps(tampered(item, ranges=cut)), payload, LIMIT)
    with pytest.raises(InvalidRequest, match="outside the ranges the service sent"):
        list(message.decode(schema, 5_000, 64 << 20))
    # a row group that declares more decoded bytes than the reader's limit is not decoded
    whole = PQ.read_parquet_message(item.header()[1], bytes(item.payload()), LIMIT)
    with pytest.raises(InvalidRequest, match="declares more than this client's limit"):
        list(whole.decode(schema, 5_000, 1_000))


@pytest.mark.parametrize("setting", ["lz4", "zstd:3"])
def test_a_piece_compressed_whole_decodes_to_the_same_rows(store: Store, setting: str) -> None:
    item, schema = piece(store)
    payload, (_, header) = item.packed(setting)
    assert len(payload) < item.nbytes  # this table's snappy pages still compress
    got = PQ.read_parquet_message(header, payload, LIMIT).decode(schema, 5_000, LIMIT)
    plain = PQ.read_parquet_message(item.header()[1], bytes(item.payload()), LIMIT)
    assert pa.Table.from_batches(list(got)).equals(
        pa.Table.from_batches(list(plain.decode(schema, 5_000, LIMIT)))
    )


def test_a_compressed_piece_is_bounded_by_what_it_declares(store: Store) -> None:
    item, _ = piece(store)
    payload, (_, header) = item.packed("zstd:1")
    fields = cbor2.loads(header)
    # declared beyond the reader's limit: refused before anything is decompressed
    with pytest.raises(InvalidRequest, match=r"declares .* bytes decompressed"):
        PQ.read_parquet_message(header, payload, item.nbytes - 1)
    # declaring less than it holds: decompression stops at what was declared, and fails
    short = cbor2.dumps({**fields, "length": item.nbytes // 2})
    with pytest.raises(InvalidRequest, match=r"cannot be decompressed|decompresses to"):
        PQ.read_parquet_message(short, payload, LIMIT)
    with pytest.raises(InvalidRequest, match="codec 'brotli'"):
        PQ.read_parquet_message(cbor2.dumps({**fields, "codec": "brotli"}), payload, LIMIT)
    with pytest.raises(InvalidRequest, match="cannot be decompressed"):
        PQ.read_parquet_message(header, bytes(len(payload)), LIMIT)


def test_auto_puts_lz4_on_stored_pages_only_where_it_shrinks_them_enough(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os

    from aqueduct_spark import protocol as P
    from aqueduct_spark.service import scan_codec
    from aqueduct_spark.service.scan_codec import ScanCodec

    # a million rows of the bench table shrink to 0.08 with lz4 on their snappy pages; this
    # test's 200k rows to 0.27: the threshold is raised to 0.3 to keep the test small
    monkeypatch.setattr(scan_codec, "STORED_LZ4", 0.3)

    seq = Store(str(tmp_path_factory.mktemp("seq")))
    n = 200_000  # ids in sequence and their halves, as the bench table: snappy leaves much
    data = pa.table({"id": pa.array(range(n), pa.int64()), "x": [i / 2 for i in range(n)]})
    write(seq, "seq", data, row_group_bytes=4 << 20, batch_rows=20_000)
    item = next(i for i in seq.scan(seq.plan("seq").splits, passing=True))
    assert isinstance(item, PQ.ParquetPiece)
    auto = ScanCodec(P.AUTO, P.AutoCompression(P.CODECS))
    chosen, payload, _ = auto.pack(item)
    assert chosen == "lz4" and len(payload) <= 0.3 * item.nbytes
    assert auto.pack(item)[0] == "lz4"  # decided once per scan
    # a reader's fixed setting is honoured, none included
    assert ScanCodec(P.Compression("none"), None).pack(item)[0] == "none"
    # pages that do not shrink go as they are
    noise = Store(str(tmp_path_factory.mktemp("noise")))
    data = pa.table({"b": pa.array([os.urandom(64) for _ in range(20_000)])})
    write(noise, "noise", data, row_group_bytes=400 << 10, batch_rows=4_000)
    plan = noise.plan("noise")
    (first, *_) = [i for i in noise.scan(plan.splits, passing=True)]
    assert isinstance(first, PQ.ParquetPiece)
    fresh = ScanCodec(P.AUTO, P.AutoCompression(P.CODECS))
    assert fresh.pack(first)[0] == "none"


def test_row_groups_on_an_object_store_go_as_stored_too(seaweed: Any) -> None:
    """A store's file is read one ranged request per range, not memory-mapped: the pieces
    decode to the rows of the Arrow path (SeaweedFS, a real S3-compatible store)."""
    import uuid

    s3 = Store(f"{seaweed.root}/pq-{uuid.uuid4().hex[:8]}", storage_options=seaweed.storage_options)
    write(s3, "big", table(0, 20_000), row_group_bytes=400 << 10, batch_rows=4_000)
    plan = s3.plan("big")
    items = list(s3.scan(plan.splits, passing=True))
    assert sum(isinstance(i, PQ.ParquetPiece) for i in items) >= 2
    arrow = pa.Table.from_batches(list(s3.scan(plan.splits)), schema=plan.schema)
    assert rows_of(items, plan.schema).equals(arrow)
