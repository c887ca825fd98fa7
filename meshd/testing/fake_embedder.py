"""A deterministic stand-in for ``meshd.embed.Embedder`` (the cache's ``EmbedderLike``).

Each lower-cased word is hashed to a fixed random unit vector; a text's embedding is the
normalised sum of its words' vectors. Texts sharing most words are close, texts sharing none
are nearly orthogonal: enough to drive the cache's store and index in unit tests.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence

import numpy as np


class FakeEmbedder:
    def __init__(self, dim: int = 32, identity: str = "fake-embedder@0") -> None:
        self._dim = dim
        self._identity = identity
        self.calls = 0

    @property
    def identity(self) -> str:
        return self._identity

    @property
    def dim(self) -> int:
        return self._dim

    def _word(self, word: str) -> np.ndarray:
        seed = int.from_bytes(hashlib.sha256(word.encode()).digest()[:8], "little")
        v = np.random.default_rng(seed).standard_normal(self._dim)
        return v / np.linalg.norm(v)

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        self.calls += 1
        out = np.zeros((len(texts), self._dim), np.float32)
        for i, text in enumerate(texts):
            v = sum((self._word(w) for w in re.findall(r"\w+", text.lower())),
                    np.zeros(self._dim))
            n = float(np.linalg.norm(v))
            out[i] = v / n if n > 0 else self._word("")
        return out
