"""Compressed data messages are hostile input like any other (issue 26, item 4).

An Arrow IPC body compressed with zstd or LZ4 declares, per buffer, the size it decompresses
to, and pyarrow allocates and decompresses whatever is declared: 64 KiB of zstd zeros held
2 GiB in the service. The size a message declares now counts against the batch limit
(``aqueduct serve --max-batch-bytes``, the client's ``maxBatchBytes``) before anything is
decompressed, at both ends, over QUIC and TCP alike. And a written batch's offsets (strings,
binaries, lists) are checked before anything reads through them.

The bomb here is honest: the project's own encoder (``P.batch_to_payload`` with zstd) run on
a real 2 GiB batch of zeros, one message, with the client's own size check bypassed. Its
buffer is an anonymous mapping never written to (the kernel's zero page), so building it
costs this process no memory, only about two seconds of zstd.
"""

from __future__ import annotations

import asyncio
import mmap
import os
import resource
import struct
from collections.abc import Coroutine, Iterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from conftest import MEMORY_CAP_HEADROOM, MIB, TOKEN, ServerMemory
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aqueduct_core.api import Connection, Receiver
from aqueduct_core.transport import ClientTLS, serve
from aqueduct_spark import protocol as P
from aqueduct_spark.client import AsyncClient, ClientConfig
from aqueduct_spark.protocol import arrow
from aqueduct_spark.protocol.arrow import payload_size
from aqueduct_spark.protocol.ipc_meta import declared
from aqueduct_spark.testing import ServiceProcess, start_service

GIB = 1 << 30
BOMB_BYTES = 2 * GIB
GROWTH = 64 * MIB
"""What a refused bomb may add to the receiving process's peak RSS (issue 26's acceptance)."""
SCHEMA = pa.schema([("zero", pa.int64())])


