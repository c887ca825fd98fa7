"""Drive a ``Generation`` over a whole-model stage session: prefill, then one decode step per
token. ``generate_sync`` runs onnxruntime inline (for the CLI); ``generate_async`` runs the steps
in worker threads under a ``trio.CapacityLimiter`` so many requests share one model.

A hop into a worker thread and back costs about 240 us of CPU on a 2-core box, more than a whole
decode step of a small model (a 1-layer model steps in ~170 us), so ``generate_async`` does not
make one per token: the prefill and the first token come back alone (time to first token is
untouched), then each thread call runs decode steps, sampling included, for up to ``BURST_S``
and hands back every token it made. Tokens reach the consumer in groups at most ``BURST_S``
apart (well inside the 10 ms a forwarding hop coalesces anyway); another request waiting on the
same limiter waits at most one burst.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import numpy as np

from meshd.engine.generation import Generation, TokenEvent
from meshd.engine.loaded import LoadedModel
from meshd.engine.planning import PREFILL_CHUNK_TOKENS
from meshd.engine.protocols import StageSessionLike
from meshd.engine.sampling import GenerationConfig
from meshd.errors import LocalError

BURST_S = 0.004  # decode work per worker-thread call (the first token always comes alone)


def check_prompt(model: LoadedModel, prompt: str | list[int], cfg: GenerationConfig,
                 chat: bool) -> tuple[list[int], int]:
    """The prompt's token ids and how many tokens may follow them (errors for a partial
    model, an empty prompt or one that fills the context)."""
    if model.layers != (0, model.num_layers):
        lo, hi = model.layers
        raise LocalError(f"generation needs every layer; this model loaded [{lo}, {hi})")
    ids = model.encode_prompt(prompt, chat=chat)
    if not ids:
        raise LocalError("the prompt is empty")
    ctx = model.context_length
    if len(ids) >= ctx:
        raise LocalError(f"the prompt has {len(ids)} tokens; the model's context is {ctx}")
    return ids, min(cfg.max_tokens, ctx - len(ids))


def _prepare(model: LoadedModel, prompt: str | list[int], cfg: GenerationConfig | None,
             chat: bool) -> tuple[list[int], Generation, StageSessionLike]:
    cfg = cfg or GenerationConfig()
    if cfg.n > 1:
        raise LocalError("n > 1 decodes the choices as one batch: it needs [engine] batching")
    ids, max_new = check_prompt(model, prompt, cfg, chat)
    session = model.stage(0, model.num_layers).open_session(max_tokens=len(ids) + max_new)
    return ids, Generation(ids, cfg, model.tokenizer, max_new_tokens=max_new), session


def _prefill(model: LoadedModel, session: StageSessionLike, ids: list[int]) -> tuple[np.ndarray, int]:
    """Restore the prompt's longest cached prefix (the model's prefix cache, if it keeps one),
    cut to whole prefill chunks so that the chunks after it are the ones a prompt prefilled
    from its start runs, and at least the last token computed; prefill the rest and keep the
    prompt's blocks. Returns the last token's logits and the tokens restored."""
    px = model.prefixes(0, model.num_layers)
    if px is not None:
        def grow(n: int) -> list[np.ndarray]:
            session.reserve(n)
            return session.cache()

        session.restored(px.reuse(ids, len(ids) - 1, PREFILL_CHUNK_TOKENS, grow))
    n = session.length
    logits = session.step(np.asarray(ids[n:], dtype=np.int64),
                          np.arange(n, len(ids), dtype=np.int64), last_only=True)
    if px is not None:
        px.keep(ids, session.cache())
    return logits, n


def _decode_args(token: int, position: int) -> tuple[np.ndarray, np.ndarray]:
    return np.array([token], dtype=np.int64), np.array([position], dtype=np.int64)


def generate_sync(model: LoadedModel, prompt: str | list[int], cfg: GenerationConfig | None = None,
                  *, chat: bool = False) -> Iterator[TokenEvent]:
    ids, gen, session = _prepare(model, prompt, cfg, chat)
    try:
        logits, cached = _prefill(model, session, ids)
        event = dataclasses.replace(gen.feed(logits[-1]), cached_tokens=cached)
        while True:
            yield event
            if event.finish_reason is not None:
                return
            logits = session.step(*_decode_args(event.token_id, session.length), last_only=True)
            event = gen.feed(logits[-1])
    finally:
        session.free()


async def generate_async(model: LoadedModel, prompt: str | list[int],
                         cfg: GenerationConfig | None = None, *, chat: bool = False,
                         limiter: Any = None) -> AsyncIterator[TokenEvent]:
    import trio

    limiter = limiter if limiter is not None else model.limiter
    ids, gen, session = _prepare(model, prompt, cfg, chat)

    def prefill() -> list[TokenEvent]:
        logits, cached = _prefill(model, session, ids)
        return [dataclasses.replace(gen.feed(logits[-1]), cached_tokens=cached)]

    def decode(last: TokenEvent) -> list[TokenEvent]:
        out: list[TokenEvent] = []
        deadline = time.perf_counter() + BURST_S
        while True:
            logits = session.step(*_decode_args(last.token_id, session.length), last_only=True)
            last = gen.feed(logits[-1])
            out.append(last)
            if last.finish_reason is not None or time.perf_counter() >= deadline:
                return out

    try:
        events = await trio.to_thread.run_sync(prefill, limiter=limiter)
        while True:
            for event in events:
                yield event
                if event.finish_reason is not None:
                    return
            events = await trio.to_thread.run_sync(functools.partial(decode, events[-1]),
                                                   limiter=limiter)
    finally:
        session.free()
