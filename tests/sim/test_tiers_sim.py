"""Model tiers in the simulator (meshd.sim.tiers): model = "auto" arrivals get their model from
meshd.core.tiers.choose_tier, the daemon's decision; the baselines send all to one tier."""

from __future__ import annotations

from typing import Any

import pytest

from meshd.errors import ConfigError
from meshd.sim import tiers as sim_tiers
from meshd.sim.runner import compare_tiers
from meshd.sim.scenario_parse import scenario_from_dict
from meshd.sim.tiers import table


def scenario(scores: str = "perfect", **arrival: Any) -> dict[str, Any]:
    return {
        "name": "tiers-tiny",
        "sim": {"duration_s": 8.0, "drain_s": 20.0, "seed": 3},
        "latency": {"inter_region_ms": {"edge/dc": 30.0}},
        "tiers": {"scores": scores},
        "hardware": [
            {"name": "cpu", "prefill_tps": 1500.0, "decode_tps": 40.0, "concurrency": 2,
             "max_queue": 16, "cost_per_hour": 0.02},
            {"name": "gpu", "prefill_tps": 4000.0, "decode_tps": 30.0, "concurrency": 4,
             "max_queue": 32, "cost_per_hour": 2.5},
        ],
        "model": [{"name": "mic", "num_layers": 4, "tier": "micro"},
                  {"name": "big", "num_layers": 8, "tier": "large", "quality": 1.0}],
        "region": [{"name": "edge", "nodes": [{"hardware": "cpu", "count": 4, "serve": ["mic"]}]},
                   {"name": "dc", "nodes": [{"hardware": "gpu", "count": 2, "serve": ["big"]}]}],
        "arrivals": [{"region": "edge", "model": "auto", "rate_per_s": 3.0,
                      "complex_share": 0.4,
                      "prompt_tokens": {"dist": "fixed", "mean": 100},
                      "output_tokens": {"dist": "fixed", "mean": 20}, **arrival}],
    }


def test_tiered_sends_by_the_score_and_baselines_send_all_one_way() -> None:
    r = compare_tiers(scenario_from_dict(scenario()))
    tiered = r["tiered"]["tiers"]["counts"]
    # perfect scores: none sent down (a request arriving before any advert is heard is unrouted)
    assert tiered["complex"] == tiered["complex_large"] + tiered.get("complex_unrouted", 0)
    assert tiered["complex_large"] > 0 and "complex_micro" not in tiered
    assert tiered["simple"] == tiered["simple_micro"] + tiered.get("simple_unrouted", 0) > 0
    assert r["tiered"]["tiers"]["complex_sent_down"] == 0.0
    assert r["all_micro"]["tiers"]["complex_sent_down"] == 1.0
    assert r["all_large"]["tiers"]["counts"].get("simple_micro", 0) == 0
    # every mode saw the same requests (common random numbers)
    assert {m: x["tiers"]["counts"]["complex"] for m, x in r.items()} == {m: tiered["complex"] for m in r}
    assert r["tiered"]["cost_per_1k_tokens"] < r["all_large"]["cost_per_1k_tokens"]
    assert "| tiered |" in table(r)


def test_the_simulator_decides_with_the_core_function(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    real = sim_tiers.choose_tier

    def spy(*a: Any, **k: Any) -> Any:
        calls.append(a[0])
        return real(*a, **k)

    monkeypatch.setattr(sim_tiers, "choose_tier", spy)
    r = compare_tiers(scenario_from_dict(scenario()))
    assert len(calls) == r["tiered"]["arrived"] > 0


def test_shipped_scores_send_some_complex_down() -> None:
    r = compare_tiers(scenario_from_dict(scenario("shipped")))
    assert 0.0 <= r["tiered"]["tiers"]["complex_sent_down"] < 0.5
    assert r["tiered"]["tiers"]["threshold"] == pytest.approx(sim_tiers.shipped_scores()[0])


def test_auto_needs_a_tiered_model() -> None:
    d = scenario()
    for m in d["model"]:
        m.pop("tier")
    with pytest.raises(ConfigError, match="no \\[\\[model\\]\\] has a tier"):
        scenario_from_dict(d)