def zeros(nbytes: int) -> pa.RecordBatch:
    """A batch of ``nbytes`` of int64 zeros that occupies no memory until written to."""
    mapping = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    column = pa.Array.from_buffers(pa.int64(), nbytes // 8, [None, pa.py_buffer(mapping)])
    return pa.record_batch([column], schema=SCHEMA)


def bomb(nbytes: int, codec: str = "zstd") -> bytes:
    return bytes(P.batch_to_payload(zeros(nbytes), P.ipc_options(codec)))


@pytest.fixture(scope="module")
def big_bomb() -> bytes:
    payload = bomb(BOMB_BYTES)
    assert len(payload) < 80 * 1024  # 64 KiB on the wire...
    assert P.read_data_message(payload).size > BOMB_BYTES  # ...declaring 2 GiB
    return payload


def run_within_growth(memory: ServerMemory, attack: Coroutine[Any, Any, str], who: str) -> str:
    """Run ``attack``; fails if it raised the peak RSS ``memory`` reads by ``GROWTH`` or
    more. Returns what the attack returned (the error its client saw)."""
    memory.reset_peak()
    before = memory.rss
    error = asyncio.run(asyncio.wait_for(attack, 60))
    grew = memory.peak - before
    print(f"\n[{who}] peak RSS growth {grew / MIB:.1f} MiB")
    assert grew < GROWTH, f"{who}: peak RSS grew by {grew / MIB:.0f} MiB"
    return error


# -- what a message declares, read before decoding -------------------------------------------


def sample(rows: int) -> pa.RecordBatch:
    return pa.record_batch(
        {
            "id": pa.array(range(rows), pa.int64()),
            "name": pa.array([None if i % 7 == 0 else f"row {i}" for i in range(rows)]),
            "tags": pa.array([[i, i + 1] for i in range(rows)], pa.list_(pa.int32())),
            "point": pa.array([{"x": float(i), "y": -1.0} for i in range(rows)]),
        }
    )


def allocated(batch: pa.RecordBatch) -> int:
    """Bytes of every buffer of a decoded batch, children included."""
    return sum(b.size for column in batch.columns for b in column.buffers() if b is not None)


@pytest.mark.parametrize("codec", ["lz4", "zstd"])
@pytest.mark.parametrize("rows", [0, 1, 1000, 30_000])
def test_the_declared_size_is_what_decoding_allocates(codec: str, rows: int) -> None:
    batch = sample(rows)
    payload = P.batch_to_payload(batch, P.ipc_options(codec))
    message = P.read_data_message(payload)
    decoded = message.decode(batch.schema)
    assert decoded.equals(batch)
    assert message.compressed
    assert message.size == max(len(payload), message.message.metadata.size + allocated(decoded))


@pytest.mark.parametrize("codec", ["none", "lz4", "zstd"])
@pytest.mark.parametrize("rows", [0, 1, 1000, 30_000])
def test_a_message_in_parts_is_the_message_and_counts_as_it_will_be_counted(
    codec: str, rows: int
) -> None:
    """The sender sends the parts without joining them (the batch's own buffers), and cuts
    batches to a reader's limit by the size the reader will count, read from the parts."""
    batch = sample(rows)
    payload = P.batch_to_payload(batch, P.ipc_options(codec))
    whole = bytes(payload)
    if codec == "none":
        assert whole == batch.serialize().to_pybytes()
    assert payload_size(payload) == P.read_data_message(whole).size
    assert P.read_data_message(whole).decode(batch.schema).equals(batch)


def test_an_uncompressed_message_counts_its_own_length() -> None:
    payload = P.batch_to_payload(sample(1000), P.ipc_options("none"))
    message = P.read_data_message(payload)
    assert not message.compressed and message.size == len(payload)


@pytest.mark.parametrize("codec", ["lz4", "zstd"])
def test_a_bomb_declares_what_it_holds(codec: str) -> None:
    payload = bomb(64 * MIB, codec)
    assert len(payload) < MIB
    message = P.read_data_message(payload)
    assert 64 * MIB <= message.size < 64 * MIB + 1024
    assert P.describe_size(message) == "64.0 MiB once decompressed"
    column = message.decode(SCHEMA).column(0)  # and it holds that much: a real bomb
    assert len(column) == 8 * MIB and pc.max(column).as_py() == 0


@pytest.mark.parametrize(
    ("declare", "error"),
    [
        (-2, "negative length"),
        (-(2**63), "negative length"),
        (8 * 999, "not an Arrow record batch"),  # smaller than it is: pyarrow stops, no overrun
        (8 * 1001, "not an Arrow record batch"),  # larger than it holds
        (-1, "not an Arrow record batch"),  # "stored uncompressed": too short for 1000 rows
    ],
)
def test_a_lying_length_is_refused(declare: int, error: str) -> None:
    batch = pa.record_batch([pa.array([0] * 1000, pa.int64())], schema=SCHEMA)
    payload = bytearray(bytes(P.batch_to_payload(batch, P.ipc_options("zstd"))))
    at = len(payload) - pa.ipc.read_message(payload).body.size  # the data buffer comes first
    assert struct.unpack_from("<q", payload, at)[0] == 8 * 1000
    struct.pack_into("<q", payload, at, declare)
    with pytest.raises(P.InvalidRequest, match=error):
        P.read_data_message(payload).decode(SCHEMA)


def test_a_dictionary_batch_is_not_a_data_message() -> None:
    batch = pa.record_batch({"d": pa.array(["a", "b", "a"]).dictionary_encode()})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    reader = pa.ipc.MessageReader.open_stream(sink.getvalue())
    reader.read_next_message()  # the schema
    dictionary = reader.read_next_message()
    assert dictionary.type == "dictionary"
    with pytest.raises(P.InvalidRequest, match="must be an Arrow record batch"):
        P.read_data_message(dictionary.serialize())


FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SEEDS = [
    bytes(P.batch_to_payload(sample(rows), P.ipc_options(codec)))
    for rows in (0, 3, 200)
    for codec in ("none", "lz4", "zstd")
]


@FUZZ
@given(
    seed=st.sampled_from(SEEDS),
    flips=st.lists(st.tuples(st.integers(0, 10**6), st.integers(1, 255)), max_size=6),
    cut=st.integers(0, 10**6),
)
def test_a_mutated_message_is_refused_or_decoded_within_its_declared_size(
    seed: bytes, flips: list[tuple[int, int]], cut: int
) -> None:
    """Bit flips in real messages (metadata and body) and truncation: reading what they
    declare raises InvalidRequest or gives a size, and a message decoded within that size
    allocates no more than it declared."""
    data = bytearray(seed)
    for at, mask in flips:
        data[at % len(data)] ^= mask
    data = data[: max(8, len(data) - cut % 64)] if cut % 3 == 0 else data
    try:
        message = P.read_data_message(bytes(data))
    except P.InvalidRequest:
        return
    assert message.size >= len(data)
    if message.size > 64 * MIB:
        return  # a caller refuses it here, before decoding
    try:
        batch = message.decode(sample(0).schema)
    except P.InvalidRequest:
        return
    if message.compressed:
        assert allocated(batch) <= message.size


@FUZZ
@given(metadata=st.binary(max_size=400), body=st.binary(max_size=200))
def test_arbitrary_metadata_reads_or_raises_value_error(metadata: bytes, body: bytes) -> None:
    """The Flatbuffer reader alone, on bytes pyarrow never verified: every read is
    bounds-checked (a ValueError), and what it returns is never negative."""
    try:
        found = declared(metadata, body)
    except ValueError:
        return
    assert found.decoded >= 0


# -- a real service refuses the bomb before decompressing it ---------------------------------


@pytest.fixture(scope="module")
def capped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServiceProcess, Any]]:
    """``aqueduct serve`` (default limits) under an address-space cap, as the attack tests'
    ``target`` (shared by this module's tests)."""
    svc = start_service(tmp_path_factory.mktemp("bomb-root"), token=TOKEN)
    try:
        memory = ServerMemory(svc.proc.pid)
        _, hard = resource.prlimit(svc.proc.pid, resource.RLIMIT_AS)
        cap = memory.address_space + MEMORY_CAP_HEADROOM
        resource.prlimit(svc.proc.pid, resource.RLIMIT_AS, (cap, hard))
        yield svc, memory
    finally:
        svc.stop()


