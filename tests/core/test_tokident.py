"""Tokenizer identities and bundles (meshd.core.tokident): what the identity covers, tampered
bundles refused, chunks put back together, the advert field."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshd.core.advert import Advert, ModelAdvert, decode_advert
from meshd.core.tokident import (
    CHUNK_BYTES,
    Assembler,
    BundleMismatch,
    TokenizerMeta,
    chunks,
    decode_bundle,
    encode_bundle,
    is_identity,
    names,
    short_id,
    tokenizer_identity,
)
from meshd.core.wire import pack
from meshd.errors import ProtocolError

JSON = b'{"version": "1.0", "model": {"type": "BPE"}}'
META = TokenizerMeta(bos_token_id=0, eos_token_ids=(1,), bos_token="<s>", eos_token="</s>",
                     chat_template="{{ bos_token }}{% for m in messages %}{{ m['content'] }}{% endfor %}")


def test_identity_is_hex_and_stable() -> None:
    ident = tokenizer_identity(JSON, META)
    assert is_identity(ident) and ident == tokenizer_identity(JSON, META)
    assert not is_identity(ident.upper()) and not is_identity(ident[:-1]) and not is_identity(None)


@pytest.mark.parametrize("change", [
    {"bos_token_id": 2}, {"bos_token_id": None}, {"eos_token_ids": (1, 2)}, {"bos_token": "<bos>"},
    {"eos_token": None}, {"chat_template": None}, {"chat_template": "{{ messages }}"},
])
def test_identity_covers_everything_that_decides_the_ids(change: dict[str, object]) -> None:
    assert tokenizer_identity(JSON, replace(META, **change)) != tokenizer_identity(JSON, META)  # type: ignore[arg-type]


def test_identity_covers_the_tokenizer_file() -> None:
    assert tokenizer_identity(JSON + b" ", META) != tokenizer_identity(JSON, META)


def test_bundle_round_trip() -> None:
    ident = tokenizer_identity(JSON, META)
    assert decode_bundle(encode_bundle(JSON, META), ident) == (JSON, META)


def test_a_tampered_bundle_is_refused() -> None:
    ident = tokenizer_identity(JSON, META)
    bad_json = encode_bundle(JSON.replace(b"BPE", b"WPE"), META)
    bad_meta = encode_bundle(JSON, replace(META, chat_template="{{ 'pwned' }}"))
    for bundle in (bad_json, bad_meta):
        with pytest.raises(BundleMismatch, match="hash mismatch") as e:
            decode_bundle(bundle, ident)
        assert e.value.code == "malformed"


@pytest.mark.parametrize(("bundle", "says"), [
    (pack([1]), "version 1"),
    (pack({"v": 2, "json": JSON, "meta": META.as_list()}), "version 1"),
    (pack({"v": 1, "json": "text", "meta": META.as_list()}), "binary"),
    (pack({"v": 1, "json": JSON, "meta": [0, [1]]}), "5 values"),
    (pack({"v": 1, "json": JSON, "meta": [True, [1], None, None, None]}), "bos_token_id"),
    (pack({"v": 1, "json": JSON, "meta": [0, ["1"], None, None, None]}), "eos_token_ids"),
    (pack({"v": 1, "json": JSON, "meta": [0, [1], 5, None, None]}), "bos_token"),
    (b"\xc1", "undecodable"),
])
def test_malformed_bundles(bundle: bytes, says: str) -> None:
    with pytest.raises(ProtocolError, match=says):
        decode_bundle(bundle, tokenizer_identity(JSON, META))


@given(st.binary(max_size=200))
def test_decode_bundle_raises_only_protocol_error(data: bytes) -> None:
    with pytest.raises(ProtocolError):
        decode_bundle(data, "0" * 64)


@pytest.mark.parametrize("size", [1, CHUNK_BYTES - 1, CHUNK_BYTES, CHUNK_BYTES + 1, 3 * CHUNK_BYTES + 5])
def test_chunks_reassemble(size: int) -> None:
    bundle = bytes(i % 251 for i in range(size))
    a = Assembler()
    parts = list(chunks(bundle))
    assert all(len(d) <= CHUNK_BYTES for _, d in parts)
    results = [a.feed(off, size, d) for off, d in parts]
    assert results[:-1] == [None] * (len(parts) - 1) and results[-1] == bundle


@pytest.mark.parametrize(("feeds", "says"), [
    ([(0, 10, b"abc"), (4, 10, b"d")], "expected 3"),
    ([(0, 10, b"abc"), (3, 11, b"d")], "total changed"),
    ([(0, 3, b"abcd")], "more bytes"),
    ([(0, 0, b"")], "outside"),
    ([(0, 1 << 40, b"a")], "outside"),
])
def test_assembler_refuses_bad_chunks(feeds: list[tuple[int, int, bytes]], says: str) -> None:
    a = Assembler()
    with pytest.raises(ProtocolError, match=says):
        for off, total, data in feeds:
            a.feed(off, total, data)


def test_adverts_carry_the_identity_and_older_adverts_decode() -> None:
    ident = tokenizer_identity(JSON, META)
    adv = Advert(peer_id="p", name="n", seq=1, ts=1.0,
                 models=(ModelAdvert("tiny-en", 6, 0, 6, context_length=256, tokenizer=ident),))
    body = adv.to_dict()
    assert body["models"][0]["tok"] == ident
    assert decode_advert(adv.encode()).models[0].tokenizer == ident
    del body["models"][0]["tok"]  # an advert from an older node
    assert decode_advert(pack(body)).models[0].tokenizer == ""
    body["models"][0]["tok"] = 7
    with pytest.raises(ProtocolError, match="tok"):
        decode_advert(pack(body))


def test_a_request_names_a_tokenizer_by_a_prefix_of_its_identity() -> None:
    ident = tokenizer_identity(JSON, META)
    assert short_id(ident) == ident[:16] and names(short_id(ident), ident) and names(ident, ident)
    assert not names("0" * 16 if not ident.startswith("0" * 16) else "1" * 16, ident)
    for bad in ("", "abc", ident[:15], ident.upper()[:16], ident + "0", 7):
        with pytest.raises(ProtocolError, match="16 to 64"):
            names(bad, ident)
