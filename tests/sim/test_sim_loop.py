"""The simulator: deterministic, conserves requests, drives the daemon's router, ranks sanely."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from meshd.core import routing
from meshd.sim.loop import Simulation
from meshd.sim.runner import run_one
from meshd.sim.scenario_parse import load_scenario

from .helpers import SCENARIOS, scenario

STRIP = ("wall_s", "cpu_s", "max_rss_mib")


def _figures(r: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in r.items() if k not in STRIP}


def test_same_seed_same_result() -> None:
    sc = scenario()
    a = Simulation(sc, "meshd").run()
    b = Simulation(sc, "meshd").run()
    assert a == b
    c = Simulation(sc, "meshd", seed=99).run()
    assert c != a


def test_same_seed_same_result_with_loss_failures_and_joins() -> None:
    sc = scenario(
        gossip={"advert_loss": 0.2},
        events=[
            {"at_s": 4.0, "action": "fail", "fraction": 0.25},
            {"at_s": 6.0, "action": "join", "region": "a", "hardware": "gpu", "count": 2,
             "serve": ["m"]},
        ],
    )  # fmt: skip
    a = Simulation(sc, "lwsq").run()
    assert a == Simulation(sc, "lwsq").run()
    assert a["nodes"] == 18


@pytest.mark.parametrize("strategy", routing.STRATEGIES)
def test_every_request_completes_or_fails(strategy: str) -> None:
    sc = scenario(events=[{"at_s": 5.0, "action": "fail", "fraction": 0.3}])
    r = Simulation(sc, strategy).run()
    assert r["arrived"] > 100
    assert r["completed"] + r["failed"] == r["arrived"]
    assert sum(r["failed_by_reason"].values()) == r["failed"]


def test_overload_fails_requests_and_still_conserves() -> None:
    sc = scenario(
        arrivals=[{**_arrival("a"), "rate_per_s": 80.0}],
        sim={"duration_s": 5.0, "drain_s": 3.0, "timeout_s": 2.0},
    )
    r = Simulation(sc, "round_robin").run()
    assert r["failed"] > 0
    # Busy answers, clients giving up, or every peer looking full to the router ("no_route").
    assert set(r["failed_by_reason"]) <= {"busy", "timeout", "unfinished", "no_route"}
    assert r["completed"] + r["failed"] == r["arrived"]


def _arrival(region: str) -> dict[str, Any]:
    return {
        "region": region, "model": "m", "process": "poisson", "rate_per_s": 6.0,
        "prompt_tokens": {"dist": "fixed", "mean": 100}, "output_tokens": {"dist": "fixed", "mean": 20},
    }  # fmt: skip


def test_every_decision_is_made_by_the_daemons_router(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, int]] = []
    real = routing.route

    def counting(req: Any, snap: Any, policy: Any, rng: Any, rr_index: int = 0) -> Any:
        calls.append((policy.strategy, len(snap.nodes)))
        return real(req, snap, policy, rng, rr_index)

    # the simulator decides with the daemon's own decide(), which asks the router
    from meshd.core import decide
    from meshd.sim import loop

    assert loop.decide is decide.decide
    monkeypatch.setattr(decide, "route", counting)
    r = Simulation(scenario(), "meshd").run()
    assert len(calls) >= r["arrived"]  # one per request, more on retries
    assert {s for s, _ in calls} == {"meshd"}
    # Each decision sees a bounded view: its cell (8 nodes here) plus a few probed peers.
    assert max(n for _, n in calls) <= 8 + 2


def test_what_follows_each_decision_is_the_daemons_request_machine(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Retries, refusals, hedges and new decisions in the simulator are the daemon's
    ``RequestLife`` (meshd.node.forward drives the same class): every one of the simulation's
    retry, refusal and hedge counts is the machine's."""
    from meshd.core import request_life
    from meshd.sim import loop

    assert loop.RequestLife is request_life.RequestLife
    seen: dict[str, int] = {}
    real = request_life.RequestLife.handle

    def counting(self: Any, ev: Any, now: float) -> Any:
        acts = real(self, ev, now)
        for a in acts:
            seen[type(a).__name__] = seen.get(type(a).__name__, 0) + 1
        return acts

    monkeypatch.setattr(request_life.RequestLife, "handle", counting)
    sc = scenario(events=[{"at_s": 4.0, "action": "fail", "fraction": 0.25}])
    r = Simulation(sc, "meshd").run()
    assert seen.get("Send", 0) >= r["arrived"] - r["failed_by_reason"].get("no_route", 0)
    assert seen.get("Send", 0) >= r["retries"] + r["wait_refusals"] + r["hedges"]
    assert r["retries"] > 0 and r["hedges"] > 0 and seen.get("Cancel", 0) > 0
    assert seen.get("Finish", 0) == r["completed"]


