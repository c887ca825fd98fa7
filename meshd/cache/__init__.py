"""The semantic cache: answers found by an exact repeat of the request, or by the meaning of
its question within an error bound, per node, in SQLite.

``SemanticCache(path)`` is the I/O part (sync, thread-safe); ``keys`` (who may read what, the
exact key, conversations), ``policy`` (the semantic decision), ``bound`` (the error bound's
threshold) and ``eviction`` (bounds, LRU, TTL) are pure. See docs/cache.md.
"""

from __future__ import annotations

from meshd.cache.bound import Calibration
from meshd.cache.eviction import CacheLimits
from meshd.cache.keys import Admission, CacheRequest, admit, conversation
from meshd.cache.policy import Decision, decide
from meshd.cache.store import EmbedderLike, Lookup, SemanticCache

__all__ = [
    "Admission",
    "CacheLimits",
    "CacheRequest",
    "Calibration",
    "Decision",
    "EmbedderLike",
    "Lookup",
    "SemanticCache",
    "admit",
    "conversation",
    "decide",
]
