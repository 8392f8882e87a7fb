"""Frame-sequence parsers (profile §1.2): grammar, split invariance, stream resets and ends,
limits, and large payloads.

Conformance checklist (profile §6) cases 10, 23, 24 and 35.
"""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aqueduct_core.errors import CloseCode, RemoteProtocolError
from aqueduct_core.testing import strategies as aqs
from aqueduct_core.wire import (
    AckVersion,
    Attachment,
    CancelSender,
    ConnectionHeaders,
    Dequeued,
    Frame,
    Message,
    RouteTo,
    StreamParser,
    Version,
    WireLimits,
    encode_frame,
    encode_frames,
    encode_varint,
    parse_datagram,
)

VERSION_BYTES = bytes.fromhex(
    "ef 50 5f a6 60 0f 40 8e 41 51 55 45 44 55 43 54 0b 30 2e 30 2e 30 2d 41 46 54 45 52"
)
ROUTE_0 = bytes.fromhex("03 00")
MESSAGE_HI = bytes.fromhex("04 00 00 00 02 68 69")

Outcome = list[Frame] | str


def feed_chunks(chunks: list[bytes], flow_control: bool = False) -> Outcome:
    """Frames of a whole stream delivered as ``chunks``, or "error"."""
    parser = StreamParser(flow_control=flow_control)
    frames: list[Frame] = []
    try:
        for chunk in chunks:
            frames += parser.feed(chunk)
        parser.finish()
    except RemoteProtocolError:
        return "error"
    return frames


def split_at(data: bytes, cuts: list[int]) -> list[bytes]:
    points = [0, *sorted(cuts), len(data)]
    return [data[a:b] for a, b in itertools.pairwise(points)]


# -- case 10 --------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(aqs.stream_sequences(flow_control=True, max_payload=40), st.booleans())
def test_case_10_every_split_point_gives_the_same_frames(
    frames: list[Frame], flow_control: bool
) -> None:
    """case 10: a valid stream parses to the same frames whole and split at every point."""
    if not flow_control:
        frames = [f for f in frames if not isinstance(f, Dequeued)]
    data = encode_frames(*frames)
    assert feed_chunks([data], flow_control) == frames
    for cut in range(len(data) + 1):
        assert feed_chunks([data[:cut], data[cut:]], flow_control) == frames


@given(aqs.stream_sequences(flow_control=True), st.data())
def test_case_10_random_multi_splits(frames: list[Frame], data: st.DataObject) -> None:
    """case 10: any number of chunk boundaries, empty chunks included, changes nothing."""
    wire = encode_frames(*frames)
    cuts = data.draw(st.lists(st.integers(0, len(wire)), max_size=12))
    assert feed_chunks(split_at(wire, cuts), flow_control=True) == frames


@settings(max_examples=60, deadline=None)
@given(aqs.stream_sequences(max_payload=40), st.data())
def test_case_10_error_equivalence(frames: list[Frame], data: st.DataObject) -> None:
    """case 10: for a corrupted stream, every split gives the same outcome as the whole:
    the same frames, or an error at every split."""
    wire = bytearray(encode_frames(*frames))
    if wire:
        for _ in range(data.draw(st.integers(1, 3))):
            pos = data.draw(st.integers(0, len(wire) - 1))
            wire[pos] = data.draw(st.integers(0, 255))
    wire += data.draw(st.binary(max_size=4))
    whole = feed_chunks([bytes(wire)])
    for cut in range(len(wire) + 1):
        assert feed_chunks([bytes(wire[:cut]), bytes(wire[cut:])]) == whole


def test_case_10_byte_by_byte_golden_stream() -> None:
    """case 10: the profile's entrypoint stream fed one byte at a time."""
    wire = VERSION_BYTES + ROUTE_0 + MESSAGE_HI
    expected = [Version(), RouteTo(0), Message(0, payload=b"hi")]
    assert feed_chunks([wire[i : i + 1] for i in range(len(wire))]) == expected


@given(aqs.datagram_sequences())
def test_datagram_sequences_parse(frames: list[Frame]) -> None:
    wire = encode_frames(*frames)
    parsed, version_first = parse_datagram(wire)
    assert parsed == frames
    assert version_first == (bool(frames) and isinstance(frames[0], Version))


# -- case 23 --------------------------------------------------------------------------------

