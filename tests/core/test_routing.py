"""The router: hard constraints, every strategy, meshd's prediction and sampling, and a seeded
simulation in which meshd must beat lwsq and least_queue with stale adverts."""

from __future__ import annotations

import dataclasses
import heapq
import math
import random
from collections import Counter
from collections.abc import Iterable

import pytest

from meshd.core import predict, routing
from meshd.core.routing import (
    STRATEGIES,
    Candidate,
    RouteDecision,
    hedge_deadline_ms,
    residency_allows,
    route,
)
from meshd.core.snapshot import MeshSnapshot, NodeView, Policy, RouteRequest, Serving
from meshd.errors import ConfigError, RoutingError

M = "m"
WHOLE = (Serving(M, 8, 0, 8),)


def node(pid: str, **kw: object) -> NodeView:
    base: dict[str, object] = {
        "peer_id": pid, "name": pid.upper(), "serving": WHOLE, "max_concurrency": 4,
        "prefill_tps": 1000.0, "decode_tps": 50.0, "rtt_ms": 10.0, "rtt_source": "measured",
    }  # fmt: skip
    base.update(kw)
    return NodeView(**base)  # type: ignore[arg-type]


def snap(*nodes: NodeView, local: str = "a", **kw: object) -> MeshSnapshot:
    return MeshSnapshot(local, tuple(nodes), **kw)  # type: ignore[arg-type]


def req(**kw: object) -> RouteRequest:
    base: dict[str, object] = {
        "request_id": "r1",
        "model": M,
        "prompt_tokens": 100,
        "max_tokens": 11,
    }
    base.update(kw)
    return RouteRequest(**base)  # type: ignore[arg-type]


def decide(s: MeshSnapshot, strategy: str = "meshd", seed: int = 1, **kw: object) -> RouteDecision:
    r = kw.pop("request", None) or req()
    assert isinstance(r, RouteRequest)
    return route(r, s, Policy(strategy=strategy, **kw), random.Random(seed))  # type: ignore[arg-type]


# --- hard constraints ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("labels", "tag", "ok"),
    [
        (frozenset({"eu"}), "eu", True),
        (frozenset({"eu/de"}), "eu", True),
        (frozenset({"eu"}), "eu/de", False),
        (frozenset({"residency:eu"}), "eu", True),
        (frozenset({"europe"}), "eu", False),  # not a prefix on a "/" boundary
        (frozenset(), "eu", False),
        (frozenset({"us", "eu/fr"}), "eu/fr", True),
    ],
)
def test_residency_allows(labels: frozenset[str], tag: str, ok: bool) -> None:
    assert residency_allows(labels, tag) is ok


@pytest.mark.parametrize(
    ("bad", "r", "policy", "reason"),
    [
        (
            node("b", labels=frozenset({"us"})),
            req(residency="eu"),
            {},
            "residency (labels do not allow eu)",
        ),
        (node("b"), req(exclude=frozenset({"b"})), {}, "already tried"),
        (node("b", queue_depth=60, sent_since_advert=4), req(), {}, "busy (queue 64/64)"),
        (node("b", free_kv_tokens=50), req(), {}, "kv cache full (50 free < 111)"),
        (node("b"), req(hops=4), {"max_hops": 4}, "hop limit (4/4)"),
    ],
)
def test_each_hard_constraint_excludes_and_says_why(
    bad: NodeView, r: RouteRequest, policy: dict[str, object], reason: str
) -> None:
    good = node("a", is_local=True, rtt_ms=0.0, labels=frozenset({"eu"}))
    for strategy in STRATEGIES:
        d = decide(snap(good, bad), strategy, request=r, **policy)
        assert d.order == ("a",)
        excluded = d.candidate("b")
        assert excluded is not None and excluded.excluded_by == reason
        assert excluded.predicted_ttft_ms is None
        assert d.candidate("a") is not None and d.candidate("a").excluded_by is None  # type: ignore[union-attr]


def test_nothing_qualifies_names_every_node_and_reason() -> None:
    s = snap(
        node("a", labels=frozenset({"us"})),
        node("b", labels=frozenset({"eu"}), queue_depth=64),
        node("c", labels=frozenset({"asia"})),
    )
    with pytest.raises(RoutingError) as err:
        decide(s, request=req(residency="eu"))
    msg = str(err.value)
    assert "\n" not in msg
    assert "3 excluded" in msg and "residency: A, C" in msg and "busy: B" in msg


