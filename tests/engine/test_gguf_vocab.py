"""GGUF vocabularies as tokenizer.json (meshd.engine.gguf_vocab, gguf_pretok, gguf_meta).

Tiny synthetic vocabularies pin the rules: merge order, pre-tokenizer splits, special tokens,
byte fallback, BOS/EOS, the chat template fallback, refusals. Where the real GGUF files are
installed, the whole corpus (tests/data/tokenizer_corpus.txt) must encode to the ids llama.cpp
gives (tests/data/tokenizer_golden_*.json, written by scripts/gguf_tokenizer_golden.py); where
llama-tokenize is built too, a seeded sample is also checked against it live.
"""

from __future__ import annotations

import hashlib
import heapq
import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer as HfTokenizer

from meshd.engine.gguf_meta import parse_metadata, read_gguf_metadata
from meshd.engine.gguf_vocab import (
    BYTE,
    CONTROL,
    NORMAL,
    UNKNOWN,
    USER_DEFINED,
    tokenizer_from_gguf,
)
from meshd.engine.tokenizer import Tokenizer
from meshd.errors import ModelError
from meshd.testing.gguf_corpus import (
    CORPUS,
    GGUF_FILES,
    REPO,
    find_gguf,
    llama_tokenize,
    llama_tokenize_bin,
    load_corpus,
)


def hf(fields: dict[str, Any]) -> HfTokenizer:
    return HfTokenizer.from_str(tokenizer_from_gguf(fields).tokenizer_json)


# ---- byte-level BPE ('gpt2') -------------------------------------------------------------

def bpe_fields(**over: Any) -> dict[str, Any]:
    tokens = ["<|end|>", "<|start|>", "a", "b", "c", "Ġ", "Ċ", "1", "2", "'", "s",
              "ab", "abc", "Ġa", "12", "'s"]
    fields = {
        "general.architecture": "llama",
        "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "smollm",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": [CONTROL, CONTROL] + [NORMAL] * (len(tokens) - 2),
        "tokenizer.ggml.merges": ["a b", "ab c", "Ġ a", "1 2", "' s"],
        "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 0,
        "tokenizer.ggml.add_bos_token": False,
        "tokenizer.chat_template": "{% for m in messages %}{{ m['content'] }}{% endfor %}",
    }
    fields.update(over)
    return fields


def ids_of(fields: dict[str, Any], *texts: str) -> list[int]:
    tokens = fields["tokenizer.ggml.tokens"]
    return [tokens.index(t) for t in texts]


@pytest.mark.parametrize("pre, text, pieces", [
    # merges by rank: "a b" (0) before "Ġ a" (2), so " ab" is Ġ + ab, not Ġa + b
    ("smollm", "abc ab", ["abc", "Ġ", "ab"]),
    ("smollm", "12", ["1", "2"]),  # smollm splits every digit first
    ("gpt-2", "12", ["12"]),
    ("smollm", "a's", ["a", "'s"]),  # the contraction is a piece of its own
    ("smollm", "a\nb", ["a", "Ċ", "b"]),
    ("smollm", "a<|end|>b", ["a", "<|end|>", "b"]),  # a control token is one id, anywhere
    ("smollm", "<|start|><|end|>", ["<|start|>", "<|end|>"]),
])
def test_bpe_encodes_as_llama_cpp_does(pre: str, text: str, pieces: list[str]) -> None:
    fields = bpe_fields(**{"tokenizer.ggml.pre": pre})
    tok = hf(fields)
    assert tok.encode(text).ids == ids_of(fields, *pieces)
    assert tok.decode(tok.encode(text).ids, skip_special_tokens=False) == text


