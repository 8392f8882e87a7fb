"""The h11 fuzz invariant for the wire codec: any input either decodes or raises
:class:`RemoteProtocolError`, never anything else (house style, "Tests").

Two sources of input: arbitrary bytes, and valid encoded sequences mutated by bit flips,
truncation, insertion, deletion and splicing, which reach far deeper into the frame grammar
than random bytes do. On every input the four decoders agree: ``decode_frame``,
``parse_datagram``, and ``StreamParser`` fed the whole input at once and fed byte by byte. A
successful decode re-encodes to exactly the input (every valid encoding is canonical).

The default run is bounded (500 mutated inputs: the fast suite's share of a fuzz campaign);
``pytest -m slow`` runs the same targets with 10,000 and a targeted 1,500.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings, target
from hypothesis import strategies as st

from aqueduct_core.errors import CloseCode, RemoteProtocolError
from aqueduct_core.testing import strategies as aqs
from aqueduct_core.wire import (
    Dequeued,
    Frame,
    StreamParser,
    Version,
    decode_frame,
    encode_frame,
    encode_frames,
    parse_datagram,
)
from aqueduct_core.wire.frames import DATAGRAM_TYPES

FUZZ = settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SLOW_FUZZ = settings(FUZZ, max_examples=10_000)
# hypothesis.target() hill-climbing costs several times the plain run per example.
TARGETED_FUZZ = settings(FUZZ, max_examples=1500)

# Byte strings that sit on the edges of the encoding: frame tags (VERSION's magic, the ones
# after the last tag), continuation bytes, a 9-byte varint and an overlong one, big lengths.
INTERESTING = [
    b"\x00",
    b"\x80",
    b"\xff",
    b"\x80\x00",
    b"\xff" * 9,
    b"\xff" * 8 + b"\x00",
    b"\x03\x00",
    b"\x0c\x01",
    b"\x0d",
    b"\xef",
    bytes.fromhex("ef 50 5f a6 60 0f 40 8e 41 51 55 45 44 55 43 54"),
    b"\x80\x80\x80\x20",  # 64 MiB
]


def expect_error(exc: RemoteProtocolError) -> str:
    assert isinstance(exc.code, CloseCode)
    assert str(exc)
    return "error"


def check_decode_frame(data: bytes, flow_control: bool) -> None:
    try:
        frame = decode_frame(data, flow_control=flow_control)
    except RemoteProtocolError as exc:
        expect_error(exc)
        return
    assert encode_frame(frame) == data


def check_datagram(data: bytes, flow_control: bool) -> None:
    try:
        frames, version_first = parse_datagram(data, flow_control=flow_control)
    except RemoteProtocolError as exc:
        expect_error(exc)
        return
    assert all(isinstance(f, DATAGRAM_TYPES) for f in frames)
    assert encode_frames(*frames) == data
    assert version_first == (bool(frames) and isinstance(frames[0], Version))


def stream_whole(data: bytes, flow_control: bool) -> list[Frame] | str:
    parser = StreamParser(flow_control=flow_control)
    try:
        frames = parser.feed(data)
        parser.finish()
    except RemoteProtocolError as exc:
        return expect_error(exc)
    return frames


def stream_bytewise(data: bytes, flow_control: bool) -> tuple[list[Frame] | str, int]:
    """Outcome of feeding one byte at a time, and how many frames came out before it ended."""
    parser = StreamParser(flow_control=flow_control)
    frames: list[Frame] = []
    try:
        for i in range(len(data)):
            frames += parser.feed(data[i : i + 1])
        parser.finish()
    except RemoteProtocolError as exc:
        return expect_error(exc), len(frames)
    return frames, len(frames)


def check_stream(data: bytes, flow_control: bool) -> int:
    whole = stream_whole(data, flow_control)
    bytewise, count = stream_bytewise(data, flow_control)
    assert whole == bytewise
    if whole != "error":
        assert isinstance(whole, list)
        assert encode_frames(*whole) == data
    return count


def check_all(data: bytes, flow_control: bool) -> int:
    """Assert the invariant for every decoder; return the frames the stream yielded."""
    check_decode_frame(data, flow_control)
    check_datagram(data, flow_control)
    return check_stream(data, flow_control)


# -- arbitrary bytes ------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64), st.booleans())
def test_arbitrary_bytes_decode_or_raise_remote_protocol_error(
    data: bytes, flow_control: bool
) -> None:
    check_all(data, flow_control)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(INTERESTING), max_size=8).map(b"".join), st.booleans())
def test_edge_byte_soup(data: bytes, flow_control: bool) -> None:
    check_all(data, flow_control)


# -- mutated valid sequences ----------------------------------------------------------------

MUTATIONS = ("flip", "set", "truncate", "insert", "delete", "splice", "duplicate", "interesting")
# Built once: constructing strategies inside the composite would cost more than the fuzzing.
BASE_SEQUENCES = st.one_of(
    aqs.stream_sequences(flow_control=True, max_payload=24),
    aqs.datagram_sequences(max_payload=24),
)
SPLICE_FRAMES = aqs.frames(flow_control=True, max_payload=8)


@st.composite
def mutated_sequences(draw: st.DrawFn) -> bytes:
    """A valid stream or datagram sequence, encoded, then mutated one to four times."""
    data = bytearray(encode_frames(*draw(BASE_SEQUENCES)))
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(MUTATIONS))
        pos = draw(st.integers(0, len(data)))
        if op == "flip" and data:
            data[min(pos, len(data) - 1)] ^= 1 << draw(st.integers(0, 7))
        elif op == "set" and data:
            data[min(pos, len(data) - 1)] = draw(st.integers(0, 255))
        elif op == "truncate":
            del data[pos:]
        elif op == "insert":
            data[pos:pos] = draw(st.binary(min_size=1, max_size=4))
        elif op == "delete":
            del data[pos : pos + draw(st.integers(1, 8))]
        elif op == "splice":
            data[pos:pos] = encode_frame(draw(SPLICE_FRAMES))
        elif op == "duplicate":
            stop = draw(st.integers(pos, len(data)))
            data[stop:stop] = data[pos:stop]
        else:
            data[pos:pos] = draw(st.sampled_from(INTERESTING))
    return bytes(data)


@FUZZ
@given(mutated_sequences(), st.booleans())
def test_fuzz_mutated_sequences(data: bytes, flow_control: bool) -> None:
    """Mutated valid sequences: every decoder decodes or raises RemoteProtocolError, and the
    stream parser agrees with itself whole and byte by byte."""
    check_all(data, flow_control)


@pytest.mark.slow
@SLOW_FUZZ
@given(mutated_sequences(), st.booleans())
def test_fuzz_mutated_sequences_slow(data: bytes, flow_control: bool) -> None:
    """The same fuzz target with five times the examples (select with ``-m slow``)."""
    check_all(data, flow_control)


@pytest.mark.slow
@TARGETED_FUZZ
@given(mutated_sequences(), st.booleans())
def test_fuzz_mutated_sequences_targeted_slow(data: bytes, flow_control: bool) -> None:
    """The fuzz target steered by :func:`hypothesis.target` towards inputs that get deep
    into a sequence (many frames parsed) before they fail."""
    target(float(check_all(data, flow_control)), label="frames parsed")


@pytest.mark.slow
@settings(max_examples=10_000, deadline=None)
@given(st.binary(max_size=256), st.booleans())
def test_arbitrary_bytes_slow(data: bytes, flow_control: bool) -> None:
    check_all(data, flow_control)


# -- valid sequences stay valid ------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(aqs.stream_sequences(flow_control=True), st.booleans())
def test_valid_stream_sequences_pass_every_decoder_check(
    frames: list[Frame], flow_control: bool
) -> None:
    data = encode_frames(*frames)
    uses_tag_12 = any(isinstance(f, Dequeued) for f in frames)
    expected = "error" if uses_tag_12 and not flow_control else frames
    assert stream_whole(data, flow_control) == expected
    check_all(data, flow_control)
