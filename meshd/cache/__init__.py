"""The semantic cache: answers found by the meaning of the prompt, per node, in SQLite.

``SemanticCache(path, embedder)`` is the I/O part (sync, thread-safe); ``keys`` (who may read
what), ``policy`` (hit or not: guards, fixed and adaptive thresholds) and ``eviction`` (bounds,
LRU, TTL) are pure. See docs/cache.md.
"""

from __future__ import annotations

from meshd.cache.eviction import CacheLimits
from meshd.cache.guards import guard
from meshd.cache.keys import Admission, CacheRequest, admit
from meshd.cache.policy import AdaptiveThreshold, Decision, FixedThreshold
from meshd.cache.store import EmbedderLike, Lookup, SemanticCache

__all__ = [
    "AdaptiveThreshold",
    "Admission",
    "CacheLimits",
    "CacheRequest",
    "Decision",
    "EmbedderLike",
    "FixedThreshold",
    "Lookup",
    "SemanticCache",
    "admit",
    "guard",
]
