"""Primitives of profile §1.1: varint (G1), varbytes, header data, chanid (G2).

Conformance checklist (profile §6) cases 1-7. Expected bytes are the profile's golden vectors,
written out literally.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aqueduct_core.errors import CloseCode, LocalProtocolError, RemoteProtocolError
from aqueduct_core.testing import strategies as aqs
from aqueduct_core.wire import (
    ENTRYPOINT,
    ConnectionHeaders,
    Message,
    RouteTo,
    Side,
    StreamParser,
    WireLimits,
    creator_of,
    decode_frame,
    encode_frame,
    encode_varint,
    index_of,
    is_oneshot,
    make_chanid,
    parse_datagram,
    pull_varint,
    sender_of,
)
from aqueduct_core.wire.frames import pull_frame
from aqueduct_core.wire.primitives import Truncated, check_headers, varint_size

VARINT_VECTORS = [
    (0, "00"),
    (127, "7f"),
    (128, "80 01"),
    (300, "ac 02"),
    (16383, "ff 7f"),
    (16384, "80 80 01"),
    (2**56 - 1, "ff ff ff ff ff ff ff 7f"),
    (2**56, "80 80 80 80 80 80 80 80 01"),
    (2**63, "80 80 80 80 80 80 80 80 80"),
    (2**64 - 1, "ff ff ff ff ff ff ff ff ff"),
]


def pull(data: bytes) -> tuple[int, int]:
    return pull_varint(memoryview(data), 0)


def stream_outcome(data: bytes) -> list[object]:
    """Feed a whole stream and end it; raises RemoteProtocolError like a real stream would."""
    parser = StreamParser()
    frames: list[object] = list(parser.feed(data))
    parser.finish()
    return frames


# -- case 1 ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("value", "hexbytes"), VARINT_VECTORS)
def test_case_1_varint_vectors(value: int, hexbytes: str) -> None:
    """case 1: varint round trip at the profile's vectors, including the 8/9-byte edges."""
    expected = bytes.fromhex(hexbytes)
    assert encode_varint(value) == expected
    assert varint_size(value) == len(expected)
    assert pull(expected) == (value, len(expected))


@given(aqs.varints())
def test_case_1_varint_round_trip(value: int) -> None:
    """case 1: every u64 round-trips through the minimal 1-9 byte form."""
    data = encode_varint(value)
    assert len(data) == varint_size(value) <= 9
    assert pull(data + b"\x00\xff") == (value, len(data))


@pytest.mark.parametrize("value", [-1, 2**64])
def test_varint_encoder_refuses_out_of_range(value: int) -> None:
    with pytest.raises(LocalProtocolError):
        encode_varint(value)


# -- case 2 ---------------------------------------------------------------------------------


@pytest.mark.parametrize("hexbytes", ["80 00", "81 00", "ff ff ff ff ff ff ff ff 00", "ff 80 00"])
def test_case_2_overlong_varints_rejected(hexbytes: str) -> None:
    """case 2: overlong varints (last byte 0x00, including a 9th byte of 0x00) are rejected."""
    data = bytes.fromhex(hexbytes)
    with pytest.raises(RemoteProtocolError) as info:
        pull(data)
    assert info.value.code == CloseCode.PROTOCOL_VIOLATION
    # The same bytes as a ROUTE_TO chanid, in every place a frame can arrive.
    frame = b"\x03" + data
    with pytest.raises(RemoteProtocolError):
        decode_frame(frame)
    with pytest.raises(RemoteProtocolError):
        parse_datagram(frame)
    with pytest.raises(RemoteProtocolError):
        stream_outcome(frame)


# -- case 3 ---------------------------------------------------------------------------------


def test_case_3_ninth_byte_is_data_not_continuation() -> None:
    """case 3: the decoder stops after 9 bytes; a 9th byte with its top bit set is data."""
    nine = bytes.fromhex("80 80 80 80 80 80 80 80 80")
    assert pull(nine + b"\x05") == (2**63, 9)
    assert pull(bytes.fromhex("ff ff ff ff ff ff ff ff ff 7f")) == (2**64 - 1, 9)
    # In a frame sequence the byte after the 9th starts the next frame (ROUTE_TO 2**63, then
    # CANCEL_SENDER), where LEB128 would read a 10-byte varint.
    frames = stream_outcome(b"\x03" + nine + b"\x07")
    assert frames[0] == RouteTo(2**63)
    assert len(frames) == 2


