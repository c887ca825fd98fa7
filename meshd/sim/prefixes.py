"""Which prompt prefixes each simulated node's KV prefix cache holds, and what it advertises.

A node whose hardware class has ``prefix_cache_tokens`` keeps the daemon's own index,
``meshd.core.prefix_cache.PrefixCache`` (blocks of 32 tokens named by chained hashes, least
recently used evicted past the budget), with no payload and each block's size counted in tokens.
As the engine does (docs/engine.md, "Prefix cache"):

- a request starting its prefill reuses the longest run of cached blocks of its prompt, cut to
  whole prefill chunks (``REUSE_ALIGN``, 128 tokens) and never its last token, and prefills only
  the rest;
- the prompt's full blocks are stored when its prefill ends (a request arriving meanwhile does
  not find them yet);
- with ``keep_answers``, a finished request's prompt and answer are queued (at most
  ``answer_keep.QUEUE``) to be prefilled again from the prompt's kept chunks, their blocks
  stored when that ends (``finished``, ``keep_answers_now``): as the engine, only while no
  prompt waits at the node, one after another, beside decoding streams only where a chunk fits
  a quarter of their step (``meshd.core.answer_keep``), else when none decodes. Checked when a
  request finishes there; unlike the engine, one already started is not paused by a prompt
  arriving, and its chunks do not slow the streams' decode (prompts' prefill does not either);
- the advert carries ``PrefixCache.sketch``: a Bloom filter (at most 512 bytes) of the names
  of the blocks held at chunk depths (128, 256, 384, ... tokens), the 256 most recently used
  at most, as ``Serving.prefix_sketch`` beside the model identity the names are made with
  (``model_id``), so the entry node's decision (``meshd.core.decide``) credits the prefill it
  would skip exactly as the daemon's does.

Requests name their blocks once (``names_of``). Pipelines are not modelled (a chat scenario
serves its model whole).
"""

from __future__ import annotations

import dataclasses
import heapq

from meshd.core.answer_keep import QUEUE, answer_seconds
from meshd.core.prefix_cache import PrefixCache, layer_space
from meshd.core.prefix_names import BLOCK_TOKENS, block_hashes
from meshd.core.snapshot import Serving

REUSE_ALIGN = 128  # tokens: the engine's prefill chunk (PREFILL_CHUNK_TOKENS), which reuse keeps whole
SPACE = layer_space(0, 0)  # one space per node: it serves its model whole


def model_identity(model: str) -> str:
    """The identity a simulated model's blocks are named with (meshd.core.modelid's role)."""
    return f"sim:{model}"


def names_of(model: str, ids: tuple[int, ...]) -> list[bytes]:
    """The chained names of the full blocks of a prompt (``prefix_names.block_hashes``)."""
    return block_hashes(ids, model_identity(model))


class NodePrefixes:
    """One node's prefix cache: ``budget_tokens`` of KV, for the one model it serves whole."""

    __slots__ = ("cache", "pending", "seq", "reused_tokens", "hits", "keep_answers",
                 "answers_kept", "answers", "answers_until")

    def __init__(self, budget_tokens: int, *, keep_answers: bool = True) -> None:
        self.cache = PrefixCache(budget_tokens)
        self.keep_answers = keep_answers
        self.answers_kept = 0
        self.answers: list[tuple[list[bytes], int]] = []  # finished: (names, tokens to prefill)
        self.answers_until = 0.0  # when the answer being prefilled ends
        self.pending: list[tuple[float, int, list[bytes]]] = []  # (prefill ends, seq, names)
        self.seq = 0
        self.reused_tokens = 0
        self.hits = 0

    def _settle(self, now: float) -> None:
        """Store the blocks of every prompt whose prefill has ended by ``now``."""
        p = self.pending
        while p and p[0][0] <= now:
            _, _, names = heapq.heappop(p)
            absent = self.cache.absent(SPACE, names)
            self.cache.store(SPACE, names, {i: (None, BLOCK_TOKENS) for i in absent})

    def reuse(self, names: list[bytes], prompt_tokens: int, now: float) -> int:
        """Prompt tokens a request starting its prefill now skips (whole chunks, never the
        last token)."""
        self._settle(now)
        limit = (prompt_tokens - 1) // BLOCK_TOKENS  # blocks before the last token
        if limit < REUSE_ALIGN // BLOCK_TOKENS:
            return 0
        found = self.cache.match(SPACE, names[:limit])
        n = len(found) * BLOCK_TOKENS // REUSE_ALIGN * REUSE_ALIGN
        if n:
            self.cache.note_reuse(n)
            self.hits += 1
            self.reused_tokens += n
        return n

    def keep(self, names: list[bytes], at: float) -> None:
        """The prompt named ``names`` finishes its prefill at ``at``: its blocks are kept then."""
        if names:
            self.seq += 1
            heapq.heappush(self.pending, (at, self.seq, names))

    def finished(self, model: str, prompt: tuple[int, ...], answer: tuple[int, ...]) -> None:
        """A request finished: queue its prompt and answer to be kept (``keep_answers``), from
        the prompt's whole chunks on (its blocks kept at its prefill's end)."""
        if not (self.keep_answers and answer):
            return
        start = (len(prompt) - 1) // REUSE_ALIGN * REUSE_ALIGN
        if len(self.answers) >= QUEUE:
            self.answers.pop(0)
        self.answers.append((names_of(model, prompt + answer), len(prompt) + len(answer) - start))

    def keep_answers_now(self, now: float, streams: int, step_s: float, prefill_tps: float,
                         prompts_waiting: bool) -> None:
        """Prefill the queued answers that can go now, one after another: none while a prompt
        waits; beside ``streams`` decoding (a step of ``step_s``) only where a chunk fits."""
        while self.answers and not prompts_waiting:
            names, tokens = self.answers[0]
            secs = answer_seconds(tokens, step_s, prefill_tps, streams)
            if secs is None:
                return
            self.answers.pop(0)
            self.answers_until = max(now, self.answers_until) + secs
            self.answers_kept += 1
            self.keep(names, self.answers_until)

    def serving(self, serving: tuple[Serving, ...], now: float) -> tuple[Serving, ...]:
        """What the node's advert says it serves now: ``serving`` with its prefix sketch."""
        self._settle(now)
        px = self.cache.sketch(SPACE)
        return tuple(dataclasses.replace(s, model_id=model_identity(s.model), prefix_sketch=px)
                     for s in serving)
