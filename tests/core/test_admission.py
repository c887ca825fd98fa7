"""Wait-bounded admission: the server's wait estimate and the entry node's bounds (table tests)."""

from __future__ import annotations

import math

import pytest

from meshd.core.admission import CHECKED_ATTEMPTS, after_refusals, slot_wait_ms, wait_bounds
from meshd.core.routing import Candidate, RouteDecision
from meshd.core.snapshot import Policy


@pytest.mark.parametrize(
    ("finishes", "waiting", "slots", "service_ms", "want"),
    [
        ([], 0, 2, 500.0, 0.0),  # idle
        ([10.3], 0, 2, 500.0, 0.0),  # a slot free
        ([10.3, 10.1], 0, 2, 500.0, 100.0),  # full: the first to finish frees a slot
        ([10.3, 10.1], 1, 2, 500.0, 300.0),  # one waits ahead: it takes the first slot
        ([10.3, 10.1], 2, 2, 500.0, 600.0),  # a round of service after the first slot frees
        ([10.3, 10.1], 3, 2, 500.0, 800.0),
        ([9.0, 9.5], 0, 2, 500.0, 0.0),  # overdue requests count as ending now
        ([10.3], 1, 2, 500.0, 300.0),  # a free slot but one queued (in the instant it starts)
        ([10.3, 10.1], 2, 2, math.inf, math.inf),  # unknown speed: an unknown wait
        ([11.0], 0, 0, 500.0, 1000.0),  # slots < 1 counts as one
    ],
)
def test_slot_wait(finishes: list[float], waiting: int, slots: int, service_ms: float,
                   want: float) -> None:
    got = slot_wait_ms(10.0, finishes, waiting, slots, service_ms)
    assert got == pytest.approx(want) if math.isfinite(want) else math.isinf(got)


def cand(pid: str, ttft: float | None, wait: float = 0.0) -> Candidate:
    return Candidate(pid, pid.upper(), ttft, 5.0, "measured", wait, 1.0, ttft, None)


def decision(strategy: str, *ttfts: float | None) -> RouteDecision:
    cands = tuple(cand(f"p{i}", t) for i, t in enumerate(ttfts))
    return RouteDecision("r", strategy, cands, tuple(c.peer_id for c in cands), ())


@pytest.mark.parametrize(
    ("strategy", "ttfts", "policy", "want"),
    [
        # bound on i = next candidate's predicted TTFT, floored; the last one has none
        ("meshd", (20.0, 30.0, 400.0, 50.0), {}, {"p0": 50.0, "p1": 400.0}),
        ("meshd", (20.0, 30.0, 400.0), {"wait_bound_attempts": 3}, {"p0": 50.0, "p1": 400.0}),
        ("meshd", (20.0, 90.0), {"wait_bound_min_ms": 10.0}, {"p0": 90.0}),
        ("meshd", (20.0, None), {}, {"p0": 50.0}),  # no prediction for the next: the floor
        ("meshd", (20.0,), {}, {}),  # nowhere else to go
        ("meshd", (20.0, 30.0), {"wait_bound_attempts": 0}, {}),  # turned off
        ("lwsq", (20.0, 30.0, 40.0), {}, {}),  # the baselines run as published
        ("round_robin", (20.0, 30.0), {}, {}),
    ],
)
def test_wait_bounds(strategy: str, ttfts: tuple[float | None, ...], policy: dict[str, float],
                     want: dict[str, float]) -> None:
    assert wait_bounds(decision(strategy, *ttfts), Policy(**policy)) == want  # type: ignore[arg-type]


def test_after_refusals_checks_the_next_candidate_against_the_best_refusers_wait() -> None:
    policy = Policy(wait_bound_attempts=2, wait_bound_min_ms=50.0)
    # next predicted sooner than the refusers (1,200 ms and 800 ms known there): on, bounded by
    # the best refuser's time less the next candidate's own RTT + prefill (100 ms)
    assert after_refusals(300.0, 100.0, [1200.0, 800.0], policy) == (None, 700.0)
    # never tighter than the floor
    assert after_refusals(30.0, 20.0, [60.0, 90.0], policy) == (None, 50.0)
    # next predicted later than the best refuser: back to it, unbounded
    assert after_refusals(900.0, 100.0, [1200.0, 800.0], policy) == (1, None)
    # no next candidate: back to the soonest refuser
    assert after_refusals(None, None, [1200.0, 800.0], policy) == (1, None)
    # checks spent (planned bounded attempts + CHECKED_ATTEMPTS refusals): back to the soonest
    # refuser, unbounded, however free the next candidate's advert says it is
    spent = [1000.0, 900.0] + [1100.0] * CHECKED_ATTEMPTS
    assert after_refusals(300.0, 100.0, spent, policy) == (1, None)
    # nobody refused: nothing to check against
    assert after_refusals(300.0, 100.0, [], policy) == (None, None)