ROUTED_VECTORS = [
    "04 00 00 00 00",  # MESSAGE
    "05 03",  # SENT_UNRELIABLE
    "06 04",  # FINISH_SENDER
    "07",  # CANCEL_SENDER
    "08 02 00 01",  # ACK_RELIABLE
    "09 01 01",  # ACK_NACK_UNRELIABLE
    "0a",  # CLOSE_RECEIVER
    "0b",  # FORGET_CHANNEL
    "0c 01",  # DEQUEUED
]


@pytest.mark.parametrize("hexbytes", ROUTED_VECTORS)
def test_case_23_routed_frame_without_route_to(hexbytes: str) -> None:
    """case 23: a routed frame with nothing (or only prelude frames) before it, and no
    ROUTE_TO, is a protocol error."""
    frame = bytes.fromhex(hexbytes)
    for prefix in (b"", VERSION_BYTES, VERSION_BYTES + bytes.fromhex("01 02 00")):
        assert feed_chunks([prefix + frame], flow_control=True) == "error"
    if frame[0] == 4:
        with pytest.raises(RemoteProtocolError, match="no ROUTE_TO"):
            parse_datagram(frame)


def test_case_23_second_route_to() -> None:
    """case 23: a second ROUTE_TO in one sequence is a protocol error, on streams and in
    datagrams."""
    wire = bytes.fromhex("03 00 04 00 00 00 00 03 08")
    with pytest.raises(RemoteProtocolError, match="second ROUTE_TO"):
        StreamParser().feed(wire)
    with pytest.raises(RemoteProtocolError, match="second ROUTE_TO"):
        parse_datagram(wire)
    assert feed_chunks([ROUTE_0, bytes.fromhex("03 00")]) == "error"


# -- case 24 --------------------------------------------------------------------------------


@pytest.mark.parametrize("prelude", [VERSION_BYTES, bytes.fromhex("01"), bytes.fromhex("02 00")])
def test_case_24_prelude_after_route_to(prelude: bytes) -> None:
    """case 24: VERSION, ACK_VERSION or CONNECTION_HEADERS after ROUTE_TO is an error."""
    with pytest.raises(RemoteProtocolError, match="after ROUTE_TO"):
        StreamParser().feed(ROUTE_0 + prelude)
    with pytest.raises(RemoteProtocolError, match="after ROUTE_TO"):
        StreamParser().feed(ROUTE_0 + MESSAGE_HI + prelude)
    with pytest.raises(RemoteProtocolError):
        parse_datagram(ROUTE_0 + prelude)


@pytest.mark.parametrize(
    "hexbytes",
    [
        "01",  # ACK_VERSION
        "02 00",  # CONNECTION_HEADERS
        "03 00 05 03",  # then routed: SENT_UNRELIABLE
        "03 00 06 04",  # FINISH_SENDER
        "03 00 07",  # CANCEL_SENDER
        "03 00 08 02 00 01",  # ACK_RELIABLE
        "03 00 09 01 01",  # ACK_NACK_UNRELIABLE
        "03 00 0a",  # CLOSE_RECEIVER
        "03 00 0b",  # FORGET_CHANNEL
        "03 00 0c 01",  # DEQUEUED
    ],
)
def test_case_24_datagram_allows_only_version_route_to_message(hexbytes: str) -> None:
    """case 24: in a datagram, any frame other than VERSION, ROUTE_TO or MESSAGE is an
    error, even when it would be grammatical on a stream."""
    wire = bytes.fromhex(hexbytes)
    with pytest.raises(RemoteProtocolError, match="not allowed in a datagram"):
        parse_datagram(wire, flow_control=True)
    assert feed_chunks([wire], flow_control=True) != "error"


def test_case_24_datagram_prelude_of_versions() -> None:
    """case 24: VERSION, ROUTE_TO and MESSAGE are the datagram alphabet."""
    wire = VERSION_BYTES + ROUTE_0 + MESSAGE_HI + MESSAGE_HI
    frames, version_first = parse_datagram(wire)
    assert frames == [Version(), RouteTo(0), Message(0, payload=b"hi"), Message(0, payload=b"hi")]
    assert version_first


# -- case 35 --------------------------------------------------------------------------------


def test_case_35_empty_stream_and_datagram_are_ignored() -> None:
    """case 35: an empty stream (or datagram) is fine and yields nothing."""
    parser = StreamParser()
    assert parser.feed(b"") == []
    parser.finish()
    assert parser.frame_count == 0
    assert parser.route is None
    assert not parser.version_first
    assert parse_datagram(b"") == ([], False)