def test_bpe_metadata_becomes_tokenizer_info() -> None:
    got = tokenizer_from_gguf(bpe_fields())
    assert (got.model, got.pre, got.vocab_size) == ("gpt2", "smollm", 16)
    assert (got.bos_token_id, got.bos_token, got.eos_token, got.add_bos) == (
        1, "<|start|>", "<|end|>", False)
    assert got.eos_token_ids == (0,)
    assert got.chat_template and not got.chat_template_builtin
    info = got.tokenizer_info("tokenizer.json", "ab" * 32)
    assert (info.bos_token_id, info.eos_token_ids, info.chat_template) == (
        1, (0,), got.chat_template)


def test_add_bos_and_add_eos_go_to_the_post_processor() -> None:
    fields = bpe_fields(**{"tokenizer.ggml.add_bos_token": True,
                           "tokenizer.ggml.add_eos_token": True})
    tok = Tokenizer(None, tokenizer_from_gguf(fields).tokenizer_info("t.json", ""),
                    data=tokenizer_from_gguf(fields).tokenizer_json.encode())
    assert tok.encode("ab") == ids_of(fields, "<|start|>", "ab", "<|end|>")
    assert tok.encode("ab", add_special_tokens=False) == ids_of(fields, "ab")
    assert tok.decode(tok.encode("ab")) == "ab"  # special tokens are skipped


def test_llama3_ignores_merges_for_whole_tokens() -> None:
    # "abc" is a token but no merge path makes it ("b c" is missing): llama-bpe takes it whole
    fields = bpe_fields(**{"tokenizer.ggml.pre": "llama-bpe",
                           "tokenizer.ggml.merges": ["Ġ a"]})
    assert hf(fields).encode("abc").ids == ids_of(fields, "abc")
    assert hf(bpe_fields(**{"tokenizer.ggml.merges": ["Ġ a"]})).encode("abc").ids == ids_of(
        fields, "a", "b", "c")
    assert not tokenizer_from_gguf(fields).add_bos  # as the file says
    del fields["tokenizer.ggml.add_bos_token"]
    assert tokenizer_from_gguf(fields).add_bos  # llama.cpp's default for llama-bpe


# ---- SentencePiece ('llama') ---------------------------------------------------------------

def spm_fields(extra: dict[str, float] | None = None, **over: Any) -> dict[str, Any]:
    """<unk> <s> </s>, the 256 byte tokens, a few pieces with scores, one user-defined token."""
    pieces = {"▁": -1.0, "a": -2.0, "b": -3.0, "c": -4.0, "ab": -5.0, "bc": -6.0, "▁a": -7.0,
              **(extra or {})}
    tokens = ["<unk>", "<s>", "</s>", "<start_of_turn>", "<end_of_turn>", "\n\n"]
    types = [UNKNOWN, CONTROL, CONTROL, CONTROL, CONTROL, USER_DEFINED]
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [BYTE] * 256
    tokens += list(pieces)
    types += [NORMAL] * len(pieces)
    fields = {
        "general.architecture": "gemma3", "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.pre": "default", "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.scores": [0.0] * (len(tokens) - len(pieces)) + list(pieces.values()),
        "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.unknown_token_id": 0, "tokenizer.ggml.add_space_prefix": False,
    }
    fields.update(over)
    return fields


def llama_spm(fields: dict[str, Any], text: str) -> list[int]:
    """llama.cpp's SentencePiece rule restated: split out special tokens (longest first); in
    each other fragment (after a space when add_space_prefix), spaces become ▁ and the adjacent
    pair whose joined text is a token of highest score merges first (leftmost on a tie); what
    is no token is spelled in bytes."""
    tokens, types = fields["tokenizer.ggml.tokens"], fields["tokenizer.ggml.token_type"]
    vocab = {t: i for i, t in enumerate(tokens)}
    frags: list[str | int] = [text]
    for sid in sorted((i for i, k in enumerate(types) if k in (UNKNOWN, CONTROL, USER_DEFINED)),
                      key=lambda i: -len(tokens[i].encode())):
        out: list[str | int] = []
        for fr in frags:
            if isinstance(fr, int):
                out.append(fr)
                continue
            for k, part in enumerate(fr.split(tokens[sid])):
                out += ([sid] if k else []) + ([part] if part else [])
        frags = out
    ids = [1] if fields.get("tokenizer.ggml.add_bos_token", True) else []
    prefix = " " if fields.get("tokenizer.ggml.add_space_prefix", True) else ""
    for fr in frags:
        if isinstance(fr, int):
            ids.append(fr)
            continue
        for piece in spm_merge(list((prefix + fr).replace(" ", "▁")), vocab,
                               fields["tokenizer.ggml.scores"]):
            ids += ([vocab[piece]] if piece in vocab
                    else [vocab[f"<0x{b:02X}>"] for b in piece.encode()])
    return ids


