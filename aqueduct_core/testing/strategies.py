"""Hypothesis strategies for Aqueduct wire values, frames and frame sequences (profile §1).

Every strategy draws values the encoder accepts, so ``encode_frame`` never raises on them and
``decode_frame`` gives back an equal frame. Frames are *syntactically* valid only: the codec
does not check contextual rules (direction, message numbers against the FINISH count, the
attachment CREATOR rule, the version string), so neither do these strategies, except where a
keyword argument asks for it.

Typical use::

    from hypothesis import given
    from aqueduct_core.testing import strategies as aqs

    @given(aqs.stream_sequences())
    def test_round_trip(frames): ...
"""

from __future__ import annotations

from hypothesis import strategies as st

from aqueduct_core.wire.chanid import MAX_INDEX, Side, make_chanid
from aqueduct_core.wire.frames import (
    DEFAULT_VERSION,
    MAX_VERSION_STRING,
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
    Version,
)
from aqueduct_core.wire.primitives import MAX_U64, Headers

__all__ = [
    "ack_nack_ranges",
    "ack_reliable_ranges",
    "attachments",
    "chanids",
    "datagram_sequences",
    "frames",
    "headers",
    "messages",
    "payloads",
    "prelude_frames",
    "routed_frames",
    "stream_sequences",
    "varints",
    "versions",
]

# Values where the varint length changes (2**(7k) - 1, 2**(7k)), plus the 9-byte boundaries
# of G1: 2**56 is the first 9-byte value and 2**63 has a 9th byte of 0x80.
_VARINT_EDGES = sorted(
    {0, 1, MAX_U64, MAX_U64 - 1, 1 << 63, (1 << 63) - 1}
    | {(1 << (7 * k)) - 1 for k in range(1, 9)}
    | {1 << (7 * k) for k in range(1, 9)}
)


def varints(min_value: int = 0, max_value: int = MAX_U64) -> st.SearchStrategy[int]:
    """Unsigned 64-bit integers, biased towards small values and the varint length edges."""
    if not 0 <= min_value <= max_value <= MAX_U64:
        raise ValueError(f"need 0 <= min_value <= max_value <= 2**64-1: {min_value}, {max_value}")
    edges = [v for v in _VARINT_EDGES if min_value <= v <= max_value]
    small = st.integers(min_value, min(max_value, min_value + 300))
    parts = [small, st.integers(min_value, max_value)]
    if edges:
        parts.append(st.sampled_from(edges))
    return st.one_of(*parts)


def headers(
    max_pairs: int = 4, max_key: int = 16, max_value: int = 32
) -> st.SearchStrategy[Headers]:
    """Header data: a multimap of byte keys to byte values. Keys repeat sometimes, since
    order and duplicates must survive a round trip (profile §1.1)."""
    keys = st.one_of(st.sampled_from([b"codec-1a2b3c", b"k", b""]), st.binary(max_size=max_key))
    pair = st.tuples(keys, st.binary(max_size=max_value))
    return st.lists(pair, max_size=max_pairs).map(tuple)


def chanids(
    creator: Side | None = None, sender: Side | None = None, oneshot: bool | None = None
) -> st.SearchStrategy[int]:
    """Channel ids (profile §1.1, G2). Fix ``creator``, ``sender`` or ``oneshot`` to draw from
    one part of the id space; the index is biased towards small values."""
    sides = st.sampled_from([Side.CLIENT, Side.SERVER])
    return st.builds(
        make_chanid,
        sides if creator is None else st.just(creator),
        sides if sender is None else st.just(sender),
        st.booleans() if oneshot is None else st.just(oneshot),
        varints(0, MAX_INDEX),
    )


def attachments(
    max_size: int = 3, creator: Side | None = None
) -> st.SearchStrategy[tuple[Attachment, ...]]:
    """MESSAGE.ATTACHMENTS: distinct chanids, each with channel headers. Pass ``creator`` (the
    frame's sender) to obey the CREATOR rule the engine checks (profile §1.4)."""
    one = st.builds(Attachment, chanids(creator=creator), headers(max_pairs=2))
    return st.lists(one, max_size=max_size, unique_by=lambda a: a.chanid).map(tuple)


def payloads(max_size: int = 256) -> st.SearchStrategy[bytes]:
    """MESSAGE payloads (kept small by default so sequences stay fast to parse)."""
    return st.binary(max_size=max_size)