@pytest.mark.parametrize(
    ("s", "r", "policy", "match"),
    [
        (snap(node("a")), req(model="other"), {}, "no node serves the whole of model 'other'"),
        (snap(node("a")), req(), {"model_allow": frozenset({"x"})}, "not in the allow-list"),
        (
            snap(node("a"), client_in_flight={"bob": 2}),
            req(client="bob"),
            {"client_quota": {"bob": 2}},
            "quota is 2",
        ),
    ],
)
def test_request_wide_constraints(
    s: MeshSnapshot, r: RouteRequest, policy: dict[str, object], match: str
) -> None:
    with pytest.raises(RoutingError, match=match):
        decide(s, request=r, **policy)


def test_constraints_are_listed_in_words() -> None:
    s = snap(node("a", is_local=True, labels=frozenset({"eu"})), client_in_flight={"bob": 1})
    d = decide(
        s, request=req(client="bob", residency="eu", exclude=frozenset({"zz"})),
        model_allow=frozenset({M}), client_quota={"bob": 3},
    )  # fmt: skip
    text = " | ".join(d.constraints)
    assert (
        "allow-list" in text
        and "quota (2/3)" in text
        and "residency eu" in text
        and "excluding 1" in text
    )


def test_partial_servers_are_not_candidates() -> None:
    s = snap(node("a", serving=(Serving(M, 8, 0, 4),)), node("b"))
    assert decide(s).order == ("b",)


def test_unknown_strategy_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="unknown routing strategy 'fastest'"):
        decide(snap(node("a")), "fastest")


# --- the baselines ---------------------------------------------------------------------------

FIVE = snap(*(node(p, rtt_ms=r, queue_depth=q) for p, r, q in
              [("a", 30.0, 0), ("b", 5.0, 3), ("c", 20.0, 1), ("d", 8.0, 0), ("e", 50.0, 2)]))  # fmt: skip


@pytest.mark.parametrize(("rr", "want"), [(0, "a"), (1, "b"), (4, "e"), (5, "a"), (7, "c")])
def test_round_robin_lockstep_walks_peer_id_order(rr: int, want: str) -> None:
    d = route(req(), FIVE, Policy(strategy="round_robin_lockstep"), random.Random(1), rr)
    assert d.chosen == want
    assert len(d.order) == 5 and d.order[0] == want and sorted(d.order) == list("abcde")
    assert all(c.score is None for c in d.candidates)


def _rr_walk(s: MeshSnapshot, start: int, steps: int, request: RouteRequest | None = None
             ) -> list[str]:  # fmt: skip
    pol = Policy(strategy="round_robin")
    return [route(request or req(), s, pol, random.Random(1), start + k).chosen
            for k in range(steps)]  # fmt: skip


def test_round_robin_walks_every_eligible_node_once_per_turn_in_its_own_order() -> None:
    walk = _rr_walk(FIVE, 0, 10)
    assert sorted(walk[:5]) == list("abcde") and walk[5:] == walk[:5]
    d = route(req(), FIVE, Policy(strategy="round_robin"), random.Random(1), 0)
    assert d.order == tuple(walk[:5])  # the fallbacks go on along the same walk
    assert all(c.score is None for c in d.candidates)
    # Another node has its own order, and the same node always the same one.
    others = {tuple(_rr_walk(dataclasses.replace(FIVE, local_peer_id=f"n{i}"), 0, 5))
              for i in range(12)}  # fmt: skip
    assert len(others) >= 6
    assert _rr_walk(dataclasses.replace(FIVE, local_peer_id="n3"), 0, 5) == _rr_walk(
        dataclasses.replace(FIVE, local_peer_id="n3"), 0, 5
    )
    # Excluded nodes drop out of the walk; the others keep their relative order.
    tried = req(exclude=frozenset({"b", "d"}))
    sub = _rr_walk(FIVE, 0, 3, tried)
    assert sorted(sub) == list("ace") and sub == [p for p in walk[:5] if p in "ace"]


@pytest.mark.parametrize("n", [40, 80])  # the loop path and the numpy path
def test_round_robin_walks_the_local_nodes_own_order_from_its_counter(n: int) -> None:
    nodes = [node(f"p{i:03d}", queue_depth=64 if i % 7 == 0 else 0) for i in range(n)]
    s = snap(*nodes, local="p005")
    eligible = [f"p{i:03d}" for i in range(n) if i % 7]
    own = sorted(eligible, key=lambda p: routing.round_robin_rank("p005", p))
    start = 12345 % len(own)
    assert _rr_walk(s, 12345, len(own)) == own[start:] + own[:start]


