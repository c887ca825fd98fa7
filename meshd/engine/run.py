"""Drive a ``Generation`` over a whole-model stage session: prefill, then one decode step per
token. ``generate_sync`` runs onnxruntime inline (for the CLI); ``generate_async`` runs each step
in a worker thread under a ``trio.CapacityLimiter`` so many requests share one model.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from meshd.engine.generation import Generation, TokenEvent
from meshd.engine.sampling import GenerationConfig
from meshd.errors import LocalError

if TYPE_CHECKING:
    from meshd.engine.runtime import Model, StageSession


def _prepare(model: Model, prompt: str | list[int], cfg: GenerationConfig | None,
             chat: bool) -> tuple[list[int], Generation, StageSession]:
    cfg = cfg or GenerationConfig()
    if model.layers != (0, model.num_layers):
        lo, hi = model.layers
        raise LocalError(f"generation needs every layer; this model loaded [{lo}, {hi})")
    ids = model.encode_prompt(prompt, chat=chat)
    if not ids:
        raise LocalError("the prompt is empty")
    ctx = model.context_length
    if len(ids) >= ctx:
        raise LocalError(f"the prompt has {len(ids)} tokens; the model's context is {ctx}")
    max_new = min(cfg.max_tokens, ctx - len(ids))
    session = model.stage(0, model.num_layers).open_session(max_tokens=len(ids) + max_new)
    return ids, Generation(ids, cfg, model.tokenizer, max_new_tokens=max_new), session


def _prefill_args(ids: list[int]) -> tuple[np.ndarray, np.ndarray]:
    return np.asarray(ids, dtype=np.int64), np.arange(len(ids), dtype=np.int64)


def _decode_args(token: int, position: int) -> tuple[np.ndarray, np.ndarray]:
    return np.array([token], dtype=np.int64), np.array([position], dtype=np.int64)


def generate_sync(model: Model, prompt: str | list[int], cfg: GenerationConfig | None = None,
                  *, chat: bool = False) -> Iterator[TokenEvent]:
    ids, gen, session = _prepare(model, prompt, cfg, chat)
    try:
        logits = session.step(*_prefill_args(ids), last_only=True)
        while True:
            event = gen.feed(logits[-1])
            yield event
            if event.finish_reason is not None:
                return
            logits = session.step(*_decode_args(event.token_id, session.length), last_only=True)
    finally:
        session.free()


async def generate_async(model: Model, prompt: str | list[int],
                         cfg: GenerationConfig | None = None, *, chat: bool = False,
                         limiter: Any = None) -> AsyncIterator[TokenEvent]:
    import trio

    limiter = limiter if limiter is not None else model.limiter
    ids, gen, session = _prepare(model, prompt, cfg, chat)

    async def step(x: np.ndarray, pos: np.ndarray) -> np.ndarray:
        call = functools.partial(session.step, x, pos, last_only=True)
        result: np.ndarray = await trio.to_thread.run_sync(call, limiter=limiter)
        return result

    try:
        logits = await step(*_prefill_args(ids))
        while True:
            event = gen.feed(logits[-1])
            yield event
            if event.finish_reason is not None:
                return
            logits = await step(*_decode_args(event.token_id, session.length))
    finally:
        session.free()
