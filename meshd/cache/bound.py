"""The error bound of the semantic path: from labelled near misses to the threshold that keeps
the share of near misses served at or below ``max_error``, with confidence.

Pure: scores and counts come in, a threshold comes out; no clock, no file, no NumPy.

A *near miss* is a cached prompt that looks like the new one but needs another answer. The
calibration set holds the verifier's score of each of ``n`` labelled near misses (only those
that reach the cosine ``gate`` can ever be served; the others count in ``n`` with no score).
Serving every candidate scored above ``t`` would have served ``k(t)`` of them. The threshold
for ``max_error`` is the lowest one whose Clopper-Pearson upper bound on the rate, at
``confidence``, is at most ``max_error``: so the share of near misses served, on prompts drawn
like the calibration set, is at most ``max_error`` with that confidence. When even ``k = 0``
cannot support the bound (``max_error`` below ``1 - (1 - confidence) ** (1 / n)``), there is
no threshold: the semantic path serves nothing.

Wrong-answer feedback adds near misses: each one served at score ``s`` and reported wrong
counts as one more near miss scored ``s``, so the threshold rises past it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass


def binomial_cdf(k: int, n: int, p: float) -> float:
    """P(X <= k) for X ~ Binomial(n, p)."""
    if k >= n or p <= 0.0:
        return 1.0
    if p >= 1.0:
        return 0.0
    lp, lq = math.log(p), math.log1p(-p)
    base = math.lgamma(n + 1)
    terms = [base - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * lp + (n - i) * lq
             for i in range(k + 1)]
    top = max(terms)
    return min(1.0, math.exp(top) * math.fsum(math.exp(t - top) for t in terms))


def upper_bound(k: int, n: int, confidence: float = 0.95) -> float:
    """The one-sided Clopper-Pearson upper bound on a rate seen ``k`` times in ``n``."""
    if n <= 0 or k >= n:
        return 1.0
    lo, hi = k / n, 1.0
    for _ in range(64):
        mid = (lo + hi) / 2
        if binomial_cdf(k, n, mid) > 1.0 - confidence:
            lo = mid
        else:
            hi = mid
    return hi


def most_allowed(n: int, max_error: float, confidence: float = 0.95) -> int:
    """The largest ``k`` whose upper bound over ``n`` is at most ``max_error``, or -1. The
    bound of ``k`` is at most ``max_error`` exactly when ``P(X <= k | n, max_error)`` is at most
    ``1 - confidence``, which grows with ``k``: a binary search of that."""
    if max_error >= 1.0:
        return n
    alpha = 1.0 - confidence
    if n <= 0 or binomial_cdf(0, n, max_error) > alpha:
        return -1
    lo, hi = 0, n - 1  # lo satisfies the bound
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if binomial_cdf(mid, n, max_error) <= alpha:
            lo = mid
        else:
            hi = mid - 1
    return lo


@dataclass(frozen=True, slots=True)
class Calibration:
    """``scores``: the verifier's scores of the near misses that reached the cosine ``gate``,
    highest first; ``near_misses``: all of them, those below the gate included."""

    gate: float
    near_misses: int
    scores: tuple[float, ...]
    confidence: float = 0.95
    name: str = ""

    def with_wrong(self, scores: Iterable[float]) -> Calibration:
        """The calibration with near misses reported wrong by feedback (each at the score it
        was served at) added."""
        extra = tuple(scores)
        if not extra:
            return self
        merged = tuple(sorted((*self.scores, *extra), reverse=True))
        return Calibration(self.gate, self.near_misses + len(extra), merged, self.confidence,
                           self.name)


def threshold(cal: Calibration, max_error: float) -> float | None:
    """Serve a candidate whose score is strictly above the returned value; None: the bound
    cannot hold at any threshold (serve nothing)."""
    if not max_error > 0.0:
        return None
    k = most_allowed(cal.near_misses, max_error, cal.confidence)
    if k < 0:
        return None
    if k >= len(cal.scores):
        return -math.inf  # every near miss that reaches the gate could be served
    return cal.scores[k]
