"""Text as token ids for a model served by an upstream server. Pure: no I/O.

The mesh moves requests as token ids (the entry node tokenizes, the serving node generates from
ids, a failover resumes from the prompt ids plus the ids already streamed). A model served by an
OpenAI-compatible upstream has no tokenizer here, so its "token ids" are a reversible packing of
text, opaque to every other part of meshd:

- a prompt is a header id (kind and byte length) and its UTF-8 bytes three to an id, so a prompt
  counts about one "token" per 3 bytes, near the estimate entry nodes use for text they cannot
  tokenize, and the speeds the runner measures in these units stay consistent for the router;
  every prompt id is below 2**32, so prompts pack as u32 on the wire (meshd.core.packing);
- the kind is plain text (``/v1/completions``) or chat messages as JSON (``/v1/chat/completions``);
- each piece of text the upstream streams becomes one id per up to 7 UTF-8 bytes (cut at
  character boundaries), the bytes and their count packed below bit 62, so the ids streamed so
  far decode back to the text so far, on any node that serves the same upstream model.

Generated ids are below 2**63, as msgpack and the wire's id lists take them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

PROMPT_BASE = 1 << 31  # header ids: PROMPT_BASE + 2 * nbytes + kind (prompt words are < 2**24)
WORD_BYTES = 3
TEXT, CHAT = 0, 1
PIECE_FLAG = 1 << 62  # generated ids: flag | nbytes << 56 | bytes
PIECE_MAX_BYTES = 7
MAX_PROMPT_BYTES = 1 << 22


class CodecError(ValueError):
    """Ids that are not a packed upstream prompt."""


def _pack_prompt(kind: int, data: bytes) -> list[int]:
    if len(data) > MAX_PROMPT_BYTES:
        raise CodecError(f"prompt of {len(data)} bytes; the limit is {MAX_PROMPT_BYTES}")
    ids = [PROMPT_BASE + 2 * len(data) + kind]
    for i in range(0, len(data), WORD_BYTES):
        ids.append(int.from_bytes(data[i:i + WORD_BYTES].ljust(WORD_BYTES, b"\0"), "big"))
    return ids


def encode_text(text: str) -> list[int]:
    return _pack_prompt(TEXT, text.encode())


def encode_chat(messages: list[dict[str, Any]]) -> list[int]:
    clean = [{"role": str(m["role"]), "content": str(m["content"])} for m in messages]
    return _pack_prompt(CHAT, json.dumps(clean, separators=(",", ":")).encode())


def piece_ids(text: str) -> list[tuple[int, str]]:
    """(id, text) for each part of ``text`` of at most 7 UTF-8 bytes, cut between characters."""
    out: list[tuple[int, str]] = []
    part = ""
    size = 0
    for ch in text:
        n = len(ch.encode())
        if size + n > PIECE_MAX_BYTES and part:
            out.append((_piece(part), part))
            part, size = "", 0
        part += ch
        size += n
    if part:
        out.append((_piece(part), part))
    return out


def _piece(part: str) -> int:
    data = part.encode()
    return PIECE_FLAG | (len(data) << 56) | int.from_bytes(data, "big")


@dataclass(frozen=True)
class Decoded:
    kind: int  # TEXT or CHAT
    prompt: str  # the text, or the messages as JSON
    generated: str  # the text of any generated ids after the prompt (a resumed request)

    def messages(self) -> list[dict[str, str]]:
        out: list[dict[str, str]] = json.loads(self.prompt)
        return out


def decode(ids: list[int]) -> Decoded:
    """The prompt and the text generated so far; raises CodecError on foreign ids (a request
    tokenized for a real model reached an upstream model of the same name)."""
    if not ids or not PROMPT_BASE <= ids[0] < PROMPT_BASE + 2 * (MAX_PROMPT_BYTES + 1):
        raise CodecError("these token ids were not made for an upstream model")
    header = ids[0] - PROMPT_BASE
    kind, nbytes = header % 2, header // 2
    words = (nbytes + WORD_BYTES - 1) // WORD_BYTES
    body = ids[1:1 + words]
    if len(body) != words or any(not 0 <= w < 1 << (8 * WORD_BYTES) for w in body):
        raise CodecError("a truncated or corrupt upstream prompt")
    data = b"".join(w.to_bytes(WORD_BYTES, "big") for w in body)[:nbytes]
    gen = bytearray()
    for w in ids[1 + words:]:
        if not w & PIECE_FLAG or w >= 1 << 63:
            raise CodecError("a generated id that is not an upstream piece")
        n = (w >> 56) & 0x3F
        if not 0 < n <= PIECE_MAX_BYTES:
            raise CodecError("a generated id with a bad length")
        gen += (w & ((1 << 56) - 1)).to_bytes(n, "big")
    try:
        return Decoded(kind, data.decode(), gen.decode())
    except UnicodeDecodeError:
        raise CodecError("an upstream prompt that is not UTF-8") from None