def client_of(svc: ServiceProcess, transport: str, **fields: Any) -> AsyncClient:
    return AsyncClient(
        ClientConfig(
            svc.url,
            token=TOKEN,
            tls=ClientTLS(fingerprint=svc.fingerprint),
            transport=transport,
            retries=0,
            **fields,
        )
    )


@pytest.mark.parametrize("transport", ["quic", "tcp"])
def test_a_compression_bomb_is_refused_before_it_is_decompressed(
    capped: tuple[ServiceProcess, Any],
    big_bomb: bytes,
    transport: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    svc, memory = capped

    def unchecked(batch: pa.RecordBatch, *_: Any) -> Iterator[tuple[pa.RecordBatch, Any]]:
        yield batch, big_bomb  # the client's own split and size check bypassed

    async def attack() -> str:
        client = client_of(svc, transport, compression="zstd")
        try:
            txn = await client.begin("bombed", SCHEMA)
            monkeypatch.setattr(P, "payloads_within", unchecked)
            with pytest.raises(P.InvalidRequest) as refused:
                await client.write_task(txn, [zeros(8)])
            monkeypatch.undo()
            # The connection and the service are fine: an honest compressed write lands.
            honest = pa.record_batch([pa.array([0] * 1000, pa.int64())], schema=SCHEMA)
            await client.write("bombed", honest, mode="append")
            assert (await client.read("bombed")).num_rows >= 1000
            return str(refused.value)
        finally:
            await client.close()

    error = run_within_growth(memory, attack(), f"the service (bomb over {transport})")
    assert "2048.0 MiB once decompressed" in error
    assert "over the service's limit of 64 MiB" in error
    assert "aqueduct serve --max-batch-bytes" in error


# -- offsets that lie: refused before anything reads through them ----------------------------


def lying(offsets: list[int], data: bytes = b"abcdef", binary: bool = False) -> bytes:
    """A data message of one column whose offsets are ``offsets`` over ``data``: what a
    hostile client can send (pyarrow's own writer copies the buffers as they are)."""
    buffers = [None, pa.py_buffer(struct.pack(f"<{len(offsets)}i", *offsets)), pa.py_buffer(data)]
    kind = pa.binary() if binary else pa.string()
    column = pa.Array.from_buffers(kind, len(offsets) - 1, buffers)
    return bytes(pa.record_batch([column], names=["s"]).serialize())


def nested_lie() -> bytes:
    """A list of strings whose strings' offsets run backwards."""
    buffers = [None, pa.py_buffer(struct.pack("<4i", 0, 4, 2, 6)), pa.py_buffer(b"abcdef")]
    strings = pa.Array.from_buffers(pa.string(), 3, buffers)
    column = pa.ListArray.from_arrays(pa.array([0, 3], pa.int32()), strings)
    return bytes(pa.record_batch([column], names=["s"]).serialize())


LIES = {
    "past its data": lying([0, 1000, 6]),  # value 0 would read 994 bytes beyond the buffer
    "backwards": lying([0, 4, 2, 6]),
    "negative": lying([0, -5, 6]),
    "not UTF-8": lying([0, 2, 4], b"\xff\xfeab"),
    "a binary past its data": lying([0, 1 << 20, 6], binary=True),
    "in a list": nested_lie(),
}


def lie_schema(lie: str) -> pa.Schema:
    kind = {"a binary past its data": pa.binary(), "in a list": pa.list_(pa.string())}
    return pa.schema([("s", kind.get(lie, pa.string()))])


@pytest.mark.parametrize("lie", list(LIES))
def test_a_batch_whose_offsets_lie_is_refused_before_use(lie: str) -> None:
    """pyarrow's reader and its basic ``validate`` take all of these (they check buffer
    sizes, not the values in them). ``check="full"``, what the service does for every
    write, refuses each; ``offsets``, what a client does for every scan, each but the
    invalid UTF-8 (which reads no memory it should not)."""
    message = P.read_data_message(LIES[lie])
    message.decode(lie_schema(lie), check="sizes")
    with pytest.raises(P.InvalidRequest, match=r"not an Arrow record batch.*Invalid"):
        message.decode(lie_schema(lie), check="full")
    if lie == "not UTF-8":
        message.decode(lie_schema(lie), check="offsets")
    else:
        with pytest.raises(P.InvalidRequest, match=r"not an Arrow record batch.*offset"):
            message.decode(lie_schema(lie), check="offsets")


def test_every_string_in_nested_types_is_checked_and_honest_batches_pass() -> None:
    honest = pa.record_batch(
        {
            "plain": pa.array(["a", "bé"], pa.large_string()),
            "point": pa.array([{"x": 1, "name": "p"}, {"x": 2, "name": "q"}]),
            "tags": pa.array([{"k": "v"}, {}], pa.map_(pa.string(), pa.string())),
            "words": pa.array([["a"], ["b", "c"]], pa.large_list(pa.string())),
            "pair": pa.array([["a", "b"], ["c", "d"]], pa.list_(pa.string(), 2)),
            "ids": pa.array([[1], [2, 3]], pa.list_(pa.int64())),
        }
    )
    message = P.read_data_message(bytes(honest.serialize()))
    for check in ("sizes", "offsets", "full"):
        assert message.decode(honest.schema, check=check).equals(honest)
    assert arrow._strings_as_binary(honest.schema.field("tags").type) == pa.map_(
        pa.binary(), pa.binary()
    )
    assert arrow._strings_as_binary(honest.schema.field("ids").type) is None


def test_a_written_batch_whose_offsets_lie_is_refused_by_the_service(
    capped: tuple[ServiceProcess, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through a real connection: the write is refused naming the offset, nothing of it is
    committed, and the connection goes on."""
    svc, _ = capped
    schema = pa.schema([("s", pa.string())])

    def unchecked(batch: pa.RecordBatch, *_: Any) -> Iterator[tuple[pa.RecordBatch, Any]]:
        yield batch, LIES["past its data"]

    async def attack() -> str:
        client = client_of(svc, "quic")
        try:
            txn = await client.begin("lied", schema)
            monkeypatch.setattr(P, "payloads_within", unchecked)
            with pytest.raises(P.InvalidRequest) as refused:
                await client.write_task(txn, [pa.record_batch([pa.array(["x"])], schema=schema)])
            monkeypatch.undo()
            await client.write("lied", pa.table({"s": ["honest"]}), mode="append")
            assert (await client.read("lied")).column("s").to_pylist() == ["honest"]
            return str(refused.value)
        finally:
            await client.close()

    error = asyncio.run(asyncio.wait_for(attack(), 60))
    assert "offset for slot 1 out of bounds: 1000 > 6" in error


# -- a hostile service's scan answer does not blow up the client -----------------------------


class BombingService:
    """Answers every ``scan`` with one bomb on its data channel; counts the scans."""

    def __init__(self, payload: bytes) -> None:
        self.payload = payload
        self.scans = 0

    async def handler(self, conn: Connection, rx: Receiver[Any]) -> None:
        async for request in rx:
            if request.get("op") == "scan":
                self.scans += 1
                out = request["out"]
                await out.send(self.payload, headers=[P.batch_header(BOMB_BYTES // 8, 0)])
                out.finish()


@pytest.mark.parametrize("transport", ["quic", "tcp"])
def test_a_bomb_in_a_scan_answer_is_refused_by_the_client(big_bomb: bytes, transport: str) -> None:
    """A hostile (or broken) service must not blow up a Spark executor: the client refuses
    the message before decompressing it, naming its own limit, and does not ask again."""
    service = BombingService(big_bomb)

    async def scan() -> str:
        server = await serve(service.handler, "127.0.0.1", 0)
        client = AsyncClient(
            ClientConfig(
                f"quic://127.0.0.1:{server.port}",
                tls=ClientTLS(fingerprint=server.fingerprint),
                transport=transport,
                retries=2,
            )
        )
        try:
            with pytest.raises(P.InvalidRequest) as refused:
                async for _ in client.scan({"dataset": "x"}, schema=SCHEMA):
                    pass
            return str(refused.value)
        finally:
            await client.close()
            await server.close()

    client = ServerMemory(os.getpid())
    error = run_within_growth(client, scan(), f"the client (scan bomb over {transport})")
    assert service.scans == 1  # refused for good: not retried
    assert "the service sent a data message of 2048.0 MiB once decompressed" in error
    assert "over this client's limit of 64 MiB" in error and "maxBatchBytes" in error
