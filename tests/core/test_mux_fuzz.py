"""The h11 fuzz invariant for the TCP multiplexer: any input either parses or raises
:class:`MuxProtocolError` (with a close code, and CLOSE queued), never anything else, and the
parser's memory stays bounded whatever it is fed. Inputs: arbitrary bytes after a valid
SETTINGS, and valid frame sequences mutated by bit flips, truncation and splicing, fed in
arbitrary pieces. A second property checks that whatever a sender writes arrives intact and
in order per stream, however TCP splits it.
"""

from __future__ import annotations

import dataclasses
import itertools
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aqueduct_core.errors import CloseCode
from aqueduct_core.transport.mux import MuxConnection
from aqueduct_core.transport.mux_wire import (
    HEADER_SIZE,
    IDLE_TIMEOUT,
    FrameType,
    MuxProtocolError,
    MuxSettings,
    StreamData,
    encode_frame,
    encode_settings,
)

FUZZ = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# The fast suite runs each target with 400 examples (it had 1,500: 2.5 min for both at load
# 12); the slow copies below run 5,000.
SLOW_FUZZ = settings(FUZZ, max_examples=5000)
LIMITS = MuxSettings(
    max_frame_size=20000, max_streams=100, max_datagram=4000, initial_stream_credit=5000
)
PREFACE = encode_settings({1: 16384, 2: 1000, 3: 100, 4: 100})


def frames() -> st.SearchStrategy[bytes]:
    sid = st.sampled_from([2, 3, 6, 7, 10, 14, 18, 22, 26, 30, 34, 0, 1, 2**62 - 2])
    frame = st.one_of(
        st.builds(
            lambda s, fin, data: encode_frame(FrameType.STREAM, fin, struct.pack(">Q", s) + data),
            sid,
            st.integers(0, 1),
            st.binary(max_size=300),
        ),
        st.builds(
            lambda s, c: encode_frame(FrameType.RESET, 0, struct.pack(">QQ", s, c)),
            sid,
            st.integers(0, 9),
        ),
        st.builds(
            lambda s, c: encode_frame(FrameType.CREDIT, 0, struct.pack(">QQ", s, c)),
            sid,
            st.integers(0, 2**63),
        ),
        st.builds(lambda d: encode_frame(FrameType.DATAGRAM, 0, d), st.binary(max_size=200)),
        st.builds(
            lambda f, d: encode_frame(FrameType.PING, f, d),
            st.integers(0, 1),
            st.binary(min_size=8, max_size=8),
        ),
        st.builds(
            lambda d: encode_frame(FrameType.CLOSE, 0, struct.pack(">Q", 3) + d),
            st.binary(max_size=40),
        ),
        st.binary(min_size=1, max_size=20),
    )
    return st.lists(frame, max_size=12).map(b"".join)


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    data = bytearray(PREFACE + draw(frames()))
    for _ in range(draw(st.integers(0, 4))):
        if not data:
            break
        op = draw(st.sampled_from(["flip", "cut", "splice"]))
        i = draw(st.integers(0, len(data) - 1))
        if op == "flip":
            data[i] ^= 1 << draw(st.integers(0, 7))
        elif op == "cut":
            del data[i : i + draw(st.integers(1, 16))]
        else:
            data[i:i] = draw(st.binary(min_size=1, max_size=12))
    return bytes(data)


def check(data: bytes, cuts: list[int]) -> None:
    mux = MuxConnection(False, LIMITS)
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    try:
        for a, b in itertools.pairwise(points):
            buf = bytearray(data[a:b])
            for ev in mux.receive_data(buf, 0.0):
                if isinstance(ev, StreamData):
                    assert len(ev.data) <= LIMITS.max_frame_size
            # Bounded memory: one partial header or control body, the open streams.
            assert len(mux._acc) <= max(LIMITS.max_frame_size, HEADER_SIZE + 8)
            assert len(mux._recv) <= LIMITS.max_streams
            assert len(mux._credit_due) <= LIMITS.max_streams
            mux.data_to_send()
    except MuxProtocolError as exc:
        assert exc.code in (CloseCode.PROTOCOL_VIOLATION, CloseCode.LIMIT_VIOLATION)
        assert str(exc).startswith("mux: ")
        assert mux.closed
        out = b"".join(bytes(b) for b in mux.data_to_send())
        assert out[0] == FrameType.CLOSE
        assert mux.receive_data(b"more", 0.0) == []


