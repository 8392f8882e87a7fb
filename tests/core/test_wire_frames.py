"""Frames of profile §1.3: golden vectors, encoder/decoder round trips, malformed frames.

Conformance checklist (profile §6) cases 8, 9, 11, 12, 13 and 14.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aqueduct_core.errors import CloseCode, LocalProtocolError, RemoteProtocolError
from aqueduct_core.testing import strategies as aqs
from aqueduct_core.wire import (
    AckNackUnreliable,
    AckReliable,
    AckVersion,
    Attachment,
    CancelSender,
    CloseReceiver,
    ConnectionHeaders,
    Dequeued,
    FinishSender,
    ForgetChannel,
    Frame,
    Message,
    RouteTo,
    SentUnreliable,
    StreamParser,
    Version,
    decode_frame,
    encode_frame,
    encode_frames,
    message_cost,
    parse_datagram,
)
from aqueduct_core.wire.frames import (
    ATTACHMENT_COST,
    MESSAGE_OVERHEAD,
    message_parts,
    push_frame,
)
from aqueduct_core.wire.ranges import (
    ack_nack_runs,
    ack_reliable_runs,
    encode_ack_nack,
    encode_ack_reliable,
)

VERSION_HEX = (
    "ef 50 5f a6 60 0f 40 8e"  # magic; the first byte is the tag, 239
    " 41 51 55 45 44 55 43 54"  # AQUEDUCT
    " 0b 30 2e 30 2e 30 2d 41 46 54 45 52"  # varbytes "0.0.0-AFTER"
)
VERSION_BYTES = bytes.fromhex(VERSION_HEX)


def stream_frames(data: bytes, flow_control: bool = False) -> list[Frame]:
    parser = StreamParser(flow_control=flow_control)
    frames = parser.feed(data)
    parser.finish()
    return frames


# -- golden vectors of §1.3 -----------------------------------------------------------------

FRAME_VECTORS: list[tuple[Frame, str]] = [
    (AckVersion(), "01"),
    (ConnectionHeaders(), "02 00"),
    (RouteTo(0), "03 00"),
    (RouteTo(45), "03 2d"),
    (Message(0, payload=b"hi"), "04 00 00 00 02 68 69"),
    (Message(1, attachments=(Attachment(2),)), "04 01 00 02 02 00 00"),
    (SentUnreliable(3), "05 03"),
    (FinishSender(4), "06 04"),
    (CancelSender(), "07"),
    (AckReliable((0, 3, 2, 1)), "08 04 00 03 02 01"),
    (AckNackUnreliable((2, 2, 1)), "09 03 02 02 01"),
    (AckNackUnreliable((0, 3)), "09 02 00 03"),
    (CloseReceiver(), "0a"),
    (ForgetChannel(), "0b"),
    (Dequeued(300), "0c ac 02"),
]


@pytest.mark.parametrize(("frame", "hexbytes"), FRAME_VECTORS, ids=lambda v: repr(v)[:40])
def test_frame_vectors(frame: Frame, hexbytes: str) -> None:
    wire = bytes.fromhex(hexbytes)
    assert encode_frame(frame) == wire
    assert decode_frame(wire, flow_control=True) == frame


def test_client_first_stream_vector() -> None:
    """Profile §1.3: the client's first stream is [VERSION] 02 00."""
    wire = VERSION_BYTES + bytes.fromhex("02 00")
    assert encode_frames(Version(), ConnectionHeaders()) == wire
    assert stream_frames(wire) == [Version(), ConnectionHeaders()]


def test_entrypoint_message_vector() -> None:
    """Profile §1.3: entrypoint message "hi" is [VERSION] 03 00 | 04 00 00 00 02 68 69."""
    wire = VERSION_BYTES + bytes.fromhex("03 00 04 00 00 00 02 68 69")
    frames = [Version(), RouteTo(0), Message(0, payload=b"hi")]
    assert encode_frames(*frames) == wire
    assert stream_frames(wire) == frames
    assert parse_datagram(wire) == (frames, True)


# -- case 8 ---------------------------------------------------------------------------------


def test_case_8_version_vector() -> None:
    """case 8: VERSION is exactly the 28-byte vector."""
    assert len(VERSION_BYTES) == 28
    assert encode_frame(Version()) == VERSION_BYTES
    assert decode_frame(VERSION_BYTES) == Version(b"0.0.0-AFTER")


@pytest.mark.parametrize("position", range(1, 16))
def test_case_8_bad_magic_or_text_is_unsupported_version(position: int) -> None:
    """case 8: a bad magic byte (positions 1-7) or bad AQUEDUCT text (8-15) closes with code 2,
    in a single frame, on a stream and in a datagram."""
    wire = bytearray(VERSION_BYTES)
    wire[position] ^= 0x01
    for decode in (decode_frame, stream_frames, parse_datagram):
        with pytest.raises(RemoteProtocolError) as info:
            decode(bytes(wire))
        assert info.value.code == CloseCode.UNSUPPORTED_VERSION


