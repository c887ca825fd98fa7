"""The planner's pruned search (``planner._Walk``, used when every link between two stage nodes
is the path through the entry) plans exactly what the full search plans, field for field."""

from __future__ import annotations

import dataclasses
import random
import time

import pytest

from meshd.core import planner
from meshd.core.snapshot import MeshSnapshot, NodeView, Policy, RouteRequest, Serving
from meshd.core.vivaldi import Coord
from meshd.errors import RoutingError

L = 12


def random_mesh(rng: random.Random, n: int, dup: bool = False) -> MeshSnapshot:
    """``dup``: a node may list one range twice (then the full search runs)."""
    nodes = []
    tie = rng.random() < 0.3  # many equal figures: ties decided by peer ids and offer order
    for i in range(n):
        ranges: list[Serving] = []
        for _ in range(rng.choice([1, 1, 1, 2, 3])):
            kind = rng.random()
            if kind < 0.25:
                a, b = 0, L
            else:
                a = rng.choice([0, 3, 4, 6, 8, rng.randrange(L)])
                b = rng.choice([L, 6, 8, 10, rng.randrange(a + 1, L + 1)])
                a, b = min(a, b - 1), max(b, a + 1)
            pl = 0.0 if tie or rng.random() < 0.3 else rng.choice([0.5, 1.0, rng.uniform(0.1, 3)])
            dl = 0.0 if tie or rng.random() < 0.3 else rng.choice([0.25, rng.uniform(0.05, 1)])
            if dup or all((s.layer_start, s.layer_end) != (a, b) for s in ranges):
                ranges.append(Serving("m", L, a, b, pl, dl))
        nodes.append(NodeView(
            peer_id=f"p{i:03d}", name=f"n{i}", serving=tuple(ranges),
            labels=frozenset({"eu"} if i % 3 else {"us"}),
            queue_depth=0 if tie else rng.randint(0, 8), in_flight=0 if tie else rng.randint(0, 3),
            max_concurrency=2, max_queue=rng.choice([6, 64]),
            prefill_tps=rng.choice([800.0, 800.0, 0.0 if rng.random() < 0.05 else 400.0]),
            decode_tps=rng.choice([40.0, 40.0, 0.0 if rng.random() < 0.05 else 20.0]),
            rtt_ms=0.0 if i == 0 else (20.0 if tie else rng.choice([0.0, 5.0, rng.uniform(1, 150)])),
            is_local=i == 0, free_kv_tokens=rng.choice([50, 1 << 20]),
            service_rate_rps=rng.choice([0.0, 0.0, 2.5]),
        ))  # fmt: skip
    rng.shuffle(nodes)
    return MeshSnapshot("p000", tuple(nodes))


def both(req: RouteRequest, snap: MeshSnapshot, monkeypatch: pytest.MonkeyPatch) -> tuple[str, str]:
    def run() -> str:
        try:
            return repr(planner.plan(req, snap, Policy()))  # repr: NaN equals NaN
        except RoutingError as e:
            return f"RoutingError: {e}"

    fast = run()
    with monkeypatch.context() as m:
        m.setattr(planner, "_separable", lambda *a: None)
        full = run()
    return fast, full