# -- case 4 ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "hexbytes",
    [
        "03 80",  # ROUTE_TO, chanid varint cut after a continuation byte
        "03 ff ff ff ff ff ff ff ff",  # ... cut before the 9th byte
        "05",  # SENT_UNRELIABLE with no COUNT
        "02 05 01 61 01",  # CONNECTION_HEADERS, block cut short
        "02 80",  # ... block length itself cut
        "03 00 04 00 00 00 05 68 69",  # MESSAGE payload cut
        "03 00 08 04 00 03",  # ACK_RELIABLE range list cut
    ],
)
def test_case_4_truncated_varint_or_varbytes(hexbytes: str) -> None:
    """case 4: a varint or varbytes truncated at the end of a stream or datagram is a protocol
    error."""
    data = bytes.fromhex(hexbytes)
    view = memoryview(data)
    pos = 0
    with pytest.raises(Truncated):  # the internal signal, before it becomes an error
        while True:
            _, pos = pull_frame(view, pos)
    with pytest.raises(RemoteProtocolError):
        parse_datagram(data)
    parser = StreamParser()
    parser.feed(data)  # a stream waits for more bytes...
    assert parser.mid_frame
    with pytest.raises(RemoteProtocolError):
        parser.finish()  # ...and ending there is the error


# -- case 5 ---------------------------------------------------------------------------------


def test_case_5_varbytes_over_limit() -> None:
    """case 5: a varbytes length over the configured limit is a limit violation (code 3),
    raised as soon as the length is read."""
    limits = WireLimits(max_header_bytes=4)
    # CONNECTION_HEADERS with a 5-byte block: the block bytes never need to arrive.
    with pytest.raises(RemoteProtocolError) as info:
        decode_frame(bytes.fromhex("02 05"), limits=limits)
    assert info.value.code == CloseCode.LIMIT_VIOLATION
    with pytest.raises(RemoteProtocolError) as info:
        StreamParser(limits).feed(bytes.fromhex("02 05"))
    assert info.value.code == CloseCode.LIMIT_VIOLATION
    # Exactly at the limit is fine.
    assert decode_frame(bytes.fromhex("02 04 01 61 01 62"), limits=limits) == ConnectionHeaders(
        ((b"a", b"b"),)
    )


def test_case_5_varbytes_past_end_of_datagram() -> None:
    """case 5: a varbytes running past the end of a datagram is a protocol error (code 1)."""
    # ROUTE_TO 0; MESSAGE 0 with a payload length of 3 but 2 bytes left in the datagram.
    with pytest.raises(RemoteProtocolError) as info:
        parse_datagram(bytes.fromhex("03 00 04 00 00 00 03 68 69"))
    assert info.value.code == CloseCode.PROTOCOL_VIOLATION


# -- case 6 ---------------------------------------------------------------------------------


def test_case_6_empty_header_data() -> None:
    """case 6: header data `00` is zero pairs."""
    assert decode_frame(bytes.fromhex("02 00")) == ConnectionHeaders(())
    assert encode_frame(ConnectionHeaders(())) == bytes.fromhex("02 00")


def test_case_6_header_vector_with_one_pair() -> None:
    """case 6: profile §1.3 vector `02 12 0c "codec-1a2b3c" 04 "json"`."""
    wire = bytes.fromhex("02 12 0c") + b"codec-1a2b3c" + bytes.fromhex("04") + b"json"
    frame = ConnectionHeaders(((b"codec-1a2b3c", b"json"),))
    assert encode_frame(frame) == wire
    assert decode_frame(wire) == frame


def test_case_6_duplicate_keys_kept_in_order() -> None:
    """case 6: header data is a multimap; duplicates and their order survive."""
    wire = bytes.fromhex("02 0c 01 61 01 31 01 62 01 33 01 61 01 32")
    frame = ConnectionHeaders(((b"a", b"1"), (b"b", b"3"), (b"a", b"2")))
    assert decode_frame(wire) == frame
    assert encode_frame(frame) == wire


