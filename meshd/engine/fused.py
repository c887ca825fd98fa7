"""One onnxruntime call for a decode step and a prompt chunk together (docs/engine.md,
"Continuous batching": stall-free admission).

A decode step of a small batch is bound by reading the weights; a prompt chunk run on its own
reads them again. ``FusedStep`` runs both in the whole model's fused graph
(``graph.build_stage_graph(fused=True)``): the weight products go over the decoding rows' B
tokens and the chunk's T tokens at once, attention runs for the decoding rows against their
rows of the batch's cache and for the chunk against the prompt's own cache (a one-row
``BatchStage`` sized for the whole prompt). A running stream's step then costs one pass over
the weights plus the chunk's extra arithmetic, instead of a decode step plus a whole chunk.
Each row's arithmetic is the same as in a step of its own group, so a sequence's tokens do not
depend on what ran beside it (up to float32 rounding of the products, as in any batch).
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort

from meshd.engine import graph as g
from meshd.engine.batch import BatchStage, Slot
from meshd.engine.kvbind import bind_cache
from meshd.engine.loaded import CompiledStage
from meshd.errors import LocalError


class FusedStep:
    """Runs (decoding rows of ``main``) + (one chunk of a prompt in ``pre``) in one call."""

    def __init__(self, stage: CompiledStage) -> None:
        if not (stage.fused and stage.is_first and stage.is_last):
            raise LocalError("a fused step needs the whole model's fused stage")
        self.stage = stage
        self._layers = list(range(stage.start, stage.end))
        self._vocab = stage.model.manifest.arch.vocab_size
        self._binding: ort.IOBinding | None = None
        self._key: tuple[int, ...] = ()
        self._outs: list[np.ndarray] = []
        self.runs = 0

    def run(self, main: BatchStage, slots: list[Slot], ids: np.ndarray, pre: BatchStage,
            pslot: Slot, chunk: np.ndarray, *, chunk_logits: bool) -> tuple[np.ndarray,
                                                                            np.ndarray | None]:
        """``ids`` [B, 1] the decoding rows' next tokens (rows ``slots`` of ``main``), ``chunk``
        [T] the prompt's next tokens (``pslot``, the only row of ``pre``). Returns the rows'
        logits [B, V] in the order of ``slots`` and, with ``chunk_logits``, the logits of the
        chunk's last token [V]."""
        n, t = len(slots), int(chunk.shape[0])
        for s in slots:
            if s.length + 1 > s.max_tokens:
                raise LocalError(f"sequence is full: {s.length} + 1 tokens > "
                                 f"max_tokens={s.max_tokens}")
        if pslot.length + t > pslot.max_tokens:
            raise LocalError(f"sequence is full: {pslot.length} + {t} tokens > "
                             f"max_tokens={pslot.max_tokens}")
        main._ensure(max(s.length for s in slots) + 1)
        pre._ensure(pslot.length + t)
        lo, ordered, inv = main.order(slots)
        if inv is not None:
            ids = ids[inv]
        k = n + (1 if chunk_logits else 0)
        b, outs = self._bind(main, lo, n, pre, pslot.row, t, k)
        lengths = np.array([s.length for s in ordered], np.int64)
        b.bind_cpu_input(g.INPUT_IDS, np.ascontiguousarray(ids, np.int64))
        b.bind_cpu_input(g.POSITIONS, lengths[:, None])
        b.bind_cpu_input(g.CHUNK_IDS, np.ascontiguousarray(chunk, np.int64)[None])
        b.bind_cpu_input(g.CHUNK_POSITIONS,
                         (pslot.length + np.arange(t, dtype=np.int64))[None])
        rows = np.arange(n, dtype=np.int64)
        if chunk_logits:
            rows = np.append(rows, n + t - 1)
        b.bind_cpu_input(g.LOGIT_ROWS, rows)
        self.stage._run(b)  # writes both groups' new keys and values into their rows in place
        self.runs += 1
        main.advance(ordered, 1)
        pre.advance([pslot], t)
        logits = outs[0].copy()
        dec = logits[:n]
        if inv is not None:
            dec = dec[np.argsort(inv)]
        return dec, (logits[n] if chunk_logits else None)

    def release_buffers(self) -> None:
        """Let go of the cache buffers bound (one of the stages reallocates them)."""
        if self._binding is not None:
            self._binding.clear_binding_inputs()
            self._binding.clear_binding_outputs()
        self._binding, self._key, self._outs = None, (), []

    def _bind(self, main: BatchStage, lo: int, n: int, pre: BatchStage, prow: int, t: int,
              k: int) -> tuple[ort.IOBinding, list[np.ndarray]]:
        key = (id(main), main.generation, lo, n, id(pre), pre.generation, prow, t, k)
        if self._binding is not None and key == self._key:
            return self._binding, self._outs
        b = self._binding if self._binding is not None else self.stage._session.io_binding()
        main.hold(self)
        pre.hold(self)
        for prefix, views in (("", main.cache(lo, n)), (g.CHUNK, pre.cache(prow, 1))):
            bind_cache(b, self._layers, views[0::2], views[1::2], prefix)
        outs = [np.empty((k, self._vocab), np.float32)]
        b.bind_ortvalue_output(g.LOGITS, ort.OrtValue.ortvalue_from_numpy(outs[0]))
        self._binding, self._key, self._outs = b, key, outs
        return b, outs
