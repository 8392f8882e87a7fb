"""The TCP multiplexer (``aqueduct_core.transport.mux``), sans-IO: two MuxConnections joined
in memory, bytes moved by hand. The wire format is ``docs/protocol-profile.md`` §7."""

from __future__ import annotations

import struct

import pytest

from aqueduct_core.errors import CloseCode
from aqueduct_core.transport.mux import MuxConnection
from aqueduct_core.transport.mux_wire import (
    FLAG_FIN,
    IDLE_TIMEOUT,
    ConnectionClosed,
    DatagramReceived,
    FrameType,
    MuxEvent,
    MuxProtocolError,
    MuxSettings,
    PeerReady,
    StreamData,
    StreamReset,
    encode_frame,
    encode_settings,
)


def wire(a: MuxConnection, max_bytes: int = 1 << 20) -> bytes:
    out = b""
    while True:
        bufs = a.data_to_send(max_bytes)
        if not bufs:
            return out
        out += b"".join(bytes(b) for b in bufs)


def feed(b: MuxConnection, data: bytes, now: float = 0.0, split: int = 0) -> list[MuxEvent]:
    """Deliver ``data`` to ``b`` (in pieces of ``split`` bytes if given), copying each piece
    out of the events as the caller's buffer would be reused."""
    events: list[MuxEvent] = []
    pieces = [data[i : i + split] for i in range(0, len(data), split)] if split else [data]
    for piece in pieces:
        buf = bytearray(piece)
        for ev in b.receive_data(buf, now):
            if isinstance(ev, StreamData):
                ev.data = bytes(ev.data)
            events.append(ev)
    return events


def pair(
    client: MuxSettings | None = None, server: MuxSettings | None = None, **kw: bool
) -> tuple[MuxConnection, MuxConnection]:
    c, s = MuxConnection(True, client, **kw), MuxConnection(False, server, **kw)
    assert isinstance(feed(s, wire(c))[0], PeerReady)
    assert isinstance(feed(c, wire(s))[0], PeerReady)
    return c, s


def streams(events: list[MuxEvent]) -> dict[int, tuple[bytes, bool]]:
    got: dict[int, tuple[bytearray, bool]] = {}
    for ev in events:
        if isinstance(ev, StreamData):
            data, fin = got.setdefault(ev.stream_id, (bytearray(), False))
            assert not fin, "data after FIN"
            data += ev.data
            got[ev.stream_id] = (data, ev.fin)
    return {sid: (bytes(d), fin) for sid, (d, fin) in got.items()}


def violation(conn: MuxConnection, data: bytes) -> MuxProtocolError:
    with pytest.raises(MuxProtocolError) as info:
        feed(conn, data)
    assert conn.closed
    close = wire(conn)
    assert close[0] == FrameType.CLOSE and struct.unpack(">Q", close[6:14])[0] == info.value.code
    return info.value


def test_golden_vector_from_the_profile() -> None:
    """The worked example of profile §7 (tests/core/test_tcp_profile.py sends it to a real
    server): our SETTINGS with the defaults, the client's three frames, the answer."""
    assert encode_settings({1: 1 << 20}) == bytes.fromhex("01 00 0000000a 0001 0000000000100000")
    s = MuxConnection(False)
    assert wire(s) == bytes.fromhex(
        "01 00 00000032  0001 0000000000100000  0002 0000000001000000  0003 0000000000002710"
        "0004 0000000000010000  0005 0000000000007530"
    )
    hello = bytes.fromhex("ef505fa6600f408e 4151554544554354 0b 302e302e302d4146544552  02 00")
    data = bytes.fromhex(
        "01 00 0000000a 0001 0000000000100000"
        "02 01 00000026 0000000000000002" + hello.hex() + "06 00 00000008 0102030405060708"
    )
    events = feed(s, data)
    assert isinstance(events[0], PeerReady) and events[0].settings.max_frame_size == 1 << 20
    assert events[0].settings.max_datagram == 0  # absent: no datagrams
    assert streams(events) == {2: (hello, True)}
    assert wire(s) == bytes.fromhex("06 01 00000008 0102030405060708")


@pytest.mark.parametrize("split", [0, 1, 7, 4096])
def test_streams_fin_reset_and_datagrams_round_trip(split: int) -> None:
    c, s = pair(MuxSettings(chunk_size=4096))
    big = bytes(range(256)) * 200  # several chunks
    c.write(2, big[:30_000])
    c.write(2, memoryview(big)[30_000:], fin=True)
    c.write(6, b"small")
    c.write(10, b"", fin=True)
    assert c.send_datagram(b"dgram")
    c.write(14, b"doomed")
    c.reset(14, 7)
    events = feed(s, wire(c), split=split)
    assert streams(events) == {
        2: (big, True),
        6: (b"small", False),
        10: (b"", True),
        14: (b"doomed", False),
    }
    assert [e.data for e in events if isinstance(e, DatagramReceived)] == [b"dgram"]
    assert [(e.stream_id, e.code) for e in events if isinstance(e, StreamReset)] == [(14, 7)]
    # The server answers on its own streams (3 mod 4).
    s.write(3, b"back", fin=True)
    assert streams(feed(c, wire(s))) == {3: (b"back", True)}