def test_round_robin_offset_is_stable_per_identity_and_differs_across_nodes() -> None:
    ids = [f"12D3KooW{i:040d}" for i in range(200)]
    offsets = [routing.round_robin_offset(p) for p in ids]
    assert offsets == [routing.round_robin_offset(p) for p in ids]
    assert len(set(offsets)) == len(offsets)
    assert all(0 <= x < 2**31 for x in offsets)
    # Spread over any modulus a decision uses (a cell of 32 candidates): no start is crowded.
    starts = Counter(x % 32 for x in offsets)
    assert len(starts) >= 28 and max(starts.values()) <= 16
    # Fixed by the identity alone: the same value on every platform and in every process.
    assert routing.round_robin_offset("12D3KooWtest") == 1172782473
    assert routing.round_robin_offset("12D3KooWtest", "round_robin_lockstep") == 0


def test_random_is_seeded() -> None:
    picks = [decide(FIVE, "random", seed=s).chosen for s in range(40)]
    assert picks == [decide(FIVE, "random", seed=s).chosen for s in range(40)]
    assert set(picks) == set("abcde")


@pytest.mark.parametrize(
    ("strategy", "order"),
    [
        ("least_queue", "dacEb"),  # queue 0 (d at 8 ms before a at 30 ms), then 1, 2, 3
        ("latency_only", "bdcae"),
        # alpha * rtt + beta * queue with alpha 1, beta 50: d 8, a 30, c 70, e 150, b 155
        ("lwsq", "dacEb"),
        # every node has a free slot (4 slots, queues of 3 at most): the nearest first
        ("least_ttft", "bdcae"),
    ],
)
def test_scored_baselines(strategy: str, order: str) -> None:
    assert decide(FIVE, strategy).order == tuple(order.lower())


def test_lwsq_score_is_the_published_formula() -> None:
    d = decide(FIVE, "lwsq", lwsq_alpha=2.0, lwsq_beta=10.0)
    for c in d.candidates:
        n = FIVE.by_id(c.peer_id)
        assert n is not None
        assert c.score == pytest.approx(
            2.0 * n.rtt_ms + 10.0 * (n.queue_depth + n.in_flight + n.sent_since_advert)
        )


def test_ties_go_to_the_lowest_peer_id() -> None:
    s = snap(node("c"), node("a"), node("b"))  # unsorted on purpose
    for strategy in ("least_queue", "latency_only", "lwsq"):
        assert decide(s, strategy).order == ("a", "b", "c")


# --- meshd: prediction -----------------------------------------------------------------------


def test_prediction_matches_the_formulas_when_adverts_are_fresh() -> None:
    n = node("b", rtt_ms=12.0, queue_depth=5, in_flight=4, sent_since_advert=1, max_concurrency=4,
             service_rate_rps=2.0, prefill_tps=500.0)  # fmt: skip
    c = decide(snap(n)).candidate("b")
    assert c is not None
    wait = predict.queue_wait_ms(predict.load(5, 4, 1), 4, 2.0)
    assert c.queue_wait_ms == pytest.approx(wait) == pytest.approx(3500.0)
    assert c.prefill_ms == pytest.approx(predict.prefill_ms(100, 500.0)) == pytest.approx(200.0)
    assert c.predicted_ttft_ms == pytest.approx(predict.predicted_ttft_ms(12.0, wait, 200.0))


def test_service_rate_is_derived_from_speeds_when_not_measured() -> None:
    n = node("b", queue_depth=4, in_flight=4, max_concurrency=4)  # prefill 1000 tps, decode 50
    c = decide(snap(n)).candidate("b")
    rate = predict.service_rate_rps(4, 100, 11, 1000.0, 50.0)
    assert c is not None and c.queue_wait_ms == pytest.approx(predict.queue_wait_ms(8, 4, rate))


