"""Batched steps of one stage for many pipeline sessions (the stage server's side of batching).

A ``StageBatcher`` owns a ``BatchStage`` (one KV row per session) and a trio task (``run``)
that collects the steps its sessions ask for (``StageHandle.step``) and runs them together:
every pending one-token step (decode) in one onnxruntime call, plus at most one chunk of one
pending multi-token step (a prompt), so a long prompt holds the decoding sessions up for one
chunk at a time. Every change to the rows (open, free) is applied by that task between runs,
in the worker thread, so nothing touches the cache while onnxruntime reads it.

With the model's prefix cache on (docs/engine.md, "Prefix cache"), a session can restore the
longest cached block prefix of its tokens before its first step (``StageHandle.reuse``: this
stage's layers only; a pipeline cuts every stage back to the shortest, ``truncate``) and keeps
its blocks when it is freed with its tokens (``free(tokens)``). A middle stage, which never sees
the token ids, does both by the prompt's block names, which the entry node computes
(``reuse(names=...)``, ``free(names=...)``).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from meshd.engine.batch import BatchStage, Slot
from meshd.errors import LocalError, MeshdError

if TYPE_CHECKING:
    from meshd.engine.runtime import Stage

log = logging.getLogger(__name__)

PREFILL_CHUNK_TOKENS = 128  # as StageSession: bounds the attention buffers of a prompt


@dataclass(eq=False)
class _Job:
    slot: Slot
    x: np.ndarray  # [T] ids or [T, H] hidden states
    last_only: bool
    done: Any  # trio.Event
    offset: int = 0
    parts: list[np.ndarray] = field(default_factory=list)
    result: np.ndarray | None = None
    error: BaseException | None = None


@dataclass(eq=False)
class _Reuse:
    slot: Slot
    ids: list[int] | None  # the prompt's ids, or (None) its block names
    names: list[bytes] | None
    limit: int
    done: Any  # trio.Event
    tokens: int = 0
    error: BaseException | None = None


class StageHandle:
    """One session's row; the interface of ``StageSession`` with an async ``step``."""

    def __init__(self, owner: StageBatcher, slot: Slot) -> None:
        self._owner = owner
        self.slot = slot
        self.freed = False

    @property
    def length(self) -> int:
        return self.slot.length

    @property
    def max_tokens(self) -> int:
        return self.slot.max_tokens

    def memory_bytes(self) -> int:
        rows = max(len(self._owner.batch.slots), 1)
        return 0 if self.freed else self._owner.batch.memory_bytes() // rows

    def free(self, tokens: Sequence[int] | None = None, *,
             names: Sequence[bytes] | None = None) -> None:
        """Release the row; with ``tokens`` (the prompt: tokens this row prefilled, not
        decoded), or their block ``names`` (``meshd.core.prefix_names``), their full blocks
        are kept in the model's prefix cache first."""
        if not self.freed:
            self.freed = True
            kept = (list(tokens) if tokens is not None else None,
                    list(names) if names is not None else None)
            self._owner._closes.append((self.slot, *kept))
            self._owner._poke()

    async def reuse(self, ids: Sequence[int] | None = None, limit: int | None = None, *,
                    names: Sequence[bytes] | None = None) -> int:
        """Before the first step: restore the longest cached prefix of ``ids`` (whole
        prefill chunks, at most ``limit`` tokens; default all but the last) into this row,
        or of the prompt whose block ``names`` are given (a middle stage never sees ids; at
        most those blocks). Returns the tokens restored: the first step starts at that
        position (0: nothing cached, or no cache). Keep only prefilled tokens' blocks
        (``free``)."""
        import trio

        if self.freed or self.slot.length:
            raise LocalError("a prefix is restored into a fresh session only")
        if names is not None:
            job = _Reuse(self.slot, None, [bytes(n) for n in names], self.slot.max_tokens,
                         trio.Event())
        else:
            ids = list(ids or [])
            limit = len(ids) - 1 if limit is None else min(limit, len(ids))
            job = _Reuse(self.slot, [int(i) for i in ids], None,
                         min(limit, self.slot.max_tokens), trio.Event())
        self._owner._reuses.append(job)
        self._owner._poke()
        await job.done.wait()
        if job.error is not None:
            raise job.error
        return job.tokens

    def truncate(self, n: int) -> None:
        """Forget every cached token from position ``n`` on (a pipeline's stages agree on the
        shortest restored prefix). Only between steps."""
        if not 0 <= n <= self.slot.length:
            raise LocalError(f"cannot truncate a session of {self.slot.length} tokens to {n}")
        self.slot.length = n

    async def step(self, x: np.ndarray, positions: np.ndarray, *,
                   last_only: bool = False) -> np.ndarray:
        import trio

        if self.freed:
            raise LocalError("stage session was freed")
        t = int(np.asarray(positions).shape[0])
        if t < 1 or positions[0] != self.slot.length:
            raise LocalError(f"positions must start at {self.slot.length}")
        if self.slot.length + t > self.slot.max_tokens:
            raise LocalError(f"session is full: {self.slot.length} + {t} tokens > "
                             f"max_tokens={self.slot.max_tokens}")
        job = _Job(self.slot, x, last_only, trio.Event())
        self._owner._jobs.append(job)
        self._owner._poke()
        await job.done.wait()
        if job.error is not None:
            raise job.error
        assert job.result is not None
        return job.result


