"""A stage's slotted KV cache: one cache row per sequence, many sequences per onnxruntime run.

``BatchStage`` holds, per layer of a stage, one key buffer ``[rows, kv_heads, head_dim, C]``
and one value buffer ``[rows, kv_heads, C, head_dim]`` (the graph's layout, ``graph.py``). A
sequence (``Slot``) owns one row; ``step(slots, x)`` runs ``T`` new tokens of each of the given
sequences in one call, each at its own position, and writes their keys and values into their
rows. The sequences of a step must occupy one contiguous run of rows, because onnxruntime reads
the cache in place (a leading slice of a C-contiguous buffer is contiguous): a step moves rows
to the front when the set changes (copying only the cached prefix of each moved row), and a
sequence that leaves hands its row to the last one. In steady decoding nothing moves.

``C`` is shared: it grows (by at least ``CACHE_CHUNK_TOKENS``, copying once) to the longest
sequence's need, and shrinks again when the long sequences have left, because attention reads
all ``C`` slots of every row (the unused ones are masked). Not thread-safe: one caller at a
time (the batch scheduler's worker thread, or a stage server's).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import onnxruntime as ort

from meshd.engine import graph as g
from meshd.errors import LocalError

if TYPE_CHECKING:
    from meshd.engine.runtime import Stage

CACHE_CHUNK_TOKENS = 64


class Slot:
    """One sequence's row in a ``BatchStage``: ``length`` tokens cached, at most ``max_tokens``."""

    __slots__ = ("length", "max_tokens", "row")

    def __init__(self, row: int, max_tokens: int) -> None:
        self.row = row
        self.length = 0
        self.max_tokens = max_tokens


