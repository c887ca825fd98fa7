"""The request's life after the decision (``meshd.core.request_life``): tables of events and
the actions they give, then every event in every state, then random lives (Hypothesis)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshd.core.request_life import (
    MAX_ATTEMPTS,
    ArmTimer,
    BackToRefuser,
    Busy,
    CacheHit,
    CacheLookup,
    CacheMiss,
    Cancel,
    Decided,
    Drop,
    Expired,
    Fail,
    Failed,
    Finish,
    Finished,
    FirstToken,
    FirstTokenLate,
    GiveUp,
    HedgeDue,
    NoRoute,
    Redecide,
    Release,
    RequestLife,
    Route,
    Send,
    SendPlan,
    ServeCached,
    StageFailed,
)
from meshd.core.snapshot import Policy

PLAN = object()  # plans are opaque to the machine


def life(**kw: Any) -> RequestLife[str]:
    return RequestLife(started_s=0.0, **kw)


def started(*order: str, hedge_ms: float | None = None, **kw: Any) -> tuple[RequestLife[str], list[Any]]:
    lf = life(**kw)
    return lf, lf.handle(Decided(Route(tuple(order), hedge_ms=hedge_ms)), 0.0)


def sends(acts: list[Any]) -> list[tuple[str, int]]:
    return [(a.peer, a.attempt) for a in acts if isinstance(a, Send)]


def kinds(acts: list[Any]) -> list[str]:
    return [type(a).__name__ for a in acts]


# ---------------------------------------------------------------------------------- one node


def test_the_first_decision_sends_to_the_chosen_peer_and_arms_the_hedge() -> None:
    lf, acts = started("a", "b", "c", hedge_ms=40.0)
    assert acts == [Send(0, "a", None, 0), ArmTimer("hedge", 0.04)]
    assert lf.state == "running" and lf.live.keys() == {0}


def test_a_failure_moves_on_along_the_order_then_decides_again_without_the_tried() -> None:
    lf, _ = started("a", "b")
    assert sends(lf.handle(Busy(0), 0.1)) == [("b", 1)]
    acts = lf.handle(Failed(1, "peer_gone", "killed"), 0.2)
    assert acts == [Redecide(frozenset({"a", "b"}), "killed")]
    assert lf.state == "redeciding" and lf.attempts == 2
    assert sends(lf.handle(Decided(Route(("c",))), 0.3)) == [("c", 2)]


def test_known_dead_peers_of_the_order_are_skipped() -> None:
    lf, _ = started("a", "b", "c", "d")
    assert sends(lf.handle(Failed(0, gone={"b", "c"}), 0.1)) == [("d", 1)]


@pytest.mark.parametrize("limit", [1, 2, 3, 5])
def test_the_request_fails_after_max_attempts_counted_failures(limit: int) -> None:
    lf, acts = started(*"abcdefgh", max_attempts=limit)
    for i in range(limit):
        acts = lf.handle(Busy(i, reason=f"busy {i}"), float(i))
    assert acts == [Fail("busy", f"busy {limit - 1}")]
    assert lf.over and lf.retries == limit and lf.attempts == limit


def test_three_attempts_is_the_rule() -> None:
    assert MAX_ATTEMPTS == 3


def test_a_failure_past_the_timeout_ends_the_request() -> None:
    lf, _ = started("a", "b", timeout_s=30.0)
    assert lf.handle(Failed(0, "peer_gone", "gone"), 31.0) == [Fail("peer_gone", "gone")]


def test_no_route_after_a_failure_names_both() -> None:
    lf, _ = started("a")
    lf.handle(Failed(0, "peer_gone", "a died"), 0.1)
    acts = lf.handle(NoRoute("nobody serves m"), 0.2)
    assert len(acts) == 1 and isinstance(acts[0], Fail) and acts[0].code == "no_route"
    assert "a died" in acts[0].reason and "nobody serves m" in acts[0].reason


def test_first_token_timeout_counts_one_failure_and_moves_on() -> None:
    lf, acts = started("a", "b", first_token_timeout_s=5.0)
    assert acts == [Send(0, "a", None, 0), ArmTimer("first_token", 5.0)]
    assert lf.handle(FirstTokenLate(), 4.0) == []  # not yet
    acts = lf.handle(FirstTokenLate(), 5.0)
    assert acts[0] == Cancel(0, "a", "late") and sends(acts) == [("b", 1)]
    assert lf.attempts == 1 and lf.code == "deadline"
    lf.handle(FirstToken(1), 6.0)
    assert lf.handle(FirstTokenLate(), 99.0) == []  # a token came: no deadline


def test_an_answer_finishes_and_nothing_follows() -> None:
    lf, _ = started("a", "b")
    assert lf.handle(FirstToken(0), 0.1) == []
    assert lf.handle(Finished(0), 0.5) == [Finish(0)]
    assert lf.over and lf.handle(Failed(0), 0.6) == [] and lf.handle(HedgeDue(), 0.7) == []


def test_stale_events_of_attempts_that_ended_change_nothing() -> None:
    lf, _ = started("a", "b", "c")
    lf.handle(Busy(0), 0.1)
    for ev in (Busy(0), Failed(0), FirstToken(0), Finished(0), Expired(0), StageFailed(0)):
        assert lf.handle(ev, 0.2) == []
    assert lf.live.keys() == {1} and lf.attempts == 1


# ---------------------------------------------------------------------------------- refusals


def bounded(**predicted: float) -> Route[str]:
    """All but the last carry a 50 ms bound (as wait_bounds gives); RTT + prefill 5 ms each."""
    names = list(predicted)
    return Route(tuple(names), {p: 50.0 for p in names[:-1]},
                 {p: (ms, 5.0) for p, ms in predicted.items()})


@pytest.mark.parametrize(
    ("predicted", "waits", "want"),
    [
        # a and b refuse; c is predicted slower than going back to a (30 + 5 ms): back to a
        ({"a": 20.0, "b": 30.0, "c": 200.0}, {"a": 30.0, "b": 500.0},
         [("a", 50.0), ("b", 50.0), ("a", None)]),
        # c is predicted sooner than either refuser: c, checked against a's wait (35 - 5 ms,
        # never under the 50 ms floor)
        ({"a": 20.0, "b": 30.0, "c": 20.0}, {"a": 30.0, "b": 500.0},
         [("a", 50.0), ("b", 50.0), ("c", 50.0)]),
        # c's advert said free but it would wait 2 s: it refuses the check, back to a
        ({"a": 20.0, "b": 30.0, "c": 20.0}, {"a": 300.0, "b": 500.0, "c": 2000.0},
         [("a", 50.0), ("b", 50.0), ("c", 300.0), ("a", None)]),
        # b, the last, is checked against a's wait and turns out full (busy, no estimate): the
        # order is spent, so back to a, which only refused
        ({"a": 20.0, "b": 30.0}, {"a": 300.0, "b": None}, [("a", 50.0), ("b", 300.0), ("a", None)]),
    ],
)
def test_wait_refusals_move_on_then_go_where_it_is_soonest(
    predicted: dict[str, float], waits: dict[str, float | None],
    want: list[tuple[str, float | None]],
) -> None:
    lf: RequestLife[str] = life(policy=Policy())
    acts = lf.handle(Decided(bounded(**predicted)), 0.0)
    got: list[tuple[str, float | None]] = []
    plain = 0
    t = 0.0
    while True:
        s = next(a for a in acts if isinstance(a, Send))
        got.append((s.peer, s.max_wait_ms))
        t += 0.01
        if s.peer in waits and (s.max_wait_ms is not None or waits[s.peer] is None):
            plain += waits[s.peer] is None  # a busy answer without a wait: counted
            acts = lf.handle(Busy(s.attempt, waits.pop(s.peer) if waits[s.peer] is None
                                  else waits[s.peer]), t)
            continue
        assert lf.handle(Finished(s.attempt), t) == [Finish(s.attempt)]
        break
    assert got == want
    assert lf.attempts == plain  # refusals cost none


def test_going_back_to_a_refuser_is_noted() -> None:
    lf: RequestLife[str] = life()
    lf.handle(Decided(bounded(a=20.0, b=30.0, c=200.0)), 0.0)
    lf.handle(Busy(0, 30.0), 0.01)
    acts = lf.handle(Busy(1, 500.0), 0.02)
    assert acts[0] == BackToRefuser("a", 35.0, "c") and sends(acts) == [("a", 2)]
    assert lf.refusals == 2 and lf.retries == 0


def test_a_busy_answer_without_a_bound_is_a_plain_failure() -> None:
    lf, _ = started("a", "b")  # no bounds
    acts = lf.handle(Busy(0, 120.0), 0.1)
    assert sends(acts) == [("b", 1)] and lf.attempts == 1 and lf.refusals == 0


# ---------------------------------------------------------------------------------- hedging


def test_a_late_first_token_sends_one_hedge_without_a_bound() -> None:
    lf: RequestLife[str] = life()
    lf.handle(Decided(Route(("a", "b", "c"), {"a": 50.0, "b": 50.0}, hedge_ms=30.0)), 0.0)
    assert lf.handle(HedgeDue(), 0.02) == []  # not due yet
    acts = lf.handle(HedgeDue(), 0.03)
    assert acts == [Send(1, "b", None, 1, hedge=True)]
    assert lf.racing and lf.hedges == 1
    assert lf.handle(HedgeDue(), 0.5) == []  # one hedge at most


def test_the_first_token_decides_the_race_and_the_loser_is_next_in_line() -> None:
    lf, _ = started("a", "b", "c", hedge_ms=30.0)
    lf.handle(HedgeDue(), 0.03)
    assert lf.handle(FirstToken(1), 0.05) == [Cancel(0, "a", "lost")]
    assert lf.hedge_won == 1 and not lf.racing
    # the hedge copy dies after some tokens: the copy that lost did nothing wrong, it goes next
    acts = lf.handle(Failed(1, "peer_gone", "killed"), 0.2)
    assert acts == [Send(2, "a", None, 1)]  # unbounded, on the copy that failed
    assert lf.attempts == 1


def test_a_copy_that_fails_while_its_sibling_runs_is_dropped_uncounted() -> None:
    lf, _ = started("a", "b", "c", hedge_ms=30.0)
    lf.handle(HedgeDue(), 0.03)
    assert lf.handle(Busy(1), 0.04) == [Drop(1)]
    assert lf.attempts == 0 and lf.live.keys() == {0}
    assert sends(lf.handle(Failed(0), 0.1)) == [("c", 2)]  # the last copy retries, counted


def test_no_hedge_after_a_first_token_or_without_a_peer_left() -> None:
    lf, _ = started("a", "b", hedge_ms=30.0)
    lf.handle(FirstToken(0), 0.01)
    assert lf.handle(HedgeDue(), 0.03) == []
    lf2, _ = started("a", hedge_ms=30.0)
    assert lf2.handle(HedgeDue(), 0.03) == []
    lf3, _ = started("a", "b", hedge_ms=30.0, max_attempts=5)
    lf3.handle(Failed(0, gone={"b"}), 0.01)  # order spent: a new decision is pending
    assert lf3.state == "redeciding" and lf3.handle(HedgeDue(), 0.03) == []


def test_only_the_first_decision_arms_the_hedge() -> None:
    lf, _ = started("a", hedge_ms=30.0)
    lf.handle(Failed(0), 0.01)
    acts = lf.handle(Decided(Route(("b", "c"), hedge_ms=30.0)), 0.02)
    assert not any(isinstance(a, ArmTimer) for a in acts)


def test_the_answer_of_either_copy_cancels_the_other() -> None:
    lf, _ = started("a", "b", hedge_ms=30.0)
    lf.handle(HedgeDue(), 0.03)
    assert lf.handle(Finished(0), 0.04) == [Cancel(1, "b", "done"), Finish(0)]


# ---------------------------------------------------------------------------------- pipelines


def test_a_failed_stage_blames_its_culprits_and_decides_again() -> None:
    lf = life()
    assert lf.handle(Decided(plan=PLAN), 0.0) == [SendPlan(0, PLAN, 0)]
    acts = lf.handle(StageFailed(0, frozenset({"s2"}), "peer_gone", "s2 gone"), 1.0)
    assert acts == [Redecide(frozenset({"s2"}), "s2 gone")]
    assert lf.attempts == 1


@pytest.mark.parametrize("then", ["plan", "one node"])
def test_after_a_failed_stage_the_new_decision_may_be_a_chain_or_one_node(then: str) -> None:
    lf = life()
    lf.handle(Decided(plan=PLAN), 0.0)
    lf.handle(StageFailed(0, frozenset({"s2"})), 1.0)
    if then == "plan":
        assert lf.handle(Decided(plan=PLAN), 1.1) == [SendPlan(1, PLAN, 0)]
    else:
        assert sends(lf.handle(Decided(Route(("w",), hedge_ms=10.0)), 1.1)) == [("w", 1)]
        # a one-node fallback walks its order on failure, as any
        assert lf.handle(Failed(1), 1.2) == [Redecide(frozenset({"s2", "w"}), "peer gone")]


def test_a_plan_is_never_hedged() -> None:
    lf = life()
    lf.handle(Decided(plan=PLAN), 0.0)
    assert lf.hedge_at is None and lf.handle(HedgeDue(), 10.0) == []


# ---------------------------------------------------------------------------------- the cache, the end


def looking(*order: str, hedge_ms: float | None = None, here: str = "me", **kw: Any
            ) -> tuple[RequestLife[str], list[Any]]:
    """A machine whose semantic lookup is pending, then given ``order`` as its first decision."""
    lf = life(**kw)
    assert lf.handle(CacheLookup(here), 0.0) == [] and lf.held
    return lf, lf.handle(Decided(Route(tuple(order), hedge_ms=hedge_ms)), 0.0)


def test_a_cache_hit_before_the_first_token_cancels_every_attempt_and_serves_the_cached_answer(
        ) -> None:
    lf, acts = looking("a", "b", hedge_ms=30.0)
    assert sends(acts) == [("a", 0)]  # a peer's model starts beside the lookup
    lf.handle(HedgeDue(), 0.03)
    assert lf.handle(CacheHit(), 0.04) == [Cancel(0, "a", "cached"), Cancel(1, "b", "cached"),
                                           ServeCached("cancelled")]
    assert lf.state == "cached" and not lf.held and lf.handle(FirstToken(0), 0.05) == []


def test_a_first_token_while_the_lookup_runs_is_held_back_and_a_hit_still_wins() -> None:
    lf, _ = looking("a")
    assert lf.handle(FirstToken(0), 0.01) == [] and lf.held  # the driver keeps it back
    assert lf.handle(CacheHit(), 0.02) == [Cancel(0, "a", "cached"), ServeCached("cancelled")]


def test_an_answer_complete_before_the_lookup_waits_for_it() -> None:
    lf, _ = looking("a")
    lf.handle(FirstToken(0), 0.01)
    assert lf.handle(Finished(0), 0.02) == [] and lf.state == "waiting" and not lf.over
    assert lf.handle(CacheHit(), 0.03) == [ServeCached("dropped")]  # the model's answer dropped
    lf, _ = looking("a")
    lf.handle(FirstToken(0), 0.01)
    lf.handle(Finished(0), 0.02)
    assert lf.handle(CacheMiss(), 0.03) == [Release(), Finish(0)] and lf.state == "done"


def test_a_miss_lets_out_what_was_held_and_changes_nothing_else() -> None:
    events = [FirstToken(0), Failed(0), HedgeDue(), FirstToken(1), Finished(1)]
    lf, acts = looking("a", "b", "c", hedge_ms=30.0)
    twin, twin_acts = started("a", "b", "c", hedge_ms=30.0)
    assert acts == twin_acts
    assert lf.handle(CacheMiss(), 0.001) == [Release()] and not lf.held
    for i, ev in enumerate(events):
        now = 0.01 * (i + 1)
        assert lf.handle(ev, now) == twin.handle(ev, now)
    assert lf.state == twin.state == "done"


def test_a_late_cache_hit_after_the_answer_was_let_out_changes_nothing() -> None:
    lf, _ = looking("a")
    lf.handle(CacheMiss(), 0.01)
    lf.handle(FirstToken(0), 0.02)  # streamed to the client
    assert lf.handle(CacheHit(), 0.03) == [] and lf.state == "running"
    assert lf.handle(Finished(0), 0.04) == [Finish(0)]
    # with no lookup at all, a hit is nobody's
    lf, _ = started("a")
    lf.handle(FirstToken(0), 0.01)
    assert lf.handle(CacheHit(), 0.02) == [] and lf.handle(Finished(0), 0.03) == [Finish(0)]


@pytest.mark.parametrize("first", ["here", "plan"])
def test_a_decision_for_this_node_or_a_plan_waits_for_the_lookup(first: str) -> None:
    lf = life()
    lf.handle(CacheLookup("me"), 0.0)
    decided = Decided(Route(("me", "b"), hedge_ms=20.0)) if first == "here" else Decided(plan=PLAN)
    assert lf.handle(decided, 0.0) == []  # nothing runs beside the embedding
    assert lf.handle(CacheHit(), 0.05) == [ServeCached(None)]  # and a hit runs no model
    lf = life()
    lf.handle(CacheLookup("me"), 0.0)
    lf.handle(decided, 0.0)
    acts = lf.handle(CacheMiss(), 0.05)
    assert acts[0] == Release()
    if first == "here":  # sent now, the hedge counted from now
        assert acts[1:] == [Send(0, "me", None, 0), ArmTimer("hedge", 0.07)]
    else:
        assert acts[1:] == [SendPlan(0, PLAN, 0)]


def test_no_route_waits_for_the_lookup_then_fails_with_its_code() -> None:
    lf = life()
    lf.handle(CacheLookup("me"), 0.0)
    assert lf.handle(NoRoute("over quota", "quota"), 0.0) == [] and lf.state == "waiting"
    assert lf.handle(CacheMiss(), 0.05) == [Release(), Fail("quota", "over quota")]
    lf = life()
    lf.handle(CacheLookup("me"), 0.0)
    lf.handle(NoRoute("none"), 0.0)
    assert lf.handle(CacheHit(), 0.05) == [ServeCached(None)]


def test_a_failed_request_waits_for_the_lookup_but_giving_up_does_not() -> None:
    lf, _ = looking("a", max_attempts=1)
    assert lf.handle(Failed(0), 0.01) == [] and lf.state == "waiting"
    assert lf.handle(CacheHit(), 0.02) == [ServeCached("cancelled")]
    lf, _ = looking("a")
    assert lf.handle(GiveUp("cancelled"), 0.01) == [Cancel(0, "a", "gave up"),
                                                    Fail("cancelled", "cancelled")]


def test_a_server_that_drops_an_expired_request_ends_it() -> None:
    lf, _ = started("a", "b")
    assert lf.handle(Expired(0, "timeout"), 30.1) == [Fail("timeout", lf.reason)]


# ---------------------------------------------------------------------------------- every state

EVENTS: list[Any] = [
    Decided(Route(("x", "y"), hedge_ms=10.0)), Decided(plan=PLAN), NoRoute("none"), FirstToken(0),
    Finished(0), Busy(0), Busy(0, 80.0), Failed(0), StageFailed(0, frozenset({"x"})), Expired(0),
    HedgeDue(), FirstTokenLate(), CacheLookup("me"), CacheHit(), CacheMiss(), GiveUp("unfinished"),
]


def in_state(state: str) -> RequestLife[str]:
    lf = life(first_token_timeout_s=1.0)
    if state in ("cached", "holding", "waiting"):
        lf.handle(CacheLookup("me"), 0.0)
    if state == "deciding":
        return lf
    lf.handle(Decided(Route(("a", "b"), {"a": 50.0}, {"b": (20.0, 5.0)}, hedge_ms=10.0)), 0.0)
    if state == "redeciding":
        lf.handle(Failed(0, gone={"b"}), 0.001)
    elif state == "racing":
        lf.handle(HedgeDue(), 0.01)
    elif state in ("done", "failed", "cached"):
        lf.handle({"done": Finished(0), "failed": GiveUp("x"), "cached": CacheHit()}[state], 0.01)
    elif state == "waiting":
        lf.handle(Finished(0), 0.01)
    assert lf.state == {"racing": "running", "holding": "running"}.get(state, state)
    return lf


@pytest.mark.parametrize("state", ["deciding", "running", "racing", "redeciding", "holding",
                                   "waiting", "done", "failed", "cached"])
@pytest.mark.parametrize("ev", EVENTS, ids=lambda e: type(e).__name__)
def test_every_event_in_every_state(state: str, ev: Any) -> None:
    lf = in_state(state)
    before, held = lf.state, lf.held
    acts = lf.handle(ev, 5.0)
    if before in ("done", "failed", "cached"):
        assert acts == []
        return
    # nothing runs while deciding: only a decision or an end matters
    if before in ("deciding", "redeciding") and not isinstance(ev, Decided | NoRoute | GiveUp):
        assert acts == []
        return
    # waiting for the cache: only its answer or giving up matters
    if before == "waiting" and not isinstance(ev, CacheHit | CacheMiss | GiveUp):
        assert acts == []
        return
    # no lookup pending: the cache's answers change nothing
    if not held and isinstance(ev, CacheHit | CacheMiss) or isinstance(ev, CacheLookup):
        assert acts == []
        return
    # every answer keeps the machine consistent
    assert len(lf.live) <= 2 and lf.attempts <= lf.max_attempts
    if lf.over:
        assert lf.live == {} and isinstance(acts[-1], Fail | Finish | ServeCached)
    ends = [a for a in acts if isinstance(a, Fail | Finish | ServeCached)]
    assert len(ends) == (1 if lf.over else 0)


# ---------------------------------------------------------------------------------- random lives

ev_strategy = st.one_of(
    st.builds(FirstToken, st.integers(0, 6)),
    st.builds(Finished, st.integers(0, 6)),
    st.builds(Busy, st.integers(0, 6), st.one_of(st.none(), st.floats(0, 5000))),
    st.builds(Failed, st.integers(0, 6)),
    st.builds(StageFailed, st.integers(0, 6), st.frozensets(st.sampled_from("abcdef"), max_size=2)),
    st.builds(Expired, st.integers(0, 6)),
    st.builds(HedgeDue), st.builds(FirstTokenLate), st.just(CacheHit()), st.just(CacheMiss()),
    st.builds(Decided, st.builds(Route, st.lists(st.sampled_from("abcdef"), min_size=1, max_size=4,
                                                 unique=True).map(tuple))),
    st.builds(Decided, plan=st.just(PLAN)),
    st.builds(NoRoute, st.just("none")),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(ev_strategy, max_size=30), st.integers(1, 4), st.sampled_from([None, "a", "z"]))
def test_random_lives_keep_the_rules(events: list[Any], limit: int, lookup: str | None) -> None:
    lf: RequestLife[str] = life(max_attempts=limit, first_token_timeout_s=0.5)
    if lookup is not None:  # a cache lookup runs, for this node ("a": first in the order) or not
        lf.handle(CacheLookup(lookup), 0.0)
    lf.handle(Decided(Route(("a", "b", "c"), {"a": 50.0, "b": 50.0},
                            {p: (10.0, 5.0) for p in "abc"}, hedge_ms=20.0)), 0.0)
    ids: set[int] = {0} if lookup != "a" else set()
    ended = 0
    hedges = 0
    for i, ev in enumerate(events):
        held = lf.held
        acts = lf.handle(ev, 0.1 * (i + 1))
        if held:  # while the lookup runs only a hit ends it (a miss lets out a held end)
            assert isinstance(ev, CacheMiss) or not any(isinstance(a, Finish | Fail) for a in acts)
        else:  # the cache answers only while its lookup runs
            assert not any(isinstance(a, ServeCached | Release) for a in acts)
        for a in acts:
            if isinstance(a, Send | SendPlan):
                assert a.attempt not in ids  # attempts are fresh
                ids.add(a.attempt)
                hedges += isinstance(a, Send) and a.hedge
            if isinstance(a, Fail | Finish | ServeCached):
                ended += 1
        assert len(lf.live) <= 2 and lf.attempts <= limit
        assert hedges <= 1
        if lf.over:
            assert lf.live == {}
    assert ended == (1 if lf.over else 0)