def test_stale_queue_figures_revert_towards_the_typical_load() -> None:
    # Two identical nodes: one advertised an empty queue, one a long one, both 3 s ago.
    idle = node("a", queue_depth=0, in_flight=0, advert_age_s=3.0, service_rate_rps=4.0)
    busy = node("b", queue_depth=12, in_flight=4, advert_age_s=3.0, service_rate_rps=4.0)
    d = decide(snap(idle, busy))
    ca, cb = d.candidate("a"), d.candidate("b")
    assert ca is not None and cb is not None
    fresh = decide(
        snap(
            dataclasses.replace(idle, advert_age_s=0.0), dataclasses.replace(busy, advert_age_s=0.0)
        )
    )
    fb = fresh.candidate("b")
    assert fb is not None and cb.queue_wait_ms < fb.queue_wait_ms  # the long queue has drained
    # predict.stale_load with the typical load of 8 requests (16 advertised over 8/s) per 4/s.
    relax_b = 16 / 4.0
    want_b = predict.queue_wait_ms(predict.stale_load(16, 8, 3.0, relax_b), 4, 4.0)
    assert cb.queue_wait_ms == pytest.approx(want_b)
    relax_a = 4 / 4.0
    want_a = predict.queue_wait_ms(predict.stale_load(0, 8, 3.0, relax_a), 4, 4.0)
    assert ca.queue_wait_ms == pytest.approx(want_a) and want_a > 0.0  # the idle one filled up
    off = decide(snap(idle, busy), stale_relax_factor=0.0).candidate("a")
    assert off is not None and off.queue_wait_ms == 0.0


def test_our_own_sends_since_the_advert_count_in_full() -> None:
    base = node(
        "b", queue_depth=0, in_flight=4, max_concurrency=4, service_rate_rps=2.0, advert_age_s=1.0
    )
    w0 = decide(snap(base)).candidate("b")
    w3 = decide(snap(dataclasses.replace(base, sent_since_advert=3))).candidate("b")
    assert w0 is not None and w3 is not None
    assert w3.queue_wait_ms - w0.queue_wait_ms == pytest.approx(3 / 2.0 * 1000.0)


# --- meshd: choosing -------------------------------------------------------------------------


def test_meshd_order_is_chosen_then_best_first_without_duplicates() -> None:
    rng = random.Random(3)
    nodes = [node(f"p{i:02d}", rtt_ms=rng.uniform(1, 100), queue_depth=rng.randint(0, 9),
                  in_flight=4, advert_age_s=rng.uniform(0, 2)) for i in range(30)]  # fmt: skip
    for seed in range(20):
        d = decide(snap(*nodes), seed=seed)
        assert len(d.order) == 9 and len(set(d.order)) == 9
        scores = [d.candidate(p).score for p in d.order[1:]]  # type: ignore[union-attr]
        assert scores == sorted(scores)  # type: ignore[type-var]
        assert d.candidates[0].peer_id == d.chosen
        assert len(d.candidates) == 16 and d.omitted == 14


def test_meshd_is_deterministic_for_a_seed() -> None:
    rng = random.Random(4)
    nodes = [
        node(f"p{i:02d}", rtt_ms=rng.uniform(1, 100), queue_depth=rng.randint(0, 9))
        for i in range(20)
    ]
    s = snap(*nodes)
    assert [decide(s, seed=k) for k in range(10)] == [decide(s, seed=k) for k in range(10)]


def test_meshd_prefers_the_clearly_better_node() -> None:
    fast = node("b", rtt_ms=5.0)
    far = node("c", rtt_ms=140.0)
    slow = node("d", rtt_ms=5.0, prefill_tps=100.0)  # 1 s of prefill
    loaded = node("e", rtt_ms=5.0, queue_depth=20, in_flight=4, service_rate_rps=2.0)
    s = snap(fast, far, slow, loaded, local="zz")
    picks = Counter(decide(s, seed=k).chosen for k in range(300))
    assert picks["b"] > 0.9 * 300


def test_meshd_compares_with_the_local_node() -> None:
    # The local node is idle and as fast as anyone: it always wins its comparison.
    local = node("a", rtt_ms=0.0, is_local=True)
    peers = [node(f"p{i}", rtt_ms=10.0) for i in range(10)]
    assert {decide(snap(local, *peers), seed=k).chosen for k in range(50)} == {"a"}
    # Without the local comparison the peers get work too (when sampling: not on an idle mesh,
    # where meshd takes the global minimum, which is the local node here too).
    picks = {decide(snap(local, *peers), seed=k, sample_local=False, argmin_below_occupancy=0.0).chosen
             for k in range(50)}
    assert len(picks) > 3
    assert {decide(snap(local, *peers), seed=k, sample_local=False).chosen for k in range(50)} == {"a"}


