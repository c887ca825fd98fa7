"""Continuous batching of a whole model's generations (docs/engine.md, "Continuous batching").

``BatchScheduler`` is the synchronous part, run by one worker thread at a time: each ``step()``
runs one decode step of every sequence that is generating together with one chunk of the
oldest waiting prompt (at most ``chunk_tokens`` tokens, on the prompt's own cache row) in one
onnxruntime call (``fused.FusedStep``), so a long prompt adds one chunk's arithmetic to the
running streams' step and no pass over the weights; it samples each sequence's next token with
its own ``Generation`` (its own seed and settings). A prompt whose last chunk is done joins the
decoding rows (``BatchStage.adopt``, into buffers ``BatchStage.prepare`` made a layer a step).
Sequences join and leave between steps (``add``, ``remove``; applied by the caller between
steps).

``Batcher`` is the trio side: one scheduler task per model (``run``) that calls ``step()`` in a
worker thread under the model's limiter while there is work, and hands each sequence's tokens to
its consumer (``generate``) through a memory channel.

Constrained rows (a request with a grammar: ``meshd.engine.constrain``) get their next-token
masks computed together, in one parallel llguidance call per step, before each row is sampled;
the time it takes is kept per step (``mask_trace``). A request with ``n`` > 1 choices is one
prompt, prefilled once: when its last chunk is done, each choice samples its first token from
the same logits and joins the decoding rows with its own copy of the prompt's cache.

With a prefix cache, a finished answer's KV is kept too (``keep_answers``): the next turn of a
conversation resends the prompt and the answer, and only prefilled KV may be reused (a decode
step computes a token's keys and values with other kernels than a prefill chunk). So the
finished sequence (prompt and generated tokens) is queued as a *warm* sequence: lowest
priority, prefilled chunk by chunk only while no prompt waits (restoring the prompt's cached
blocks first, so only the answer is computed), never sampled, its blocks kept when done. Beside
decoding streams its chunk may add at most a quarter of their step (``meshd.core.answer_keep``;
else it waits for a step with no stream). A prompt that arrives pauses it between two steps
(what it prefilled is kept; it resumes from there later). Its keys and values are a prefill's,
so reusing them gives the same tokens as prefilling the whole history.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import math
import time
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from meshd.core.answer_keep import CHUNK_MULTIPLE, answer_chunk
from meshd.core.answer_keep import QUEUE as WARM_QUEUE
from meshd.engine.batch import BatchStage, Slot
from meshd.engine.fused import FusedStep
from meshd.engine.generation import Generation, TokenEvent
from meshd.engine.loaded import LoadedModel
from meshd.engine.prefix import StagePrefixes
from meshd.engine.run import check_prompt
from meshd.engine.sampling import GenerationConfig
from meshd.errors import LocalError, ModelError
from meshd.modeldir.pages import trim_heap

log = logging.getLogger(__name__)

# Prompt tokens prefilled between two decode steps, when the model has no measured speed yet.
DEFAULT_CHUNK_TOKENS = 64
# A chunk is sized to take about this long (from the measured prefill speed), between these bounds.
CHUNK_BUDGET_MS = 50.0
MIN_CHUNK_TOKENS, MAX_CHUNK_TOKENS = CHUNK_MULTIPLE, 128
EWMA = 0.3
TRACE_STEPS = 4096


def chunk_tokens(budget_ms: float, ms_per_token: float) -> int:
    """Prompt tokens per prefill chunk: as many as fit ``budget_ms`` at the measured speed
    (``ms_per_token``, 0: unknown), a multiple of 16 within [MIN, MAX]."""
    if ms_per_token <= 0:
        return DEFAULT_CHUNK_TOKENS
    n = int(budget_ms / ms_per_token) // CHUNK_MULTIPLE * CHUNK_MULTIPLE
    return max(MIN_CHUNK_TOKENS, min(MAX_CHUNK_TOKENS, n))


@dataclass(eq=False)
class BatchSequence:
    """One generation in the batch."""

    ids: list[int]
    gen: Generation
    max_tokens: int
    slot: Slot | None = None
    prefilled: int = 0
    cached: int = 0  # of the prompt's tokens, those restored from the prefix cache
    last: int = -1  # the token to feed at the next decode step
    events: list[TokenEvent] = field(default_factory=list)  # made by the current step
    channel: Any = None  # trio send channel (the Batcher's)
    forks: list[BatchSequence] = field(default_factory=list)  # choices 1.. (n > 1), same channel
    warm: bool = False  # a finished answer prefilled again for the prefix cache (never sampled)

    @property
    def decoding(self) -> bool:
        return self.slot is not None and self.prefilled == len(self.ids)


class BatchScheduler:
    def __init__(self, model: LoadedModel, *, chunk_budget_ms: float = CHUNK_BUDGET_MS,
                 max_batch: int = 64, fused: bool = True, keep_answers: bool = False) -> None:
        self.model = model
        whole = model.stage(0, model.num_layers)
        self.stage = BatchStage(whole)  # the decoding sequences' rows
        self.pre = BatchStage(whole)  # the prompt being prefilled: its own row, sized once
        self.chunk_budget_ms = chunk_budget_ms
        self.max_batch = max_batch
        self.use_fused = fused  # decode step and prompt chunk in one call (``fused.py``)
        self._fused: FusedStep | None = None
        self.waiting: deque[BatchSequence] = deque()  # prompts not (fully) prefilled, oldest first
        self.running: list[BatchSequence] = []  # generating
        # finished answers to prefill again while no prompt waits (``keep_answers``), oldest first
        self.keep_answers = keep_answers
        self.warming: deque[BatchSequence] = deque()
        # ms a prompt token adds to a step: with fusing, what a chunk adds to a decode step;
        # without, a chunk's own run over its tokens
        self.prefill_ms_per_token = 0.0
        self.decode_ms: dict[int, float] = {}  # batch size -> EWMA of a decode step's ms
        self.stats = {"steps": 0, "decode_runs": 0, "prefill_chunks": 0, "fused_runs": 0,
                      "tokens": 0, "max_batch_seen": 0, "joined": 0, "left": 0,
                      "answers_kept": 0, "answer_tokens_prefilled": 0, "answers_paused": 0,
                      "answers_dropped": 0}
        self.last_chunk = 0
        # the last steps: (start, ms, what ran: decode / chunk / fused, +prepare, +join)
        self.trace: deque[tuple[float, float, str]] = deque(maxlen=TRACE_STEPS)
        # the last steps with constrained rows: (rows masked, ms computing their masks)
        self.mask_trace: deque[tuple[int, float]] = deque(maxlen=TRACE_STEPS)

    def add(self, seq: BatchSequence) -> None:
        self.waiting.append(seq)
        self.stats["joined"] += 1

    def remove(self, seq: BatchSequence) -> None:
        """Drop a sequence (finished or abandoned) and free its cache row."""
        if seq in self.running:
            self.running.remove(seq)
            stage = self.stage
        elif seq in self.waiting:
            self.waiting.remove(seq)
            stage = self.pre
        else:
            return
        if seq.slot is not None:
            if stage is self.pre:  # an abandoned prompt: the chunks prefilled so far
                self._keep_and_free(seq)
            else:
                stage.close(seq.slot)
                seq.slot = None
        self.stats["left"] += 1

    def _keep_and_free(self, seq: BatchSequence) -> None:
        """Keep the blocks a prompt row's prefill made (what it has prefilled so far) and free
        the row."""
        assert seq.slot is not None
        self._keep(self.pre, seq.slot, seq.ids)
        self.pre.close(seq.slot)
        seq.slot = None

    @property
    def prefixes(self) -> StagePrefixes | None:
        """The model's prefix cache as the whole-model rows use it (None: it keeps none)."""
        return self.model.prefixes(0, self.model.num_layers)

    @property
    def busy(self) -> bool:
        return bool(self.waiting or self.running or self.warming)

    def drop_answers(self) -> None:
        """Forget the finished answers not yet kept (their rows freed)."""
        while self.warming:
            seq = self.warming.popleft()
            if seq.slot is not None:
                self.pre.close(seq.slot)
                seq.slot = None
            self.stats["answers_dropped"] += 1

    def _answer_done(self, seq: BatchSequence) -> None:
        """Queue a finished sequence's prompt and answer to be prefilled again (``keep_answers``)
        when that adds a full block to what its prompt kept: one choice (``n`` = 1), not
        abandoned (that goes through ``remove`` alone)."""
        px, ids = self.prefixes, seq.gen.history
        if not self.keep_answers or seq.forks or seq.gen.choice or px is None:
            return
        if len(ids) // px.block <= len(seq.ids) // px.block:
            return
        if not px.cache.absent(px.space, px.names(ids)):  # kept already (the same answer)
            return
        if len(self.warming) >= WARM_QUEUE:  # the oldest not being prefilled goes
            del self.warming[1 if self.warming[0].slot is not None else 0]
            self.stats["answers_dropped"] += 1
        self.warming.append(BatchSequence(ids=list(ids), gen=seq.gen, max_tokens=len(ids) + 1,
                                          warm=True))

    def _pause_answer(self) -> None:
        """A prompt waits: the answer being prefilled gives up its row, keeping its blocks so
        far (it resumes from them)."""
        self._keep_and_free(self.warming[0])
        self.stats["answers_paused"] += 1

    def _next_prompt(self) -> BatchSequence | None:
        """The sequence whose chunk this step prefills: the oldest waiting prompt, else the
        oldest finished answer to keep (None: no room in the batch, or nothing)."""
        if len(self.running) >= self.max_batch:
            return None
        if self.waiting:
            if self.warming and self.warming[0].slot is not None:
                self._pause_answer()
            return self.waiting[0]
        return self.warming[0] if self.warming else None

    def fused_step(self) -> FusedStep | None:
        """The fused decode-and-chunk step (built on first use; None when switched off or
        the fused graph cannot be built, then chunks run between decode steps)."""
        if self._fused is None and self.use_fused:
            try:
                self._fused = FusedStep(self.model.stage(0, self.model.num_layers, fused=True))
            except (LocalError, ModelError) as err:
                log.warning("fused batch step unavailable model=%s error=%s",
                            self.model.manifest.name, err)
                self.use_fused = False
        return self._fused

    def calibrate(self, tokens: int = 32, max_batch: int = 8) -> None:
        """Measure the prefill speed (a ``tokens``-token prompt), a decode step at batch
        sizes 1, 2, 4, ... ``max_batch`` on scratch rows, and what a chunk adds to a decode
        step when fused, so the first real chunk is already sized to the budget and the speed
        curve is known before traffic refines it."""
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
            fused = self.fused_step()
            if fused is not None:
                p = self.pre.open(tokens)
                try:
                    for _ in range(2):
                        p.length, slots[0].length = 0, 1
                        t0 = time.perf_counter()
                        fused.run(self.stage, slots[:1], np.ones((1, 1), np.int64), self.pre, p,
                                  np.ones(tokens, np.int64), chunk_logits=True)
                        ms = (time.perf_counter() - t0) * 1000
                    extra = (ms - self.decode_ms.get(1, 0.0)) / tokens
                    self.prefill_ms_per_token = max(extra, per / 4)
                finally:
                    self.pre.close(p)
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

    def _note_chunk(self, n: int, ms: float) -> None:
        if n < 16:  # short chunks say more about the fixed cost than the speed
            return
        per = ms / n
        old = self.prefill_ms_per_token
        self.prefill_ms_per_token = per if old <= 0 else (1 - EWMA) * old + EWMA * per

    def chunk(self) -> int:
        return chunk_tokens(self.chunk_budget_ms, self.prefill_ms_per_token)

    def answer_chunk(self) -> int:
        """Tokens of a finished answer to prefill this step (``keep_answers``): a whole chunk
        with no stream decoding, else what adds at most a quarter of the streams' measured step
        (``meshd.core.answer_keep``; 0: none this step)."""
        n = len(self.running)
        return answer_chunk(self.decode_ms.get(n, 0.0), self.prefill_ms_per_token, self.chunk(), n)

    def step(self) -> list[BatchSequence]:
        """One scheduling step; returns the sequences that made tokens (in ``.events``).
        Finished sequences are removed before it returns."""
        out: list[BatchSequence] = []
        start = time.perf_counter()
        what: list[str] = []
        seq: BatchSequence | None = None
        chunk = np.zeros(0, np.int64)
        final = False
        seq = self._next_prompt()
        room = self.chunk()
        if seq is not None and seq.warm:  # a finished answer: what fits beside the streams
            room = self.answer_chunk()
            if not room:
                seq = None
        if seq is not None:
            if seq.slot is None:
                seq.slot = self.pre.open(seq.max_tokens)
                seq.prefilled = seq.cached = self._reuse(seq.slot, seq.ids, count=not seq.warm)
            n = min(room, len(seq.ids) - seq.prefilled)
            if seq.prefilled + n > self.pre.capacity:  # its row doubles: few copies of one row,
                # and a chunk's attention reads at most twice the slots it needs
                self.pre.reserve(min(len(seq.ids), max(seq.prefilled + n, 2 * self.pre.capacity)))
            self.last_chunk = n
            chunk = np.asarray(seq.ids[seq.prefilled:seq.prefilled + n], np.int64)
            final = seq.prefilled + n == len(seq.ids)
        batch = list(self.running)
        slots = [s.slot for s in batch]
        assert all(sl is not None for sl in slots)
        ids = np.array([[s.last] for s in batch], np.int64)
        fused = self.fused_step() if (seq is not None and batch) else None
        first: np.ndarray | None = None
        logits: np.ndarray | None = None
        if fused is not None and seq is not None and seq.slot is not None:
            t0 = time.perf_counter()
            logits, first = fused.run(self.stage, slots, ids, self.pre,  # type: ignore[arg-type]
                                      seq.slot, chunk, chunk_logits=final and not seq.warm)
            ms = (time.perf_counter() - t0) * 1000
            self._note_chunk(len(chunk), ms - self.decode_ms.get(len(batch), ms))
            self.stats["fused_runs"] += 1
            what.append("fused")
        else:
            if seq is not None and seq.slot is not None:
                t0 = time.perf_counter()
                first = self.pre.step([seq.slot], chunk[None], last_only=True)[0]
                what.append("chunk")
                if not self.use_fused:
                    self._note_chunk(len(chunk), (time.perf_counter() - t0) * 1000)
            if batch:
                t0 = time.perf_counter()
                logits = self.stage.step(slots, ids, last_only=True)  # type: ignore[arg-type]
                self.note_decode(len(batch), (time.perf_counter() - t0) * 1000)
                what.append("decode")
        if batch:
            self.stats["decode_runs"] += 1
            self.stats["max_batch_seen"] = max(self.stats["max_batch_seen"], len(batch))
        if seq is not None and seq.slot is not None:
            self.stats["prefill_chunks"] += 1
            seq.prefilled += len(chunk)
            if seq.warm:
                if final:  # the answer's blocks are kept: the next turn reuses them
                    self.warming.popleft()
                    self._keep_and_free(seq)
                    self.stats["answers_kept"] += 1
                self.stats["answer_tokens_prefilled"] += len(chunk)
            elif final and first is not None:
                self.waiting.popleft()
                members = [seq, *seq.forks]  # every choice samples from the prompt's logits
                src = seq.slot
                for m, allowed in zip(members, self._masks(members), strict=True):
                    ev = dataclasses.replace(m.gen.feed(first, allowed), cached_tokens=seq.cached)
                    m.events.append(ev)
                    out.append(m)
                    m.slot = None
                    if ev.finish_reason is None:  # joins the decoding rows (a copy of its cache)
                        m.slot = self.stage.adopt(self.pre, src, keep=True)
                        m.last = ev.token_id
                        self.running.append(m)
                    else:
                        self.stats["left"] += 1
                self._keep(self.pre, src, seq.ids)
                self.pre.close(src)
                if any(m.slot is not None for m in members):
                    what.append("join")
            elif batch:  # the rows' buffers for the join, spread over the chunks left
                left = -(-(len(seq.ids) - seq.prefilled) // max(self.chunk(), 1)) - 1
                if self.stage.prepare(len(seq.ids) + 1, steps=left, extra_rows=1 + len(seq.forks)):
                    what.append("prepare")
        if logits is not None:
            masks = self._masks(batch)
            for row, s in enumerate(batch):
                ev = s.gen.feed(logits[row], masks[row])
                s.events.append(ev)
                s.last = ev.token_id
                out.append(s)
                if ev.finish_reason is not None:
                    self.remove(s)
                    self._answer_done(s)
        self.stats["steps"] += 1
        self.stats["tokens"] += len(out)
        self.trace.append((start, (time.perf_counter() - start) * 1000, "+".join(what)))
        return out

    def _reuse(self, slot: Slot, ids: list[int], *, count: bool = True) -> int:
        """Restore the longest cached prefix of a prompt into its row, in whole chunks (the
        chunks after it start where they would have without it) and leaving at least its last
        token to prefill, for the first token's logits; returns its length."""
        px = self.prefixes
        if px is None:
            return 0

        def grow(n: int) -> list[np.ndarray]:
            self.pre.reserve(n)
            return self.pre.cache(slot.row, 1)

        slot.length = px.reuse(ids, len(ids) - 1, self.chunk(), grow, count=count)
        return slot.length

    def _keep(self, stage: BatchStage, slot: Slot, ids: list[int]) -> None:
        """Keep the full blocks a prompt's prefill put in its row (``ids``: the prompt). Only
        prefilled tokens are kept: a decode step computes a token's keys and values with other
        kernels (one row) than a prefill chunk, and a quantized model's next layers turn that
        difference in the last bits into different tokens."""
        px = self.prefixes
        if px is not None and slot.length:
            px.keep(ids[:slot.length], stage.cache(slot.row, 1))

    def _masks(self, seqs: list[BatchSequence]) -> list[np.ndarray | None]:
        """The grammar masks of the constrained ``seqs`` (None for the others), in one call."""
        rows = [i for i, s in enumerate(seqs) if s.gen.constrained]
        out: list[np.ndarray | None] = [None] * len(seqs)
        if rows:
            from meshd.engine.constrain import fill_masks

            t0 = time.perf_counter()
            masks = fill_masks([seqs[i].gen.matcher() for i in rows])
            self.mask_trace.append((len(rows), (time.perf_counter() - t0) * 1000))
            for i, m in zip(rows, masks, strict=True):
                out[i] = m
        return out

    def statistics(self) -> dict[str, Any]:
        return {**self.stats, "running": len(self.running), "waiting": len(self.waiting),
                "answers_waiting": len(self.warming),
                "chunk_tokens": self.chunk(), "fused": self.use_fused,
                "kv_bytes": self.stage.memory_bytes() + self.pre.memory_bytes(),
                "prepared_bytes": self.stage.prepared_bytes,
                "zeroed_at_join": self.stage.zeroed_at_join,
                "rows_moved": self.stage.rows_moved,
                "prefill_ms_per_token": round(self.prefill_ms_per_token, 3),

                "decode_ms_by_batch": {str(b): round(ms, 3)
                                       for b, ms in sorted(self.decode_ms.items())}}


def prepare(model: LoadedModel, prompt: str | list[int], cfg: GenerationConfig | None,
            chat: bool) -> BatchSequence:
    """Check and encode a prompt into a sequence for the batch (the same rules as
    ``run.generate_sync``)."""
    cfg = cfg or GenerationConfig()
    ids, max_new = check_prompt(model, prompt, cfg, chat)
    gen = Generation(ids, cfg, model.tokenizer, max_new_tokens=max_new)
    seq = BatchSequence(ids=ids, gen=gen, max_tokens=len(ids) + max_new)
    seq.forks = [BatchSequence(ids=ids, gen=Generation(ids, cfg, model.tokenizer,
                                                       max_new_tokens=max_new, choice=i),
                               max_tokens=len(ids) + max_new) for i in range(1, cfg.n)]
    return seq


def warm_grammar(model: LoadedModel) -> None:
    """Build llguidance's view of the model's vocabulary now (0.35 s for SmolLM2's 49k tokens,
    2 s for Gemma 3's 262k)."""
    from meshd.engine.constrain import grammar_tokenizer

    grammar_tokenizer(model.tokenizer)
    trim_heap()  # what it built the view with, freed but kept by the C heap (~4 MiB)


class Batcher:
    """The model's batch scheduler task and the streams it serves."""

    def __init__(self, model: LoadedModel, *, limiter: Any = None,
                 chunk_budget_ms: float = CHUNK_BUDGET_MS, max_batch: int = 64,
                 calibrate_batch: int = 8) -> None:
        import trio

        self.sched = BatchScheduler(model, chunk_budget_ms=chunk_budget_ms, max_batch=max_batch,
                                    keep_answers=model.keep_answers)
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
                try:  # llguidance's view of the vocabulary, so no request waits for it
                    await trio.to_thread.run_sync(warm_grammar, self.model, limiter=limiter)
                except Exception as err:  # constrained requests will fail with the reason
                    log.warning("grammar engine unavailable model=%s error=%s",
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
                    self.sched.drop_answers()
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
            self.sched.drop_answers()

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
        for f in seq.forks:
            f.channel = send
        self._joins.append(seq)
        self._wake.set()
        open_choices = 1 + len(seq.forks)
        try:
            async with recv:
                async for item in recv:
                    if isinstance(item, BaseException):
                        raise item
                    for ev in item:
                        yield ev
                        if ev.finish_reason is not None:
                            open_choices -= 1
                            if not open_choices:
                                return
        finally:
            if seq in self._joins:
                self._joins.remove(seq)
            else:
                self._leaves.extend([seq, *seq.forks])
                self._wake.set()
