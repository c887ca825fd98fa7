"""Nearest-neighbour search over one partition's vectors (unit length, inner product).

A partition starts as an exact index (a NumPy matrix, one matrix-vector product per search)
and turns into an HNSW graph (``usearch``) once it holds more than ``exact_max`` vectors;
below that size the exact search is as fast and needs no graph. Keys are the cache's entry ids.
Not thread-safe: the store calls it under its lock.
"""

from __future__ import annotations

from typing import Any

import numpy as np

EXACT_MAX = 4096  # see docs/cache.md: exact search of 4,096 x 384 floats takes ~0.2 ms
# The graph's search breadth (usearch's ``expansion_search``; its default is 64). At 100,000
# entries (docs/cache.md, "Index choice") 32 found the exact nearest entry for 300 of 300
# paraphrases, as 64 did, with a third fewer distances: a search in a daemon runs on caches
# the model has just flushed, where each distance is a miss (3.2 ms at 64, 0.6 ms warm).
EXPANSION_SEARCH = 32


class PartitionIndex:
    def __init__(self, dim: int, *, exact_max: int = EXACT_MAX, dtype: str = "f16",
                 connectivity: int = 16, expansion_add: int = 64,
                 expansion_search: int = EXPANSION_SEARCH) -> None:
        self.dim = dim
        self.exact_max = exact_max
        self._dtype = dtype
        self._graph = (connectivity, expansion_add, expansion_search)
        self._keys = np.empty(0, np.int64)
        self._vecs = np.empty((0, dim), np.float32)
        self._n = 0
        self._where: dict[int, int] = {}
        self._hnsw: Any = None

    def __len__(self) -> int:
        return len(self._hnsw) if self._hnsw is not None else self._n

    @property
    def kind(self) -> str:
        return "hnsw" if self._hnsw is not None else "exact"

    def add(self, keys: np.ndarray, vectors: np.ndarray, *, threads: int = 1) -> None:
        """Add vectors under their keys (``threads``: for a bulk add into the graph; 0 = all
        cores)."""
        keys = np.asarray(keys, np.int64).reshape(-1)
        vectors = np.asarray(vectors, np.float32).reshape(len(keys), self.dim)
        if not len(keys):
            return
        if self._hnsw is None and self._n + len(keys) > self.exact_max:
            self._to_hnsw(threads)
        if self._hnsw is not None:
            self._hnsw.add(keys, vectors, threads=threads)
            return
        need = self._n + len(keys)
        if need > len(self._keys):
            cap = max(need, 2 * len(self._keys), 64)
            self._keys = np.resize(self._keys, cap)
            grown = np.zeros((cap, self.dim), np.float32)
            grown[:self._n] = self._vecs[:self._n]
            self._vecs = grown
        self._keys[self._n:need] = keys
        self._vecs[self._n:need] = vectors
        for i, k in enumerate(keys.tolist()):
            self._where[k] = self._n + i
        self._n = need

    def remove(self, keys: list[int]) -> None:
        """Remove ``keys`` (absent ones are skipped). From a graph, in one call followed by one
        throwaway search: the first search after a removal costs usearch a pass over the whole
        graph (3 ms at 100,000 entries on the 2-core box, against 0.7 for a search on a cold
        cache), and it is paid here, by the thread that removes (an eviction runs in the
        insert that follows an answer), not by the next lookup of a waiting request."""
        if not keys:
            return
        if self._hnsw is not None:
            self._hnsw.remove(np.asarray(keys, np.int64))
            if len(self._hnsw):
                self._hnsw.search(np.zeros(self.dim, np.float32), 1)
            return
        for key in keys:
            i = self._where.pop(int(key), None)
            if i is None:
                continue
            last = self._n - 1
            if i != last:  # move the last row into the hole
                self._keys[i] = self._keys[last]
                self._vecs[i] = self._vecs[last]
                self._where[int(self._keys[i])] = i
            self._n = last

    def search(self, vector: np.ndarray, k: int = 4) -> list[tuple[int, float]]:
        """Up to ``k`` (key, cosine similarity) pairs, most similar first."""
        if len(self) == 0:
            return []
        q = np.asarray(vector, np.float32).reshape(self.dim)
        if self._hnsw is not None:
            found = self._hnsw.search(q, min(k, len(self._hnsw)))
            return [(int(key), 1.0 - float(d)) for key, d in zip(found.keys, found.distances,
                                                                  strict=True)]
        # Not ``@``: a BLAS gemv of this size runs on OpenBLAS's threads, whose wake-ups took
        # 44 ms at the 90th percentile on the loaded 2-core box (0.13 ms on one thread);
        # einsum's own loop stays on this thread (2,000 x 384: 0.2 ms p50, 0.43 ms p90).
        sims = np.einsum("ij,j->i", self._vecs[:self._n], q)
        k = min(k, self._n)
        top = np.argpartition(-sims, k - 1)[:k] if self._n > k else np.arange(self._n)
        top = top[np.argsort(-sims[top], kind="stable")]
        return [(int(self._keys[i]), float(sims[i])) for i in top]

    def save(self, path: str) -> bool:
        """Write the HNSW graph to ``path`` (exact partitions are cheap to rebuild: False)."""
        if self._hnsw is None:
            return False
        self._hnsw.save(path)
        return True

    def load(self, path: str) -> None:
        """Replace this (empty) index with the HNSW graph saved at ``path``."""
        from usearch.index import Index

        connectivity, expansion_add, expansion_search = self._graph
        index = Index(ndim=self.dim, metric="ip", dtype=self._dtype, connectivity=connectivity,
                      expansion_add=expansion_add, expansion_search=expansion_search)
        index.load(path)
        if index.ndim != self.dim:
            raise ValueError(f"{path}: {index.ndim} dimensions, expected {self.dim}")
        self._hnsw = index

    def memory_bytes(self) -> int:
        if self._hnsw is not None:
            return int(self._hnsw.memory_usage)
        return int(self._keys.nbytes + self._vecs.nbytes)

    def _to_hnsw(self, threads: int) -> None:
        from usearch.index import Index

        connectivity, expansion_add, expansion_search = self._graph
        index = Index(ndim=self.dim, metric="ip", dtype=self._dtype, connectivity=connectivity,
                      expansion_add=expansion_add, expansion_search=expansion_search)
        if self._n:
            index.add(self._keys[:self._n].copy(), self._vecs[:self._n].copy(), threads=threads)
        self._hnsw = index
        self._keys = np.empty(0, np.int64)
        self._vecs = np.empty((0, self.dim), np.float32)
        self._where.clear()
        self._n = 0