@pytest.mark.parametrize("cut", [1, 3, 4, 5, 6])
def test_case_35_stream_ending_mid_frame(cut: int) -> None:
    """case 35: a stream that ends in the middle of a frame (head or payload) is an error;
    the frames before it were delivered."""
    parser = StreamParser()
    frames = parser.feed(ROUTE_0 + MESSAGE_HI[:cut])
    assert frames == [RouteTo(0)]
    assert parser.mid_frame
    with pytest.raises(RemoteProtocolError, match="middle of a frame") as info:
        parser.finish()
    assert info.value.code == CloseCode.PROTOCOL_VIOLATION


@pytest.mark.parametrize("partial", [bytes.fromhex("02 05 01"), bytes.fromhex("04 00 00 00 05 68")])
def test_case_35_reset_drops_only_the_partial_frame(partial: bytes) -> None:
    """case 35: a reset mid-frame drops the partial frame (a header block, or a MESSAGE
    whose payload is incomplete); frames fully received before it still count."""
    parser = StreamParser()
    delivered = parser.feed(ROUTE_0 + MESSAGE_HI + partial)
    assert delivered == [RouteTo(0), Message(0, payload=b"hi")]
    assert parser.mid_frame
    parser.reset()
    assert not parser.mid_frame
    parser.finish()  # nothing buffered any more
    assert parser.route == 0
    assert parser.feed(b"") == []


def test_case_35_stream_ending_cleanly_after_frames() -> None:
    """case 35: the same stream ending at a frame boundary is fine."""
    parser = StreamParser()
    assert parser.feed(ROUTE_0 + MESSAGE_HI) == [RouteTo(0), Message(0, payload=b"hi")]
    parser.finish()


# -- stream parser behaviour ----------------------------------------------------------------


def test_large_payload_in_16k_chunks() -> None:
    """A 3 MiB payload fed in 16 KiB chunks arrives intact, only once the last byte does."""
    payload = random.Random(7).randbytes(3 * 1024 * 1024)
    wire = encode_frames(RouteTo(8), Message(5, ((b"k", b"v"),), (Attachment(16),), payload))
    parser = StreamParser()
    frames: list[Frame] = []
    chunk = 16 * 1024
    for start in range(0, len(wire), chunk):
        got = parser.feed(wire[start : start + chunk])
        if start + chunk < len(wire):
            assert not any(isinstance(f, Message) for f in got)
        frames += got
    parser.finish()
    assert frames == [RouteTo(8), Message(5, ((b"k", b"v"),), (Attachment(16),), payload)]


def test_payload_then_next_frame_in_the_same_chunk() -> None:
    """The chunk that completes a gathered payload may also carry the next frames."""
    wire = ROUTE_0 + encode_frame(Message(1, payload=b"x" * 100)) + bytes.fromhex("07")
    parser = StreamParser()
    assert parser.feed(wire[:10]) == [RouteTo(0)]
    assert parser.feed(wire[10:]) == [Message(1, payload=b"x" * 100), CancelSender()]
    parser.finish()


def test_reused_bytearray_chunks_do_not_corrupt_payloads() -> None:
    """A transport may reuse one receive buffer; the parser must not keep pointing into it."""
    wire = ROUTE_0 + encode_frame(Message(1, payload=bytes(range(64))))
    parser = StreamParser()
    frames: list[Frame] = []
    buf = bytearray()
    for start in range(0, len(wire), 8):
        buf[:] = wire[start : start + 8]
        frames += parser.feed(buf)
    buf[:] = b"\xff" * 8
    parser.finish()
    assert frames == [RouteTo(0), Message(1, payload=bytes(range(64)))]


def test_reused_buffer_views_through_absorb_arrive_intact_as_one_buffer() -> None:
    """The TCP path: views of one reused receive buffer, most taken by ``absorb``. The
    payload is copied once into the buffer handed out, whatever the pieces."""
    payload = random.Random(3).randbytes(300_001)
    wire = ROUTE_0 + encode_frame(Message(2, payload=payload))
    parser = StreamParser()
    buf = bytearray(4096)
    view = memoryview(buf)
    frames: list[Frame] = []
    for start in range(0, len(wire), 4096):
        piece = wire[start : start + 4096]
        buf[: len(piece)] = piece
        if not parser.absorb(view[: len(piece)]):
            frames += parser.feed(view[: len(piece)])
        buf[:] = b"\xee" * 4096  # the transport reuses its buffer at once
    parser.finish()
    assert frames == [RouteTo(0), Message(2, payload=payload)]
    assert type(frames[1].payload) is bytearray  # gathered into it: no join at the end


