"""The rate sweep's pure parts (meshd.testnet.sweep): the rate a mesh sustains before its p95
TTFT doubles, and the scenario with batching switched off or on."""

from __future__ import annotations

from pathlib import Path

import pytest

from meshd.config import parse_config
from meshd.testnet.scenario import load_scenario
from meshd.testnet.sweep import RatePoint, sustained_rate, with_batching

ROOT = Path(__file__).resolve().parents[2]
P = RatePoint


@pytest.mark.parametrize(("points", "want"), [
    ([P(1, 100), P(2, 150), P(4, 199), P(8, 400)], 4),  # 8 rps reached 2 x 100 ms
    ([P(4, 199), P(1, 100), P(8, 400), P(2, 150)], 4),  # order does not matter
    ([P(1, 100), P(2, 200), P(4, 150)], 1),  # exactly 2x stops it; a later dip does not count
    ([P(1, 100), P(2, 120), P(4, 130)], 4),  # never doubled: the top of the sweep
    ([P(1, 100), P(2, 120, 0.05), P(4, 130)], 1),  # 5% of 2 rps's requests failed
    ([P(1, 100), P(2, None, 1.0)], 1),  # nothing completed at 2 rps
    ([P(1, 100, 0.5), P(2, 100)], None),  # even the lowest rate failed
    ([P(1, None, 1.0)], None),
    ([], None),
])
def test_sustained_rate_is_the_last_rate_before_p95_doubles(points: list[RatePoint],
                                                             want: float | None) -> None:
    rate, why = sustained_rate(points)
    assert rate == want
    assert why


def test_sustained_rate_says_when_the_sweep_did_not_reach_the_limit() -> None:
    assert "lower bound" in sustained_rate([P(1, 100), P(2, 120)])[1]
    assert "8 rps" in sustained_rate([P(1, 100), P(8, 250)])[1]


@pytest.mark.parametrize(("batching", "slots"), [(False, 2), (True, 8)])
def test_with_batching_sets_every_daemon_and_model(batching: bool, slots: int) -> None:
    scenario = load_scenario(ROOT / "testnet" / "regions-12.toml")
    got = with_batching(scenario, batching, slots)
    assert len(got.nodes) == len(scenario.nodes) == 12
    for old, new in zip(scenario.nodes, got.nodes, strict=True):
        cfg = parse_config({**new.daemon_config(), "models": new.daemon_models()}, "test")
        assert cfg.engine.batching is batching
        assert cfg.engine.threads == 1  # the scenario's own engine keys stay
        assert [m.max_concurrency for m in cfg.models] == [slots] * len(old.models)
        assert new.max_decode_tokens_per_s == old.max_decode_tokens_per_s
    assert all("batching" not in n.config.get("engine", {}) for n in scenario.nodes)  # a copy
