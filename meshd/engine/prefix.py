"""Prefix reuse on a stage: restore a prompt's cached blocks into a cache row, keep a finished
row's blocks (docs/engine.md, "Prefix cache").

``StagePrefixes`` binds a model's ``PrefixCache`` (``meshd.core.prefix_cache``) to one stage:
its blocks are stored under the stage's layer range, named by ``block_hashes`` over the model's
content hash. It reads and writes a row through the cache *views* the stage exposes (per layer
a key and a value buffer of one row, ``BatchStage.cache``, ``StageSession.cache``), so the only
thing it knows of the layout is which axis of each holds the tokens (``TOKEN_AXES``, by the
graph's ``KV_LAYOUT``). A block's payload is a copy of its tokens' keys and values, per layer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from meshd.core.prefix_cache import PrefixCache, block_hashes, layer_space
from meshd.engine import graph as g
from meshd.errors import ModelError

# The token axis of a key buffer and of a value buffer, per KV layout (graph.KV_LAYOUT).
TOKEN_AXES = {"3": (3, 2), "4": (2, 2)}  # 3: keys [B, kvh, d, C]; 4: keys and values [B, kvh, C, d]
if g.KV_LAYOUT not in TOKEN_AXES:
    raise ModelError(f"the prefix cache does not know KV layout {g.KV_LAYOUT!r} (TOKEN_AXES)")
_KEY_AXIS, _VALUE_AXIS = TOKEN_AXES[g.KV_LAYOUT]


def _span(view: np.ndarray, axis: int, a: int, b: int) -> np.ndarray:
    return view[(slice(None),) * axis + (slice(a, b),)]


def _axis(j: int) -> int:
    return _KEY_AXIS if j % 2 == 0 else _VALUE_AXIS


class StagePrefixes:
    """A model's prefix cache as the stage of layers ``[start, end)`` uses it."""

    def __init__(self, cache: PrefixCache, identity: str, start: int, end: int) -> None:
        self.cache = cache
        self.identity = identity
        self.space = layer_space(start, end)
        self.block = cache.block_tokens

    def names(self, ids: Sequence[int]) -> list[bytes]:
        return block_hashes(ids, self.identity, self.block)

    def reuse(self, ids: Sequence[int], limit: int, align: int,
              grow: Callable[[int], list[np.ndarray]], *, count: bool = True) -> int:
        """Restore the longest cached prefix of ``ids`` into a row, cut to a multiple of
        ``align`` (the caller's prefill chunk: the chunks after it start where they would
        have without it) and to at most ``limit`` tokens: ``grow(n)`` makes the row hold
        ``n`` tokens and returns its views. Returns the tokens restored (0: none, and
        ``grow`` is not called); the caller sets the row's length. ``count``: a request's
        reuse, in the cache's statistics (a finished answer kept again is not)."""
        return self.restore(self.names(ids[:max(limit, 0)]), align, grow, count=count)

    def restore(self, names: Sequence[bytes], align: int,
                grow: Callable[[int], list[np.ndarray]], *, count: bool = True) -> int:
        """``reuse`` by the prompt's block names (a pipeline's middle stage never sees the
        token ids: the entry node names them): at most ``len(names)`` blocks."""
        found = self.cache.match(self.space, names, count=count) if names else []
        n = len(found) * self.block // align * align
        if not n:
            return 0
        found = found[:-(-n // self.block)]
        views = grow(n)
        for j, view in enumerate(views):
            ax = _axis(j)
            whole = np.concatenate([p[j] for p in found], axis=ax)
            _span(view, ax, 0, n)[...] = _span(whole, ax, 0, n)
        if count:
            self.cache.note_reuse(n)
        return n

    def keep(self, ids: Sequence[int], views: list[np.ndarray]) -> int:
        """Store the full blocks of ``ids`` (whose keys and values are the first ``len(ids)``
        tokens of the row ``views``, computed by prefill) that are not stored yet. Returns the
        blocks added."""
        return self.keep_names(self.names(ids), views)

    def keep_names(self, names: Sequence[bytes], views: list[np.ndarray]) -> int:
        """``keep`` by block names: block ``i`` of the row is stored as ``names[i]``."""
        if not names:
            return 0
        new: dict[int, tuple[Any, int]] = {}
        for i in self.cache.absent(self.space, names):
            a, b = i * self.block, (i + 1) * self.block
            parts = [_span(v, _axis(j), a, b).copy() for j, v in enumerate(views)]
            new[i] = (parts, sum(p.nbytes for p in parts))
        self.cache.store(self.space, names, new)
        return len(new)

def stage_prefixes(cache: PrefixCache | None, identity: str, start: int,
                   end: int) -> StagePrefixes | None:
    """The stage's view of a model's prefix cache (None: the model keeps none)."""
    return None if cache is None else StagePrefixes(cache, identity, start, end)
