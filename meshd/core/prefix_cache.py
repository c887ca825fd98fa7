"""The KV prefix cache's index: blocks of tokens, named by chained hashes, kept LRU under a budget.

A prompt is cut into blocks of ``BLOCK_TOKENS`` (32) tokens; block ``i`` is named by a hash
chained over the model's identity and every token of blocks ``0..i`` (``block_hashes``, in
``meshd.core.prefix_names``: the entry node names a request's blocks the same way), so equal
names mean equal prefixes, and a block's name says nothing without the blocks before it. The
size: small enough that a prompt reuses most of a shared prefix, large enough that a 2,048-token
prompt is 64 blocks to look up and copy, and a divisor of every prefill chunk (multiples of 16
from 32 on, 128), so that a reuse cut to whole chunks loses no block. The KV of a
block depends on the layers that computed it too, so a block is stored under its name *and* the
stage's layer range (``space``): each stage of a pipeline keeps its own layers' KV of a prefix.

``PrefixCache`` holds opaque payloads (the engine's copies of the block's keys and values,
``meshd.engine.prefix``; nothing in the simulator, which models which blocks each node holds
with this very index, ``meshd.sim.prefixes``) and their sizes, least recently used first, and evicts from that end
while the total is over the budget. A lookup (``match``) returns the longest run of stored
blocks from the first; it and ``store`` touch a chain from its last block to its first, so the
first blocks of a chain are the most recently used and a chain is evicted from its tail (a block
whose predecessor is gone can never match). Thread-safe (one lock): the batch scheduler, stage
servers and single-stream generations of one model share it from worker threads. No I/O.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from meshd.core.prefix_names import BLOCK_TOKENS, block_hashes, sketch

__all__ = ["BLOCK_TOKENS", "PrefixCache", "block_hashes", "layer_space"]


def layer_space(start: int, end: int) -> str:
    """The key a stage's blocks are stored under beside their names: its layer range."""
    return f"{start}-{end}"

class PrefixCache:
    """Stored blocks ``(space, name) -> (payload, bytes)``, LRU under ``budget_bytes``."""

    def __init__(self, budget_bytes: int, *, block_tokens: int = BLOCK_TOKENS) -> None:
        if budget_bytes < 0:
            raise ValueError("budget_bytes must be >= 0")
        self.budget_bytes = budget_bytes
        self.block_tokens = block_tokens
        # (space, name) -> (payload, bytes, depth: 1 for a prompt's first block)
        self._blocks: OrderedDict[tuple[str, bytes], tuple[Any, int, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self._changes = 0  # lookups and stores so far: what the last sketch was made after
        self._sketch: tuple[tuple[str, int], bytes] | None = None
        self.stats = {"lookups": 0, "hits": 0, "reused_tokens": 0, "stored_blocks": 0,
                      "evicted_blocks": 0}

    def match(self, space: str, names: Sequence[bytes], *, count: bool = True) -> list[Any]:
        """The payloads of the longest run of stored blocks ``names[0], names[1], ...``
        (``count``: a request's lookup, in the statistics; an engine's own is not)."""
        with self._lock:
            found: list[Any] = []
            for name in names:
                entry = self._blocks.get((space, name))
                if entry is None:
                    break
                found.append(entry[0])
            self._touch(space, names[:len(found)])
            self.stats["lookups"] += count
            return found

    def note_reuse(self, tokens: int) -> None:
        """A lookup's blocks were used: ``tokens`` of a prompt were not prefilled."""
        if tokens > 0:
            with self._lock:
                self.stats["hits"] += 1
                self.stats["reused_tokens"] += tokens

    def absent(self, space: str, names: Sequence[bytes]) -> list[int]:
        """The indices of ``names`` not stored (what ``store`` would add)."""
        with self._lock:
            return [i for i, n in enumerate(names) if (space, n) not in self._blocks]

    def store(self, space: str, names: Sequence[bytes], new: dict[int, tuple[Any, int]]) -> int:
        """Add the blocks ``new`` (index in ``names`` -> payload, bytes), touch the chain
        ``names`` and evict the least recently used blocks past the budget. Returns how many
        blocks were evicted."""
        with self._lock:
            for i, (payload, size) in sorted(new.items()):
                key = (space, names[i])
                if key in self._blocks or size > self.budget_bytes:
                    continue
                self._blocks[key] = (payload, size, i + 1)
                self._bytes += size
                self.stats["stored_blocks"] += 1
            self._touch(space, names)
            evicted = 0
            while self._bytes > self.budget_bytes and self._blocks:
                _, (_, size, _) = self._blocks.popitem(last=False)
                self._bytes -= size
                evicted += 1
            self.stats["evicted_blocks"] += evicted
            return evicted

    def _touch(self, space: str, names: Sequence[bytes]) -> None:
        self._changes += 1
        for name in reversed(names):  # the chain's first block ends most recent
            key = (space, name)
            if key in self._blocks:
                self._blocks.move_to_end(key)

    def sketch(self, space: str) -> bytes:
        """What a node advertises of the prefixes ``space`` holds (``prefix_names.sketch``): a
        Bloom filter of its blocks at chunk depths, most recently used first, at most 512 bytes.
        Kept until a lookup or a store changes what it would be."""
        with self._lock:
            key = (space, self._changes)
            if self._sketch is not None and self._sketch[0] == key:
                return self._sketch[1]
            held = [(name, e[2]) for (sp, name), e in reversed(self._blocks.items()) if sp == space]
            out = sketch(held)
            self._sketch = (key, out)
            return out

    def __contains__(self, key: tuple[str, bytes]) -> bool:
        with self._lock:
            return key in self._blocks

    def statistics(self) -> dict[str, Any]:
        with self._lock:
            return {"budget_bytes": self.budget_bytes, "bytes": self._bytes,
                    "blocks": len(self._blocks), "block_tokens": self.block_tokens,
                    **self.stats}