def test_meshd_takes_the_global_minimum_only_while_the_mesh_is_lightly_busy() -> None:
    """Two candidates can miss the free node next door: below ``argmin_below_occupancy`` meshd
    compares every candidate; above it, it samples (and so spreads work over near-equals)."""
    local = node("a", rtt_ms=0.0, is_local=True, in_flight=2, max_concurrency=2, queue_depth=3)
    near = node("n", rtt_ms=10.0)  # the one free node nearby
    far = [node(f"f{i}", rtt_ms=150.0, in_flight=i % 2) for i in range(8)]
    light = snap(local, near, *far)
    assert {decide(light, seed=k).chosen for k in range(100)} == {"n"}
    off = Counter(decide(light, seed=k, argmin_below_occupancy=0.0).chosen for k in range(100))
    assert off["n"] < 100, off  # what two sampled candidates did: some requests went far
    # a busy mesh (every slot taken): meshd samples again, whatever the threshold
    busy = snap(local, *[dataclasses.replace(x, in_flight=4, queue_depth=1) for x in (near, *far)])
    assert len({decide(busy, seed=k).chosen for k in range(100)}) > 1


def test_meshd_spreads_stale_load_where_lwsq_herds() -> None:
    """Independent entry nodes holding the same stale snapshot: lwsq sends every request to the
    one node that looked idle; meshd spreads them over the similar nodes."""
    nodes = [node(f"p{i:02d}", rtt_ms=10.0 + i % 3, queue_depth=2, in_flight=4,
                  advert_age_s=1.5, service_rate_rps=3.0) for i in range(16)]  # fmt: skip
    nodes[7] = dataclasses.replace(nodes[7], queue_depth=0, in_flight=1)
    s = snap(*nodes, local="entry")
    herd = Counter(decide(s, "lwsq", seed=k).chosen for k in range(400))
    assert herd.most_common(1)[0][1] == 400
    spread = Counter(decide(s, seed=k).chosen for k in range(400))
    assert len(spread) >= 12
    assert spread.most_common(1)[0][1] < 0.3 * 400


def test_meshd_weighs_cost_a_little() -> None:
    cheap = [node(f"c{i}", cost_per_hour=0.5) for i in range(5)]
    dear = [node(f"d{i}", cost_per_hour=2.0) for i in range(5)]
    picks = Counter(decide(snap(*cheap, *dear, local="zz"), seed=k).chosen[0] for k in range(400))
    assert picks["c"] > 0.6 * 400
    # ... but a little: a much faster expensive node still wins.
    fast_dear = node("f", cost_per_hour=2.0, prefill_tps=10000.0)
    slow_cheap = node("s", cost_per_hour=0.5, prefill_tps=500.0)  # 200 ms prefill against 10
    picks2 = Counter(
        decide(snap(fast_dear, slow_cheap, local="zz"), seed=k).chosen for k in range(200)
    )
    assert picks2["f"] > 0.9 * 200


def test_softmax_variant() -> None:
    s = snap(node("a", rtt_ms=5.0), node("b", rtt_ms=6.0), node("c", rtt_ms=300.0), local="zz")
    picks = Counter(decide(s, seed=k, softmax_temperature_ms=20.0).chosen for k in range(300))
    assert picks["a"] > 80 and picks["b"] > 80 and picks["c"] == 0


def test_explain_limit_lists_the_best_and_counts_the_rest() -> None:
    nodes = [node(f"p{i:02d}", rtt_ms=float(i)) for i in range(40)]
    nodes += [node(f"x{i:02d}", queue_depth=64) for i in range(5)]
    d = decide(snap(*nodes), "latency_only", explain_limit=10)
    eligible = [c for c in d.candidates if c.excluded_by is None]
    excluded = [c for c in d.candidates if c.excluded_by is not None]
    assert [c.peer_id for c in eligible] == [f"p{i:02d}" for i in range(10)]
    assert len(excluded) == 5 and all(c.excluded_by.startswith("busy") for c in excluded)  # type: ignore[union-attr]
    assert d.omitted == 30
    none = decide(snap(*nodes), "latency_only", explain_limit=0, max_fallbacks=2)
    assert len(none.candidates) == 3 and none.order == ("p00", "p01", "p02")


def test_snapshot_index_is_memoised_and_sorted() -> None:
    s = snap(node("b"), node("a"))
    idx = routing.model_index(s, M)
    assert idx.ids == ["a", "b"] and routing.model_index(s, M) is idx
    # A snapshot derived with dataclasses.replace starts with an empty memo, not the old index.
    s2 = dataclasses.replace(s, nodes=(node("c"),))
    assert routing.model_index(s2, M).ids == ["c"]
    assert s == dataclasses.replace(s)  # the memo never takes part in equality


# --- the vectorised path agrees with the loop ------------------------------------------------