class StageBatcher:
    def __init__(self, stage: Stage, *, limiter: Any = None) -> None:
        import trio

        self.stage = stage
        self.batch = BatchStage(stage)
        self._limiter = limiter
        self._opens: list[Slot] = []
        self._closes: list[tuple[Slot, list[int] | None, list[bytes] | None]] = []
        self._reuses: list[_Reuse] = []
        self._jobs: list[_Job] = []
        self._wake = trio.Event()
        self._busy = False
        self.stats = {"runs": 0, "decode_runs": 0, "decode_steps": 0, "prefill_chunks": 0,
                      "max_batch_seen": 0}

    def open(self, max_tokens: int) -> StageHandle:
        ctx = self.stage.model.manifest.arch.max_position_embeddings
        if not 1 <= max_tokens <= ctx:
            raise LocalError(f"max_tokens={max_tokens} must be in [1, {ctx}] (the context)")
        slot = Slot(-1, max_tokens)
        self._opens.append(slot)
        return StageHandle(self, slot)

    @property
    def pending(self) -> bool:
        """Steps or row changes not run yet."""
        return bool(self._jobs or self._opens or self._closes or self._reuses) or self._busy

    def _poke(self) -> None:
        self._wake.set()

    async def run(self, *, task_status: Any = None) -> None:
        import trio

        limiter = self._limiter if self._limiter is not None else self.stage.model.limiter
        if task_status is not None:
            task_status.started()
        while True:
            if not (self._jobs or self._closes or self._opens or self._reuses):
                await self._wake.wait()
                self._wake = trio.Event()
                continue
            # let the sessions woken by the last round ask for their next step first, so they
            # join this round instead of the next
            await trio.lowlevel.checkpoint()
            opens, closes, jobs, reuses = self._opens, self._closes, self._jobs, self._reuses
            self._opens, self._closes, self._jobs, self._reuses = [], [], [], []
            decode = [j for j in jobs if len(j.x) == 1]
            prefill = [j for j in jobs if len(j.x) > 1]
            chunk = prefill[0] if prefill else None
            self._busy = True
            try:
                await trio.to_thread.run_sync(self._work, opens, closes, decode, chunk, reuses,
                                              limiter=limiter)
            except Exception as err:  # every step of the round fails, never the server
                if not isinstance(err, MeshdError):
                    log.exception("stage batch round failed layers=%d-%d", self.stage.start,
                                  self.stage.end)
                    err = MeshdError(f"stage batch round failed: {err!r}")
                for j in decode + ([chunk] if chunk is not None else []):
                    j.error = err
                for r in reuses:
                    r.error = r.error or err
            finally:
                self._busy = False
            for r in reuses:
                r.done.set()
            for j in decode:
                j.done.set()
            if chunk is not None and (chunk.error is not None or chunk.result is not None):
                chunk.done.set()
                prefill = prefill[1:]
            self._jobs = prefill + self._jobs  # the prompt's next chunk, then the others

    def _work(self, opens: list[Slot],
              closes: list[tuple[Slot, list[int] | None, list[bytes] | None]],
              decode: list[_Job], chunk: _Job | None, reuses: list[_Reuse] | None = None) -> None:
        """In the worker thread: apply row changes (prefixes restored and kept), then one
        batched decode step and at most one prompt chunk."""
        px = self.stage.model.prefixes(self.stage.start, self.stage.end)
        for slot in opens:
            slot.row = len(self.batch.slots)
            self.batch.slots.append(slot)
        for slot, tokens, names in closes:
            if slot.row >= 0:
                if px is not None and tokens is not None and slot.length:
                    px.keep(tokens[:slot.length], self.batch.cache(slot.row, 1))
                elif px is not None and names and slot.length:
                    px.keep_names(names[:slot.length // px.block], self.batch.cache(slot.row, 1))
                self.batch.close(slot)
        for r in reuses or []:
            if r.slot.row < 0:
                r.error = LocalError("stage session was freed")
            elif px is not None and not r.slot.length:
                grow = functools.partial(self._grow, r.slot)
                r.tokens = r.slot.length = (
                    px.reuse(r.ids, r.limit, PREFILL_CHUNK_TOKENS, grow) if r.ids is not None
                    else px.restore((r.names or [])[:r.limit // px.block], PREFILL_CHUNK_TOKENS,
                                    grow))
        self._round(decode, chunk)

    def _grow(self, slot: Slot, n: int) -> list[np.ndarray]:
        self.batch.reserve(n)
        return self.batch.cache(slot.row, 1)

    def _round(self, decode: list[_Job], chunk: _Job | None) -> None:
        for j in [j for j in decode + ([chunk] if chunk else []) if j.slot.row < 0]:
            j.error = LocalError("stage session was freed")  # freed while its step waited
        decode = [j for j in decode if j.error is None]
        if chunk is not None and chunk.error is not None:
            chunk = None
        if decode:
            dtype = np.int64 if self.stage.is_first else np.float32
            x = np.stack([np.asarray(j.x, dtype) for j in decode])  # [B, 1] ids or [B, 1, H]
            out = self.batch.step([j.slot for j in decode], x, last_only=decode[0].last_only)
            self.stats["decode_runs"] += 1
            self.stats["decode_steps"] += len(decode)
            self.stats["max_batch_seen"] = max(self.stats["max_batch_seen"], len(decode))
            for row, j in enumerate(decode):
                j.result = out[row:row + 1] if self.stage.is_last else out[row]
        if chunk is not None:
            t = len(chunk.x)
            a, b = chunk.offset, min(t, chunk.offset + PREFILL_CHUNK_TOKENS)
            dtype = np.int64 if self.stage.is_first else np.float32
            out = self.batch.step([chunk.slot], np.asarray(chunk.x[a:b], dtype)[None],
                                  last_only=chunk.last_only)
            self.stats["prefill_chunks"] += 1
            chunk.offset = b
            out = out if self.stage.is_last else out[0]  # logits [K, V]; hidden [T, H]
            if not chunk.last_only or b == t:
                chunk.parts.append(out)
            if b == t:
                chunk.result = (chunk.parts[0] if len(chunk.parts) == 1
                                else np.concatenate(chunk.parts))
        self.stats["runs"] += 1

    def statistics(self) -> dict[str, Any]:
        return {**self.stats, "rows": len(self.batch.slots),
                "kv_bytes": self.batch.memory_bytes(), "rows_moved": self.batch.rows_moved,
                "prefill_chunk_tokens": PREFILL_CHUNK_TOKENS}
