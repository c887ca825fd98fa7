"""The tokenizer of a GGUF file, as a ``tokenizer.json`` that encodes as llama.cpp does.

``tokenizer_from_gguf(fields)`` is pure: GGUF metadata in (plain values, as
``read_gguf_metadata`` of ``meshd.engine.gguf_meta`` returns them; re-exported here), a
``GgufTokenizer`` out: the ``tokenizer.json`` text for the
``tokenizers`` library, the BOS/EOS ids and texts, whether BOS is added, and the chat template.

Two vocabularies are supported, as llama.cpp reads them:

* ``gpt2``: byte-level BPE over the GGUF merges, after the pre-tokenizer split that llama.cpp
  keys on ``tokenizer.ggml.pre`` (``meshd.engine.gguf_pretok``).
* ``llama``: SentencePiece BPE. llama.cpp merges the adjacent pair whose joined text is a token
  of highest score, leftmost first, and spells what stays out of the vocabulary with the
  ``<0xXX>`` byte tokens. Here that is a BPE whose merges are every split of every token into two
  tokens, ranked by the joined token's score, with byte fallback; spaces become ``▁`` and, with
  ``tokenizer.ggml.add_space_prefix``, each text between special tokens starts with one.

Control, user-defined and unknown tokens (token types 3, 4, 2) are added tokens, matched in the
raw text before anything else, as llama.cpp does when it parses special tokens: ``<|im_start|>``
in a rendered chat prompt is one id. Control and unknown tokens are special (dropped when
decoding with ``skip_special_tokens``); user-defined ones (Gemma's runs of newlines, spaces and
tabs, its HTML tags) are text.

Any other ``tokenizer.ggml.model``, or a ``tokenizer.ggml.pre`` this module has no split for, is
refused with a ``ModelError`` naming the value.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from meshd.engine.gguf_meta import read_gguf_metadata
from meshd.engine.gguf_pretok import pre_tokenizer
from meshd.engine.manifest import TokenizerInfo
from meshd.errors import ModelError

__all__ = ["GgufTokenizer", "read_gguf_metadata", "spm_merges", "tokenizer_from_gguf"]

# tokenizer.ggml.token_type values (llama.cpp's llama_token_type)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
_ADDED = frozenset((UNKNOWN, CONTROL, USER_DEFINED))
_SPECIAL = frozenset((UNKNOWN, CONTROL))

# Texts of tokens that end a turn: generation stops at them as at EOS (llama.cpp's list of
# end-of-generation tokens, less the fill-in-the-middle ones meshd does not use).
END_OF_TURN = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
               "<|eom_id|>", "<|end_of_text|>", "<EOT>")

# Chat templates for architectures whose GGUF files often come without one. Gemma (1, 2 and 3)
# writes turns as "<start_of_turn>{user|model}\n{text}<end_of_turn>\n" after BOS and knows no
# system role: a system message goes before the first turn's text, with a blank line. Each
# turn's text is trimmed; an assistant turn is a "model" turn.
GEMMA_TEMPLATE = (
    "{{ bos_token }}"
    "{%- if messages and messages[0]['role'] == 'system' -%}"
    "{%- set system = messages[0]['content'] + '\\n\\n' -%}"
    "{%- set turns = messages[1:] -%}"
    "{%- else -%}{%- set system = '' -%}{%- set turns = messages -%}{%- endif -%}"
    "{%- for m in turns -%}"
    "{{ '<start_of_turn>' + ('model' if m['role'] == 'assistant' else m['role']) + '\\n'"
    " + (system if loop.first else '') + m['content'] | trim + '<end_of_turn>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\\n' }}{%- endif -%}"
)
_GEMMA_TURNS = ("<start_of_turn>", "<end_of_turn>")
# general.architecture -> (template, the tokens it writes, which the vocabulary must hold)
FALLBACK_TEMPLATES = {"gemma": (GEMMA_TEMPLATE, _GEMMA_TURNS),
                      "gemma2": (GEMMA_TEMPLATE, _GEMMA_TURNS),
                      "gemma3": (GEMMA_TEMPLATE, _GEMMA_TURNS)}


@dataclass(frozen=True, slots=True)
class GgufTokenizer:
    """What a GGUF file's metadata says about its tokenizer, ready for a model directory."""

    tokenizer_json: str
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]  # the EOS id first, then other end-of-turn ids ascending
    bos_token: str | None
    eos_token: str | None
    chat_template: str | None
    add_bos: bool  # the tokenizer.json's post-processor adds BOS (and EOS when add_eos)
    add_eos: bool = False
    model: str = ""  # tokenizer.ggml.model
    pre: str = ""  # tokenizer.ggml.pre ("" for SentencePiece, which has none)
    vocab_size: int = 0
    chat_template_builtin: bool = False  # the template is meshd's fallback, not the file's

    def tokenizer_info(self, file: str, sha256: str) -> TokenizerInfo:
        """The manifest's record of this tokenizer, written to ``file`` with digest ``sha256``."""
        return TokenizerInfo(file=file, sha256=sha256, bos_token_id=self.bos_token_id,
                             eos_token_ids=self.eos_token_ids, bos_token=self.bos_token,
                             eos_token=self.eos_token, chat_template=self.chat_template)