def test_case_8_other_version_string_is_left_to_the_engine() -> None:
    """case 8: another version *string* is well-formed at the codec level; the engine closes
    the connection with code 2 when it sees one (profile §2.2)."""
    wire = bytes.fromhex("ef 50 5f a6 60 0f 40 8e 41 51 55 45 44 55 43 54 05 31 2e 30 2e 30")
    assert decode_frame(wire) == Version(version=b"1.0.0")
    assert encode_frame(Version(b"1.0.0")) == wire


def test_case_8_truncated_version() -> None:
    """case 8: a VERSION cut anywhere is an error at the end of a datagram or frame."""
    for cut in range(1, 28):
        with pytest.raises(RemoteProtocolError):
            decode_frame(VERSION_BYTES[:cut])
        with pytest.raises(RemoteProtocolError):
            parse_datagram(VERSION_BYTES[:cut])


def test_version_string_too_long() -> None:
    with pytest.raises(LocalProtocolError):
        encode_frame(Version(b"x" * 256))
    wire = VERSION_BYTES[:16] + bytes.fromhex("80 02") + b"x" * 256
    with pytest.raises(RemoteProtocolError):
        decode_frame(wire)


# -- case 9 ---------------------------------------------------------------------------------


@pytest.mark.parametrize("tag", [0, 13, 238, 12])
def test_case_9_unknown_tags(tag: int) -> None:
    """case 9: tags 0, 13, 238, and 12 (DEQUEUED) without negotiated flow control are
    protocol errors."""
    wire = bytes((tag, 0))
    with pytest.raises(RemoteProtocolError, match="tag") as info:
        decode_frame(wire)
    assert info.value.code == CloseCode.PROTOCOL_VIOLATION
    with pytest.raises(RemoteProtocolError):
        stream_frames(bytes.fromhex("03 00") + wire)


def test_case_9_every_unknown_tag_rejected() -> None:
    """case 9: only tags 1-11 (12 with flow control) and 239 start a frame."""
    for tag in range(256):
        if tag in range(1, 13) or tag == 239:
            continue
        with pytest.raises(RemoteProtocolError, match="unknown frame tag"):
            decode_frame(bytes((tag,)), flow_control=True)


def test_case_9_dequeued_only_with_flow_control() -> None:
    """case 9: tag 12 is legal once flow control is negotiated."""
    assert decode_frame(bytes.fromhex("0c 05"), flow_control=True) == Dequeued(5)
    assert stream_frames(bytes.fromhex("03 00 0c 05"), flow_control=True) == [
        RouteTo(0),
        Dequeued(5),
    ]


# -- case 11 --------------------------------------------------------------------------------


def test_case_11_message_with_attachment_vector() -> None:
    """case 11: MESSAGE attaching chan 2, byte for byte: 03 00 | 04 01 00 02 02 00 00."""
    wire = bytes.fromhex("03 00 04 01 00 02 02 00 00")
    frames = [RouteTo(0), Message(1, (), (Attachment(2, ()),), b"")]
    assert encode_frames(*frames) == wire
    assert stream_frames(wire) == frames
    assert parse_datagram(wire) == (frames, False)


def test_case_11_attachment_with_headers() -> None:
    """case 11: an attachment's CHANNEL_HEADERS sit inside the attachment list."""
    wire = bytes.fromhex("04 01 00 06 02 04 01 61 01 62 00")
    frame = Message(1, attachments=(Attachment(2, ((b"a", b"b"),)),))
    assert encode_frame(frame) == wire
    assert decode_frame(wire) == frame


@pytest.mark.parametrize(
    "hexbytes",
    [
        "04 01 00 01 02 00",  # list of 1 byte: the chanid fits, its headers do not
        "04 01 00 02 02 05 00",  # the attachment's header block runs past the list
        "04 01 00 02 02 80 00",  # ... its length varint is cut by the list end
        "04 01 00 05 02 00 00",  # the list runs past the end of the frame
        "04 01 00 04 02 00 02 00 00",  # chanid 2 attached twice
    ],
)
def test_case_11_attachment_list_errors(hexbytes: str) -> None:
    """case 11: an attachment list that overruns (or repeats a chanid) is a protocol error."""
    wire = bytes.fromhex(hexbytes)
    with pytest.raises(RemoteProtocolError) as info:
        decode_frame(wire)
    assert info.value.code == CloseCode.PROTOCOL_VIOLATION
    with pytest.raises(RemoteProtocolError):
        parse_datagram(bytes.fromhex("03 00") + wire)
    with pytest.raises(RemoteProtocolError):
        stream_frames(bytes.fromhex("03 00") + wire)