def test_large_writes_interleave_by_chunk() -> None:
    c, s = pair(MuxSettings(chunk_size=65536))
    c.write(2, b"a" * 400_000)
    c.write(6, b"b" * 400_000)
    order = [e.stream_id for e in feed(s, wire(c)) if isinstance(e, StreamData)]
    # After both opening frames, the two streams alternate: neither waits for the other.
    assert order[:6] == [2, 6, 2, 6, 2, 6]


def test_a_stream_without_credit_never_holds_back_another() -> None:
    c, s = pair(server=MuxSettings(initial_stream_credit=1000), auto_credit=False)
    c.write(2, b"x" * 5000)
    c.write(6, b"y" * 800)
    got = streams(feed(s, wire(c)))
    assert got == {2: (b"x" * 1000, False), 6: (b"y" * 800, False)}
    c.write(6, b"z" * 100)  # stream 6 still has credit: it flows while 2 is stalled
    assert streams(feed(s, wire(c))) == {6: (b"z" * 100, False)}
    assert c.buffered == 4000
    s.grant(2, 4000)
    feed(c, wire(s))
    assert streams(feed(s, wire(c))) == {2: (b"x" * 4000, False)}
    assert c.buffered == 0


def test_auto_credit_keeps_a_long_stream_flowing() -> None:
    c, s = pair(server=MuxSettings(initial_stream_credit=65536))
    total = 0
    for _ in range(20):
        c.write(2, b"q" * 50_000)
        total += len(streams(feed(s, wire(c))).get(2, (b"", False))[0])
        feed(c, wire(s))  # the CREDIT frames
    total += len(streams(feed(s, wire(c))).get(2, (b"", False))[0])
    assert total == 1_000_000


def test_credit_violation_closes_with_limit_violation() -> None:
    _, s = pair(server=MuxSettings(initial_stream_credit=100))
    frame = struct.pack(">BBIQ", FrameType.STREAM, 0, 8 + 101, 2) + b"x" * 101
    exc = violation(s, frame)
    assert exc.code == CloseCode.LIMIT_VIOLATION and "credit" in str(exc)


@pytest.mark.parametrize(
    ("frame", "code", "words"),
    [
        (encode_frame(0x7F, 0, b""), CloseCode.PROTOCOL_VIOLATION, "unknown frame type"),
        (encode_frame(FrameType.STREAM, 0x02, bytes(8)), CloseCode.PROTOCOL_VIOLATION, "flags"),
        (encode_frame(FrameType.STREAM, 0, bytes(4)), CloseCode.PROTOCOL_VIOLATION, "shorter"),
        (encode_frame(FrameType.PING, 0, bytes(7)), CloseCode.PROTOCOL_VIOLATION, "PING"),
        (encode_frame(FrameType.RESET, 0, bytes(15)), CloseCode.PROTOCOL_VIOLATION, "RESET"),
        (encode_frame(FrameType.CLOSE, 0, bytes(3)), CloseCode.PROTOCOL_VIOLATION, "CLOSE"),
        (encode_settings({}), CloseCode.PROTOCOL_VIOLATION, "second SETTINGS"),
        (
            encode_frame(FrameType.STREAM, 0, struct.pack(">Q", 3)),
            CloseCode.PROTOCOL_VIOLATION,
            "not the peer's",
        ),
        (
            encode_frame(FrameType.STREAM, 0, struct.pack(">Q", 4)),
            CloseCode.PROTOCOL_VIOLATION,
            "not the peer's",
        ),
        (
            encode_frame(FrameType.CREDIT, 0, struct.pack(">QQ", 7, 10)),
            CloseCode.PROTOCOL_VIOLATION,
            "never opened",
        ),
        (
            struct.pack(">BBI", FrameType.STREAM, 0, (1 << 20) + 1),
            CloseCode.LIMIT_VIOLATION,
            "limit",
        ),
        (encode_frame(FrameType.DATAGRAM, 0, bytes(65537)), CloseCode.LIMIT_VIOLATION, "DATAGRAM"),
    ],
)
def test_malformed_frames_close_with_a_clear_code(frame: bytes, code: int, words: str) -> None:
    _, s = pair()
    exc = violation(s, frame)
    assert exc.code == code and words in str(exc)