def spm_merge(sym: list[str], vocab: dict[str, int], scores: list[float]) -> list[str]:
    nxt = list(range(1, len(sym))) + [-1]
    heap: list[tuple[float, int, int, str]] = []

    def push(left: int, right: int) -> None:
        if left >= 0 and right >= 0 and sym[left] + sym[right] in vocab:
            joined = sym[left] + sym[right]
            heapq.heappush(heap, (-scores[vocab[joined]], left, right, joined))
    for i in range(1, len(sym)):
        push(i - 1, i)
    while heap:
        _, left, right, joined = heapq.heappop(heap)
        if nxt[left] != right or sym[left] + sym[right] != joined:
            continue  # one side has merged since
        sym[left], sym[right], nxt[left] = joined, "", nxt[right]
        push(max((i for i in range(left) if sym[i]), default=-1), left)
        push(left, nxt[left])
    return [s for s in sym if s]


@pytest.mark.parametrize("extra, text, pieces", [
    ({}, "abc", ["ab", "c"]),  # "ab" (-5) scores above "bc" (-6)
    ({"bc": -4.5}, "abc", ["a", "bc"]),  # now "bc" does
    ({}, "a b", ["a", "▁", "b"]),  # no prefix space (add_space_prefix false)
    ({}, "é", ["<0xC3>", "<0xA9>"]),  # not in the vocabulary: its UTF-8 bytes
    ({}, "a\n\nb", ["a", "\n\n", "b"]),  # a user-defined token is found before merging
    ({}, "<start_of_turn>ab<end_of_turn>", ["<start_of_turn>", "ab", "<end_of_turn>"]),
])
def test_spm_encodes_as_llama_cpp_does(extra: dict[str, float], text: str,
                                       pieces: list[str]) -> None:
    fields = spm_fields(extra)
    want = [1] + ids_of(fields, *pieces)
    assert hf(fields).encode(text).ids == want == llama_spm(fields, text)
    assert hf(fields).decode(want, skip_special_tokens=True) == text.replace(
        "<start_of_turn>", "").replace("<end_of_turn>", "")


def test_spm_space_prefix_goes_before_each_text_between_special_tokens() -> None:
    fields = spm_fields(**{"tokenizer.ggml.add_space_prefix": True})
    tok = hf(fields)
    assert tok.encode("ab").ids == [1] + ids_of(fields, "▁", "ab") == llama_spm(fields, "ab")
    assert tok.encode("a<end_of_turn>a").ids == [1] + ids_of(fields, "▁a", "<end_of_turn>",
                                                              "▁a")
    assert tok.encode("a<end_of_turn>a").ids == llama_spm(fields, "a<end_of_turn>a")
    assert tok.decode(tok.encode("ab").ids) == "ab"  # the prefix space goes again


@settings(max_examples=200, deadline=None)
@given(text=st.text(alphabet="abc é\n<>", max_size=24),
       scores=st.lists(st.floats(-50, -1, allow_nan=False), min_size=4, max_size=4,
                       unique=True))
def test_spm_agrees_with_the_llama_cpp_rule(text: str, scores: list[float]) -> None:
    extra = dict(zip(["abc", "ca", "bc", "▁ab"], scores, strict=True))
    fields = spm_fields(extra)
    assert hf(fields).encode(text).ids == llama_spm(fields, text)