# -- case 12 --------------------------------------------------------------------------------


def test_case_12_ack_reliable_vector() -> None:
    """case 12: ACK_RELIABLE for {0,1,2,5} from base 0 is 08 04 00 03 02 01."""
    ranges = encode_ack_reliable(0, {5, 0, 2, 1})
    assert ranges == (0, 3, 2, 1)
    assert encode_frame(AckReliable(ranges)) == bytes.fromhex("08 04 00 03 02 01")
    assert decode_frame(bytes.fromhex("08 04 00 03 02 01")) == AckReliable((0, 3, 2, 1))
    assert ack_reliable_runs(0, ranges) == [(0, 3), (5, 6)]
    # The base is the lowest not-yet-acked number (G8): the same set from base 3 starts
    # with a gap of 2 and acks just {5}.
    assert encode_ack_reliable(3, {5}) == (2, 1)


@pytest.mark.parametrize(
    ("hexbytes", "ranges"),
    [
        ("08 00", ()),  # empty list
        ("08 01 00", (0,)),  # odd count
        ("08 03 00 03 02", (0, 3, 2)),  # odd count
        ("08 02 00 00", (0, 0)),  # a zero run
        ("08 04 00 03 00 01", (0, 3, 0, 1)),  # a zero gap that is not the first
        ("08 04 01 03 02 00", (1, 3, 2, 0)),  # a zero last run
    ],
)
def test_case_12_ack_reliable_errors(hexbytes: str, ranges: tuple[int, ...]) -> None:
    """case 12: an odd count, a non-first zero, or an empty list is a protocol error; our own
    encoder refuses the same lists as local misuse."""
    with pytest.raises(RemoteProtocolError) as info:
        decode_frame(bytes.fromhex(hexbytes))
    assert info.value.code == CloseCode.PROTOCOL_VIOLATION
    with pytest.raises(LocalProtocolError):
        encode_frame(AckReliable(ranges))


def test_case_12_ack_reliable_range_list_overrun() -> None:
    """case 12: a range varint cut by the end of its list is an error."""
    with pytest.raises(RemoteProtocolError, match="overruns"):
        decode_frame(bytes.fromhex("08 02 00 80"))


# -- case 13 --------------------------------------------------------------------------------


def test_case_13_ack_nack_vectors() -> None:
    """case 13: ack 2, nack 2, ack 1 is 09 03 02 02 01; nack 3 is 09 02 00 03."""
    assert encode_ack_nack([True, True, False, False, True]) == (2, 2, 1)
    assert encode_ack_nack([False, False, False]) == (0, 3)
    assert encode_frame(AckNackUnreliable((2, 2, 1))) == bytes.fromhex("09 03 02 02 01")
    assert encode_frame(AckNackUnreliable((0, 3))) == bytes.fromhex("09 02 00 03")
    assert decode_frame(bytes.fromhex("09 03 02 02 01")) == AckNackUnreliable((2, 2, 1))
    assert decode_frame(bytes.fromhex("09 02 00 03")) == AckNackUnreliable((0, 3))
    # Runs are read from the ack/nack cursor (G9).
    assert ack_nack_runs(10, (2, 2, 1)) == [(10, 12, True), (12, 14, False), (14, 15, True)]
    assert ack_nack_runs(10, (0, 3)) == [(10, 13, False)]


@pytest.mark.parametrize(
    ("hexbytes", "ranges"),
    [
        ("09 00", ()),  # empty
        ("09 01 00", (0,)),  # a lone zero
        ("09 02 02 00", (2, 0)),  # a zero last element
        ("09 03 01 00 01", (1, 0, 1)),  # a zero in the middle
        ("09 02 00 00", (0, 0)),  # leading zero, then another zero
    ],
)
def test_case_13_ack_nack_errors(hexbytes: str, ranges: tuple[int, ...]) -> None:
    """case 13: empty, a lone [0], or a zero last element is a protocol error; our encoder
    refuses the same lists."""
    with pytest.raises(RemoteProtocolError) as info:
        decode_frame(bytes.fromhex(hexbytes))
    assert info.value.code == CloseCode.PROTOCOL_VIOLATION
    with pytest.raises(LocalProtocolError):
        encode_frame(AckNackUnreliable(ranges))


# -- case 14 --------------------------------------------------------------------------------


def test_case_14_ack_nack_with_leading_channel_field_rejected() -> None:
    """case 14: the 001 layout with a CHANNEL field first (09 00 03 02 02 01, chanid 0) reads
    as empty RANGES, which is a protocol error (G5)."""
    old_layout = bytes.fromhex("09 00 03 02 02 01")
    with pytest.raises(RemoteProtocolError, match="at least one"):
        decode_frame(old_layout)
    with pytest.raises(RemoteProtocolError, match="at least one"):
        stream_frames(bytes.fromhex("03 00") + old_layout)