class BatchStage:
    def __init__(self, stage: Stage) -> None:
        arch = stage.model.manifest.arch
        self.stage = stage
        self._shape = (arch.num_kv_heads, arch.head_dim)
        self._hidden = arch.hidden_size
        self._vocab = arch.vocab_size
        self._layers = list(range(stage.start, stage.end))
        self.slots: list[Slot] = []  # slots[i].row == i
        self._rows = 0
        self._capacity = 0
        self._keys: list[np.ndarray] = []
        self._values: list[np.ndarray] = []
        self._bindings: dict[str, tuple[ort.IOBinding, tuple[int, ...], list[np.ndarray]]] = {}
        self._generation = 0  # bumped when the buffers are reallocated (bindings go stale)
        self.runs = 0
        self.rows_moved = 0

    # ---------------------------------------------------------------- sequences

    def open(self, max_tokens: int) -> Slot:
        slot = Slot(len(self.slots), max_tokens)
        self.slots.append(slot)
        return slot

    def close(self, slot: Slot) -> None:
        """Free a sequence's row: the last row moves into it."""
        if slot.row < 0:
            return
        i, last = slot.row, self.slots[-1]
        if last is not slot:
            if last.length:  # a row that never ran has nothing cached (maybe no buffer yet)
                self._copy_row(last.row, i, last.length)
            last.row = i
            self.slots[i] = last
        self.slots.pop()
        slot.row = -1
        self._maybe_shrink()

    def memory_bytes(self) -> int:
        return sum(a.nbytes for a in self._keys) + sum(a.nbytes for a in self._values)

    @property
    def capacity(self) -> int:
        return self._capacity

    # ---------------------------------------------------------------- running

    def step(self, slots: list[Slot], x: np.ndarray, *, last_only: bool = True) -> np.ndarray:
        """Run ``T`` new tokens of each sequence in ``slots``: ``x`` is int64 ids [B, T] on a
        first stage, float32 hidden states [B, T, H] otherwise. Returns hidden states
        [B, T, H], or on the last stage logits [B, V] of each sequence's last token
        (``last_only``) or [B*T, V]."""
        n = len(slots)
        if n == 0:
            raise LocalError("a batch step needs at least one sequence")
        t = int(x.shape[1])
        for s in slots:
            if s.row < 0:
                raise LocalError("the sequence was closed")
            if s.length + t > s.max_tokens:
                raise LocalError(f"sequence is full: {s.length} + {t} tokens > "
                                 f"max_tokens={s.max_tokens}")
        self._ensure(max(s.length for s in slots) + t)
        lo = self._contiguous(slots)
        order = [s.row - lo for s in slots]  # x's row k goes to cache row lo + order[k]
        if order != list(range(n)):
            inv = np.argsort(order)
            x, slots = x[inv], [slots[k] for k in inv]
        else:
            inv = None
        lengths = np.array([s.length for s in slots], np.int64)
        positions = lengths[:, None] + np.arange(t, dtype=np.int64)[None, :]
        kind = "decode" if t == 1 else "prefill"
        k = n if (last_only and self.stage.is_last) else n * t
        b, outs = self._binding(kind, lo, n, t, k)
        b.bind_cpu_input(g.INPUT_IDS if self.stage.is_first else g.HIDDEN_IN,
                         np.ascontiguousarray(x))
        b.bind_cpu_input(g.POSITIONS, positions)
        if self.stage.is_last:
            rows = (np.arange(n, dtype=np.int64) * t + (t - 1)) if last_only else \
                np.arange(n * t, dtype=np.int64)
            b.bind_cpu_input(g.LOGIT_ROWS, rows)
        self.stage._run(b)
        self.runs += 1
        idx = np.arange(lo, lo + n)
        for j in range(len(self._layers)):
            nk, nv = outs[1 + 2 * j], outs[2 + 2 * j]
            if t == 1:
                self._keys[j][idx, :, :, lengths] = nk[:, :, :, 0]
                self._values[j][idx, :, lengths, :] = nv[:, :, 0, :]
            else:
                for r, s in enumerate(slots):
                    p = s.length
                    self._keys[j][lo + r, :, :, p:p + t] = nk[r]
                    self._values[j][lo + r, :, p:p + t] = nv[r]
        for s in slots:
            s.length += t
        out = outs[0].copy()
        if inv is not None:
            back = np.argsort(inv)
            if self.stage.is_last and not last_only:
                out = out.reshape(n, t, -1)[back].reshape(n * t, -1)
            else:
                out = out[back]
        return out

    def _contiguous(self, slots: list[Slot]) -> int:
        """Make the rows of ``slots`` one contiguous run (moving rows to the front if they are
        not); return its first row."""
        rows = sorted(s.row for s in slots)
        if rows[-1] - rows[0] == len(rows) - 1:
            return rows[0]
        for want, s in enumerate(sorted(slots, key=lambda s: s.row)):
            if s.row != want:
                self._swap(s, self.slots[want])
        return 0

    def _swap(self, a: Slot, b: Slot) -> None:
        ra, rb, la, lb = a.row, b.row, a.length, b.length
        for j in range(len(self._layers)):
            k, v = self._keys[j], self._values[j]
            tk, tv = k[ra, ..., :la].copy(), v[ra, :, :la].copy()
            k[ra, ..., :lb], v[ra, :, :lb] = k[rb, ..., :lb], v[rb, :, :lb]
            k[rb, ..., :la], v[rb, :, :la] = tk, tv
        a.row, b.row = rb, ra
        self.slots[ra], self.slots[rb] = b, a
        self.rows_moved += 2

    def _copy_row(self, src: int, dst: int, length: int) -> None:
        for j in range(len(self._layers)):
            self._keys[j][dst, ..., :length] = self._keys[j][src, ..., :length]
            self._values[j][dst, :, :length] = self._values[j][src, :, :length]
        self.rows_moved += 1

    # ---------------------------------------------------------------- buffers

    def _ensure(self, need: int) -> None:
        rows, cap = len(self.slots), self._capacity
        if need <= cap and rows <= self._rows:
            return
        if need > cap:
            grown = max(need, cap + max(CACHE_CHUNK_TOKENS, cap // 8))
            cap = -(-grown // CACHE_CHUNK_TOKENS) * CACHE_CHUNK_TOKENS
        self._realloc(self._rows if rows <= self._rows else max(rows, 2 * self._rows), cap)

    def _maybe_shrink(self) -> None:
        if not self.slots:  # idle: hand the memory back
            self._keys, self._values, self._rows, self._capacity = [], [], 0, 0
            self._bindings.clear()
            self._generation += 1
            return
        need = max(s.length for s in self.slots)
        if self._capacity > CACHE_CHUNK_TOKENS and need * 2 < self._capacity:
            self._realloc(self._rows, -(-(need + 1) // CACHE_CHUNK_TOKENS) * CACHE_CHUNK_TOKENS)

    def _realloc(self, rows: int, cap: int) -> None:
        kvh, d = self._shape
        keep = min(len(self.slots), rows, self._rows)
        span = min(max((s.length for s in self.slots), default=0), cap)
        keys, values = [], []
        for j in range(len(self._layers)):
            k = np.zeros((rows, kvh, d, cap), np.float32)
            v = np.zeros((rows, kvh, cap, d), np.float32)
            if keep and span:
                k[:keep, ..., :span] = self._keys[j][:keep, ..., :span]
                v[:keep, :, :span] = self._values[j][:keep, :, :span]
            keys.append(k)
            values.append(v)
        self._keys, self._values = keys, values
        self._rows, self._capacity = rows, cap
        self._generation += 1

    def _binding(self, kind: str, lo: int, n: int, t: int,
                 k: int) -> tuple[ort.IOBinding, list[np.ndarray]]:
        """An IO binding whose cache inputs are rows [lo, lo+n) and whose outputs are numpy
        buffers of the step's shape; reused while nothing changed (every decode step)."""
        key = (self._generation, lo, n, t, k)
        held = self._bindings.get(kind)
        if held is not None and held[1] == key:
            return held[0], held[2]
        b = held[0] if held is not None else self.stage._session.io_binding()
        for j, layer in enumerate(self._layers):
            b.bind_ortvalue_input(g.past_key(layer),
                                  ort.OrtValue.ortvalue_from_numpy(self._keys[j][lo:lo + n]))
            b.bind_ortvalue_input(g.past_value(layer),
                                  ort.OrtValue.ortvalue_from_numpy(self._values[j][lo:lo + n]))
        kvh, d = self._shape
        main = (k, self._vocab) if self.stage.is_last else (n, t, self._hidden)
        outs = [np.empty(main, np.float32)]
        for _ in self._layers:
            outs += [np.empty((n, kvh, d, t), np.float32), np.empty((n, kvh, t, d), np.float32)]
        b.clear_binding_outputs()
        for name, arr in zip(self.stage.output_names, outs, strict=True):
            b.bind_ortvalue_output(name, ort.OrtValue.ortvalue_from_numpy(arr))
        self._bindings[kind] = (b, key, outs)
        return b, outs
