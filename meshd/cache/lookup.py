"""What a cache lookup answers (``Lookup``), and what the cache needs of an embedder and a
verifier."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np


class EmbedderLike(Protocol):
    """What the cache needs of an embedder (meshd.embed.Embedder conforms)."""

    @property
    def identity(self) -> str: ...

    @property
    def dim(self) -> int: ...

    def embed(self, texts: Sequence[str]) -> np.ndarray: ...


Verifier = Callable[[str, str], float]  # (cached question, new question) -> P(same answer)


class Busy(Exception):
    """``lookup_exact(blocking=False)``: another thread holds the cache right now."""


@dataclass(frozen=True, slots=True)
class Lookup:
    """The result of a lookup. ``kind``: ``exact`` or ``semantic`` (``answer`` is the cached
    answer: serve it), ``refused`` (a candidate the error bound did not let through) or
    ``miss`` (compute, then ``insert``), ``skip`` (the cache takes no part: ``reason``)."""

    kind: str
    reason: str
    answer: str | None = None
    entry_id: int | None = None  # None for an exact hit on an answer staged but not yet written
    partition: str | None = None  # of the entry served (exact and semantic hits)
    key: str | None = None  # the question's key (exact hits)
    similarity: float | None = None
    score: float | None = None
    threshold: float | None = None
    vector: np.ndarray | None = field(default=None, repr=False)
    embed_ms: float = 0.0  # the question's embedding, wall
    search_ms: float = 0.0  # the nearest entry and the verifier's score, wall
    # the parts of ``search_ms`` (wall: the index search with the entry's row, the verifier),
    # and the CPU time of the looking-up thread (``time.thread_time``: onnxruntime's other
    # intra-op threads not counted) in the embedding and in the verifier
    index_ms: float = 0.0
    verify_ms: float = 0.0
    embed_cpu_ms: float = 0.0
    verify_cpu_ms: float = 0.0
    answer_ids: tuple[int, ...] | None = None  # the answer's token ids, when they were kept

    @property
    def hit(self) -> bool:
        return self.kind in ("exact", "semantic")
