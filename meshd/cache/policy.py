"""When a cached answer may be served: guards, the fixed threshold and the adaptive one.

Pure functions and frozen dataclasses: similarities, texts, observations and a uniform random
number come in, a ``Decision`` comes out. Nothing here reads a clock or a file.

A lookup finds the nearest cached prompt (cosine similarity ``s``). Then:

1. *Guards* (meshd.cache.guards) refuse pairs that embeddings are known to confuse: numbers
   that differ, a negation or opposite word in one prompt only, two runs of words trading
   places, a content word swapped, another question word, another name, and (v3) another
   time, kind of weather, arithmetic operation, unit, or an on/off action. A guard costs a
   hit, never a wrong answer.
2. The *threshold policy* decides:
   - ``FixedThreshold(t)``: serve when ``s >= t``.
   - ``AdaptiveThreshold`` (in the spirit of vCache, "verified semantic prompt caching"): each
     cached entry learns its own threshold from labelled observations ``(s, correct)``, gathered
     whenever the node computed the answer anyway and compared it with the cached one. The
     probability that serving the entry at similarity ``s`` is correct is modelled as
     ``sigmoid(slope * (s - t_e))``; ``t_e`` gets a normal prior (``prior_t``, ``prior_sd``) and
     its posterior mode and spread are found by Newton's method (Laplace approximation). The
     entry is served when even a pessimistic ``t_e`` (mode + ``z`` standard deviations) leaves
     the probability of a wrong answer at most ``delta``:
     ``s >= t_mode + z * sd + logit(1 - delta) / slope``. Between ``floor`` and that threshold
     the answer is computed and checked (``verify``), which teaches the entry; above it, a
     fraction ``explore`` of hits is verified as well, so that an entry that is too lenient
     learns so.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from meshd.cache.guards import guard
from meshd.cache.structure import Added, added_run

Kind = Literal["hit", "verify", "miss"]
Observation = tuple[float, bool]  # (similarity, was the cached answer right for that prompt?)
Align = Callable[[Added], float]  # the lowest alignment of an added run's words (meshd.cache.align)
PairCheck = Callable[[], float]  # the pair verifier's P(same answer) for this candidate
ADDED_WORD_BOUND = 0.5


def pair_refusal(pair: PairCheck | None, min_p: float) -> str | None:
    """The learned pair verifier's verdict (meshd.embed.pair_verifier: a cross-encoder reading
    both prompts): refuse when its probability that the cached answer is right is below
    ``min_p``. Asked only about a candidate that would otherwise be served; without ``pair``
    (or with ``min_p`` 0), None."""
    if pair is None or min_p <= 0.0:
        return None
    p = pair()
    if p >= min_p:
        return None
    return f"pair verifier refused (p={p:.3f} < {min_p:g})"


def qualifier(query: str, cached: str, align: Align | None, bound: float) -> str | None:
    """Guards v4's verifier (meshd.cache.structure, 13): "qualifier added" when one prompt adds
    a run of words to the other and one of its content words aligns below ``bound`` with every
    word of the other prompt (``align``: the encoder's word vectors, meshd.cache.align). Asked
    only about a candidate that would otherwise be served; without ``align``, None."""
    if align is None:
        return None
    added = added_run(query, cached)
    if added is None or align(added) >= bound:
        return None
    return "qualifier added"

@dataclass(frozen=True, slots=True)
class Decision:
    kind: Kind  # hit: serve the cached answer; verify: compute, compare, observe; miss: compute
    similarity: float
    threshold: float
    reason: str


@dataclass(frozen=True, slots=True)
class FixedThreshold:
    """Serve when the similarity reaches ``threshold`` (the baseline)."""

    threshold: float = 0.85
    guards: bool = True
    added_word_bound: float = ADDED_WORD_BOUND
    pair_min_p: float = 0.0  # the pair verifier's bound (0: not asked)

    def decide(self, similarity: float, query: str, cached: str,
               observations: tuple[Observation, ...] = (), u: float = 1.0,
               align: Align | None = None, pair: PairCheck | None = None) -> Decision:
        """``align``: the verifier of an added run (``qualifier``); ``pair``: the learned pair
        verifier (``pair_refusal``, bound ``pair_min_p``); both asked only above the
        threshold, after the guards, so a miss never pays for them."""
        if self.guards and (why := guard(query, cached)):
            return Decision("miss", similarity, self.threshold, why)
        if similarity >= self.threshold:
            if self.guards and (why := qualifier(query, cached, align, self.added_word_bound)):
                return Decision("miss", similarity, self.threshold, why)
            if why := pair_refusal(pair, self.pair_min_p):
                return Decision("miss", similarity, self.threshold, why)
            return Decision("hit", similarity, self.threshold, "above the fixed threshold")
        return Decision("miss", similarity, self.threshold, "below the fixed threshold")

    def observe(self, observations: tuple[Observation, ...], similarity: float,
                correct: bool) -> tuple[Observation, ...]:
        return observations


@dataclass(frozen=True, slots=True)
class AdaptiveThreshold:
    """Per-entry thresholds learned from labelled observations, with a bound ``delta`` on the
    probability of serving a wrong answer (see the module docstring)."""

    delta: float = 0.01
    prior_t: float = 0.80
    prior_sd: float = 0.06
    slope: float = 60.0
    z: float = 1.0
    floor: float = 0.70
    ceiling: float = 0.995
    explore: float = 0.02
    max_observations: int = 32
    guards: bool = True
    added_word_bound: float = ADDED_WORD_BOUND
    pair_min_p: float = 0.0

    def threshold(self, observations: tuple[Observation, ...]) -> float:
        mode, sd = posterior(observations, self.prior_t, self.prior_sd, self.slope)
        t = mode + self.z * sd + math.log((1 - self.delta) / self.delta) / self.slope
        return min(max(t, self.floor), self.ceiling)

    def decide(self, similarity: float, query: str, cached: str,
               observations: tuple[Observation, ...] = (), u: float = 1.0,
               align: Align | None = None, pair: PairCheck | None = None) -> Decision:
        """``u``: a uniform random number in [0, 1) that picks the hits to explore; ``align``,
        ``pair``: as for ``FixedThreshold.decide``, asked only where the answer would be
        served."""
        t = self.threshold(observations)
        if self.guards and (why := guard(query, cached)):
            return Decision("miss", similarity, t, why)
        if similarity < self.floor:
            return Decision("miss", similarity, t, "below the floor")
        if similarity < t:
            return Decision("verify", similarity, t, "below the entry's threshold")
        if self.guards and (why := qualifier(query, cached, align, self.added_word_bound)):
            return Decision("miss", similarity, t, why)
        if why := pair_refusal(pair, self.pair_min_p):
            return Decision("miss", similarity, t, why)
        if u < self.explore:
            return Decision("verify", similarity, t, "explored")
        return Decision("hit", similarity, t, "above the entry's threshold")

    def observe(self, observations: tuple[Observation, ...], similarity: float,
                correct: bool) -> tuple[Observation, ...]:
        """The entry's observations with one more (the oldest dropped past the bound)."""
        return (*observations, (float(similarity), bool(correct)))[-self.max_observations:]


def posterior(observations: tuple[Observation, ...], prior_t: float, prior_sd: float,
              slope: float) -> tuple[float, float]:
    """Mode and standard deviation of an entry's threshold ``t`` given its observations, for
    ``P(correct | s) = sigmoid(slope * (s - t))`` and the prior ``t ~ N(prior_t, prior_sd^2)``."""
    t = prior_t
    prec0 = 1.0 / (prior_sd * prior_sd)
    curvature = prec0
    for _ in range(30):
        grad = -(t - prior_t) * prec0
        curvature = prec0
        for s, ok in observations:
            p = _sigmoid(slope * (s - t))
            grad -= slope * ((1.0 if ok else 0.0) - p)
            curvature += slope * slope * p * (1.0 - p)
        step = grad / curvature
        t += max(-0.1, min(0.1, step))
        if abs(step) < 1e-7:
            break
    return t, 1.0 / math.sqrt(curvature)


def _sigmoid(x: float) -> float:
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    e = math.exp(x)
    return e / (1.0 + e)


def answers_match(a: str, b: str) -> bool:
    """The label of a verification at temperature 0: the fresh answer equals the cached one
    (whitespace aside)."""
    return " ".join(a.split()) == " ".join(b.split())


Policy = FixedThreshold | AdaptiveThreshold
