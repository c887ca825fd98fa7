"""Routing reads live hardware signals: free memory excludes, throttling slows, energy weighs.
The loop path and the numpy path (NUMPY_MIN_NODES or more candidates) agree."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from meshd.core.decide import decide
from meshd.core.hwsignals import HwSignals, read_signals, with_signals
from meshd.core.routing import NUMPY_MIN_NODES, exclusion_reason, route
from meshd.core.snapshot import MeshSnapshot, NodeView, Policy, RouteRequest, Serving
from meshd.errors import RoutingError

KVB = 1000  # KV bytes per token


def node(pid: str, *, free: int | None = None, power: float | None = None, factor: float = 1.0,
         throttle: tuple[str, ...] = (), decode: float = 50.0, prefill: float = 1000.0,
         rtt: float = 10.0, local: bool = False) -> NodeView:
    v = NodeView(pid, pid, serving=(Serving("m", 4, 0, 4, kv_bytes_per_token=KVB),),
                 prefill_tps=prefill, decode_tps=decode, rtt_ms=rtt, rtt_source="measured",
                 max_concurrency=1, is_local=local)
    return with_signals(v, HwSignals(free, power, throttle, factor))


def snap(*nodes: NodeView) -> MeshSnapshot:
    return MeshSnapshot(local_peer_id="local", nodes=tuple(sorted(nodes, key=lambda n: n.peer_id)))


REQ = RouteRequest("r1", "m", prompt_tokens=100, max_tokens=28)  # 128 tokens: 128,000 bytes


@pytest.mark.parametrize("strategy", ["meshd", "least_ttft", "round_robin", "lwsq", "random"])
def test_a_node_whose_free_memory_cannot_hold_the_kv_cache_is_not_a_candidate(strategy):
    s = snap(node("a", free=127_999), node("b", free=128_000), node("c"))
    why = exclusion_reason(REQ, s.by_id("a"), Policy())
    assert why == "not enough free memory (127999 bytes hold 127 tokens < 128)"
    assert exclusion_reason(REQ, s.by_id("b"), Policy()) is None  # exactly enough
    assert exclusion_reason(REQ, s.by_id("c"), Policy()) is None  # unknown never excludes
    for seed in range(20):
        d = route(REQ, s, Policy(strategy=strategy), random.Random(seed))
        assert d.chosen in ("b", "c") and "a" not in d.order
        assert d.candidate("a").excluded_by == why


def test_nothing_fits_says_why():
    s = snap(node("a", free=1000), node("b", free=2000))
    with pytest.raises(RoutingError, match="not enough free memory: a, b"):
        decide(REQ, s, Policy(), random.Random(1))


def test_memory_exclusion_on_the_numpy_path():
    nodes = [node(f"n{i:03d}", free=100 if i % 2 else None) for i in range(NUMPY_MIN_NODES * 2)]
    s = snap(*nodes)
    for seed in range(30):
        d = route(REQ, s, Policy(), random.Random(seed))
        assert all(int(p[1:]) % 2 == 0 for p in d.order), d.order
        assert all(c.excluded_by is None or c.excluded_by.startswith("not enough free memory")
                   for c in d.candidates)


def test_a_throttled_node_is_predicted_slower():
    fast_hot = node("a", prefill=2000.0, factor=0.4, throttle=("hw_thermal",))
    cool = node("b", prefill=1000.0)
    d = route(REQ, snap(fast_hot, cool), Policy(strategy="least_ttft"), random.Random(1))
    assert d.chosen == "b"
    a = d.candidate("a")
    assert a.prefill_ms == pytest.approx(100 / 800.0 * 1000)  # 2000 tok/s at 0.4
    d = route(REQ, snap(node("a", prefill=2000.0), cool), Policy(strategy="least_ttft"),
              random.Random(1))
    assert d.chosen == "a"  # the same node, not throttled


def test_the_throttle_reaches_routing_from_a_hardware_map():
    hw = {"kind": "nvidia", "kv_memory": "gpu", "memory_available_bytes": 1 << 30,
          "gpus": [{"memory_free_bytes": 1 << 30, "throttle": ["hw_thermal"], "clock_ratio": 0.5}]}
    v = with_signals(NodeView("a", "a", prefill_tps=2000.0, decode_tps=40.0), read_signals(hw))
    assert (v.prefill_tps, v.decode_tps, v.speed_factor) == (1000.0, 20.0, 0.5)


def share_of(s: MeshSnapshot, policy: Policy, n: int = 300) -> Counter[str]:
    rng = random.Random(7)
    return Counter(route(REQ, s, policy, rng).chosen for _ in range(n))


def test_energy_weight_trades_ttft_for_joules_per_token():
    # equal speed and distance; a draws 300 W, b 50 W, c does not measure its power
    s = snap(node("a", power=300.0), node("b", power=50.0), node("c"))
    d = route(REQ, s, Policy(), random.Random(1))
    jpt = {c.peer_id: c.joules_per_token for c in d.candidates}
    svc_s = 100 / 1000.0 + 27 / 50.0  # prefill + 27 more tokens, one slot
    assert jpt["a"] == pytest.approx(300.0 * svc_s / 28) and jpt["b"] == pytest.approx(50.0 * svc_s / 28)
    assert jpt["c"] is None
    off = share_of(s, Policy())
    assert min(off.values()) > 50  # weight 0: energy is reported, not weighed
    on = share_of(s, Policy(energy_weight=200.0))
    assert on["b"] > 0.9 * sum(on.values()), on
    # a small weight does not beat a large TTFT gap: b 300 ms further away keeps losing
    far = snap(node("a", power=300.0), node("b", power=50.0, rtt=310.0))
    assert share_of(far, Policy(energy_weight=1.0))["a"] > 250


def test_energy_on_the_numpy_path_matches_the_loop():
    few = [node(f"n{i:03d}", power=float(50 + 10 * i)) for i in range(8)]
    many = few + [node(f"z{i:03d}", power=1000.0, rtt=500.0) for i in range(NUMPY_MIN_NODES)]
    p = Policy(strategy="least_ttft")
    d_few = route(REQ, snap(*few), p, random.Random(1))
    d_many = route(REQ, snap(*many), p, random.Random(1))
    for c in d_few.candidates:
        other = d_many.candidate(c.peer_id)
        assert other is not None and other.joules_per_token == pytest.approx(c.joules_per_token)
    on = share_of(snap(*many), Policy(energy_weight=500.0), n=100)
    assert on["n000"] > 80, on
