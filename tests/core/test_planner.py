"""The pipeline planner: chains over layer ranges, whole model against pipeline, failover."""

from __future__ import annotations

import pytest

from meshd.core.planner import Hop, Plan, plan, snapshot_rtt
from meshd.core.snapshot import MeshSnapshot, NodeView, Policy, RouteRequest, Serving
from meshd.core.vivaldi import Coord
from meshd.errors import RoutingError

M = "m"
L = 10  # layers
# Speeds chosen for round numbers: prefill 1000 tps over 10 layers = 0.1 ms per token per layer,
# so 100 prompt tokens cost 10 ms per layer; decode 100 tps = 1 ms per token per layer.


def rng_(start: int, end: int) -> tuple[Serving, ...]:
    return (Serving(M, L, start, end),)


def node(pid: str, start: int = 0, end: int = L, **kw: object) -> NodeView:
    base: dict[str, object] = {
        "peer_id": pid, "name": pid.upper(), "serving": rng_(start, end), "max_concurrency": 4,
        "prefill_tps": 1000.0, "decode_tps": 100.0, "rtt_ms": 10.0,
    }  # fmt: skip
    base.update(kw)
    return NodeView(**base)  # type: ignore[arg-type]


def snap(*nodes: NodeView, local: str = "entry") -> MeshSnapshot:
    return MeshSnapshot(local, tuple(nodes))


def req(**kw: object) -> RouteRequest:
    base: dict[str, object] = {
        "request_id": "r1",
        "model": M,
        "prompt_tokens": 100,
        "max_tokens": 11,
    }
    base.update(kw)
    return RouteRequest(**base)  # type: ignore[arg-type]


def flat(ms: float) -> object:
    """rtt_between with every hop-to-hop RTT equal to ``ms`` (0 to the same node)."""
    return lambda a, b: 0.0 if a == b else ms


def spans(p: Plan) -> list[tuple[str, int, int]]:
    return [(h.peer_id, h.layer_start, h.layer_end) for h in p.hops]


def test_one_whole_node_is_a_one_hop_plan() -> None:
    p = plan(req(), snap(node("a", rtt_ms=20.0)), Policy())
    assert spans(p) == [("a", 0, L)]
    # TTFT: the round trip 20 + no wait + prefill 10 layers x 10 ms; per token: 10 x 1 ms.
    assert p.predicted_ttft_ms == pytest.approx(120.0)
    assert p.predicted_per_token_ms == pytest.approx(10.0)
    assert p.predicted_total_ms == pytest.approx(120.0 + 10 * 10.0)
    assert p.hops[0].predicted_ms == pytest.approx(120.0)
    assert not p.is_pipeline and p.peers == ("a",)
    assert p.reason.startswith("whole model on A[0,10)")


def test_three_stage_pipeline_numbers() -> None:
    s = snap(
        node("a", 0, 4, rtt_ms=10.0), node("b", 4, 7, rtt_ms=10.0), node("c", 7, 10, rtt_ms=10.0)
    )
    p = plan(req(), s, Policy(), flat(6.0))
    assert spans(p) == [("a", 0, 4), ("b", 4, 7), ("c", 7, 10)]
    # Links: entry->a 5, a->b 3, b->c 3, c->entry 5 = 16 ms one way around the ring.
    assert p.predicted_ttft_ms == pytest.approx(16.0 + 100.0)
    assert p.predicted_per_token_ms == pytest.approx(16.0 + 10.0)
    assert [h.predicted_ms for h in p.hops] == pytest.approx([5 + 40, 3 + 30, 3 + 30])
    assert p.predicted_total_ms == pytest.approx(116.0 + 10 * 26.0)
    assert p.is_pipeline and "pipeline of 3 stages" in p.reason


def test_overlapping_ranges_switch_where_it_pays() -> None:
    # a covers 0-8 and is fast; b covers 4-10 and is slow: a runs as far as it can.
    s = snap(node("a", 0, 8), node("b", 4, 10, prefill_tps=500.0, decode_tps=50.0))
    assert spans(plan(req(), s, Policy(), flat(4.0))) == [("a", 0, 8), ("b", 8, 10)]
    # Now b is the fast one: a hands over as early as possible.
    s = snap(node("a", 0, 8, prefill_tps=500.0, decode_tps=50.0), node("b", 4, 10))
    assert spans(plan(req(), s, Policy(), flat(4.0))) == [("a", 0, 4), ("b", 4, 10)]


def test_whole_model_locally_against_a_faster_pipeline() -> None:
    local = node("entry", rtt_ms=0.0, is_local=True, prefill_tps=200.0, decode_tps=20.0)
    a, b = node("a", 0, 5, rtt_ms=4.0), node("b", 5, 10, rtt_ms=4.0)
    p = plan(req(), snap(local, a, b), Policy(), flat(4.0))
    assert spans(p) == [("a", 0, 5), ("b", 5, 10)]
    assert len(p.alternatives) == 1 and p.alternatives[0].peers == ("entry",)
    assert p.alternatives[0].predicted_total_ms > p.predicted_total_ms
    assert "best alternative: whole model on ENTRY[0,10) (local)" in p.reason
    # A fast local node wins, and the pipeline is the alternative.
    fast_local = node("entry", rtt_ms=0.0, is_local=True)
    q = plan(req(), snap(fast_local, a, b), Policy(), flat(4.0))
    assert q.peers == ("entry",) and q.alternatives[0].is_pipeline  # e.g. a then the entry itself
    assert q.predicted_ttft_ms == pytest.approx(100.0)


