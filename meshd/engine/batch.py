"""A stage's slotted KV cache: one cache row per sequence, many sequences per onnxruntime run.

``BatchStage`` holds, per layer of a stage, one key and one value buffer
``[rows, kv_heads, C, head_dim]`` (the graph's layout, ``graph.py``). A sequence (``Slot``)
owns one row; ``step(slots, x)`` runs ``T`` new tokens of each of the given sequences in one
call, each at its own position, and onnxruntime writes their keys and values into their rows.
The sequences of a step must occupy one contiguous run of rows, because onnxruntime reads and
writes the cache in place (a leading slice of a C-contiguous buffer is contiguous): a step moves rows
to the front when the set changes (copying only the cached prefix of each moved row), and a
sequence that leaves hands its row to the last one. In steady decoding nothing moves.

``C`` is shared: it grows (by at least ``CACHE_CHUNK_TOKENS``, copying once) to the longest
sequence's need, and shrinks again when the long sequences have left, because attention reads
all ``C`` slots of every row (the unused ones are masked). Not thread-safe: one caller at a
time (the batch scheduler's worker thread, or a stage server's).
"""

from __future__ import annotations

import weakref
from typing import Protocol

import numpy as np
import onnxruntime as ort

from meshd.engine import graph as g
from meshd.engine import kvmem
from meshd.engine.kvbind import bind_cache
from meshd.engine.loaded import CompiledStage
from meshd.errors import LocalError

CACHE_CHUNK_TOKENS = 64
PREPARE_MIN_BYTES = 4 << 20  # zeroed ahead of a join at least this much a step
_EMPTY = np.zeros((0, 0, 0, 0), np.float32)  # stands in for a layer's dropped buffer


class BufferHolder(Protocol):
    """Something that binds a ``BatchStage``'s buffers to an IO binding of its own."""

    def release_buffers(self) -> None: ...


class Slot:
    """One sequence's row in a ``BatchStage``: ``length`` tokens cached, at most ``max_tokens``."""

    __slots__ = ("length", "max_tokens", "row")

    def __init__(self, row: int, max_tokens: int) -> None:
        self.row = row
        self.length = 0
        self.max_tokens = max_tokens


