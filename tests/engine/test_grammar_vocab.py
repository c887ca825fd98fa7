"""llguidance's view of a vocabulary from the tokens' bytes (meshd.engine.grammar_vocab).

The rules are pinned on small inputs; on the real vocabularies (SmolLM2's byte-level BPE and
Gemma 3's byte-fallback vocabulary from their GGUF files, and the tiny model's) the view must
equal the one llguidance builds from ``tokenizer.json`` itself: every token's bytes and
specialness, the tokenization of the whole corpus, and every mask along a constrained walk
whose forced bytes go through meshd's tokenize callback.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

import llguidance as llg
import numpy as np
import pytest

from meshd.engine.constrain import _build_grammar_tokenizer, schema_grammar
from meshd.engine.grammar_vocab import (
    BYTE_FALLBACK,
    BYTE_LEVEL,
    SPECIAL_MARKER,
    TokenSource,
    VocabKind,
    byte_level_table,
    token_bytes,
    token_source,
    vocab_kind,
)
from meshd.engine.manifest import TokenizerInfo, read_manifest
from meshd.engine.tokenizer import Tokenizer
from meshd.testing.gguf_corpus import load_corpus

from .test_gguf_vocab import installed

BYTE_LEVEL_DECODER = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                      "use_regex": True}
SPM_DECODER = {"type": "Sequence", "decoders": [
    {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
    {"type": "ByteFallback"}, {"type": "Fuse"}]}
SPM_NORMALIZER = {"type": "Sequence", "normalizers": [
    {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]}


# ---- the rules ------------------------------------------------------------------------------

def test_byte_level_table_is_a_bijection_onto_the_bytes() -> None:
    table = byte_level_table()
    assert sorted(table.values()) == list(range(256))
    assert table["Ġ"] == 0x20 and table["Ċ"] == 0x0A and table["a"] == ord("a")


@pytest.mark.parametrize("decoder, normalizer, pre, want", [
    (BYTE_LEVEL_DECODER, None, {"type": "ByteLevel"}, VocabKind(BYTE_LEVEL)),
    ({"type": "Sequence", "decoders": [BYTE_LEVEL_DECODER]}, None, None, VocabKind(BYTE_LEVEL)),
    (SPM_DECODER, SPM_NORMALIZER, None, VocabKind(BYTE_FALLBACK, "▁")),
    # both kinds: byte fallback wins, as in llguidance
    ({"type": "Sequence", "decoders": [BYTE_LEVEL_DECODER, {"type": "ByteFallback"}]}, None,
     None, VocabKind(BYTE_FALLBACK)),
    # a space before the text: llguidance would tokenize forced bytes without it
    (SPM_DECODER, {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "▁"},
                                                       SPM_NORMALIZER]}, None, None),
    (SPM_DECODER, None, {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first"},
     None),
    (SPM_DECODER, None, {"type": "Metaspace", "replacement": "▁"}, None),
    (SPM_DECODER, None, {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "never"},
     VocabKind(BYTE_FALLBACK, "▁")),
    ({"type": "WordPiece", "prefix": "##"}, None, None, None),  # neither kind
    (None, None, None, None),
])
def test_vocab_kind(decoder: Any, normalizer: Any, pre: Any, want: VocabKind | None) -> None:
    assert vocab_kind(decoder, normalizer, pre) == want


def test_token_bytes_byte_level() -> None:
    pieces = ["<|end|>", "Ġthe", "Ċ", "a", None, "\n\n", "<tool>"]
    added = {0: ("<|end|>", True), 5: ("\n\n", False), 6: ("<tool>", False)}
    tokens, special = token_bytes(pieces, added, VocabKind(BYTE_LEVEL))
    assert tokens == [bytes([SPECIAL_MARKER]) + b"<|end|>", b" the", b"\n", b"a", b"",
                      b"\n\n",  # outside the alphabet: the added token's own text
                      bytes([SPECIAL_MARKER]) + b"<tool>"]  # <...> is special, as llguidance
    assert special == [0, 6]


def test_token_bytes_byte_fallback() -> None:
    pieces = ["<eos>", "<0x0A>", "<0xE2>", "▁the", "é", "<0xZZ>"]
    tokens, special = token_bytes(pieces, {0: ("<eos>", True)}, VocabKind(BYTE_FALLBACK, "▁"))
    assert tokens == [bytes([SPECIAL_MARKER]) + b"<eos>", b"\n", b"\xe2", b" the",
                      "é".encode(), b"<0xZZ>"]
    assert special == [0]


# ---- the real vocabularies against llguidance's own view --------------------------------------

INFO = TokenizerInfo(file="tokenizer.json", sha256="", bos_token_id=None, eos_token_ids=(0,))


TINY = Path(str(resources.files("meshd") / "data" / "models" / "tiny-en"))


def tiny_tokenizer() -> Tokenizer:
    return Tokenizer(TINY / "tokenizer.json", read_manifest(TINY).tokenizer)


def real_tokenizer(name: str) -> Tokenizer:
    return tiny_tokenizer() if name == "tiny" else installed(name)[1]


@pytest.fixture(scope="module", params=["smollm2", "gemma3", "tiny"])
def views(request: pytest.FixtureRequest) -> tuple[Tokenizer, Any, Any, TokenSource]:
    """A vocabulary's meshd tokenizer, its view from bytes, its view from tokenizer.json, and
    the token source behind the first."""
    tok = real_tokenizer(request.param)
    eos = list(tok.eos_token_ids)
    source = token_source(tok.hf, eos[0], tok.bos_token_id)
    assert source is not None, "this vocabulary's bytes should be made here"
    ours = llg.LLTokenizer(llg.TokenizerWrapper(source), n_vocab=tok.vocab_size, eos_token=eos)
    theirs = llg.LLTokenizer(tok.to_json(), n_vocab=tok.vocab_size, eos_token=eos)
    return tok, ours, theirs, source


def test_every_token_has_llguidances_bytes(views: tuple[Tokenizer, Any, Any, TokenSource]
                                           ) -> None:
    tok, ours, theirs, _ = views
    n = tok.vocab_size
    assert ours.vocab_size == theirs.vocab_size == n
    wrong = [i for i in range(n) if ours.decode_bytes([i]) != theirs.decode_bytes([i])
             or ours.is_special_token(i) != theirs.is_special_token(i)]
    assert wrong == [], [(i, ours.decode_bytes([i]), theirs.decode_bytes([i])) for i in wrong[:5]]
    assert ours.eos_tokens == theirs.eos_tokens


def test_the_corpus_tokenizes_alike(views: tuple[Tokenizer, Any, Any, TokenSource]) -> None:
    _, ours, theirs, _ = views
    wrong = [s for s in load_corpus() if ours.tokenize_str(s) != theirs.tokenize_str(s)]
    assert wrong == []


SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string"}, "age": {"type": "integer"},
    "tags": {"type": "array", "items": {"type": "string"}},
    "kind": {"enum": ["customer", "supplier"]}}, "required": ["name", "age", "tags", "kind"]}
TARGET = ('{"name":"Ann O\'Neil, née Müller — 日本","age":42,'
          '"tags":["a b","\\n","x"],"kind":"supplier"}')


def mask(matcher: Any, vocab: int) -> np.ndarray:
    bits = np.zeros((vocab + 31) // 32, dtype=np.int32)
    matcher.unsafe_compute_mask_ptr(bits.ctypes.data, bits.nbytes)
    return np.unpackbits(bits.view(np.uint8), bitorder="little")[:vocab]


def test_masks_along_a_constrained_walk_are_llguidances(
        views: tuple[Tokenizer, Any, Any, TokenSource], monkeypatch: pytest.MonkeyPatch) -> None:
    """The walk takes, at each step, the longest allowed token that continues the target text;
    the enum and the keys are forced bytes, which llguidance tokenizes through the callback."""
    tok, ours, theirs, _ = views
    calls = []
    call = TokenSource.__call__
    monkeypatch.setattr(TokenSource, "__call__",
                        lambda self, data: calls.append(data) or call(self, data))
    grammar = schema_grammar(SCHEMA)
    a, b = llg.LLMatcher(ours, grammar), llg.LLMatcher(theirs, grammar)
    rest, steps = TARGET.encode(), 0
    pieces = [ours.decode_bytes([i]) for i in range(tok.vocab_size)]
    while rest:
        ma, mb = mask(a, tok.vocab_size), mask(b, tok.vocab_size)
        assert np.array_equal(ma, mb), f"masks differ after {steps} tokens"
        fits = [i for i in np.flatnonzero(ma) if pieces[i] and rest.startswith(pieces[i])]
        assert fits, f"no allowed token continues {rest[:20]!r}"
        t = max(fits, key=lambda i: len(pieces[i]))
        assert a.consume_token(t) and b.consume_token(t)
        rest, steps = rest[len(pieces[t]):], steps + 1
    ma, mb = mask(a, tok.vocab_size), mask(b, tok.vocab_size)
    assert np.array_equal(ma, mb) and ma[tok.eos_token_ids[0]]
    assert calls, "no forced bytes went through the tokenize callback"


def test_grammar_tokenizer_takes_the_bytes_route_and_drops_the_bytes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from meshd.engine import grammar_vocab

    made = []
    make = grammar_vocab.token_source
    monkeypatch.setattr(grammar_vocab, "token_source",
                        lambda *a: made.append(make(*a)) or made[-1])
    tok = tiny_tokenizer()
    view = _build_grammar_tokenizer(tok)
    assert len(made) == 1 and made[0] is not None
    assert made[0].tokens == []  # llguidance holds its own copy; ours is not kept
    assert view.decode_bytes(tok.encode("hello there", add_special_tokens=False)) == b"hello there"


def test_a_vocabulary_it_cannot_read_keeps_the_tokenizer_json_route(tmp_path: Path) -> None:
    """A normalizer that prepends a space: no token source, and the view still works."""
    data = json.loads((TINY / "tokenizer.json").read_text())
    data["normalizer"] = {"type": "Prepend", "prepend": "Ġ"}
    (tmp_path / "tokenizer.json").write_text(json.dumps(data))
    tok = Tokenizer(tmp_path / "tokenizer.json", INFO)
    assert token_source(tok.hf, 0, None) is None
    view = _build_grammar_tokenizer(tok)
    assert view.vocab_size == tok.vocab_size
    m = llg.LLMatcher(view, schema_grammar({"type": "integer"}))
    assert not m.is_error() and mask(m, tok.vocab_size).any()
