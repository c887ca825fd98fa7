"""Continuous batching of a whole model's generations (docs/engine.md, "Continuous batching").

``BatchScheduler`` is the synchronous part, run by one worker thread at a time: each ``step()``
prefills one chunk of the oldest waiting prompt (at most ``chunk_tokens`` tokens, so a long
prompt never holds up the running streams for more than one chunk), then runs one decode step
of every sequence that is generating, all in one onnxruntime call, and samples each
sequence's next token with its own ``Generation`` (its own seed and settings). Sequences join
and leave between steps (``add``, ``cancel``; applied by the caller between steps).

``Batcher`` is the trio side: one scheduler task per model (``run``) that calls ``step()`` in a
worker thread under the model's limiter while there is work, and hands each sequence's tokens to
its consumer (``generate``) through a memory channel.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import time
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from meshd.engine.batch import BatchStage, Slot
from meshd.engine.generation import Generation, TokenEvent
from meshd.engine.sampling import GenerationConfig

if TYPE_CHECKING:
    from meshd.engine.runtime import Model

log = logging.getLogger(__name__)

# Prompt tokens prefilled between two decode steps, when the model has no measured speed yet.
DEFAULT_CHUNK_TOKENS = 64
# A chunk is sized to take about this long (from the measured prefill speed), between these bounds.
CHUNK_BUDGET_MS = 50.0
MIN_CHUNK_TOKENS, MAX_CHUNK_TOKENS = 16, 128
EWMA = 0.3


def chunk_tokens(budget_ms: float, ms_per_token: float) -> int:
    """Prompt tokens per prefill chunk: as many as fit ``budget_ms`` at the measured speed
    (``ms_per_token``, 0: unknown), a multiple of 16 within [MIN, MAX]."""
    if ms_per_token <= 0:
        return DEFAULT_CHUNK_TOKENS
    n = int(budget_ms / ms_per_token) // 16 * 16
    return max(MIN_CHUNK_TOKENS, min(MAX_CHUNK_TOKENS, n))


@dataclass(eq=False)
class BatchSequence:
    """One generation in the batch."""

    ids: list[int]
    gen: Generation
    max_tokens: int
    slot: Slot | None = None
    prefilled: int = 0
    last: int = -1  # the token to feed at the next decode step
    events: list[TokenEvent] = field(default_factory=list)  # made by the current step
    channel: Any = None  # trio send channel (the Batcher's)

    @property
    def decoding(self) -> bool:
        return self.slot is not None and self.prefilled == len(self.ids)


class BatchScheduler:
    def __init__(self, model: Model, *, chunk_budget_ms: float = CHUNK_BUDGET_MS,
                 max_batch: int = 64) -> None:
        self.model = model
        self.stage = BatchStage(model.stage(0, model.num_layers))
        self.chunk_budget_ms = chunk_budget_ms
        self.max_batch = max_batch
        self.waiting: deque[BatchSequence] = deque()  # prompts not (fully) prefilled, oldest first
        self.running: list[BatchSequence] = []  # generating
        self.prefill_ms_per_token = 0.0
        self.decode_ms: dict[int, float] = {}  # batch size -> EWMA of a decode step's ms
        self.stats = {"steps": 0, "decode_runs": 0, "prefill_chunks": 0, "tokens": 0,
                      "max_batch_seen": 0, "joined": 0, "left": 0}
        self.last_chunk = 0

    def add(self, seq: BatchSequence) -> None:
        self.waiting.append(seq)
        self.stats["joined"] += 1

    def remove(self, seq: BatchSequence) -> None:
        """Drop a sequence (finished or abandoned) and free its cache row."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        else:
            return
        if seq.slot is not None:
            self.stage.close(seq.slot)
            seq.slot = None
        self.stats["left"] += 1

    @property
    def busy(self) -> bool:
        return bool(self.waiting or self.running)

    def calibrate(self, tokens: int = 32, max_batch: int = 8) -> None:
        """Measure the prefill speed (a ``tokens``-token prompt) and a decode step at batch
        sizes 1, 2, 4, ... ``max_batch`` on scratch rows, so the first real chunk is already
        sized to the budget and the speed curve is known before traffic refines it."""
        sizes = [1 << k for k in range(max(max_batch, 1).bit_length()) if 1 << k <= max_batch]
        slots = [self.stage.open(tokens + 2) for _ in range(sizes[-1])]
        try:
            for _ in range(2):  # the first run pays onnxruntime's first-run costs
                slots[0].length = 0
                t0 = time.perf_counter()
                self.stage.step([slots[0]], np.ones((1, tokens), np.int64))
                per = (time.perf_counter() - t0) * 1000 / tokens
            self.prefill_ms_per_token = per
            for b in sizes:
                for s in slots[:b]:
                    s.length = 1
                t0 = time.perf_counter()
                self.stage.step(slots[:b], np.ones((b, 1), np.int64))
                self.note_decode(b, (time.perf_counter() - t0) * 1000)
        finally:
            for s in reversed(slots):
                self.stage.close(s)

    def curve(self, max_batch: int) -> tuple[float, ...]:
        """Aggregate decode tokens/s at batch sizes 1, 2, 4, ... up to ``max_batch`` (0 where
        not measured): what the advert carries (``batch_tps``)."""
        out: list[float] = []
        b = 1
        while b <= max_batch and len(out) < 12:
            ms = self.decode_ms.get(b, 0.0)
            out.append(round(b * 1000.0 / ms, 1) if ms > 0 else 0.0)
            b *= 2
        return tuple(out)

    def note_decode(self, batch: int, ms: float) -> None:
        """Fold one decode step's duration into the measured curve (step ms by batch size)."""
        old = self.decode_ms.get(batch, 0.0)
        self.decode_ms[batch] = ms if old <= 0 else (1 - EWMA) * old + EWMA * ms

    def chunk(self) -> int:
        return chunk_tokens(self.chunk_budget_ms, self.prefill_ms_per_token)

    def step(self) -> list[BatchSequence]:
        """One scheduling step; returns the sequences that made tokens (in ``.events``).
        Finished sequences are removed before it returns."""
        out: list[BatchSequence] = []
        joined: BatchSequence | None = None
        if self.waiting and len(self.running) < self.max_batch:
            seq = self.waiting[0]
            if seq.slot is None:
                seq.slot = self.stage.open(seq.max_tokens)
            n = min(self.chunk(), len(seq.ids) - seq.prefilled)
            self.last_chunk = n
            x = np.asarray(seq.ids[seq.prefilled:seq.prefilled + n], np.int64)[None]
            t0 = time.perf_counter()
            logits = self.stage.step([seq.slot], x, last_only=True)
            if n >= 16:  # short chunks say more about the fixed cost than the speed
                per = (time.perf_counter() - t0) * 1000 / n
                old = self.prefill_ms_per_token
                self.prefill_ms_per_token = per if old <= 0 else (1 - EWMA) * old + EWMA * per
            self.stats["prefill_chunks"] += 1
            seq.prefilled += n
            if seq.prefilled == len(seq.ids):
                self.waiting.popleft()
                ev = seq.gen.feed(logits[0])
                seq.events.append(ev)
                out.append(seq)
                if ev.finish_reason is None:
                    seq.last = ev.token_id
                    self.running.append(seq)
                    joined = seq
                else:
                    self.stage.close(seq.slot)
                    seq.slot = None
                    self.stats["left"] += 1
        batch = [s for s in self.running if s is not joined]
        if batch:
            x = np.array([[s.last] for s in batch], np.int64)
            slots = [s.slot for s in batch]
            assert all(sl is not None for sl in slots)
            t0 = time.perf_counter()
            logits = self.stage.step(slots, x, last_only=True)  # type: ignore[arg-type]
            self.note_decode(len(batch), (time.perf_counter() - t0) * 1000)
            self.stats["decode_runs"] += 1
            self.stats["max_batch_seen"] = max(self.stats["max_batch_seen"], len(batch))
            for row, s in enumerate(batch):
                ev = s.gen.feed(logits[row])
                s.events.append(ev)
                s.last = ev.token_id
                out.append(s)
                if ev.finish_reason is not None:
                    self.remove(s)
        self.stats["steps"] += 1
        self.stats["tokens"] += len(out)
        return out

    def statistics(self) -> dict[str, Any]:
        return {**self.stats, "running": len(self.running), "waiting": len(self.waiting),
                "chunk_tokens": self.chunk(), "kv_bytes": self.stage.memory_bytes(),
                "rows_moved": self.stage.rows_moved,
                "prefill_ms_per_token": round(self.prefill_ms_per_token, 3),
                "decode_ms_by_batch": {str(b): round(ms, 3)
                                       for b, ms in sorted(self.decode_ms.items())}}