def test_frames_before_settings_and_bad_settings() -> None:
    exc = violation(MuxConnection(False), encode_frame(FrameType.PING, 0, bytes(8)))
    assert "before SETTINGS" in str(exc)
    # Only CLOSE may come first: it refuses a connection with a reason.
    refused = feed(MuxConnection(False), encode_frame(FrameType.CLOSE, 0, bytes(7) + b"\x01no"))
    assert refused == [ConnectionClosed(1, "no", True)]
    exc = violation(MuxConnection(False), encode_settings({1: 100}))
    assert "MAX_FRAME_SIZE" in str(exc)
    twice = encode_frame(FrameType.SETTINGS, 0, struct.pack(">HQHQ", 2, 5, 2, 5))
    assert "twice" in str(violation(MuxConnection(False), twice))
    assert "too large" in str(
        violation(MuxConnection(False), encode_settings(dict.fromkeys(range(100, 165), 1)))
    )
    # Unknown settings are ignored.
    assert isinstance(feed(MuxConnection(False), encode_settings({0x99: 1}))[0], PeerReady)


def test_data_on_an_ended_stream_is_a_violation() -> None:
    c, s = pair()
    c.write(2, b"a", fin=True)
    c.write(6, b"b")
    feed(s, wire(c))
    exc = violation(s, encode_frame(FrameType.STREAM, 0, struct.pack(">Q", 2) + b"late"))
    assert "already ended" in str(exc)


def test_max_streams_receiver_enforces_and_sender_waits_in_order() -> None:
    _, s = pair(server=MuxSettings(max_streams=100))
    frames = b"".join(
        encode_frame(FrameType.STREAM, 0, struct.pack(">Q", 2 + 4 * i)) for i in range(101)
    )
    exc = violation(s, frames)
    assert exc.code == CloseCode.LIMIT_VIOLATION and "more than 100 streams" in str(exc)

    c, s = pair(server=MuxSettings(max_streams=100))
    sids = [2 + 4 * i for i in range(102)]
    for sid in sids:
        c.write(sid, b"m%d" % sid, fin=sid == 2)
    assert list(streams(feed(s, wire(c)))) == sids[:101]  # 2 ended: 101 opened, one waits
    c.reset(6)
    assert list(streams(feed(s, wire(c)))) == [sids[101]]


def test_max_streams_below_the_minimum_is_refused() -> None:
    """Profile §7: MAX_STREAMS is at least 100 (Aqueduct keeps a stream per live channel
    open); a peer announcing less is refused at its SETTINGS, not stalled later."""
    exc = violation(MuxConnection(False), encode_settings({3: 99}))
    assert exc.code == CloseCode.PROTOCOL_VIOLATION and "MAX_STREAMS 99 not in [100" in str(exc)
    assert isinstance(feed(MuxConnection(False), encode_settings({3: 100}))[0], PeerReady)
    with pytest.raises(ValueError, match="at least 100"):
        MuxSettings(max_streams=99)


def test_writes_after_fin_or_reset_are_dropped_like_quic() -> None:
    c, s = pair()
    c.write(2, b"x", fin=True)
    c.write(6, b"y")
    c.reset(6)
    feed(s, wire(c))
    c.write(2, b"late")
    c.write(6, b"late")
    assert wire(c) == b""


def test_datagram_queue_is_bounded_and_drops_the_oldest() -> None:
    c, s = pair(MuxSettings(datagram_queue=1000), MuxSettings(max_datagram=600))
    for i in range(5):
        assert c.send_datagram(bytes([i]) * 300)
    assert not c.send_datagram(b"z" * 601)  # larger than the peer accepts
    assert c.buffered == 900 and c.datagrams_dropped == 3
    got = [e.data[0] for e in feed(s, wire(c)) if isinstance(e, DatagramReceived)]
    assert got == [2, 3, 4]


def test_ping_pong_and_idle_timeouts() -> None:
    cfg = MuxSettings(idle_timeout=3.0, ping_interval=0.5)
    c, s = pair(cfg, cfg)
    assert c.next_timer() == 0.5
    assert c.handle_timer(0.5) == []
    feed(s, wire(c), now=0.6)
    feed(c, wire(s), now=0.7)  # the pong
    assert c.next_timer() == pytest.approx(1.0)  # next PING, nothing outstanding
    # A peer that stops answering (it stopped reading) is closed after the idle timeout,
    # even while its bytes keep arriving.
    c.handle_timer(1.0)
    wire(c)
    for t in (1.5, 2.5, 3.5):
        feed(c, encode_frame(FrameType.DATAGRAM, 0, b"."), now=t)
    assert c.next_timer() == pytest.approx(4.0)
    [closed] = c.handle_timer(4.0)
    assert isinstance(closed, ConnectionClosed) and closed.code == IDLE_TIMEOUT
    assert "unanswered" in closed.reason and c.closed
    events = feed(s, wire(c))
    assert events == [ConnectionClosed(IDLE_TIMEOUT, closed.reason, True)]
    # Nothing at all from the peer:
    c2, _ = pair(cfg, cfg)
    [closed] = c2.handle_timer(3.0)
    assert "nothing received" in closed.reason