@pytest.mark.parametrize(
    ("hexbytes", "reason"),
    [
        ("02 02 01 61", "odd"),  # one item: a key with no value
        ("02 06 01 61 01 62 01 63", "odd"),  # three items
        ("02 02 05 61", "overruns"),  # inner item longer than the block
        ("02 04 01 61 02 62", "overruns"),  # value runs one byte past the block
        ("02 03 01 61 80", "overruns"),  # inner length varint cut by the block end
        ("02 05 01 61 80 80 04", "overruns"),  # a huge inner length: still not a limit error
    ],
)
def test_case_6_malformed_header_data(hexbytes: str, reason: str) -> None:
    """case 6: an odd inner count, or an inner item overrunning the outer block, is a protocol
    error (code 1, not the limit code)."""
    with pytest.raises(RemoteProtocolError, match=reason) as info:
        decode_frame(bytes.fromhex(hexbytes))
    assert info.value.code == CloseCode.PROTOCOL_VIOLATION


@given(aqs.headers())
def test_header_data_round_trip(headers: tuple[tuple[bytes, bytes], ...]) -> None:
    assert decode_frame(encode_frame(ConnectionHeaders(headers))) == ConnectionHeaders(headers)


def test_check_headers_normalises_caller_input() -> None:
    assert check_headers({"a": "1"}) == ((b"a", b"1"),)
    assert check_headers([(b"a", bytearray(b"1")), ("a", "2")]) == ((b"a", b"1"), (b"a", b"2"))
    for bad in (42, [("a",)], [(1, 2)]):
        with pytest.raises(LocalProtocolError):
            check_headers(bad)


# -- case 7 ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("hexbyte", "creator", "sender", "oneshot", "index"),
    [
        ("00", Side.CLIENT, Side.CLIENT, False, 0),  # entrypoint
        ("08", Side.CLIENT, Side.CLIENT, False, 1),
        ("02", Side.CLIENT, Side.SERVER, False, 0),
        ("03", Side.SERVER, Side.SERVER, False, 0),
        ("2d", Side.SERVER, Side.CLIENT, True, 5),
    ],
)
def test_case_7_chanid_vectors(
    hexbyte: str, creator: Side, sender: Side, oneshot: bool, index: int
) -> None:
    """case 7: chanid vectors with the 001 bit order (bit0 CREATOR, bit1 SENDER, bit2
    ONESHOT), not 000's."""
    value = bytes.fromhex(hexbyte)[0]
    assert make_chanid(creator, sender, oneshot, index) == value
    assert (creator_of(value), sender_of(value), is_oneshot(value), index_of(value)) == (
        creator,
        sender,
        oneshot,
        index,
    )
    wire = bytes.fromhex("03" + hexbyte)
    assert encode_frame(RouteTo(value)) == wire
    assert decode_frame(wire) == RouteTo(value)


def test_case_7_entrypoint_is_chanid_zero() -> None:
    """case 7: the entrypoint is client-created, client-sent, multishot, index 0."""
    assert ENTRYPOINT == 0 == make_chanid(Side.CLIENT, Side.CLIENT, False, 0)


@given(aqs.chanids())
def test_chanid_fields_round_trip(chanid: int) -> None:
    rebuilt = make_chanid(
        creator_of(chanid), sender_of(chanid), is_oneshot(chanid), index_of(chanid)
    )
    assert rebuilt == chanid
    assert decode_frame(encode_frame(RouteTo(chanid))) == RouteTo(chanid)


@given(st.data(), st.sampled_from(list(Side)), st.sampled_from(list(Side)), st.booleans())
def test_chanid_strategy_pins_fields(
    data: st.DataObject, creator: Side, sender: Side, oneshot: bool
) -> None:
    chanid = data.draw(aqs.chanids(creator=creator, sender=sender, oneshot=oneshot))
    assert (creator_of(chanid), sender_of(chanid), is_oneshot(chanid)) == (creator, sender, oneshot)


def test_chanid_index_out_of_range() -> None:
    with pytest.raises(LocalProtocolError):
        make_chanid(Side.CLIENT, Side.CLIENT, False, 2**61)


def test_message_num_is_a_plain_varint() -> None:
    """MESSAGE_NUM 2**64-1 is syntactically fine; rejecting it is the engine's job (§1.4)."""
    wire = bytes.fromhex("04 ff ff ff ff ff ff ff ff ff 00 00 00")
    assert decode_frame(wire) == Message(2**64 - 1)