def tokenizer_from_gguf(fields: Mapping[str, Any]) -> GgufTokenizer:
    """The tokenizer described by GGUF metadata ``fields`` (key -> plain value)."""
    model = str(fields.get("tokenizer.ggml.model", ""))
    tokens = [str(t) for t in _array(fields, "tokenizer.ggml.tokens")]
    if not tokens:
        raise ModelError("GGUF has no tokenizer.ggml.tokens")
    types = _array(fields, "tokenizer.ggml.token_type") or [NORMAL] * len(tokens)
    if len(types) < len(tokens):
        raise ModelError(f"GGUF tokenizer.ggml.token_type has {len(types)} entries for "
                         f"{len(tokens)} tokens")
    if model == "gpt2":
        pre = str(fields.get("tokenizer.ggml.pre") or "default")
        split = pre_tokenizer(pre)  # raises on an unknown one
        body = _bpe_body(tokens, _array(fields, "tokenizer.ggml.merges"), split.regexes,
                         split.ignore_merges)
        defaults, add_bos_default, add_space = (11, 11), split.add_bos, False
    elif model == "llama":
        pre = ""
        add_space = bool(fields.get("tokenizer.ggml.add_space_prefix", True))
        body = _spm_body(tokens, types, _array(fields, "tokenizer.ggml.scores"), add_space)
        defaults, add_bos_default = (1, 2), True
    else:
        shown = repr(model) if model else "missing"
        raise ModelError(f"unsupported GGUF vocabulary: tokenizer.ggml.model = {shown} "
                         "(meshd reads 'gpt2' and 'llama')")

    bos_id = _token_id(fields, "tokenizer.ggml.bos_token_id", defaults[0], len(tokens))
    eos_id = _token_id(fields, "tokenizer.ggml.eos_token_id", defaults[1], len(tokens))
    add_bos = bool(fields.get("tokenizer.ggml.add_bos_token", add_bos_default))
    add_eos = bool(fields.get("tokenizer.ggml.add_eos_token", False))
    if (add_bos and bos_id is None) or (add_eos and eos_id is None):
        raise ModelError("GGUF asks to add a BOS or EOS token it does not name")

    body["added_tokens"] = [
        {"id": i, "content": tokens[i], "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": types[i] in _SPECIAL}
        for i in range(len(tokens)) if types[i] in _ADDED]
    body["post_processor"] = _post_processor(tokens, bos_id if add_bos else None,
                                             eos_id if add_eos else None)
    if add_space:
        body["decoder"]["decoders"].append({"type": "Strip", "content": " ", "start": 1,
                                            "stop": 0})

    template = fields.get("tokenizer.chat_template")
    builtin = False
    if not template:
        template = _fallback_template(str(fields.get("general.architecture", "")), tokens)
        builtin = template is not None
    return GgufTokenizer(
        tokenizer_json=json.dumps(body, ensure_ascii=False),
        bos_token_id=bos_id, eos_token_ids=_eos_ids(fields, tokens, eos_id),
        bos_token=tokens[bos_id] if bos_id is not None else None,
        eos_token=tokens[eos_id] if eos_id is not None else None,
        chat_template=str(template) if template else None, add_bos=add_bos, add_eos=add_eos,
        model=model, pre=pre, vocab_size=len(tokens), chat_template_builtin=builtin)


def _bpe_body(tokens: list[str], merges: Sequence[Any], regexes: Sequence[str],
              ignore_merges: bool) -> dict[str, Any]:
    if not merges:
        raise ModelError("GGUF has no tokenizer.ggml.merges for its 'gpt2' vocabulary")
    known = set(tokens)
    pairs = []
    for m in map(str, merges):  # "left right", cut at the first space after the first character
        cut = m.find(" ", 1)
        if cut < 0:
            raise ModelError(f"GGUF tokenizer.ggml.merges holds {m!r}, not a pair")
        left, right = m[:cut], m[cut + 1:]
        if not {left, right, left + right} <= known:
            raise ModelError(f"GGUF merge {m!r} names a token outside the vocabulary")
        pairs.append((left, right))
    splits = [{"type": "Split", "pattern": {"Regex": r}, "behavior": "Isolated",
               "invert": False} for r in regexes]
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                  "use_regex": False}
    return {
        "version": "1.0", "truncation": None, "padding": None, "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [*splits, byte_level]},
        "model": _bpe_model(tokens, pairs, byte_fallback=False, unk=None,
                            ignore_merges=ignore_merges),
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
             "use_regex": True}]},
    }