def test_meshd_beats_round_robin_on_the_tiny_scenario() -> None:
    sc = load_scenario(SCENARIOS / "tiny.toml")
    m = run_one(sc, "meshd")
    rr = run_one(sc, "round_robin")
    assert m["ttft_p95_ms"] < 0.5 * rr["ttft_p95_ms"]
    assert m["cost_per_1k_tokens"] < rr["cost_per_1k_tokens"]
    assert m["failed"] <= rr["failed"]


def test_latency_only_stays_local_and_strategies_differ() -> None:
    sc = scenario()
    lo = Simulation(sc, "latency_only").run()
    assert lo["served_locally"] > 0.6 * lo["completed"]  # the rest: its own queue looked full
    rnd = Simulation(sc, "random").run()
    assert rnd["served_locally"] < 0.5 * rnd["completed"]


def test_stale_adverts_are_what_the_router_sees() -> None:
    """A decision's view of a peer is its last advert heard, aged, plus what we sent since."""
    sc = scenario(gossip={"advert_interval_s": 5.0, "early_adverts": False, "probes": 0})
    sim = Simulation(sc, "meshd")
    sim.run()
    w = sim.world
    e = w.nodes[0]
    snap = sim.views.snapshot(e, sim.now, "m")
    peers = [v for v in snap.nodes if not v.is_local]
    assert peers and all(v.rtt_source in ("vivaldi", "measured") for v in peers)
    assert all(0.0 <= v.advert_age_s <= 3 * 5.0 for v in peers)
    local = [v for v in snap.nodes if v.is_local]
    assert len(local) == 1 and local[0].rtt_ms == 0.0
    assert [v.peer_id for v in snap.nodes] == sorted(v.peer_id for v in snap.nodes)


def test_failed_nodes_leave_views_and_entries_reroute() -> None:
    sc = scenario(
        events=[{"at_s": 3.0, "action": "fail", "region": "a", "hardware": "gpu", "count": 3}]
    )
    sim = Simulation(sc, "meshd")
    r = sim.run()
    assert r["completed"] + r["failed"] == r["arrived"]
    dead = {n.peer_id for n in sim.world.nodes if not n.alive}
    assert len(dead) == 3
    for n in sim.world.nodes:
        if n.alive:
            snap = sim.views.snapshot(n, sim.now, "m")
            assert dead.isdisjoint(v.peer_id for v in snap.nodes)


def test_pipelines_are_planned_by_the_daemons_planner(monkeypatch: pytest.MonkeyPatch) -> None:
    from meshd.core import decide

    calls: list[int] = []
    real = decide.plan

    def counting(req: Any, snap: Any, policy: Any, *a: Any) -> Any:
        p = real(req, snap, policy, *a)
        calls.append(len(p.hops))
        return p

    monkeypatch.setattr(decide, "plan", counting)
    sc = load_scenario(SCENARIOS / "pipeline-48.toml").with_overrides(duration_s=15.0)
    r = Simulation(sc, "meshd").run()
    assert calls and max(calls) >= 2  # real multi-stage chains
    assert r["pipelined"] > 0
    assert r["pipeline_ttft_p50_ms"] > 0
    assert r["completed"] + r["failed"] == r["arrived"]


def test_a_dead_stage_makes_the_entry_plan_again() -> None:
    sc = load_scenario(SCENARIOS / "pipeline-48.toml").with_overrides(duration_s=15.0)
    events = [{"at_s": 6.0, "action": "fail", "hardware": "gpu-fast-70b", "fraction": 0.5}]
    from meshd.sim.scenario import EventSpec

    sc = dataclasses.replace(sc, events=tuple(EventSpec(**e) for e in events))
    r = Simulation(sc, "meshd").run()
    assert r["completed"] + r["failed"] == r["arrived"]
    assert r["pipelined"] > 0
    assert r["retries"] > 0


def test_a_hardware_batch_curve_sets_each_streams_decode_speed() -> None:
    """[[hardware]] batch_tps (an advert's batch curve): a curve that scales linearly with the
    batch is the per-stream model exactly; one that saturates slows every stream down."""
    import copy

    from .helpers import BASE

    def with_curve(curve: list[float]) -> dict[str, Any]:
        hw = copy.deepcopy(BASE["hardware"])
        hw[0]["batch_tps"] = curve
        return Simulation(scenario(hardware=hw), "meshd").run()

    base = Simulation(scenario(), "meshd").run()
    assert _figures(with_curve([40.0, 80.0, 160.0])) == _figures(base)
    slow = with_curve([40.0, 50.0, 60.0])  # 4 streams share 60 tokens/s
    assert slow["completed"] == base["completed"]
    assert slow["e2e_p95_ms"] > base["e2e_p95_ms"]
