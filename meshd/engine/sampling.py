"""Pure numpy token sampling: greedy, temperature, top-k, top-p, repetition, presence and
frequency penalties, logit bias, a grammar's mask, and the log probabilities of the choice.

No onnxruntime and no clock here; the caller owns the random generator, so a seed reproduces a
run exactly. Every sampled (not greedy) token takes exactly one draw from it, so a node that
resumes a request after ``k`` tokens (failover) skips ``k`` draws and carries on as the first
node would have.
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
    ``stop`` string (which is not included in the text), when the grammar is complete, or after
    ``max_tokens`` new tokens.

    OpenAI's settings: ``presence_penalty`` and ``frequency_penalty`` (subtracted from a token's
    logit once if it was generated, and once per time it was), ``logit_bias`` ((token id, bias)
    pairs added to the logits), ``logprobs`` (None: none; k: the chosen token's log probability
    and the k likeliest alternatives), ``n`` (choices decoded together after one prefill).
    ``grammar`` is an llguidance grammar (``meshd.engine.constrain``): every token that would
    leave it is masked. ``after`` holds the tokens generated before this run (a failover
    resumes with them at the end of the prompt): they count for the penalties, the grammar and
    the random draws as if generated here."""

    max_tokens: int = DEFAULT_MAX_TOKENS
    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    repetition_penalty: float = 1.1
    seed: int | None = None
    stop: tuple[str, ...] = ()
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    logprobs: int | None = None
    n: int = 1
    grammar: str | None = None
    after: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        problem = sampling_problem(
            max_tokens=self.max_tokens, temperature=self.temperature, top_k=self.top_k,
            top_p=self.top_p, repetition_penalty=self.repetition_penalty, seed=self.seed,
            stop=self.stop, presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty, logit_bias=self.logit_bias,
            logprobs=self.logprobs, n=self.n)  # the entry node's rule too (meshd.core.request)
        if problem is not None:
            raise ConfigError(problem)

    @property
    def plain_greedy(self) -> bool:
        """Greedy with nothing that changes the logits: a bare argmax."""
        return (self.temperature == 0 and self.repetition_penalty == 1.0
                and not self.presence_penalty and not self.frequency_penalty
                and not self.logit_bias)


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


def apply_openai_penalties(logits: np.ndarray, ids: np.ndarray, counts: np.ndarray,
                           presence: float, frequency: float) -> None:
    """OpenAI's penalties, in place: ``logit[t] -= presence + frequency * count[t]`` for each
    token ``t`` generated so far (``ids`` distinct, ``counts`` how often each was)."""
    if len(ids) and (presence or frequency):
        inside = ids < logits.shape[0]
        logits[ids[inside]] -= presence + frequency * counts[inside]


def apply_logit_bias(logits: np.ndarray, bias: Sequence[tuple[int, float]]) -> None:
    """Add each ``(token id, bias)`` to the logits, in place (ids outside are ignored)."""
    for tid, b in bias:
        if 0 <= tid < logits.shape[0]:
            logits[tid] += b


def apply_mask(logits: np.ndarray, allowed: np.ndarray) -> None:
    """Set every token not ``allowed`` (a bool array over the tokenizer's vocabulary) to -inf,
    in place; so are logits past its end (a model's output may be padded wider)."""
    n = min(allowed.shape[0], logits.shape[0])
    logits[:n][~allowed[:n]] = -np.inf
    logits[n:] = -np.inf


def process(logits_row: np.ndarray, cfg: GenerationConfig, seen: Sequence[int] | np.ndarray,
            generated: np.ndarray, counts: np.ndarray, allowed: np.ndarray | None) -> np.ndarray:
    """The logits sampling and log probabilities read: the repetition penalty (over ``seen``,
    prompt and generated tokens), presence and frequency penalties (over the ``generated`` ids
    and their ``counts``), the logit bias and the grammar's mask (``allowed``, None: no
    grammar). Returns a new float64 array."""
    out = apply_repetition_penalty(logits_row, seen, cfg.repetition_penalty)
    apply_openai_penalties(out, generated, counts, cfg.presence_penalty, cfg.frequency_penalty)
    apply_logit_bias(out, cfg.logit_bias)
    if allowed is not None:
        apply_mask(out, allowed)
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


def choose(logits: np.ndarray, cfg: GenerationConfig, rng: np.random.Generator) -> int:
    """Pick a token from processed logits (``process``): argmax when greedy, else one draw."""
    if cfg.temperature == 0:
        return int(np.argmax(logits))
    p = filter_probs(logits, cfg.temperature, cfg.top_k, cfg.top_p)
    cum = np.cumsum(p)
    idx = int(np.searchsorted(cum, rng.random() * cum[-1], side="right"))
    idx = min(idx, p.shape[0] - 1)
    while p[idx] == 0:  # float edge at the very end of the cumulative sum
        idx -= 1
    return int(idx)


def log_probs(logits: np.ndarray, temperature: float) -> np.ndarray:
    """Log probabilities of processed logits at ``temperature`` (1 when greedy): what the
    ``logprobs`` of a response report. Top-k and top-p are not applied."""
    z = logits / (temperature if temperature > 0 else 1.0)
    finite = np.isfinite(z)
    m = np.max(z[finite]) if finite.any() else 0.0
    return np.asarray(z - (m + np.log(np.sum(np.exp(z[finite] - m)))), dtype=np.float64)


def top_choices(lp: np.ndarray, k: int) -> list[tuple[int, float]]:
    """The ``k`` likeliest tokens as (id, log probability), likeliest first, ties to the lower
    id; tokens of probability 0 are left out."""
    if k <= 0:
        return []
    k = min(k, lp.shape[0])
    idx = np.argpartition(-lp, k - 1)[:k]
    idx = idx[np.lexsort((idx, -lp[idx]))]
    return [(int(i), float(lp[i])) for i in idx if np.isfinite(lp[i])]


def sample(logits_row: np.ndarray, history: Sequence[int] | np.ndarray, cfg: GenerationConfig,
           rng: np.random.Generator) -> int:
    """Pick the next token id from one row of logits. ``history`` is the tokens so far (prompt
    and generated; each distinct id once is enough), used by the repetition penalty. (No
    presence or frequency penalty, no grammar: ``meshd.engine.generation`` applies those.)"""
    if cfg.temperature == 0 and cfg.repetition_penalty == 1.0 and not cfg.logit_bias:
        return int(np.argmax(logits_row))  # the common greedy case, without a float64 copy
    logits = apply_repetition_penalty(logits_row, history, cfg.repetition_penalty)
    apply_logit_bias(logits, cfg.logit_bias)
    return choose(logits, cfg, rng)