@pytest.mark.parametrize("seed", range(120))
def test_pruned_search_plans_what_the_full_search_plans(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    snap, reqs = case(seed)
    for req in reqs:
        fast, full = both(req, snap, monkeypatch)
        assert fast == full, (seed, req)


def case(seed: int) -> tuple[MeshSnapshot, list[RouteRequest]]:
    rng = random.Random(seed)
    snap = random_mesh(rng, rng.choice([2, 4, 8, 16, 40]), dup=seed % 10 == 9)
    return snap, [
        RouteRequest("r", "m", rng.randint(1, 500), rng.choice([1, 2, 16, 128])),
        RouteRequest("r", "m", 64, 32, residency="eu"),
        RouteRequest("r", "m", 64, 1, exclude=frozenset({"p001", "p002"})),
    ]


def test_most_random_meshes_take_the_pruned_search(monkeypatch: pytest.MonkeyPatch) -> None:
    """The table above compares something: most of its meshes use the pruned search."""
    walk = planner._Walk
    used = 0
    for seed in range(120):
        walks: list[int] = []
        monkeypatch.setattr(planner, "_Walk", lambda *a, w=walks: w.append(1) or walk(*a))
        snap, reqs = case(seed)
        for req in reqs:
            try:
                planner.plan(req, snap, Policy())
            except RoutingError:
                pass
        used += bool(walks)
    assert used >= 80, used


def test_the_walk_is_used_and_prunes(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(5)
    snap = random_mesh(rng, 200)
    req = RouteRequest("r", "m", 300, 64)
    walked: list[tuple[int, int]] = []
    select = planner._Walk.select

    def counting(self: planner._Walk, *a: object) -> list[object]:
        got = select(self, *a)  # type: ignore[arg-type]
        walked.append((len(got), len(self.items)))
        return got  # type: ignore[return-value]

    monkeypatch.setattr(planner._Walk, "select", counting)
    planner.plan(req, snap, Policy())
    assert walked, "the pruned search was not used"
    assert sum(a for a, _ in walked) < 0.2 * sum(b for _, b in walked)


def test_coordinates_negative_rtts_and_duplicate_ranges_keep_the_full_search() -> None:
    units_snap = random_mesh(random.Random(1), 6)
    units, _ = planner._units(RouteRequest("r", "m", 10, 4), units_snap, Policy(), L)
    assert planner._separable(units_snap, units, None) is not None
    assert planner._separable(units_snap, units, lambda a, b: 1.0) is None
    n0 = units[0].node
    for bad in (dataclasses.replace(n0, coord=Coord((0.0, 0.0))),
                dataclasses.replace(n0, rtt_ms=-1.0), dataclasses.replace(n0, rtt_ms=float("nan"))):
        snap = dataclasses.replace(units_snap, nodes=tuple(
            bad if v.peer_id == n0.peer_id else v for v in units_snap.nodes))  # fmt: skip
        assert planner._separable(snap, units, None) is None
    assert planner._separable(units_snap, [*units, units[0]], None) is None


def test_a_thousand_whole_model_peers_and_two_stage_nodes_plan_fast() -> None:
    """Before the pruned search this took about 16 s (every state extended from every state)."""
    nodes = [NodeView(peer_id=f"p{i:04d}", name=f"n{i}", serving=(Serving("m", 32, 0, 32),),
                      rtt_ms=0.0 if i == 0 else 2.0 + (i * 37 % 148), queue_depth=i % 5,
                      max_concurrency=4, is_local=i == 0)
             for i in range(1000)]  # fmt: skip
    nodes[1] = dataclasses.replace(nodes[1], serving=(Serving("m", 32, 0, 16),))
    nodes[2] = dataclasses.replace(nodes[2], serving=(Serving("m", 32, 16, 32),))
    snap = MeshSnapshot("p0000", tuple(nodes))
    t0 = time.process_time()
    p = planner.plan(RouteRequest("r", "m", 300, 100), snap, Policy())
    assert time.process_time() - t0 < 2.0
    assert len(p.hops) == 1 and p.alternatives and p.alternatives[0].is_pipeline


def test_a_nan_first_offer_is_kept_as_the_full_search_keeps_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A node with no decode speed and a one-token request gives a NaN cost (0 * inf); the full
    search keeps a NaN first offer into a state for good, and so must the pruned one."""
    snap = MeshSnapshot("e", (
        NodeView("a", "a", serving=(Serving("m", L, 0, 6),), decode_tps=0.0, rtt_ms=5.0),
        NodeView("b", "b", serving=(Serving("m", L, 0, L),), rtt_ms=9.0),
        NodeView("c", "c", serving=(Serving("m", L, 6, L),), rtt_ms=7.0),
        NodeView("e", "e", is_local=True),
    ))  # fmt: skip
    fast, full = both(RouteRequest("r", "m", 40, 1), snap, monkeypatch)
    assert fast == full
    assert "nan" in full  # the case this test is about
