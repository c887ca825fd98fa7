"""Frame codec: round trips, caps, and 'only ProtocolError on any input'."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshd.core.messages import CONTROL_TYPES, REGISTRY, MessageType
from meshd.core.wire import (
    HEADER,
    MAX_CONTROL_FRAME,
    FrameDecoder,
    decode_message,
    encode_message,
    frame,
    pack,
)
from meshd.errors import ProtocolError


def test_round_trip_through_decoder_in_pieces() -> None:
    data = frame(MessageType.PING, {"n": 7}) + frame(MessageType.TOKENS, {"rid": "a", "ids": [1, 2]})
    d = FrameDecoder(1024)
    out = []
    for i in range(len(data)):  # one byte at a time
        d.feed(data[i : i + 1])
        out.extend(d.messages())
    assert [m["t"] for m in out] == [MessageType.PING, MessageType.TOKENS]
    assert out[1]["ids"] == [1, 2]
    assert d.pending_bytes == 0


def test_oversized_frame_is_refused_before_buffering() -> None:
    d = FrameDecoder(100)
    with pytest.raises(ProtocolError, match="exceeds"):
        d.feed(HEADER.pack(101))


@pytest.mark.parametrize(
    "body, match",
    [
        (pack([1, 2]), "map"),
        (pack({"x": 1}), "type"),
        (pack({"t": 9999}), "unknown message type"),
        (pack({"t": int(MessageType.PING)}), "lacks required field 'n'"),
        (pack({"t": int(MessageType.PING), "n": "one"}), "must be int"),
        (pack({"t": int(MessageType.TOKENS), "rid": "r", "ids": [1, "x"]}), "must be ints"),
        (b"\xc1", "undecodable"),
    ],
)
def test_schema_violations(body: bytes, match: str) -> None:
    with pytest.raises(ProtocolError, match=match):
        decode_message(body, 1024)


def test_allowed_types_per_protocol() -> None:
    body = encode_message(MessageType.REQ, {"rid": "r", "model": "m", "prompt_ids": [1],
                                            "deadline_ms": 1, "hops": 0})
    with pytest.raises(ProtocolError, match="not allowed"):
        decode_message(body, MAX_CONTROL_FRAME, CONTROL_TYPES)


def test_unknown_fields_are_ignored_for_forward_compatibility() -> None:
    body = pack({"t": int(MessageType.PING), "n": 1, "future_field": [1, 2, 3]})
    assert decode_message(body, 1024)["n"] == 1


def test_registry_ids_are_unique_and_named() -> None:
    assert len(REGISTRY) == len({s.name for s in REGISTRY.values()})
    assert all(REGISTRY[int(t)].name == t.name for t in MessageType)


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=300))
def test_any_bytes_raise_only_protocol_error(data: bytes) -> None:
    d = FrameDecoder(256)
    try:
        d.feed(data)
        list(d.messages())
    except ProtocolError:
        pass


@settings(max_examples=300, deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats() | st.text(max_size=8)
                    | st.binary(max_size=8),
                    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=4), c, max_size=4),
                    max_leaves=12),
       st.sampled_from(sorted(REGISTRY)))
def test_any_msgpack_value_raises_only_protocol_error(value: object, t: int) -> None:
    obj = {"t": t, "v": value, "rid": value, "n": value, "ids": value} if value is not None else value
    try:
        decode_message(pack(obj), 4096)
    except ProtocolError:
        pass