def test_gemma_gets_its_chat_template_and_end_of_turn() -> None:
    got = tokenizer_from_gguf(spm_fields())
    assert got.chat_template_builtin and got.add_bos
    assert got.eos_token_ids == (2, 4)  # </s>, then <end_of_turn>
    tok = Tokenizer(None, got.tokenizer_info("t.json", ""), data=got.tokenizer_json.encode())
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "ab"}]
    assert tok.apply_chat_template(messages) == (
        "<s><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n"
        "<start_of_turn>model\nHello.<end_of_turn>\n"
        "<start_of_turn>user\nab<end_of_turn>\n<start_of_turn>model\n")
    ids = tok.encode_chat([{"role": "user", "content": "ab"}])
    assert ids[:2] == [1, 3] and ids.count(1) == 1  # one BOS, written by the template
    # no fallback for an architecture meshd has none for
    other = tokenizer_from_gguf(spm_fields(**{"general.architecture": "llama"}))
    assert other.chat_template is None and not other.chat_template_builtin


@pytest.mark.parametrize("over, named", [
    ({"tokenizer.ggml.model": "bert"}, "tokenizer.ggml.model = 'bert'"),
    ({"tokenizer.ggml.model": "t5"}, "tokenizer.ggml.model = 't5'"),
    ({"tokenizer.ggml.model": None}, "tokenizer.ggml.model = missing"),
    ({"tokenizer.ggml.pre": "deepseek-llm"}, "tokenizer.ggml.pre = 'deepseek-llm'"),
    ({"tokenizer.ggml.pre": "gpt-4o"}, "tokenizer.ggml.pre = 'gpt-4o'"),
    ({"tokenizer.ggml.merges": []}, "tokenizer.ggml.merges"),
    ({"tokenizer.ggml.merges": ["b c"]}, "merge 'b c' names a token outside the vocabulary"),
    ({"tokenizer.ggml.tokens": []}, "tokenizer.ggml.tokens"),
])
def test_unsupported_vocabularies_are_refused_by_name(over: dict[str, Any], named: str) -> None:
    fields = {k: v for k, v in bpe_fields(**over).items() if v is not None}
    with pytest.raises(ModelError) as err:
        tokenizer_from_gguf(fields)
    assert named in str(err.value) and "\n" not in str(err.value)


# ---- the metadata reader -------------------------------------------------------------------

