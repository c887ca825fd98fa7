"""Retrieval-augmented prompts: which retrieved chunks go into the prompt, and how. Pure.

``build_prompt(question, passages)`` puts the passages, numbered and with their sources, before
the question. ``fit_passages`` decides which passages fit the model's context: the prompt with
every passage, plus the tokens the request may generate, must be at most the context length;
when it is not, the lowest-scoring passage goes first, then the next lowest, until it fits
(ties: the later one in retrieval order goes first, so the same retrieval always keeps the
same passages). The entry step (``meshd.node.entry.augment``) counts tokens with the model's
own tokenizer and calls these; the simulator may too.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from meshd.errors import ProtocolError

# RAG_REQ/RAG_PART caps (proto/README.md): the question as sent (the embedding model reads only
# its first 256 tokens, about 1,000 characters), chunks per answer, one chunk's text, and the
# whole answer's text, well under the request protocol's 1 MiB frame
MAX_QUERY_CHARS = 4096
MAX_K = 64
MAX_CHUNK_CHARS = 16_384
MAX_PART_CHARS = 512 * 1024
HEADER = ("Answer the question using the numbered context passages below; cite them by number "
          "[n].\n\n")


@dataclass(frozen=True, slots=True)
class Passage:
    source: str  # where the text came from (a path, with a line range)
    score: float  # similarity to the question, higher is closer
    text: str


@dataclass(frozen=True, slots=True)
class Fit:
    kept: tuple[int, ...]  # indices into the passages, in their order
    dropped: tuple[int, ...]  # indices trimmed, lowest-scoring first
    prompt_tokens: int  # of the prompt with the kept passages
    note: str | None  # said to the client when something was trimmed


def render_passage(n: int, p: Passage) -> str:
    return f"[{n}] (source: {p.source})\n{p.text.strip()}\n\n"


def build_prompt(question: str, passages: Sequence[Passage]) -> str:
    """The prompt: the instruction, the passages numbered from 1 with their sources, then the
    question. No passages: the question alone."""
    if not passages:
        return question
    body = "".join(render_passage(n, p) for n, p in enumerate(passages, 1))
    return f"{HEADER}{body}Question: {question}"


def trim_order(passages: Sequence[Passage]) -> list[int]:
    """Indices in the order they are trimmed: lowest score first; among equal scores the later
    one in retrieval order first."""
    return sorted(range(len(passages)), key=lambda i: (passages[i].score, -i))


def fit_passages(passages: Sequence[Passage], count: Callable[[Sequence[Passage]], int],
                 max_tokens: int, context: int | None) -> Fit:
    """Keep as many passages as fit: ``count(kept)`` is the prompt's token count with those
    passages (the caller's tokenizer); ``max_tokens`` what the request may generate;
    ``context`` the model's context length (None: unknown, everything is kept)."""
    order = trim_order(passages)
    dropped: list[int] = []
    kept = list(range(len(passages)))
    tokens = count([passages[i] for i in kept])
    while context is not None and kept and tokens + max_tokens > context:
        gone = order[len(dropped)]
        dropped.append(gone)
        kept.remove(gone)
        tokens = count([passages[i] for i in kept])
    note = None
    if dropped:
        note = (f"retrieval trimmed: {len(dropped)} of {len(passages)} passages left out (lowest "
                f"scores first) so that the prompt ({tokens} tokens) plus max_tokens "
                f"({max_tokens}) fits the model's context of {context} tokens")
    return Fit(tuple(kept), tuple(dropped), tokens, note)


def passages_to_wire(passages: Sequence[Passage]) -> list[dict[str, Any]]:
    """RAG_PART ``chunks``: each text cut to MAX_CHUNK_CHARS, the list cut where the total
    would pass MAX_PART_CHARS."""
    out: list[dict[str, Any]] = []
    total = 0
    for p in passages[:MAX_K]:
        text = p.text[:MAX_CHUNK_CHARS]
        total += len(text) + len(p.source)
        if total > MAX_PART_CHARS:
            break
        out.append({"source": p.source, "score": float(p.score), "text": text})
    return out


def passages_from_wire(raw: Any) -> list[Passage]:
    """RAG_PART ``chunks`` checked: a list of at most MAX_K maps of source (str), score
    (finite number) and text (str), within the caps. Raises only ``ProtocolError``."""
    if not isinstance(raw, list) or len(raw) > MAX_K:
        raise ProtocolError(f"RAG_PART.chunks must be a list of at most {MAX_K} maps")
    out: list[Passage] = []
    total = 0
    for i, c in enumerate(raw):
        if not isinstance(c, dict):
            raise ProtocolError(f"RAG_PART.chunks[{i}] must be a map")
        source, score, text = c.get("source"), c.get("score"), c.get("text")
        if not isinstance(source, str) or not isinstance(text, str) or len(source) > 4096:
            raise ProtocolError(f"RAG_PART.chunks[{i}] needs a source and a text")
        if (not isinstance(score, int | float) or isinstance(score, bool)
                or not math.isfinite(score)):
            raise ProtocolError(f"RAG_PART.chunks[{i}].score must be a finite number")
        total += len(text) + len(source)
        if len(text) > MAX_CHUNK_CHARS or total > MAX_PART_CHARS:
            raise ProtocolError("RAG_PART is over its size caps")
        out.append(Passage(source, float(score), text))
    return out