class BatchStage:
    def __init__(self, stage: CompiledStage) -> None:
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
        # others' bindings over these buffers (a fused step's): released before a reallocation
        self._holders: weakref.WeakSet[BufferHolder] = weakref.WeakSet()
        self._generation = 0  # bumped when the buffers are reallocated (bindings go stale)
        self.runs = 0
        self.rows_moved = 0
        # Buffers being made ahead of a join (``prepare``): the (rows, capacity) they are for,
        # per layer a key and a value buffer, and how many of their bytes (in that order) are
        # zeroed so far (fresh pages cost about 1.3 ms a MB to touch on the bench box).
        self._next: tuple[int, int] = (0, 0)
        self._next_kv: list[tuple[np.ndarray, np.ndarray]] = []
        self._next_done = 0
        self.prepared_bytes = 0  # zeroed ahead by ``prepare``
        self.zeroed_at_join = 0  # left for the reallocation itself to zero
        self.grown_into_prepared = 0  # reallocations that used prepared buffers

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

    def hold(self, holder: BufferHolder) -> None:
        """``holder`` binds these buffers elsewhere: it is told to let go before they are
        reallocated."""
        self._holders.add(holder)

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
        if n > 1 and t > 1 and any(s.length for s in slots):
            # onnxruntime's attention takes several new tokens of several sequences only when
            # none has cached anything: run them one sequence at a time
            outs = [self.step([s], x[k:k + 1], last_only=last_only) for k, s in enumerate(slots)]
            return np.concatenate(outs)
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
        self.stage._run(b)  # writes the new keys and values into rows lo.. in place
        self.runs += 1
        self.advance(slots, t)
        out = outs[0].copy()
        if inv is not None:
            back = np.argsort(inv)
            if self.stage.is_last and not last_only:
                out = out.reshape(n, t, -1)[back].reshape(n * t, -1)
            else:
                out = out[back]
        return out

    @staticmethod
    def advance(slots: list[Slot], t: int) -> None:
        """Count ``t`` more cached tokens for each of ``slots`` (a run wrote them in place)."""
        for s in slots:
            s.length += t

    def cache(self, lo: int, n: int) -> list[np.ndarray]:
        """Per layer the key and value buffers of rows [lo, lo+n) (views, read in place)."""
        out: list[np.ndarray] = []
        for j in range(len(self._layers)):
            out += [self._keys[j][lo:lo + n], self._values[j][lo:lo + n]]
        return out

    @property
    def generation(self) -> int:
        """Bumped whenever the buffers are reallocated (views from ``cache`` go stale)."""
        return self._generation

    def order(self, slots: list[Slot]) -> tuple[int, list[Slot], np.ndarray | None]:
        """Make ``slots`` one contiguous run of rows; return its first row, the slots in row
        order and the permutation applied (None: already in order)."""
        lo = self._contiguous(slots)
        order = [s.row - lo for s in slots]
        if order == list(range(len(slots))):
            return lo, slots, None
        inv = np.argsort(order)
        return lo, [slots[k] for k in inv], inv

    # ---------------------------------------------------------------- joins

    def reserve(self, need: int) -> None:
        """Grow the buffers now to hold ``need`` tokens a row (a prompt's own row, sized once
        for the whole prompt so that its chunks never reallocate)."""
        self._ensure(need)

    def prepare(self, need: int, steps: int = 1, extra_rows: int = 1) -> int:
        """Make the buffers that a join of ``extra_rows`` sequences needing ``need`` slots will
        grow into, zeroed (pages touched) a part a call: what is left over ``steps`` calls, so
        the join itself only copies the cached spans. Returns the bytes zeroed now."""
        target = self._target(len(self.slots) + extra_rows, need)
        if target is None:
            return 0
        if target != self._next:
            kvh, d = self._shape
            rows, cap = target
            self._next, self._next_done = target, 0
            self._next_kv = [(kvmem.zeros((rows, kvh, cap, d)), kvmem.zeros((rows, kvh, cap, d)))
                             for _ in self._layers]
        total = sum(k.nbytes + v.nbytes for k, v in self._next_kv)
        done = self._zero(max(PREPARE_MIN_BYTES, -(-(total - self._next_done) // max(steps, 1))))
        self.prepared_bytes += done
        return done

    def _zero(self, budget: int) -> int:
        """Zero up to ``budget`` more bytes of the buffers being prepared; returns how many."""
        done, pos, start = 0, 0, self._next_done
        budget -= budget % 4
        for pair in self._next_kv:
            for a in pair:
                lo, hi = max(start - pos, 0), min(a.nbytes, start + budget - pos)
                if lo < hi:
                    a.reshape(-1)[lo // 4:hi // 4] = 0.0
                    done += hi - lo
                pos += a.nbytes
        self._next_done += done
        return done

    def adopt(self, src: BatchStage, slot: Slot, *, keep: bool = False) -> Slot:
        """Move a sequence's cache from another ``BatchStage`` (its prompt's own row) into a
        new row here; ``slot`` is closed in ``src`` unless ``keep`` (a prompt shared by several
        choices is copied once for each). Returns its slot here."""
        mine = self.open(slot.max_tokens)
        self._ensure(slot.length + 1)
        n = slot.length
        for j in range(len(self._layers)):
            self._keys[j][mine.row, :, :n] = src._keys[j][slot.row, :, :n]
            self._values[j][mine.row, :, :n] = src._values[j][slot.row, :, :n]
        mine.length = n
        if not keep:
            src.close(slot)
        return mine

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
            tk, tv = k[ra, :, :la].copy(), v[ra, :, :la].copy()
            k[ra, :, :lb], v[ra, :, :lb] = k[rb, :, :lb], v[rb, :, :lb]
            k[rb, :, :la], v[rb, :, :la] = tk, tv
        a.row, b.row = rb, ra
        self.slots[ra], self.slots[rb] = b, a
        self.rows_moved += 2

    def _copy_row(self, src: int, dst: int, length: int) -> None:
        for j in range(len(self._layers)):
            self._keys[j][dst, :, :length] = self._keys[j][src, :, :length]
            self._values[j][dst, :, :length] = self._values[j][src, :, :length]
        self.rows_moved += 1

    # ---------------------------------------------------------------- buffers

    def _target(self, rows: int, need: int) -> tuple[int, int] | None:
        """The buffers' (rows, capacity) once ``rows`` sequences need ``need`` slots (None: the
        present buffers hold them)."""
        cap = max(self._capacity, need)
        if need <= self._capacity and rows <= self._rows:
            return None
        if need > self._capacity:
            grown = max(need, self._capacity + max(CACHE_CHUNK_TOKENS, self._capacity // 8))
            cap = -(-grown // CACHE_CHUNK_TOKENS) * CACHE_CHUNK_TOKENS
        return (self._rows if rows <= self._rows else max(rows, 2 * self._rows), cap)

    def _ensure(self, need: int) -> None:
        target = self._target(len(self.slots), need)
        if target is not None:
            self._realloc(*target)

    def _maybe_shrink(self) -> None:
        if not self.slots:  # idle: hand the memory back
            self._keys, self._values, self._rows, self._capacity = [], [], 0, 0
            self._next, self._next_kv, self._next_done = (0, 0), [], 0
            self._bindings.clear()
            self._generation += 1
            return
        need = max(s.length for s in self.slots)
        if self._capacity > CACHE_CHUNK_TOKENS and need * 2 < self._capacity:
            self._realloc(self._rows, -(-(need + 1) // CACHE_CHUNK_TOKENS) * CACHE_CHUNK_TOKENS)

    def _realloc(self, rows: int, cap: int) -> None:
        """New buffers of ``rows`` x ``cap`` slots holding the cached spans, made one layer at a
        time: each layer's old buffers are dropped as soon as their span is copied, so a growth
        holds one layer twice, not the whole cache (bindings made before go stale with the
        generation)."""
        kvh, d = self._shape
        keep = min(len(self.slots), rows, self._rows)
        span = min(max((s.length for s in self.slots), default=0), cap)
        ready: list[tuple[np.ndarray, np.ndarray]] = []
        if self._next == (rows, cap):  # made ahead by ``prepare`` (kept for a later growth if not)
            self.zeroed_at_join += self._zero(1 << 62)
            self.grown_into_prepared += 1
            ready, self._next, self._next_kv, self._next_done = self._next_kv, (0, 0), [], 0
        self._generation += 1
        # an IO binding holds the arrays bound to it: let go of them, so that each layer's old
        # buffers go when copied (the next step binds afresh: the generation changed)
        for holder in list(self._holders):
            holder.release_buffers()
        for b, _, _ in self._bindings.values():
            b.clear_binding_inputs()
            b.clear_binding_outputs()
        self._bindings.clear()
        old_k, old_v = self._keys, self._values
        self._keys, self._values = [], []
        for j in range(len(self._layers)):
            if j < len(ready):
                k, v = ready[j]
            else:
                k = kvmem.zeros((rows, kvh, cap, d))
                v = kvmem.zeros((rows, kvh, cap, d))
            if keep and span:
                k[:keep, :, :span] = old_k[j][:keep, :, :span]
                v[:keep, :, :span] = old_v[j][:keep, :, :span]
            if j < len(old_k):
                old_k[j] = old_v[j] = _EMPTY
            self._keys.append(k)
            self._values.append(v)
        self._rows, self._capacity = rows, cap

    def _binding(self, kind: str, lo: int, n: int, t: int,
                 k: int) -> tuple[ort.IOBinding, list[np.ndarray]]:
        """An IO binding whose cache inputs are rows [lo, lo+n) and whose outputs are numpy
        buffers of the step's shape; reused while nothing changed (every decode step)."""
        key = (self._generation, lo, n, t, k)
        held = self._bindings.get(kind)
        if held is not None and held[1] == key:
            return held[0], held[2]
        b = held[0] if held is not None else self.stage.binding()
        bind_cache(b, self._layers, [a[lo:lo + n] for a in self._keys],
                   [a[lo:lo + n] for a in self._values])
        main = (k, self._vocab) if self.stage.is_last else (n, t, self._hidden)
        outs = [np.empty(main, np.float32)]
        b.bind_ortvalue_output(self.stage.output_names[0], ort.OrtValue.ortvalue_from_numpy(outs[0]))
        self._bindings[kind] = (b, key, outs)
        return b, outs