def prepare(model: Model, prompt: str | list[int], cfg: GenerationConfig | None,
            chat: bool) -> BatchSequence:
    """Check and encode a prompt into a sequence for the batch (the same rules as
    ``run.generate_sync``)."""
    from meshd.engine.run import check_prompt

    cfg = cfg or GenerationConfig()
    ids, max_new = check_prompt(model, prompt, cfg, chat)
    gen = Generation(ids, cfg, model.tokenizer, max_new_tokens=max_new)
    return BatchSequence(ids=ids, gen=gen, max_tokens=len(ids) + max_new)


class Batcher:
    """The model's batch scheduler task and the streams it serves."""

    def __init__(self, model: Model, *, limiter: Any = None,
                 chunk_budget_ms: float = CHUNK_BUDGET_MS, max_batch: int = 64,
                 calibrate_batch: int = 8) -> None:
        import trio

        self.sched = BatchScheduler(model, chunk_budget_ms=chunk_budget_ms, max_batch=max_batch)
        self.model = model
        self.calibrate_batch = calibrate_batch
        self._limiter = limiter
        self._joins: list[BatchSequence] = []
        self._leaves: list[BatchSequence] = []
        self._wake = trio.Event()
        self.running = False
        self.stall_ms: list[float] = []  # duration of each step that ran a prefill chunk

    async def run(self, *, task_status: Any = None) -> None:
        import trio

        limiter = self._limiter if self._limiter is not None else self.model.limiter
        self.running = True
        if task_status is not None:
            task_status.started()
        try:
            if self.sched.prefill_ms_per_token <= 0:
                try:
                    await trio.to_thread.run_sync(
                        functools.partial(self.sched.calibrate, max_batch=self.calibrate_batch),
                        limiter=limiter)
                except Exception as err:  # the first request will report a model that cannot run
                    log.warning("batch calibration failed model=%s error=%s",
                                self.model.manifest.name, err)
            while True:
                self._apply()
                if not self.sched.busy:
                    await self._wake.wait()
                    self._wake = trio.Event()
                    continue
                try:
                    done = await trio.to_thread.run_sync(self.sched.step, limiter=limiter)
                except Exception as err:  # onnxruntime failed: every sequence in it fails
                    log.warning("batch step failed model=%s error=%s",
                                self.model.manifest.name, err)
                    for seq in list(self.sched.running) + list(self.sched.waiting):
                        with contextlib.suppress(trio.BrokenResourceError,
                                                 trio.ClosedResourceError):
                            seq.channel.send_nowait(err)
                        self.sched.remove(seq)
                    continue
                for seq in done:
                    events, seq.events = seq.events, []
                    try:
                        seq.channel.send_nowait(events)
                    except (trio.BrokenResourceError, trio.ClosedResourceError):
                        self._leaves.append(seq)
        finally:
            self.running = False
            for seq in list(self.sched.running) + list(self.sched.waiting) + self._joins:
                seq.channel.close()
                self.sched.remove(seq)

    def _apply(self) -> None:
        for seq in self._leaves:
            self.sched.remove(seq)
        for seq in self._joins:
            self.sched.add(seq)
        self._joins, self._leaves = [], []

    def statistics(self) -> dict[str, Any]:
        return self.sched.statistics()

    async def generate(self, prompt: str | list[int], cfg: GenerationConfig | None = None, *,
                       chat: bool = False) -> AsyncIterator[TokenEvent]:
        """Stream one generation through the batch (the scheduler task must be running)."""
        import trio

        seq = prepare(self.model, prompt, cfg, chat)
        send, recv = trio.open_memory_channel[Any](math.inf)
        seq.channel = send
        self._joins.append(seq)
        self._wake.set()
        try:
            async with recv:
                async for item in recv:
                    if isinstance(item, BaseException):
                        raise item
                    for ev in item:
                        yield ev
                        if ev.finish_reason is not None:
                            return
        finally:
            if seq in self._joins:
                self._joins.remove(seq)
            else:
                self._leaves.append(seq)
                self._wake.set()