def messages(max_payload: int = 256) -> st.SearchStrategy[Message]:
    """MESSAGE frames with headers, attachments and a payload."""
    return st.builds(
        Message,
        num=varints(),
        headers=headers(),
        attachments=attachments(),
        payload=payloads(max_payload),
    )


def versions() -> st.SearchStrategy[Version]:
    """VERSION frames: mostly our version string, sometimes another (the engine, not the
    codec, rejects another version string)."""
    other = st.binary(max_size=MAX_VERSION_STRING)
    return st.builds(Version, st.one_of(st.just(DEFAULT_VERSION), other))


def ack_reliable_ranges() -> st.SearchStrategy[tuple[int, ...]]:
    """ACK_RELIABLE ranges: gap, run, gap, run, ...; even and non-empty; only the first gap
    may be 0 (profile §1.3)."""
    first_gap = varints()
    pair = st.tuples(varints(min_value=1), varints(min_value=1))
    return st.builds(
        lambda gap, run, rest: (gap, run, *(v for p in rest for v in p)),
        first_gap,
        varints(min_value=1),
        st.lists(pair, max_size=4),
    )


def ack_nack_ranges() -> st.SearchStrategy[tuple[int, ...]]:
    """ACK_NACK_UNRELIABLE ranges: ack, nack, ack, ...; at least one; all non-zero except a
    leading 0 followed by more (a frame that starts with a nack, profile §1.3)."""
    runs = st.lists(varints(min_value=1), min_size=1, max_size=6)
    return st.builds(
        lambda lead, rest: (0, *rest) if lead else tuple(rest),
        st.booleans(),
        runs,
    )


def prelude_frames() -> st.SearchStrategy[Frame]:
    """VERSION, ACK_VERSION or CONNECTION_HEADERS."""
    return st.one_of(
        versions(),
        st.just(AckVersion()),
        st.builds(ConnectionHeaders, headers()),
    )


def routed_frames(flow_control: bool = False, max_payload: int = 256) -> st.SearchStrategy[Frame]:
    """Every frame that may follow ROUTE_TO; DEQUEUED only when ``flow_control``."""
    parts: list[st.SearchStrategy[Frame]] = [
        messages(max_payload),
        st.builds(SentUnreliable, varints()),
        st.builds(FinishSender, varints()),
        st.just(CancelSender()),
        st.builds(AckReliable, ack_reliable_ranges()),
        st.builds(AckNackUnreliable, ack_nack_ranges()),
        st.just(CloseReceiver()),
        st.just(ForgetChannel()),
    ]
    if flow_control:
        parts.append(st.builds(Dequeued, varints()))
    return st.one_of(*parts)


def frames(flow_control: bool = False, max_payload: int = 256) -> st.SearchStrategy[Frame]:
    """Any single frame, of every type (DEQUEUED only when ``flow_control``)."""
    return st.one_of(
        prelude_frames(),
        st.builds(RouteTo, chanids()),
        routed_frames(flow_control, max_payload),
    )


def stream_sequences(
    flow_control: bool = False, max_frames: int = 6, max_payload: int = 256
) -> st.SearchStrategy[list[Frame]]:
    """Grammatical stream frame sequences: ``prelude* [ROUTE_TO routed*]`` (profile §1.2).
    Possibly empty."""
    prelude = st.lists(prelude_frames(), max_size=3)
    routed = st.lists(routed_frames(flow_control, max_payload), max_size=max_frames)
    tail = st.one_of(
        st.just([]),
        st.builds(lambda r, rest: [RouteTo(r), *rest], chanids(), routed),
    )
    return st.builds(lambda p, t: [*p, *t], prelude, tail)


def datagram_sequences(
    max_frames: int = 3, max_payload: int = 256
) -> st.SearchStrategy[list[Frame]]:
    """Grammatical datagram frame sequences: ``VERSION* [ROUTE_TO MESSAGE*]``, the only
    frames legal in a datagram (profile §1.2). Possibly empty."""
    prelude = st.lists(versions(), max_size=2)
    tail = st.one_of(
        st.just([]),
        st.builds(
            lambda r, rest: [RouteTo(r), *rest],
            chanids(),
            st.lists(messages(max_payload), max_size=max_frames),
        ),
    )
    return st.builds(lambda p, t: [*p, *t], prelude, tail)