def _random_snapshot(rng: random.Random, n: int) -> MeshSnapshot:
    nodes = []
    for i in range(n):
        nodes.append(node(
            f"p{i:04d}", rtt_ms=rng.uniform(0, 150), queue_depth=rng.randint(0, 12),
            in_flight=rng.randint(0, 8), max_concurrency=rng.choice([1, 2, 8]),
            max_queue=rng.choice([8, 32]), prefill_tps=rng.choice([120.0, 400.0, 5000.0]),
            decode_tps=rng.choice([6.0, 30.0, 50.0]), advert_age_s=rng.uniform(0, 3),
            sent_since_advert=rng.randint(0, 2), cost_per_hour=rng.choice([0.08, 0.3, 0.6]),
            is_local=(i == 3), service_rate_rps=rng.choice([0.0, 2.0, 5.0]),
            labels=frozenset({rng.choice(["eu", "us"])}),
        ))  # fmt: skip
    return MeshSnapshot("p0003", tuple(nodes))


@pytest.mark.parametrize("strategy", ["meshd", "least_queue", "lwsq", "latency_only"])
def test_vectorised_path_agrees_with_the_loop(
    strategy: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = random.Random(9)
    for trial in range(12):
        s = _random_snapshot(rng, 300)
        r = req(prompt_tokens=rng.randint(8, 900), max_tokens=rng.randint(2, 200),
                residency="eu" if trial % 3 == 0 else None, exclude=frozenset({"p0010", "p0011"}))  # fmt: skip
        big = decide(s, strategy, seed=trial, request=r)
        monkeypatch.setattr(routing.constraints, "NUMPY_MIN_NODES", 10**9)
        small = decide(dataclasses.replace(s), strategy, seed=trial, request=r)
        monkeypatch.undo()
        assert big.order == small.order
        for a, b in zip(big.candidates, small.candidates, strict=True):
            assert a.peer_id == b.peer_id and a.excluded_by == b.excluded_by
            for x, y in ((a.predicted_ttft_ms, b.predicted_ttft_ms), (a.score, b.score),
                         (a.queue_wait_ms, b.queue_wait_ms)):  # fmt: skip
                assert (x is None and y is None) or x == pytest.approx(y, rel=1e-9, abs=1e-9)



@pytest.mark.parametrize("n", [40, 300])  # the loop and the numpy forms of the eligible set
def test_the_eligible_set_is_the_nodes_no_node_constraint_excludes(n: int) -> None:
    """``constraints.eligible`` (the fast form) must keep exactly the nodes for which every one
    of ``NODE_CONSTRAINTS`` says None: a constraint added to the list but not to the fast form
    (or the other way round) fails here."""
    rng = random.Random(n)
    for trial in range(10):
        s = _random_snapshot(rng, n)
        r = req(prompt_tokens=rng.randint(8, 900), max_tokens=rng.randint(2, 200),
                residency="eu" if trial % 2 else None, hops=4 if trial % 5 == 0 else 0,
                exclude=frozenset({"p0010", "p0011"}) if trial % 3 else frozenset())  # fmt: skip
        pol = Policy(max_hops=4)
        idx = routing.model_index(s, M)
        fast = [idx.ids[i] for i in list(routing.constraints.eligible(r, idx, pol))]
        slow = [v.peer_id for v in idx.nodes if routing.exclusion_reason(r, v, pol) is None]
        assert fast == slow
        for v in idx.nodes:  # the reason is the first constraint of the list that applies
            said = [c(r, v, pol) for c in routing.NODE_CONSTRAINTS]
            assert routing.exclusion_reason(r, v, pol) == next((w for w in said if w), None)


# --- hedging ---------------------------------------------------------------------------------


def _decision(ttft: float | None, order: Iterable[str] = ("a", "b")) -> RouteDecision:
    cands = tuple(Candidate(p, p, ttft, 1.0, "measured", 0.0, 0.0, 1.0, None) for p in order)
    return RouteDecision("r", "meshd", cands, tuple(order), ())


@pytest.mark.parametrize(
    ("ttft", "order", "policy", "want"),
    [
        (100.0, ("a", "b"), {}, 200.0),
        (5.0, ("a", "b"), {}, 25.0),  # never sooner than hedge_min_ms
        (100.0, ("a", "b"), {"hedge_factor": 1.5, "hedge_min_ms": 0.0}, 150.0),
        (100.0, ("a",), {}, None),  # nobody to hedge to
        (None, ("a", "b"), {}, None),  # nothing predicted
        (100.0, ("a", "b"), {"hedge_factor": 0.0}, None),  # off
    ],
)
def test_hedge_deadline(
    ttft: float | None, order: tuple[str, ...], policy: dict[str, float], want: float | None
) -> None:
    assert hedge_deadline_ms(_decision(ttft, order), Policy(**policy)) == want  # type: ignore[arg-type]


# --- a seeded simulation ---------------------------------------------------------------------


def _simulate(strategy: str, seed: int = 5, duration_s: float = 25.0) -> list[float]:
    """2 regions x 10 nodes (fast and slow), every node an entry, Poisson arrivals at ~80% of
    capacity, adverts every 2 s reaching the others 0.1 s later. Returns TTFTs in ms."""
    rng = random.Random(seed)
    n = 20
    region = [i // 10 for i in range(n)]
    fast = [i % 2 == 0 for i in range(n)]
    slots = [4 if f else 1 for f in fast]
    pf = [4000.0 if f else 500.0 for f in fast]
    dc = [40.0 if f else 20.0 for f in fast]
    mean_p, mean_o = 200, 40
    rate = [predict.service_rate_rps(slots[i], mean_p, mean_o, pf[i], dc[i]) for i in range(n)]
    rtt = [
        [0.0 if i == j else (8.0 if region[i] == region[j] else 90.0) for j in range(n)]
        for i in range(n)
    ]
    ids = [f"n{i:02d}" for i in range(n)]
    policy = Policy(strategy=strategy, explain_limit=0, max_fallbacks=0)
    lam = 0.8 * sum(rate)
    events: list[tuple[float, int, str, int, tuple[int, int, float, int]]] = []
    seq = 0

    def push(
        t: float, kind: str, j: int, data: tuple[int, int, float, int] = (0, 0, 0.0, 0)
    ) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(events, (t, seq, kind, j, data))

    t = 0.0
    while t < duration_s:
        t += rng.expovariate(lam)
        push(t, "arrive", rng.randrange(n))
    for j in range(n):
        push(rng.uniform(0, 2.0), "advert", j)
    queue: list[list[tuple[int, int, float, int]]] = [[] for _ in range(n)]
    busy = [0] * n
    board = [(0.0, 0, 0)] * n  # (published at, queued, running) as heard
    sends: dict[tuple[int, int], list[float]] = {}
    ttfts: list[float] = []
    rr = [0] * n

    def start(j: int, now: float, r: tuple[int, int, float, int]) -> None:
        p, o, t0, e = r
        busy[j] += 1
        if t0 > 5.0:  # warm-up
            ttfts.append((now + p / pf[j] - t0) * 1000.0 + rtt[e][j] / 2)
        push(now + p / pf[j] + (o - 1) / dc[j], "done", j)

    while events:
        now, _, kind, j, data = heapq.heappop(events)
        if kind == "advert":
            push(now + 0.1, "heard", j, (len(queue[j]), busy[j], now, 0))
            if now < duration_s:
                push(now + 2.0, "advert", j)
        elif kind == "heard":
            board[j] = (data[2], data[0], data[1])
        elif kind == "arrive":
            e = j
            p = max(8, min(1500, int(rng.lognormvariate(math.log(mean_p) - 0.32, 0.8))))
            o = max(2, min(200, int(rng.expovariate(1 / mean_o)) + 1))
            views = []
            for k in range(n):
                at, q, f = board[k]
                if k == e:
                    q, f, age, sent = len(queue[k]), busy[k], 0.0, 0
                else:
                    age = now - at
                    sent = sum(1 for x in sends.get((e, k), ()) if x > at)
                views.append(NodeView(ids[k], ids[k], serving=WHOLE, queue_depth=q, in_flight=f,
                                      max_concurrency=slots[k], max_queue=10_000, prefill_tps=pf[k],
                                      decode_tps=dc[k], rtt_ms=rtt[e][k], advert_age_s=age,
                                      sent_since_advert=sent, is_local=k == e,
                                      service_rate_rps=rate[k]))  # fmt: skip
            d = route(
                RouteRequest("r", M, p, o), MeshSnapshot(ids[e], tuple(views)), policy, rng, rr[e]
            )
            rr[e] += 1
            k = ids.index(d.chosen)
            arrive = now + rtt[e][k] / 2000.0
            sends.setdefault((e, k), []).append(arrive)
            push(arrive, "reach", k, (p, o, now, e))
        elif kind == "reach":
            if busy[j] < slots[j]:
                start(j, now, data)
            else:
                queue[j].append(data)
        elif kind == "done":
            busy[j] -= 1
            if queue[j]:
                start(j, now, queue[j].pop(0))
    return sorted(ttfts)


def _pct(xs: list[float], q: float) -> float:
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def test_simulation_meshd_beats_lwsq_least_queue_and_round_robin_at_the_tail() -> None:
    res = {s: _simulate(s) for s in ("meshd", "lwsq", "least_queue", "round_robin")}
    p95 = {s: _pct(v, 0.95) for s, v in res.items()}
    p99 = {s: _pct(v, 0.99) for s, v in res.items()}
    for other in ("lwsq", "least_queue", "round_robin"):
        assert p95["meshd"] < 0.85 * p95[other], (p95, p99)
        assert p99["meshd"] < p99[other], (p95, p99)
    assert p95["meshd"] < 0.6 * p95["round_robin"], (p95, p99)


def test_entry_nodes_in_step_herd_with_lockstep_and_spread_with_round_robin() -> None:
    """Sixteen entry nodes of one cell, each on its first decision, all holding the same view:
    lockstep sends all of them to one server; the fair round-robin (counters from each node's
    identity, each walking its own order) spreads them over most of the cell."""
    ids = [f"12D3KooW{i:04d}" for i in range(16)]
    chosen: dict[str, Counter[str]] = {"round_robin_lockstep": Counter(), "round_robin": Counter()}
    for strategy, picks in chosen.items():
        for me in ids:
            view = snap(*(node(p, is_local=p == me) for p in ids), local=me)
            start = routing.round_robin_offset(me, strategy)
            picks[route(req(), view, Policy(strategy=strategy), random.Random(1), start).chosen] += 1
    assert chosen["round_robin_lockstep"] == Counter({ids[0]: 16})
    assert len(chosen["round_robin"]) >= 8 and max(chosen["round_robin"].values()) <= 4


def test_least_ttft_is_the_global_minimum_of_the_predicted_ttft() -> None:
    s = snap(
        node("near-slow", rtt_ms=5.0, prefill_tps=100.0),  # 5 + 1000 ms of prefill
        node("far-fast", rtt_ms=30.0),  # 30 + 100
        node("near-full", rtt_ms=6.0, queue_depth=3, in_flight=4, service_rate_rps=2.0),  # 4 ahead
    )
    d = decide(s, "least_ttft")
    assert d.order == ("far-fast", "near-slow", "near-full")  # 130, 1005, 6 + 2000 + 100 ms
    assert [c.score for c in d.candidates] == [c.predicted_ttft_ms for c in d.candidates]


@pytest.mark.parametrize(
    ("occupancy", "floor", "want"),
    [(0.0, 0.1, 10.0), (0.02, 0.1, 10.0), (0.1, 0.1, 20.0), (0.25, 0.1, 50.0), (0.45, 0.1, 90.0),
     (0.5, 0.1, 100.0), (3.0, 0.1, 100.0), (0.1, 1.0, 100.0), (float("nan"), 0.1, 100.0)],
)  # fmt: skip
def test_known_temperature_follows_the_occupancy(occupancy: float, floor: float, want: float) -> None:
    pol = Policy(sample_temperature_ms=100.0, known_temperature_floor=floor)
    assert pol.known_temperature_full_at == 0.5
    assert routing.known_temperature_ms(pol, occupancy) == pytest.approx(want)


def _fast_share(floor: float, queue: int) -> float:
    """Share of decisions an entry node (a slow box) sends to the fast half of 20 peers."""
    peers = [node(f"f{i:02d}", prefill_tps=5000.0, max_concurrency=8, queue_depth=queue)
             for i in range(10)]  # fmt: skip
    peers += [node(f"m{i:02d}", prefill_tps=2500.0, max_concurrency=8, queue_depth=queue)
              for i in range(10)]  # fmt: skip
    peers.append(node("a", prefill_tps=200.0, rtt_ms=0.0, is_local=True, max_concurrency=8))
    s = snap(*peers, local="a")
    # the temperature alone (below argmin_below_occupancy meshd would take the global minimum)
    pol = Policy(known_temperature_floor=floor, argmin_below_occupancy=0.0)
    rng = random.Random(5)
    picks = [route(req(prompt_tokens=256), s, pol, rng).chosen for _ in range(2000)]
    return sum(p.startswith("f") for p in picks) / len(picks)


def test_meshd_on_an_idle_mesh_sends_work_to_the_nodes_known_to_be_fastest() -> None:
    idle = _fast_share(0.1, 0)
    assert idle > 0.9
    assert idle > _fast_share(1.0, 0) + 0.1  # the fixed temperature spread it more
    assert _fast_share(0.1, 6) < idle - 0.1  # busy slots everywhere: spread over near-equals