# -- round trips ----------------------------------------------------------------------------

FRAME_STRATEGIES: dict[str, st.SearchStrategy[Frame]] = {
    "Version": aqs.versions(),
    "AckVersion": st.just(AckVersion()),
    "ConnectionHeaders": st.builds(ConnectionHeaders, aqs.headers()),
    "RouteTo": st.builds(RouteTo, aqs.chanids()),
    "Message": aqs.messages(),
    "SentUnreliable": st.builds(SentUnreliable, aqs.varints()),
    "FinishSender": st.builds(FinishSender, aqs.varints()),
    "CancelSender": st.just(CancelSender()),
    "AckReliable": st.builds(AckReliable, aqs.ack_reliable_ranges()),
    "AckNackUnreliable": st.builds(AckNackUnreliable, aqs.ack_nack_ranges()),
    "CloseReceiver": st.just(CloseReceiver()),
    "ForgetChannel": st.just(ForgetChannel()),
    "Dequeued": st.builds(Dequeued, aqs.varints()),
}


@pytest.mark.parametrize("name", sorted(FRAME_STRATEGIES))
@given(data=st.data())
def test_round_trip_every_frame_type(name: str, data: st.DataObject) -> None:
    """decode_frame(encode_frame(f)) == f, and push_frame appends the same bytes."""
    frame = data.draw(FRAME_STRATEGIES[name])
    assert type(frame).__name__ == name
    wire = encode_frame(frame)
    assert decode_frame(wire, flow_control=True) == frame
    buf = bytearray(b"prefix")
    push_frame(buf, frame)
    assert bytes(buf) == b"prefix" + wire


@given(aqs.frames(flow_control=True))
def test_frames_strategy_round_trip(frame: Frame) -> None:
    assert decode_frame(encode_frame(frame), flow_control=True) == frame


@given(aqs.frames(flow_control=False))
def test_frames_strategy_without_flow_control_never_draws_dequeued(frame: Frame) -> None:
    assert not isinstance(frame, Dequeued)
    assert decode_frame(encode_frame(frame)) == frame


@given(aqs.messages(max_payload=2048), st.sampled_from([bytes, bytearray, memoryview]))
def test_message_parts_and_cost(message: Message, payload_type: type) -> None:
    """message_parts(m) + payload is the whole frame, and cost(m) is its length (§3.2)."""
    message = Message(
        message.num, message.headers, message.attachments, payload_type(message.payload)
    )
    wire = encode_frame(message)
    assert message_parts(message) + bytes(message.payload) == wire
    extra = MESSAGE_OVERHEAD + ATTACHMENT_COST * len(message.attachments)
    assert message_cost(message) == len(wire) + extra
    assert decode_frame(wire) == message


def test_message_parts_of_the_attachment_vector() -> None:
    message = Message(0, payload=b"hi")
    assert message_parts(message) == bytes.fromhex("04 00 00 00 02")
    assert message_cost(message) == 7 + MESSAGE_OVERHEAD


@given(aqs.ack_reliable_ranges())
def test_ack_reliable_ranges_decode_to_the_same_runs(ranges: tuple[int, ...]) -> None:
    """Ranges drawn by the strategy obey the zero rules, and encode_ack_reliable rebuilds
    them from the numbers they ack."""
    assert decode_frame(encode_frame(AckReliable(ranges))) == AckReliable(ranges)
    runs = ack_reliable_runs(7, ranges)
    if runs[-1][1] - 7 < 5000:
        numbers = [n for start, stop in runs for n in range(start, stop)]
        assert encode_ack_reliable(7, numbers) == ranges


@given(st.lists(st.booleans(), min_size=1, max_size=50))
def test_ack_nack_decisions_round_trip(decisions: list[bool]) -> None:
    ranges = encode_ack_nack(decisions)
    assert decode_frame(encode_frame(AckNackUnreliable(ranges))) == AckNackUnreliable(ranges)
    rebuilt = [acked for start, stop, acked in ack_nack_runs(0, ranges) for _ in range(start, stop)]
    assert rebuilt == decisions


def test_encoder_refuses_non_frames() -> None:
    with pytest.raises(LocalProtocolError):
        encode_frame(object())  # type: ignore[arg-type]
    with pytest.raises(LocalProtocolError):
        encode_ack_reliable(4, [3])
    with pytest.raises(LocalProtocolError):
        encode_ack_reliable(0, [])
    with pytest.raises(LocalProtocolError):
        encode_ack_nack([])


def test_trailing_bytes_after_a_frame() -> None:
    with pytest.raises(RemoteProtocolError, match="after the frame"):
        decode_frame(bytes.fromhex("07 07"))
    with pytest.raises(RemoteProtocolError):
        decode_frame(b"")
