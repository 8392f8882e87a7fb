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
    return _routed(messages(max_payload), varints(), flow_control)


def _routed(
    message: st.SearchStrategy[Message],
    counts: st.SearchStrategy[int],
    flow_control: bool,
    message_weight: int = 1,
) -> st.SearchStrategy[Frame]:
    """The routed frame types: MESSAGEs from ``message`` (listed ``message_weight`` times),
    count fields from ``counts``."""
    parts: list[st.SearchStrategy[Frame]] = [
        *[message] * message_weight,
        st.builds(SentUnreliable, counts),
        st.builds(FinishSender, counts),
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


# -- hostile input for a server (issue 13) -------------------------------------------------

__all__ += [
    "claimed_numbers",
    "client_chanids",
    "hostile_messages",
    "hostile_routed_frames",
    "splits",
    "unfinished_messages",
]


def claimed_numbers(gap: int | None = None) -> st.SearchStrategy[int]:
    """MESSAGE_NUM, SENT_UNRELIABLE and FINISH_SENDER values a hostile peer claims: small
    ones, ones on either side of the receiver's allowed ``gap`` (default: the engine's
    ``max_message_gap``, profile G31), and ones far beyond it up to 2**64-1. Work or memory
    proportional to any of these is a bug."""
    if gap is None:
        from aqueduct_core.engine.config import EngineConfig

        gap = EngineConfig().max_message_gap
    return st.one_of(
        st.integers(0, 8),
        st.integers(max(0, gap - 2), gap + 1),
        st.sampled_from([1 << 32, 1 << 40, 1 << 62, 1 << 63, MAX_U64 - 1, MAX_U64]),
        varints(),
    )


def client_chanids(sender: Side | None = None) -> st.SearchStrategy[int]:
    """Chanids a client routes frames to on a server: mostly the entrypoint and channels the
    client created (small indices, so they collide and repeat); now and then a
    server-created channel the server never allocated. ``sender``: only channels whose
    sender that side holds (``Side.CLIENT`` for MESSAGE and the other sender frames)."""
    senders = [Side.CLIENT, Side.SERVER] if sender is None else [sender]
    # Weights by repetition: one_of and sampled_from pick their options evenly.
    creators = [Side.CLIENT] * 12 + [Side.SERVER]
    made = st.builds(
        make_chanid,
        st.sampled_from(creators),
        st.sampled_from(senders),
        st.sampled_from([False, False, False, True]),
        st.integers(0, 8),
    )
    if sender is Side.SERVER:
        return made
    return st.one_of(st.just(0), made)


def hostile_messages(max_payload: int = 64) -> st.SearchStrategy[Message]:
    """MESSAGE frames with claimed numbers and client-created attachments (small indices,
    so they collide with routed channels and with each other across messages)."""
    one = st.builds(
        Attachment,
        st.builds(
            make_chanid,
            st.just(Side.CLIENT),
            st.sampled_from([Side.CLIENT, Side.SERVER]),
            st.booleans(),
            st.integers(0, 8),
        ),
        st.just(()),
    )
    return st.builds(
        Message,
        num=claimed_numbers(),
        headers=st.one_of(st.just(()), headers(max_pairs=1, max_key=4, max_value=4)),
        attachments=st.lists(one, max_size=3, unique_by=lambda a: a.chanid).map(tuple),
        payload=st.binary(max_size=max_payload),
    )


def hostile_routed_frames(flow_control: bool = False) -> st.SearchStrategy[Frame]:
    """Frames a client may send after ROUTE_TO, with claimed numbers in every count field."""
    # MESSAGE listed twice: the frames that matter most are drawn more often.
    return _routed(hostile_messages(), claimed_numbers(), flow_control, message_weight=2)


def unfinished_messages() -> st.SearchStrategy[bytes]:
    """The bytes of a MESSAGE that stops inside its payload: the head announces more payload
    (up to far more than any limit) than follows."""

    from aqueduct_core.wire.frames import encode_frame
    from aqueduct_core.wire.primitives import encode_varint

    def build(num: int, announced: int, sent: int) -> bytes:
        head = encode_frame(Message(num))
        # An empty MESSAGE ends with its payload length, a single 0 byte: announce ours.
        return head[:-1] + encode_varint(announced) + b"\xa5" * min(sent, announced - 1)

    return st.builds(
        build,
        claimed_numbers(),
        st.one_of(st.integers(1, 4096), st.sampled_from([1 << 20, 64 << 20, 1 << 30, MAX_U64])),
        st.integers(0, 512),
    )


def splits(data: bytes, max_pieces: int = 8) -> st.SearchStrategy[list[bytes]]:
    """``data`` cut into consecutive pieces at arbitrary offsets (empty pieces allowed), as a
    QUIC stream may deliver it."""
    cuts = st.lists(st.integers(0, len(data)), max_size=max_pieces - 1).map(sorted)
    return cuts.map(lambda c: [data[a:b] for a, b in zip([0, *c], [*c, len(data)], strict=True)])