def test_a_payload_holds_what_arrived_not_what_was_announced() -> None:
    """A MESSAGE head announcing 48 MiB followed by a few bytes makes the parser hold a few
    bytes, not 48 MiB (without flow control nothing else bounds it: the security fuzzer's
    held-memory invariant)."""
    import tracemalloc

    head = ROUTE_0 + bytes.fromhex("04 00 00 00") + encode_varint(48 << 20)
    parser = StreamParser()
    tracemalloc.start()
    try:
        parser.feed(head + b"\x01" * 100)
        assert parser.head is not None
        assert parser.absorb(b"")
        assert parser.absorb(b"\x02" * 100)
        assert tracemalloc.get_traced_memory()[1] < 1 << 20
    finally:
        tracemalloc.stop()


def test_message_placement_error_before_the_payload_arrives() -> None:
    """An unrouted MESSAGE is rejected when its head arrives, not after its megabytes."""
    head = bytes.fromhex("04 00 00 00") + encode_varint(8 * 1024 * 1024)
    with pytest.raises(RemoteProtocolError, match="no ROUTE_TO"):
        StreamParser().feed(head + b"\x00" * 100)
    with pytest.raises(RemoteProtocolError, match="no ROUTE_TO"):
        StreamParser().feed(VERSION_BYTES + head)


def test_stream_properties_describe_the_sequence() -> None:
    parser = StreamParser()
    parser.feed(VERSION_BYTES + bytes.fromhex("01 02 00 03 2d"))
    assert parser.version_first
    assert parser.route == 45
    assert parser.frame_count == 4
    assert [type(f) for f in StreamParser().feed(bytes.fromhex("01 02 00"))] == [
        AckVersion,
        ConnectionHeaders,
    ]


# -- limits ---------------------------------------------------------------------------------


def test_payload_over_the_limit() -> None:
    """A payload longer than max_payload_bytes is close code 3, raised at the length."""
    limits = WireLimits(max_payload_bytes=1000)
    ok = ROUTE_0 + encode_frame(Message(0, payload=b"a" * 1000))
    assert len(StreamParser(limits).feed(ok)) == 2
    too_big = ROUTE_0 + bytes.fromhex("04 00 00 00") + encode_varint(1001)
    with pytest.raises(RemoteProtocolError) as info:
        StreamParser(limits).feed(too_big)
    assert info.value.code == CloseCode.LIMIT_VIOLATION
    with pytest.raises(RemoteProtocolError) as info:
        parse_datagram(too_big + b"a" * 1001, limits)
    assert info.value.code == CloseCode.LIMIT_VIOLATION


def test_default_payload_limit() -> None:
    """The default limit is 64 MiB; one byte more is refused before any payload arrives."""
    head = ROUTE_0 + bytes.fromhex("04 00 00 00") + encode_varint(64 * 1024 * 1024 + 1)
    with pytest.raises(RemoteProtocolError) as info:
        StreamParser().feed(head)
    assert info.value.code == CloseCode.LIMIT_VIOLATION


@pytest.mark.parametrize(
    "frame",
    [
        ConnectionHeaders(((b"k", b"v" * 60),)),
        Message(0, headers=((b"k", b"v" * 60),)),
        Message(0, attachments=(Attachment(2, ((b"k", b"v" * 60),)),)),
    ],
    ids=["connection", "message", "attachment"],
)
def test_header_block_over_the_limit(frame: Frame) -> None:
    """A header block longer than max_header_bytes is close code 3, wherever it appears."""
    wire = encode_frame(frame)  # the block is 63 bytes: 01 "k" 3c "v"*60
    prefix = b"" if isinstance(frame, ConnectionHeaders) else ROUTE_0
    assert len(StreamParser(WireLimits(max_header_bytes=63)).feed(prefix + wire)) >= 1
    with pytest.raises(RemoteProtocolError) as info:
        StreamParser(WireLimits(max_header_bytes=62)).feed(prefix + wire)
    assert info.value.code == CloseCode.LIMIT_VIOLATION


def test_attachment_and_range_lists_over_the_limit() -> None:
    limits = WireLimits(max_list_bytes=4)
    many = Message(0, attachments=(Attachment(2), Attachment(10), Attachment(18)))
    with pytest.raises(RemoteProtocolError) as info:
        StreamParser(limits).feed(ROUTE_0 + encode_frame(many))
    assert info.value.code == CloseCode.LIMIT_VIOLATION
    with pytest.raises(RemoteProtocolError) as info:
        StreamParser(limits).feed(ROUTE_0 + bytes.fromhex("09 05 01 01 01 01 01"))
    assert info.value.code == CloseCode.LIMIT_VIOLATION