def test_metadata_reader_matches_the_gguf_package(tmp_path: Path) -> None:
    gguf = pytest.importorskip("gguf")
    path = tmp_path / "tiny.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_string("tokenizer.ggml.model", "gpt2")
    w.add_array("tokenizer.ggml.tokens", ["a", "b", "ĠΩ", "日本"])
    w.add_array("tokenizer.ggml.scores", [0.5, -1.25, 0.0, -3.0])
    w.add_array("tokenizer.ggml.token_type", [1, 3, 1, 6])
    w.add_bool("tokenizer.ggml.add_bos_token", True)
    w.add_uint32("tokenizer.ggml.bos_token_id", 1)
    w.add_int64("some.i64", -5)
    w.add_float64("some.f64", 2.5)
    w.add_uint8("some.u8", 7)
    w.add_array("some.bools", [True, False])
    w.add_tensor("t", np.zeros(4, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    mine = read_gguf_metadata(path)
    reader = gguf.GGUFReader(str(path))
    ref = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    assert mine == ref
    assert mine["tokenizer.ggml.tokens"] == ["a", "b", "ĠΩ", "日本"]
    assert mine["tokenizer.ggml.add_bos_token"] is True


def test_metadata_reader_refuses_what_is_no_gguf(tmp_path: Path) -> None:
    bad = tmp_path / "model.gguf"
    bad.write_bytes(b"PK\x03\x04not a gguf")
    with pytest.raises(ModelError, match="model.gguf: not a readable GGUF file"):
        read_gguf_metadata(bad)
    good = (b"GGUF" + (3).to_bytes(4, "little") + (0).to_bytes(8, "little")
            + (1).to_bytes(8, "little") + (3).to_bytes(8, "little") + b"key"
            + (8).to_bytes(4, "little") + (5).to_bytes(8, "little") + b"value")
    assert parse_metadata(good) == {"key": "value"}
    bad.write_bytes(good[:-2])
    with pytest.raises(ModelError, match="truncated"):
        read_gguf_metadata(bad)
    with pytest.raises(ModelError, match="cannot read"):
        read_gguf_metadata(tmp_path / "missing.gguf")


# ---- the real files against llama.cpp ------------------------------------------------------

_BUILT: dict[str, tuple[Path, Tokenizer]] = {}


def installed(name: str) -> tuple[Path, Tokenizer]:
    """The GGUF file ``name`` and the meshd tokenizer built from its metadata (built once), or
    a skip saying where it was looked for."""
    if name not in _BUILT:
        path, why = find_gguf(name)
        if path is None:
            pytest.skip(why)
        got = tokenizer_from_gguf(read_gguf_metadata(path))
        _BUILT[name] = (path, Tokenizer(None, got.tokenizer_info("tokenizer.json", ""),
                                        data=got.tokenizer_json.encode()))
    return _BUILT[name]


@pytest.mark.parametrize("name", sorted(GGUF_FILES))
def test_corpus_encodes_as_llama_cpp_golden(name: str) -> None:
    _, tok = installed(name)
    golden = json.loads((REPO / "tests" / "data" / f"tokenizer_golden_{name}.json").read_text())
    assert golden["corpus_sha256"] == hashlib.sha256(CORPUS.read_bytes()).hexdigest(), (
        "the corpus changed: run scripts/gguf_tokenizer_golden.py")
    samples = load_corpus()
    assert len(golden["ids"]) == len(samples)
    got = [tok.encode(s) for s in samples]
    wrong = [w for w in zip(samples, golden["ids"], got, strict=True) if w[1] != w[2]]
    assert not wrong, f"{len(wrong)}/{len(samples)} differ, first: {wrong[0]!r}"


def test_smollm2_chat_prompt_has_its_special_tokens() -> None:
    _, tok = installed("smollm2")
    ids = tok.encode_chat([{"role": "user", "content": "Hi"}])
    assert ids[0] == 1 and ids.count(2) == 2  # <|im_start|> first, two <|im_end|>
    assert tok.eos_token_ids == (2, 0) and tok.bos_token_id == 1
    assert tok.decode(ids) == "system\nYou are a helpful AI assistant named SmolLM, trained by " \
        "Hugging Face\nuser\nHi\nassistant\n"


def live_samples(seed: int, n: int) -> list[str]:
    """``n`` corpus samples and ``n`` seeded splices of corpus pieces, for the live check."""
    corpus = load_corpus()
    rng = random.Random(seed)
    picked = rng.sample(corpus, n)
    spliced = []
    for _ in range(n):
        parts = []
        for s in rng.sample(corpus, 3):
            a = rng.randrange(len(s) + 1)
            parts.append(s[a:a + rng.randint(1, 40)])
        spliced.append("".join(parts))
    return picked + spliced


@pytest.mark.parametrize("name", sorted(GGUF_FILES))
def test_live_against_llama_tokenize(name: str) -> None:
    binary, why = llama_tokenize_bin()
    if binary is None:
        pytest.skip(why)
    path, tok = installed(name)
    wrong = [(s, llama_tokenize(binary, path, s), tok.encode(s))
             for s in live_samples(seed=28, n=6)]
    wrong = [w for w in wrong if w[1] != w[2]]
    assert not wrong, f"{len(wrong)} differ, first: {wrong[0]!r}"
