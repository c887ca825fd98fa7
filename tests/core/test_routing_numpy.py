"""The router's vectorised path and what it hoists out of each decision.

Terms that do not depend on the request are computed once per snapshot (``routing.index._Columns``),
some arithmetic runs in place, and the k best come from a cheaper threshold than a partition of
everything. None of that may change a decision by a single bit: these tests compare each short
cut with the plain computation, exactly (``==`` on floats), not approximately.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import numpy as np
import pytest

from meshd.core import routing
from meshd.core.routing import RouteDecision, constraints, index, route, strategies
from meshd.core.snapshot import MeshSnapshot, NodeView, Policy, RouteRequest, Serving

M = "m"
WHOLE = (Serving(M, 8, 0, 8),)


def _snapshot(seed: int, n: int, rates: str) -> MeshSnapshot:
    rng = random.Random(seed)
    nodes = []
    for i in range(n):
        rate = {"measured": rng.choice([0.4, 2.0, 5.0]), "derived": 0.0}.get(
            rates, rng.choice([0.0, 2.0, 5.0])
        )
        nodes.append(NodeView(
            f"p{i:04d}", f"n{i}", serving=WHOLE, rtt_ms=rng.uniform(0, 150),
            queue_depth=rng.randint(0, 12), in_flight=rng.randint(0, 8),
            max_concurrency=rng.choice([1, 2, 8]), max_queue=rng.choice([8, 32]),
            prefill_tps=rng.choice([120.0, 400.0, 5000.0]), decode_tps=rng.choice([6.0, 30.0]),
            advert_age_s=rng.choice([0.0, rng.uniform(0, 3)]), sent_since_advert=rng.randint(0, 2),
            cost_per_hour=rng.choice([0.08, 0.3, 0.6]), is_local=(i == 3), service_rate_rps=rate,
            free_kv_tokens=rng.choice([1 << 30, 1 << 30, 600]),
            labels=frozenset({rng.choice(["eu", "us"])}),
        ))  # fmt: skip
    return MeshSnapshot("p0003", tuple(nodes))


def _requests(seed: int, n: int) -> list[RouteRequest]:
    rng = random.Random(seed)
    out = []
    for k in range(n):
        out.append(RouteRequest(
            f"r{k}", M, rng.randint(1, 900), rng.randint(1, 200),
            residency=rng.choice([None, None, "eu"]),
            exclude=frozenset(rng.sample(["p0010", "p0011", "p0100"], rng.choice([0, 0, 2]))),
        ))  # fmt: skip
    return out


def _decide(s: MeshSnapshot, r: RouteRequest, strategy: str, seed: int) -> tuple[RouteDecision, float]:
    rng = random.Random(seed)
    d = route(r, s, Policy(strategy=strategy), rng, seed)
    return d, rng.random()  # the decision and what it left of the random stream


@pytest.mark.parametrize("strategy", ["meshd", "lwsq", "least_queue", "latency_only"])
def test_hoisted_queue_terms_give_the_same_bits(
    strategy: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With every rate measured the queue wait is computed once per snapshot; computing it per
    request instead (the general path) must give exactly the same decisions."""
    s = _snapshot(1, 300, "measured")
    reqs = _requests(2, 24)
    fast = [_decide(s, r, strategy, k) for k, r in enumerate(reqs)]
    assert routing.model_index(s, M).cols().part(routing.model_index(s, M).cols().free)._fixed
    init = index._Part.__init__
    hoisted: list[int] = []

    def general(self: Any, cols: Any, ix: Any) -> None:
        init(self, cols, ix)
        hoisted.append(int(self.all_measured))
        self.all_measured = False  # as if some rate were not measured: compute it all

    monkeypatch.setattr(index._Part, "__init__", general)
    monkeypatch.setattr(index._Part, "fixed", _no_fixed)
    plain = [_decide(dataclasses.replace(s), r, strategy, k) for k, r in enumerate(reqs)]
    assert hoisted and all(hoisted)  # each of them would have taken the short cut
    assert fast == plain


def _no_fixed(self: Any, f: float) -> Any:
    raise AssertionError("the general path must not use the hoisted terms")


@pytest.mark.parametrize("rates", ["measured", "derived", "mixed"])
def test_a_warm_snapshot_decides_like_a_fresh_one(rates: str) -> None:
    """Per-snapshot memos (columns, the eligible set, hoisted terms) never leak between
    requests: deciding many requests on one snapshot equals deciding each on a fresh copy."""
    warm = _snapshot(3, 200, rates)
    for k, r in enumerate(_requests(4, 30)):
        assert _decide(warm, r, "meshd", k) == _decide(dataclasses.replace(warm), r, "meshd", k)


def _lowest_reference(score: np.ndarray, k: int, then: np.ndarray | None) -> list[int]:
    keys = [(float(score[j]), float(then[j]) if then is not None else 0.0, j)
            for j in range(len(score)) if score[j] == score[j]]  # fmt: skip
    return [j for *_, j in sorted(keys)[:k]]


@pytest.mark.parametrize("n", [73, 100, 257, 1000, 4096])
@pytest.mark.parametrize("k", [1, 9, 18])
def test_the_k_lowest_match_a_full_sort(n: int, k: int) -> None:
    rng = np.random.default_rng(n * 31 + k)
    for trial in range(20):
        # few distinct values: many ties, also at the kth place
        score = rng.integers(0, 3 if trial % 2 else 50, n).astype(np.float64)
        if trial % 5 == 0:
            score[rng.integers(0, n, 3)] = np.inf
        then = rng.integers(0, 4, n).astype(np.float64) if trial % 3 == 0 else None
        if n > 4 * k:
            assert strategies._lowest_np(score, k, then) == _lowest_reference(score, k, then)
        assert strategies._ranked(score, k, then) == _lowest_reference(score, k, then)


def test_a_nan_score_falls_back_to_the_full_partition() -> None:
    score = np.arange(1000, dtype=np.float64)[::-1].copy()
    score[[5, 500, 999]] = np.nan  # every block minimum near them would be NaN
    assert strategies._lowest_np(score, 18, None) == _lowest_reference(score, 18, None)


def test_busy_nodes_are_listed_as_the_loop_lists_them(monkeypatch: pytest.MonkeyPatch) -> None:
    """When only busy nodes are out, their listing is kept per snapshot: it must be what the
    plain loop lists, decision after decision."""
    s = _snapshot(5, 300, "derived")
    s = dataclasses.replace(s, nodes=tuple(
        dataclasses.replace(n, free_kv_tokens=1 << 30, queue_depth=n.max_queue if i % 7 == 0 else 0)
        for i, n in enumerate(s.nodes)
    ))  # fmt: skip
    reqs = [RouteRequest(f"r{k}", M, 50 + 37 * k, 20) for k in range(8)]
    fast = [_decide(s, r, "meshd", k)[0] for k, r in enumerate(reqs)]
    assert routing.model_index(s, M).cols().busy_memo  # the kept listing was used
    monkeypatch.setattr(constraints, "NUMPY_MIN_NODES", 10**9)
    loop = [_decide(dataclasses.replace(s), r, "meshd", k)[0] for k, r in enumerate(reqs)]
    for a, b in zip(fast, loop, strict=True):
        assert a.order == b.order and a.omitted == b.omitted
        gone_a = [c for c in a.candidates if c.excluded_by is not None]
        gone_b = [c for c in b.candidates if c.excluded_by is not None]
        assert len(gone_a) == 16 and gone_a == gone_b
        assert all(c.excluded_by.startswith("busy (queue") for c in gone_a)  # type: ignore[union-attr]