def test_queue_waits_steer_the_chain() -> None:
    busy = node("a1", 0, 5, queue_depth=8, in_flight=4, service_rate_rps=4.0)  # 9/4 s of waiting
    idle = node("a2", 0, 5, rtt_ms=30.0)
    s = snap(busy, idle, node("b", 5, 10))
    p = plan(req(), s, Policy(), flat(10.0))
    assert spans(p) == [("a2", 0, 5), ("b", 5, 10)]


def test_excluded_peers_are_replanned_around() -> None:
    s = snap(node("a", 0, 5), node("b", 5, 10), node("b2", 5, 10, rtt_ms=40.0))
    first = plan(req(), s, Policy(), flat(5.0))
    assert first.peers == ("a", "b")
    again = plan(req(exclude=frozenset({"b"})), s, Policy(), flat(5.0))
    assert again.peers == ("a", "b2")
    assert "excluded by hard constraints" in again.reason


def test_uncovered_layers_raise_naming_them() -> None:
    eu = frozenset({"eu"})
    s = snap(
        node("a", 0, 4, labels=eu),
        node("b", 8, 10, labels=eu),
        node("c", 4, 8, labels=frozenset({"us"})),
    )
    with pytest.raises(RoutingError) as err:
        plan(req(residency="eu"), s, Policy())
    msg = str(err.value)
    assert "layers 4-7 are not served by any eligible node" in msg
    assert "excluded: C[4,8) residency (labels do not allow eu)" in msg
    assert "\n" not in msg


def test_uncovered_layers_message_lists_the_gaps() -> None:
    s = snap(node("a", 0, 3), node("b", 5, 7), node("c", 9, 10))
    with pytest.raises(RoutingError, match=r"layers 3-4, 7-8 are not served by any eligible node"):
        plan(req(), s, Policy())


def test_residency_is_a_hard_constraint_for_every_stage() -> None:
    eu = frozenset({"eu"})
    s = snap(node("a", 0, 5, labels=eu), node("b", 5, 10, labels=frozenset({"us"})),
             node("c", 5, 10, labels=eu, rtt_ms=80.0))  # fmt: skip
    assert plan(req(residency="eu"), s, Policy(), flat(5.0)).peers == ("a", "c")
    with pytest.raises(RoutingError, match="residency"):
        plan(req(residency="eu"), snap(node("a", 0, 5, labels=eu), node("b", 5, 10)), Policy())


def test_no_model_and_allow_list() -> None:
    with pytest.raises(RoutingError, match="no node serves any layer of model 'x'"):
        plan(req(model="x"), snap(node("a")), Policy())
    with pytest.raises(RoutingError, match="allow-list"):
        plan(req(), snap(node("a")), Policy(model_allow=frozenset({"x"})))


def test_ties_are_deterministic() -> None:
    s1 = snap(node("b", 0, 5), node("a", 0, 5), node("d", 5, 10), node("c", 5, 10))
    s2 = snap(node("c", 5, 10), node("d", 5, 10), node("a", 0, 5), node("b", 0, 5))
    p1, p2 = plan(req(), s1, Policy(), flat(5.0)), plan(req(), s2, Policy(), flat(5.0))
    assert p1 == p2 and p1.peers == ("a", "c")


def test_two_ranges_of_one_node_need_no_link() -> None:
    n = NodeView("a", "A", serving=(Serving(M, L, 0, 5), Serving(M, L, 5, 10)), prefill_tps=1000.0,
                 decode_tps=100.0, rtt_ms=10.0)  # fmt: skip
    p = plan(req(), snap(n), Policy(), flat(50.0))
    assert spans(p) == [("a", 0, 5), ("a", 5, 10)]
    assert p.predicted_per_token_ms == pytest.approx(10.0 + 10.0)  # entry->a->entry, no a->a


def test_per_layer_speeds_override_the_node_speeds() -> None:
    s = snap(NodeView("a", "A", serving=(Serving(M, L, 0, L, prefill_ms_per_layer_token=0.2,
                                                 decode_ms_per_layer=3.0),), rtt_ms=0.0))  # fmt: skip
    p = plan(req(), s, Policy())
    assert p.predicted_ttft_ms == pytest.approx(100 * 0.2 * L)
    assert p.predicted_per_token_ms == pytest.approx(3.0 * L)


def test_snapshot_rtt_uses_entry_rtt_coords_then_the_path_through_the_entry() -> None:
    a = node("a", rtt_ms=10.0, coord=Coord((0.0, 0.0), 0.0))
    b = node("b", rtt_ms=20.0, coord=Coord((3.0, 4.0), 0.0))
    c = node("c", rtt_ms=30.0)
    rtt = snapshot_rtt(snap(a, b, c))
    assert rtt("entry", "a") == 10.0 and rtt("b", "entry") == 20.0
    assert rtt("a", "b") == pytest.approx(5.0)
    assert rtt("a", "c") == 40.0
    assert rtt("a", "a") == 0.0


def test_plan_without_rtt_between_uses_the_snapshot() -> None:
    a = node("a", 0, 5, rtt_ms=10.0, coord=Coord((0.0, 0.0), 0.0))
    b = node("b", 5, 10, rtt_ms=10.0, coord=Coord((6.0, 8.0), 0.0))
    p = plan(req(), snap(a, b), Policy())
    assert p.predicted_per_token_ms == pytest.approx(5.0 + 5.0 + 5.0 + 10.0)


def test_hop_is_a_frozen_record() -> None:
    h = Hop("a", "A", 0, 5, 1.0)
    with pytest.raises(AttributeError):
        h.layer_end = 6  # type: ignore[misc]
