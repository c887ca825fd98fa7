"""Bounds of the semantic cache: entry size, expiry and which entries to evict.

Pure functions: counts, sizes and timestamps come in (the time is passed in), decisions come
out. The store asks the database for the least recently used rows and lets
``choose_victims`` pick among them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

# Per-row overhead beyond the texts and the vector: ids, timestamps, partition, index links.
ROW_OVERHEAD_BYTES = 200


@dataclass(frozen=True, slots=True)
class CacheLimits:
    """A cache holds at most ``max_entries`` answers and ``max_bytes`` of them (prompt and
    answer text, vector, overhead: ``entry_bytes``); each lives ``ttl_s`` seconds from when it
    was stored, used or not."""

    max_entries: int = 100_000
    max_bytes: int = 512 * 2**20
    ttl_s: float = 7 * 24 * 3600.0

    def __post_init__(self) -> None:
        if self.max_entries < 1 or self.max_bytes < 1 or not self.ttl_s > 0:
            raise ValueError("cache limits must be positive")


@dataclass(frozen=True, slots=True)
class Candidate:
    """A row that may be evicted."""

    entry_id: int
    last_used: float
    nbytes: int


def entry_bytes(prompt: str, answer: str, dim: int) -> int:
    return len(prompt.encode()) + len(answer.encode()) + 4 * dim + ROW_OVERHEAD_BYTES


def expires_at(created: float, limits: CacheLimits) -> float:
    return created + limits.ttl_s


def overflow(entries: int, nbytes: int, incoming_bytes: int, limits: CacheLimits
             ) -> tuple[int, int]:
    """How many entries and bytes must go before one more entry of ``incoming_bytes`` fits.
    A cache full by its entry count frees a hundredth of ``max_entries`` more than that (none
    below 100 entries): its vector graph pays a pass over all its nodes after each removal
    (``meshd.cache.index``), once per hundred inserts rather than at each."""
    over = entries + 1 - limits.max_entries
    return (over + limits.max_entries // 100 if over > 0 else 0,
            max(0, nbytes + incoming_bytes - limits.max_bytes))


def choose_victims(candidates: Sequence[Candidate], entries_over: int, bytes_over: int
                   ) -> list[int]:
    """Least recently used first (ties: the older id first) until both excesses are covered.
    ``candidates`` may be any superset of the oldest rows; an empty list means nothing to do."""
    out: list[int] = []
    freed = 0
    for c in sorted(candidates, key=lambda c: (c.last_used, c.entry_id)):
        if len(out) >= entries_over and freed >= bytes_over:
            break
        out.append(c.entry_id)
        freed += c.nbytes
    return out
