"""Pure numpy token sampling: greedy, temperature, top-k, top-p, repetition penalty.

No onnxruntime and no clock here; the caller owns the random generator, so a seed reproduces a
run exactly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from meshd.core.request import DEFAULT_MAX_TOKENS, sampling_problem
from meshd.errors import ConfigError


@dataclass(frozen=True, slots=True)
class GenerationConfig:
    """How to generate. ``temperature == 0`` is greedy (argmax, ties to the lowest id);
    ``top_k == 0`` and ``top_p == 1`` switch those filters off; ``repetition_penalty == 1`` is no
    penalty; ``seed=None`` draws a fresh seed; generation ends at an end-of-sequence token, at a
    ``stop`` string (which is not included in the text) or after ``max_tokens`` new tokens."""

    max_tokens: int = DEFAULT_MAX_TOKENS
    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    repetition_penalty: float = 1.1
    seed: int | None = None
    stop: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        problem = sampling_problem(
            max_tokens=self.max_tokens, temperature=self.temperature, top_k=self.top_k,
            top_p=self.top_p, repetition_penalty=self.repetition_penalty, seed=self.seed,
            stop=self.stop)  # the entry node's rule too (meshd.core.request)
        if problem is not None:
            raise ConfigError(problem)


def apply_repetition_penalty(logits: np.ndarray, history: Sequence[int] | np.ndarray,
                             penalty: float) -> np.ndarray:
    """Make tokens already seen less likely (CTRL-style: divide positive logits, multiply
    negative ones). Returns a new float64 array."""
    out = np.array(logits, dtype=np.float64)
    if penalty != 1.0 and len(history):
        ids = np.asarray(history, dtype=np.int64)
        ids = ids[(ids >= 0) & (ids < out.shape[0])]
        seen = out[ids]  # repeated ids read and write the same value
        out[ids] = np.where(seen > 0, seen / penalty, seen * penalty)
    return out


def filter_probs(logits: np.ndarray, temperature: float, top_k: int, top_p: float) -> np.ndarray:
    """Sampling probabilities after temperature, top-k and top-p (nucleus) filtering."""
    z = logits / temperature
    if 0 < top_k < z.shape[0]:
        kth = np.partition(z, -top_k)[-top_k]
        z = np.where(z >= kth, z, -np.inf)
    z = z - np.max(z)
    p = np.exp(z)
    p /= p.sum()
    if top_p < 1.0:
        order = np.argsort(-p, kind="stable")
        cum = np.cumsum(p[order])
        keep = int(np.searchsorted(cum, top_p)) + 1  # smallest prefix whose mass reaches top_p
        cut = np.zeros_like(p)
        cut[order[:keep]] = p[order[:keep]]
        p = cut / cut.sum()
    return p


def sample(logits_row: np.ndarray, history: Sequence[int] | np.ndarray, cfg: GenerationConfig,
           rng: np.random.Generator) -> int:
    """Pick the next token id from one row of logits. ``history`` is the tokens so far (prompt
    and generated; each distinct id once is enough), used by the repetition penalty."""
    if cfg.temperature == 0 and cfg.repetition_penalty == 1.0:
        return int(np.argmax(logits_row))  # the common greedy case, without a float64 copy
    logits = apply_repetition_penalty(logits_row, history, cfg.repetition_penalty)
    if cfg.temperature == 0:
        return int(np.argmax(logits))
    p = filter_probs(logits, cfg.temperature, cfg.top_k, cfg.top_p)
    cum = np.cumsum(p)
    idx = int(np.searchsorted(cum, rng.random() * cum[-1], side="right"))
    idx = min(idx, p.shape[0] - 1)
    while p[idx] == 0:  # float edge at the very end of the cumulative sum
        idx -= 1
    return int(idx)
