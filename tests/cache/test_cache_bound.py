"""The error bound of the semantic path (meshd.cache.bound): Clopper-Pearson bounds, the
threshold a calibration gives, refusal when it cannot hold, and feedback raising it."""

from __future__ import annotations

import math

import pytest

from meshd.cache.bound import (
    Calibration,
    binomial_cdf,
    most_allowed,
    threshold,
    upper_bound,
)


@pytest.mark.parametrize(("k", "n", "want"), [
    (0, 100, 1 - 0.05 ** (1 / 100)),  # k = 0 has a closed form: 0.0295
    (0, 2256, 1 - 0.05 ** (1 / 2256)),  # 0.00133
    (5, 100, 0.1023),  # tables (one-sided 95%)
    (10, 1000, 0.0169),
    (100, 100, 1.0),
])
def test_upper_bound(k: int, n: int, want: float) -> None:
    assert upper_bound(k, n) == pytest.approx(want, abs=2e-4)
    if k < n:  # the bound is where seeing k or fewer becomes a 5% event
        assert binomial_cdf(k, n, upper_bound(k, n)) == pytest.approx(0.05, abs=1e-6)


def test_most_allowed_is_the_largest_k_within_the_bound() -> None:
    for n, e in ((2256, 0.01), (300, 0.01), (5000, 0.05), (2256, 0.002)):
        k = most_allowed(n, e)
        assert upper_bound(k, n) <= e < upper_bound(k + 1, n)
    assert most_allowed(2256, 0.001) == -1  # even k = 0 cannot support it
    assert most_allowed(10, 1.0) == 10


def cal(*scores: float, n: int = 1000, gate: float = 0.8) -> Calibration:
    return Calibration(gate, n, tuple(sorted(scores, reverse=True)))


def test_threshold_lets_through_only_what_the_bound_allows() -> None:
    scores = [0.99, 0.97, 0.95, 0.9, 0.8, 0.7, 0.5, 0.3]
    c = cal(*scores)
    k = most_allowed(1000, 0.01)  # 4 of 1,000 near misses may be served
    assert k == 4
    t = threshold(c, 0.01)
    assert t == 0.8 and sum(s > t for s in scores) == k  # strictly above
    assert threshold(c, 0.0) is None  # 0: nothing semantic
    assert threshold(c, 0.001) is None  # 1,000 near misses cannot support 0.1%
    assert threshold(c, 0.5) == -math.inf  # every scored near miss may pass
    assert threshold(cal(n=1000), 0.01) == -math.inf  # none reached the gate


def test_wrong_feedback_raises_the_threshold_past_the_score_it_served() -> None:
    c = cal(0.99, 0.97, 0.95, 0.9, 0.8, 0.7)
    t = threshold(c, 0.01)
    assert t == 0.8
    served_at = 0.85  # a hit above t, reported wrong
    after = threshold(c.with_wrong([served_at]), 0.01)
    assert after is not None and after >= served_at > t
    assert c.with_wrong([]) is c
    more = c.with_wrong([0.85, 0.86, 0.87, 0.88, 0.89, 0.991])
    assert more.near_misses == 1006 and threshold(more, 0.01) == 0.9  # 6 more at 0.85+
