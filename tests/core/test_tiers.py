"""The tier decision (meshd.core.tiers): pure table tests, no I/O."""

from __future__ import annotations

import pytest

from meshd.core.prompt_features import FEATURE_NAMES, prompt_features
from meshd.core.snapshot import MeshSnapshot, NodeView, Policy, Serving
from meshd.core.tiers import (
    ModelTier,
    TierPolicy,
    TierRequest,
    choose_tier,
    node_ttft_ms,
    wanted_tier,
)
from meshd.errors import RoutingError

CATALOGUE = {
    "micro-a": ModelTier("micro-a", "micro", 0.3, 2048),
    "small-a": ModelTier("small-a", "small", 0.6, 4096),
    "large-a": ModelTier("large-a", "large", 1.0, 8192),
}


def node(pid: str, model: str, *, queue: int = 0, in_flight: int = 0, rtt: float = 10.0,
         labels: frozenset[str] = frozenset(), max_queue: int = 8) -> NodeView:
    return NodeView(pid, pid, serving=(Serving(model, 4, 0, 4),), queue_depth=queue,
                    in_flight=in_flight, max_concurrency=1, max_queue=max_queue, rtt_ms=rtt,
                    prefill_tps=1000.0, decode_tps=50.0, labels=labels)


def snap(*nodes: NodeView) -> MeshSnapshot:
    return MeshSnapshot("me", tuple(sorted(nodes, key=lambda n: n.peer_id)))


def req(score: float | None, **kw: object) -> TierRequest:
    base: dict[str, object] = {"request_id": "r", "score": score, "prompt_tokens": 20, "max_tokens": 20}
    base.update(kw)
    return TierRequest(**base)  # type: ignore[arg-type]


MESH = snap(node("m1", "micro-a"), node("s1", "small-a"), node("l1", "large-a"))
POLICY = TierPolicy(threshold=0.5, small_below=0.7)


@pytest.mark.parametrize(("score", "tier"), [
    (0.0, "micro"), (0.49, "micro"), (0.5, "small"), (0.69, "small"), (0.7, "large"),
    (1.0, "large"), (None, "large"),
])
def test_score_picks_the_cheapest_tier_that_handles_it(score: float | None, tier: str) -> None:
    c = choose_tier(req(score), CATALOGUE, MESH, POLICY, Policy())
    assert (c.tier, c.wanted, c.escalated) == (tier, tier, False)
    assert c.model == f"{tier}-a"


@pytest.mark.parametrize(("mesh", "expect", "why"), [
    # micro absent: escalate to small, then large
    (snap(node("s1", "small-a"), node("l1", "large-a")), "small", "no node serving it"),
    (snap(node("l1", "large-a")), "large", "no node serving it"),
    # micro saturated (its queue is full): escalate
    (snap(node("m1", "micro-a", queue=8), node("s1", "small-a")), "small", "saturated"),
    # micro predicted too slow (queue wait far above max_ttft_ms): escalate
    (snap(node("m1", "micro-a", queue=7, in_flight=1), node("l1", "large-a")), "large", "TTFT"),
])
def test_escalates_up_when_the_wanted_tier_cannot_take_it(mesh: MeshSnapshot, expect: str, why: str) -> None:
    policy = TierPolicy(threshold=0.5, max_ttft_ms=500.0)
    c = choose_tier(req(0.1), CATALOGUE, mesh, policy, Policy())
    assert c.tier == expect and c.wanted == "micro" and c.escalated
    assert any(why in r for r in c.reasons), c.reasons


def test_never_down_unless_the_request_allows_it() -> None:
    mesh = snap(node("m1", "micro-a"))
    with pytest.raises(RoutingError, match="large: no node serving it"):
        choose_tier(req(0.9), CATALOGUE, mesh, POLICY, Policy())
    c = choose_tier(req(0.9, allow_lower=True), CATALOGUE, mesh, POLICY, Policy())
    assert (c.tier, c.lowered, c.escalated) == ("micro", True, False)


def test_pins_override_the_score_client_first() -> None:
    policy = TierPolicy(threshold=0.5, pin_clients={"vip": "large"}, pin_classes={"code": "small"})
    assert choose_tier(req(0.0, client="vip"), CATALOGUE, MESH, policy, Policy()).tier == "large"
    assert choose_tier(req(0.0, prompt_class="code"), CATALOGUE, MESH, policy, Policy()).tier == "small"
    assert choose_tier(req(0.0, client="vip", prompt_class="code"), CATALOGUE, MESH, policy,
                       Policy()).tier == "large"
    assert wanted_tier(req(0.9, prompt_class="code"), policy)[1] == "prompt class code is pinned to small"


def test_residency_still_holds() -> None:
    mesh = snap(node("m1", "micro-a"), node("l1", "large-a", labels=frozenset({"eu"})))
    c = choose_tier(req(0.1, residency="eu"), CATALOGUE, mesh, POLICY, Policy())
    assert c.model == "large-a" and c.escalated


def test_context_too_short_escalates() -> None:
    c = choose_tier(req(0.1, prompt_tokens=3000, max_tokens=64), CATALOGUE, MESH, POLICY, Policy())
    assert c.tier == "small"
    assert any("context too short" in r for r in c.reasons)


def test_fastest_model_of_a_tier_wins_ties_by_quality_then_name() -> None:
    cat = {**CATALOGUE, "micro-b": ModelTier("micro-b", "micro", 0.5, 2048)}
    mesh = snap(node("m1", "micro-a", rtt=50.0), node("m2", "micro-b", rtt=5.0))
    assert choose_tier(req(0.1), cat, mesh, POLICY, Policy()).model == "micro-b"
    mesh = snap(node("m1", "micro-a"), node("m2", "micro-b"))
    assert choose_tier(req(0.1), cat, mesh, POLICY, Policy()).model == "micro-b"  # quality


def test_no_tier_at_all_names_every_reason() -> None:
    with pytest.raises(RoutingError) as e:
        choose_tier(req(0.1), CATALOGUE, snap(), POLICY, Policy())
    assert "micro:" in str(e.value) and "large:" in str(e.value)


@pytest.mark.parametrize(("queue", "in_flight", "expect"), [
    (0, 0, 10.0 + 20.0),  # rtt + prefill of 20 tokens at 1000 tok/s
    (0, 1, None),  # one ahead on one slot: a wait on top
])
def test_node_ttft(queue: int, in_flight: int, expect: float | None) -> None:
    t = node_ttft_ms(node("a", "micro-a", queue=queue, in_flight=in_flight), "micro-a", 20, 20)
    if expect is not None:
        assert t == pytest.approx(expect)
    else:
        assert t > 30.0


@pytest.mark.parametrize(("text", "cls"), [
    ("What is the capital of France?", "text"),
    ("What is 12 + 30?", "math"),
    ("Fix this:\n```python\ndef f(x):\n    return x\n```", "code"),
])
def test_prompt_features(text: str, cls: str) -> None:
    f = prompt_features(text)
    assert f.prompt_class == cls and len(f.values) == len(FEATURE_NAMES)
    assert set(f.named()) == set(FEATURE_NAMES)