def _spm_body(tokens: list[str], types: Sequence[int], scores: Sequence[float],
              add_space: bool) -> dict[str, Any]:
    if scores and len(scores) < len(tokens):
        raise ModelError(f"GGUF tokenizer.ggml.scores has {len(scores)} entries for "
                         f"{len(tokens)} tokens")
    normalizers: list[dict[str, Any]] = [{"type": "Prepend", "prepend": "▁"}] if add_space else []
    normalizers.append({"type": "Replace", "pattern": {"String": " "}, "content": "▁"})
    unk = next((tokens[i] for i in range(len(tokens)) if types[i] == UNKNOWN), None)
    return {
        "version": "1.0", "truncation": None, "padding": None,
        "normalizer": {"type": "Sequence", "normalizers": normalizers},
        "pre_tokenizer": None,
        "model": _bpe_model(tokens, spm_merges(tokens, types, scores), byte_fallback=True,
                            unk=unk, ignore_merges=False),
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"}]},
    }


def spm_merges(tokens: Sequence[str], types: Sequence[int],
               scores: Sequence[float]) -> list[tuple[str, str]]:
    """Every split of a token into two tokens, best first: by the whole token's score, highest
    first (llama.cpp's SentencePiece merge order), then by its id and where it splits. Special
    tokens are never made by merging: llama.cpp finds them in the text before merging."""
    vocab = {t: i for i, t in enumerate(tokens)}
    ranked = []
    for i, text in enumerate(tokens):
        if types[i] in _ADDED:
            continue
        score = float(scores[i]) if scores else 0.0
        for cut in range(1, len(text)):
            if text[:cut] in vocab and text[cut:] in vocab:
                ranked.append((-score, i, cut))
    ranked.sort()
    return [(tokens[i][:cut], tokens[i][cut:]) for _, i, cut in ranked]


def _bpe_model(tokens: list[str], pairs: list[tuple[str, str]], *, byte_fallback: bool,
               unk: str | None, ignore_merges: bool) -> dict[str, Any]:
    # "a b" strings where no side holds a space: tokenizers before 0.20 read only those
    spaced = any(" " in a or " " in b for a, b in pairs)
    return {"type": "BPE", "dropout": None, "unk_token": unk, "continuing_subword_prefix": None,
            "end_of_word_suffix": None, "fuse_unk": unk is not None,
            "byte_fallback": byte_fallback, "ignore_merges": ignore_merges,
            "vocab": {t: i for i, t in enumerate(tokens)},
            "merges": [list(p) for p in pairs] if spaced else [f"{a} {b}" for a, b in pairs]}


def _post_processor(tokens: list[str], bos: int | None, eos: int | None
                    ) -> dict[str, Any] | None:
    if bos is None and eos is None:
        return None
    single: list[dict[str, Any]] = []
    pair: list[dict[str, Any]] = []
    special = {}
    for seq, type_id in (("A", 0), ("B", 1)):
        part: list[dict[str, Any]] = []
        if bos is not None:
            part.append({"SpecialToken": {"id": tokens[bos], "type_id": type_id}})
        part.append({"Sequence": {"id": seq, "type_id": type_id}})
        if eos is not None:
            part.append({"SpecialToken": {"id": tokens[eos], "type_id": type_id}})
        pair.extend(part)
        if seq == "A":
            single = list(part)
    for i in (bos, eos):
        if i is not None:
            special[tokens[i]] = {"id": tokens[i], "ids": [i], "tokens": [tokens[i]]}
    return {"type": "TemplateProcessing", "single": single, "pair": pair,
            "special_tokens": special}


def _eos_ids(fields: Mapping[str, Any], tokens: list[str], eos_id: int | None
             ) -> tuple[int, ...]:
    more = {i for i, t in enumerate(tokens) if t in END_OF_TURN}
    for key in ("tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"):
        i = _token_id(fields, key, None, len(tokens))
        if i is not None:
            more.add(i)
    head = () if eos_id is None else (eos_id,)
    return head + tuple(sorted(more - set(head)))


def _fallback_template(arch: str, tokens: list[str]) -> str | None:
    template, needs = FALLBACK_TEMPLATES.get(arch, (None, ()))
    have = set(tokens)
    return template if template and all(t in have for t in needs) else None


def _token_id(fields: Mapping[str, Any], key: str, default: int | None, n: int) -> int | None:
    """A token id from the metadata, else ``default``; out of range is none (as llama.cpp)."""
    value = fields.get(key)
    i = default if value is None or isinstance(value, bool) else int(value)
    if i is not None and not 0 <= i < n:
        i = default if default is not None and 0 <= default < n else None
    return i


def _array(fields: Mapping[str, Any], key: str) -> list[Any]:
    value = fields.get(key)
    if value is None:
        return []
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise ModelError(f"GGUF {key} is not an array")
    return list(value)