def test_idle_timeout_is_the_smaller_of_both_sides() -> None:
    c, _ = pair(MuxSettings(idle_timeout=30.0), MuxSettings(idle_timeout=2.0))
    [closed] = c.handle_timer(2.0)
    assert closed.code == IDLE_TIMEOUT


def test_close_discards_queued_data_and_carries_code_and_reason() -> None:
    c, s = pair()
    c.write(2, b"never sent" * 100)
    c.close(5, "server error: ValueError")
    assert c.buffered == 0
    events = feed(s, wire(c))
    assert events == [ConnectionClosed(5, "server error: ValueError", True)]
    assert s.closed and s.receive_data(b"anything", 0.0) == []
    c2, _ = pair()
    c2.close(0, "é" * 2000)  # truncated to 1024 bytes without splitting a character
    body = wire(c2)
    assert len(body) <= 6 + 8 + 1024 and body[14:].decode() == "é" * 512


def test_fin_frame_needs_no_credit() -> None:
    c, s = pair(server=MuxSettings(initial_stream_credit=10), auto_credit=False)
    c.write(2, b"0123456789")
    c.write(2, b"", fin=True)
    assert streams(feed(s, wire(c))) == {2: (b"0123456789", True)}
    assert FLAG_FIN == 1


@pytest.mark.parametrize(
    "bad",
    [
        {"max_frame_size": 1000},
        {"max_frame_size": 1 << 24},
        {"max_datagram": 2 << 20},
        {"initial_stream_credit": 0},
        {"max_streams": 0},
        {"chunk_size": 10},
        {"idle_timeout": 0},
    ],
)
def test_settings_out_of_range_are_refused(bad: dict[str, int]) -> None:
    with pytest.raises(ValueError):
        MuxSettings(**bad)  # type: ignore[arg-type]


def test_settings_must_arrive_by_the_deadline() -> None:
    """The handshake deadline (profile §7): no SETTINGS by then closes with code 4; once
    they arrived, the deadline is gone from the timers."""
    mux = MuxConnection(False, now=0.0, settings_deadline=5.0, handshake_timeout=5.0)
    assert mux.next_timer() == 5.0
    assert mux.handle_timer(4.9) == []
    [closed] = mux.handle_timer(5.0)
    assert closed.code == CloseCode.HANDSHAKE_TIMEOUT and "(5 s)" in closed.reason
    close = wire(mux)
    assert close[0] == FrameType.CLOSE and struct.unpack(">Q", close[6:14])[0] == 4
    ready = MuxConnection(False, now=0.0, settings_deadline=5.0)
    feed(ready, encode_settings({}))
    assert ready.next_timer() == pytest.approx(10.0)  # the first PING, not the deadline


def test_a_close_reason_is_read_up_to_1024_bytes_and_mended() -> None:
    s = MuxConnection(False)
    reason = b"\xff" + "é".encode() * 700
    [closed] = feed(s, encode_frame(FrameType.CLOSE, 0, struct.pack(">Q", 4711) + reason))
    assert closed == ConnectionClosed(4711, "\ufffd" + "é" * 511 + "\ufffd", True)
    assert wire(s) == b""  # never answered


def test_no_datagram_frame_when_max_datagram_is_0() -> None:
    _, s = pair(server=MuxSettings(max_datagram=0))
    exc = violation(s, encode_frame(FrameType.DATAGRAM, 0, b""))
    assert exc.code == CloseCode.LIMIT_VIOLATION


def test_open_streams_keep_flowing_while_another_waits_for_a_slot() -> None:
    """At the peer's MAX_STREAMS a new stream waits; a write to a stream already open must
    still go out (it stayed queued: with every slot taken, nothing ever ended, and the
    connection stalled for good)."""
    c, s = pair(server=MuxSettings(max_streams=100))
    sids = [2 + 4 * i for i in range(101)]
    for sid in sids:
        c.write(sid, b"")
    assert list(streams(feed(s, wire(c)))) == sids[:100]  # the 101st waits
    c.write(2, b"more", fin=True)
    assert streams(feed(s, wire(c))) == {2: (b"more", True), sids[100]: (b"", False)}
