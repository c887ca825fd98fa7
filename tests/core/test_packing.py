"""Packed token ids (meshd.core.packing): round trips, the dtype rule, every bad input refused
with ProtocolError only, and what packing saves on the wire."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshd.core.advert import Advert, ModelAdvert
from meshd.core.messages import MessageType
from meshd.core.packing import dtype_for, pack_ids, takes_packed, unpack_ids, vocab_bound
from meshd.core.wire import MAX_REQUEST_FRAME, decode_message, encode_message
from meshd.errors import ProtocolError


@pytest.mark.parametrize(("vocab", "dtype"), [(1, "u16"), (4096, "u16"), (65536, "u16"),
                                               (65537, "u32"), (151_936, "u32"), (1 << 32, "u32")])
def test_dtype_follows_the_vocabulary(vocab: int, dtype: str) -> None:
    assert dtype_for(vocab) == dtype


@given(st.lists(st.integers(0, 65535), min_size=1, max_size=300))
def test_u16_round_trip(ids: list[int]) -> None:
    dtype, data = pack_ids(ids, 65536)
    assert dtype == "u16" and len(data) == 2 * len(ids)
    assert unpack_ids(data, dtype, 65536) == ids


@given(st.lists(st.integers(0, (1 << 32) - 1), min_size=1, max_size=300))
def test_u32_round_trip(ids: list[int]) -> None:
    dtype, data = pack_ids(ids, 1 << 32)
    assert dtype == "u32" and len(data) == 4 * len(ids)
    assert unpack_ids(data, dtype, None) == ids


def test_little_endian() -> None:
    assert pack_ids([1, 258], 4096) == ("u16", b"\x01\x00\x02\x01")
    assert pack_ids([1], 100_000) == ("u32", b"\x01\x00\x00\x00")


def test_pack_refuses_ids_outside_the_vocabulary() -> None:
    with pytest.raises(ValueError, match="outside the vocabulary"):
        pack_ids([5, 4096], 4096)
    with pytest.raises(ValueError):
        pack_ids([-1], 4096)


def test_vocab_bound_covers_generated_ids_past_the_tokenizer() -> None:
    assert vocab_bound([1, 2], 4096) == 4096
    assert vocab_bound([70_000], 65_536) == 70_001
    assert vocab_bound([], 0) == 1


@pytest.mark.parametrize(("data", "dtype", "vocab", "says"), [
    (b"\x01\x00", "i16", 4096, "u16 or u32"),
    (b"\x01\x00", None, 4096, "u16 or u32"),
    ("\x01\x00", "u16", 4096, "binary"),
    (b"\x01\x00\x02", "u16", 4096, "whole number"),
    (b"\x01\x00\x00", "u32", 4096, "whole number"),
    (b"", "u16", 4096, "no token ids"),
    (b"\x00\x10", "u16", 4096, r"token id 4096, outside the vocabulary \[0, 4096\)"),
    (b"\xff\xff\xff\xff", "u32", 151_936, "outside the vocabulary"),
])
def test_unpack_refuses_bad_input(data: object, dtype: object, vocab: int, says: str) -> None:
    with pytest.raises(ProtocolError, match=says) as e:
        unpack_ids(data, dtype, vocab)
    assert e.value.code == "malformed"


@given(st.binary(max_size=64), st.sampled_from(["u16", "u32", "u8", ""]),
       st.one_of(st.none(), st.integers(1, 1 << 20)))
def test_unpack_raises_only_protocol_error(data: bytes, dtype: str, vocab: int | None) -> None:
    try:
        ids = unpack_ids(data, dtype, vocab)
    except ProtocolError:
        return
    assert ids and (vocab is None or max(ids) < vocab)


def _req(**prompt: object) -> bytes:
    return encode_message(MessageType.REQ, {"rid": "0123456789abcdef", "model": "tiny-en",
                                            "deadline_ms": 120_000, "hops": 1, **prompt})


def test_a_packed_req_decodes_and_is_smaller_than_a_list_of_ids() -> None:
    ids = [(i * 7919) % 4096 for i in range(1000)]  # ids of a 4,096-token vocabulary
    dtype, data = pack_ids(ids, 4096)
    packed = _req(prompt_ids=[], prompt_packed=data, prompt_dtype=dtype, tok="ab" * 32)
    listed = _req(prompt_ids=ids)
    msg = decode_message(packed, MAX_REQUEST_FRAME)
    assert unpack_ids(msg["prompt_packed"], msg["prompt_dtype"], 4096) == ids
    # a list costs 3 bytes for most such ids, packed 2; the tokenizer identity ~70 bytes once
    assert len(packed) < 0.75 * len(listed)


def test_only_nodes_advertising_a_tokenizer_get_packed_prompts() -> None:
    new = Advert(peer_id="p", name="n", seq=1, ts=0.0,
                 models=(ModelAdvert("m", 6, 0, 6, tokenizer="ab" * 32),))
    old = Advert(peer_id="q", name="o", seq=1, ts=0.0, models=(ModelAdvert("m", 6, 0, 6),))
    assert takes_packed(new, "m") and not takes_packed(new, "other")
    assert not takes_packed(old, "m") and not takes_packed(None, "m")
