"""llguidance's view of a vocabulary, made from the tokenizer meshd already holds: every token's
bytes, which tokens are special, and a callback that tokenizes with the model's own tokenizer.

Given ``tokenizer.json`` text, llguidance loads a second copy of the whole tokenizer inside
itself beside its token trie. Given the tokens' bytes and a callback, it keeps the trie only:
for SmolLM2-135M's 49,152 tokens the view costs 20.9 MiB of resident memory against 36.4 and
builds in 0.35 s against 0.54; for Gemma 3's 262,144, 98.6 MiB against 220.3 and 2.0 s against
5.4 s. The masks it computes are the same (tests/engine/test_grammar_vocab.py compares both views
token by token on the real vocabularies). The callback runs only when a grammar forces bytes
(llguidance turns them into tokens); it is the model's tokenizer, so those tokens are the ones
the model would see.

The bytes follow the rules llguidance itself applies to a ``tokenizer.json``: a byte-level
decoder maps each character of a token back to its byte (GPT-2's table); a byte-fallback decoder
reads a ``<0xNN>`` token as that byte and turns the metaspace character (the one its ``Replace``
decoder turns into a space) into a space; an added token that is special, or looks like
``<...>``, is special (llguidance marks it with a leading 0xFF byte), and any other added token is
its text. ``vocab_kind`` gives None where these rules do not hold: a decoder of neither kind, or
a tokenizer that puts a space before the text it is given (a ``Prepend`` normalizer, a
``Metaspace`` pre-tokenizer that prepends). llguidance tokenizes forced bytes without that space;
the model's tokenizer would add it, so such a vocabulary keeps the ``tokenizer.json`` route.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

SPECIAL_MARKER = 0xFF  # llguidance's first byte of a special token (TokTrie::SPECIAL_TOKEN_MARKER)
BYTE_LEVEL = "byte_level"
BYTE_FALLBACK = "byte_fallback"


@dataclass(frozen=True)
class VocabKind:
    decoder: str  # BYTE_LEVEL or BYTE_FALLBACK
    space: str = " "  # the character a byte-fallback vocabulary writes for a space


def byte_level_table() -> dict[str, int]:
    """GPT-2's byte-level alphabet, each character to the byte it stands for: printable Latin-1
    bytes stand for themselves, the other 68 are the characters from U+0100 up, in byte order."""
    def self_mapped(b: int) -> bool:
        return 0x21 <= b <= 0x7E or 0xA1 <= b <= 0xAC or 0xAE <= b <= 0xFF

    table, k = {}, 0x100
    for b in range(256):
        if self_mapped(b):
            table[chr(b)] = b
        else:
            table[chr(k)] = b
            k += 1
    return table


def _walk(node: Mapping[str, Any] | None, key: str) -> list[Mapping[str, Any]]:
    """``node`` and, for a ``Sequence``, every member under ``key``, depth first."""
    if not node:
        return []
    if node.get("type") == "Sequence":
        return [m for sub in node.get(key) or [] for m in _walk(sub, key)]
    return [node]


def vocab_kind(decoder: Mapping[str, Any] | None, normalizer: Mapping[str, Any] | None,
               pre_tokenizer: Mapping[str, Any] | None) -> VocabKind | None:
    """How a tokenizer's tokens become bytes, from its ``tokenizer.json`` ``decoder``,
    ``normalizer`` and ``pre_tokenizer``; None where the rules above do not hold."""
    if any(n.get("type") == "Prepend" for n in _walk(normalizer, "normalizers")):
        return None
    for p in _walk(pre_tokenizer, "pretokenizers"):
        if p.get("type") == "Metaspace" and str(p.get("prepend_scheme", "always")) != "never":
            return None
    kinds, space = set(), " "
    for d in _walk(decoder, "decoders"):
        if d.get("type") in ("ByteLevel", "ByteFallback"):
            kinds.add(d["type"])
        elif d.get("type") == "Replace" and d.get("content") == " ":
            pattern = (d.get("pattern") or {}).get("String")
            if isinstance(pattern, str) and len(pattern) == 1:
                space = pattern
    if "ByteFallback" in kinds:  # llguidance's order, where a decoder has both
        return VocabKind(BYTE_FALLBACK, space)
    return VocabKind(BYTE_LEVEL, space) if kinds else None


def _fallback_byte(piece: str) -> int | None:
    if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
        try:
            return int(piece[3:5], 16)
        except ValueError:
            return None
    return None


def token_bytes(pieces: Sequence[str | None], added: Mapping[int, tuple[str, bool]],
                kind: VocabKind) -> tuple[list[bytes], list[int]]:
    """Every token's bytes and the ids of the special tokens. ``pieces[i]`` is token ``i``'s
    string in the vocabulary (None for a hole), ``added`` the added tokens: id to (text,
    special)."""
    out = [b""] * len(pieces)
    special = {i for i, (text, is_special) in added.items()
               if is_special or (text.startswith("<") and text.endswith(">"))}
    for i, (text, _) in added.items():
        if i not in special and 0 <= i < len(out):
            out[i] = text.encode("utf-8")
    table = byte_level_table() if kind.decoder == BYTE_LEVEL else {}
    for i, piece in enumerate(pieces):
        if piece is None:
            continue
        if i in special:
            out[i] = bytes([SPECIAL_MARKER]) + piece.encode("utf-8")
        elif kind.decoder == BYTE_FALLBACK:
            b = _fallback_byte(piece)
            out[i] = bytes([b]) if b is not None else piece.replace(kind.space, " ").encode("utf-8")
        else:
            try:
                out[i] = bytes(table[c] for c in piece)
            except KeyError:
                pass  # a piece outside the alphabet keeps its added text, or none (as llguidance)
    return out, sorted(i for i in special if 0 <= i < len(out))


class TokenSource:
    """What llguidance's ``TokenizerWrapper`` asks of a tokenizer: the tokens' bytes, the
    special ids, EOS and BOS, and a call that tokenizes UTF-8 bytes (without special tokens)."""

    def __init__(self, hf: Any, tokens: list[bytes], special: list[int], eos: int,
                 bos: int | None) -> None:
        self._hf = hf
        self.tokens = tokens
        self.special_token_ids = special
        self.eos_token_id = eos
        self.bos_token_id = bos

    def __call__(self, data: bytes) -> list[int]:
        return list(self._hf.encode(data.decode("utf-8", "replace"),
                                    add_special_tokens=False).ids)


def _state(part: Any) -> Mapping[str, Any] | None:
    return json.loads(part.__getstate__()) if part is not None else None


def token_source(hf: Any, eos: int, bos: int | None) -> TokenSource | None:
    """The ``TokenSource`` of a ``tokenizers.Tokenizer``; None where ``vocab_kind`` says its
    tokens' bytes cannot be made here."""
    kind = vocab_kind(_state(hf.decoder), _state(hf.normalizer), _state(hf.pre_tokenizer))
    if kind is None:
        return None
    n = int(hf.get_vocab_size(with_added_tokens=True))
    pieces = [hf.id_to_token(i) for i in range(n)]
    added = {int(i): (str(t.content), bool(t.special))
             for i, t in hf.get_added_tokens_decoder().items()}
    tokens, special = token_bytes(pieces, added, kind)
    return TokenSource(hf, tokens, special, eos, bos)