@FUZZ
@given(st.binary(max_size=2000), st.lists(st.integers(0, 4000), max_size=8))
def test_arbitrary_bytes_parse_or_raise_the_protocol_error(data: bytes, cuts: list[int]) -> None:
    check(PREFACE + data, cuts)


@FUZZ
@given(mutated(), st.lists(st.integers(0, 4000), max_size=8))
def test_mutated_frames_parse_or_raise_the_protocol_error(data: bytes, cuts: list[int]) -> None:
    check(data, cuts)


@pytest.mark.slow
@SLOW_FUZZ
@given(st.binary(max_size=2000), st.lists(st.integers(0, 4000), max_size=8))
def test_arbitrary_bytes_parse_or_raise_the_protocol_error_slow(
    data: bytes, cuts: list[int]
) -> None:
    check(PREFACE + data, cuts)


@pytest.mark.slow
@SLOW_FUZZ
@given(mutated(), st.lists(st.integers(0, 4000), max_size=8))
def test_mutated_frames_parse_or_raise_the_protocol_error_slow(
    data: bytes, cuts: list[int]
) -> None:
    check(data, cuts)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from([2, 6, 10, 14, 18]), st.binary(max_size=3000), st.booleans()),
        max_size=25,
    ),
    st.lists(st.integers(1, 5000), min_size=1, max_size=20),
    st.integers(1024, 4096),
)
def test_every_stream_arrives_intact_however_tcp_splits_it(
    writes: list[tuple[int, bytes, bool]], cuts: list[int], chunk: int
) -> None:
    sender = MuxConnection(True, MuxSettings(chunk_size=chunk))
    receiver = MuxConnection(False, MuxSettings(initial_stream_credit=4096))
    receiver.receive_data(b"".join(bytes(b) for b in sender.data_to_send()), 0.0)
    sender.receive_data(b"".join(bytes(b) for b in receiver.data_to_send()), 0.0)
    # Three streams at once, so that a few writes make streams wait for a slot: below the
    # profile's minimum of 100, hence set past the checks, after the SETTINGS exchange.
    assert sender.peer is not None
    sender.peer = dataclasses.replace(sender.peer, max_streams=3)
    object.__setattr__(receiver.settings, "max_streams", 3)
    expected: dict[int, bytearray] = {}
    ended: set[int] = set()
    for sid, data, fin in writes:
        if sid in ended:
            continue
        sender.write(sid, data, fin)
        expected.setdefault(sid, bytearray()).extend(data)
        if fin:
            ended.add(sid)
    got: dict[int, bytearray] = {}
    fins: set[int] = set()
    for _ in range(200):
        out = b"".join(bytes(b) for b in sender.data_to_send(5000))
        if not out and not sender.has_data:
            break
        pos = 0
        for cut in [*cuts, len(out)]:
            piece = out[pos : pos + cut]
            pos += len(piece)
            for ev in receiver.receive_data(bytearray(piece), 0.0):
                if isinstance(ev, StreamData):
                    assert ev.stream_id not in fins
                    got.setdefault(ev.stream_id, bytearray()).extend(ev.data)
                    if ev.fin:
                        fins.add(ev.stream_id)
        sender.receive_data(b"".join(bytes(b) for b in receiver.data_to_send()), 0.0)
    # Streams that never ended may still wait for a slot (max 3 open): those that got one
    # arrived in full, in order; every stream that ended arrived with its FIN.
    assert fins == {sid for sid in ended if sid in got}
    for sid, data in got.items():
        assert expected[sid] == data
    assert IDLE_TIMEOUT == 6
