"""[[models]] max_prefill_tokens_per_s: the runner holds a request's first token until its
computed prompt tokens would have taken that long, and the prefill speed it measures (and
gossips) counts only the tokens computed, never those a prefix cache restored."""

from __future__ import annotations

import time

import pytest
import trio

from meshd.config import parse_config
from meshd.engine import GenerationConfig
from meshd.errors import ConfigError
from meshd.node.runner import Runner, Served
from meshd.testing.fake_model import FakeModel


def first_token(cap: float, prompt: int, cached: int, delay_s: float = 0.0) -> tuple[float, Served]:
    runner = Runner()
    s = Served(name="m", model=FakeModel(delay_s, cached_tokens=cached), layer_start=0, layer_end=4,
               num_layers=4, max_concurrency=2, max_queue=4, max_prefill_tps=cap)
    runner.add(s)

    async def go() -> float:
        t0 = time.perf_counter()
        got = [t async for t in runner.generate("m", list(range(1, prompt + 1)),
                                                GenerationConfig(max_tokens=1))]
        assert len(got) == 1
        return time.perf_counter() - t0

    return trio.run(go), s


def test_a_capped_prefill_takes_its_computed_tokens_over_the_cap() -> None:
    took, s = first_token(400.0, 200, 0)  # 200 tokens at 400/s: at least 0.5 s
    assert took >= 0.5
    assert 200.0 <= s.prefill_tps <= 400.0 + 1e-6  # never above the cap


def test_tokens_from_the_prefix_cache_cost_nothing_under_the_cap() -> None:
    took, s = first_token(400.0, 200, 160)  # 40 computed: at least 0.1 s, far from 0.5
    assert 0.1 <= took < 0.4
    assert s.prefill_tps <= 400.0 + 1e-6


def test_the_measured_prefill_speed_counts_only_computed_tokens() -> None:
    # no cap, and a first token that takes 20 ms whatever was cached: 200 tokens computed, or 1
    _, full = first_token(0.0, 200, 0, 0.02)
    _, reused = first_token(0.0, 200, 199, 0.02)
    assert full.prefill_tps <= 200 / 0.02
    assert reused.prefill_tps <= 1 / 0.02  # counting the restored tokens would say 200 / 0.02


def test_the_prefill_cap_is_validated() -> None:
    cfg = parse_config({"models": [{"max_prefill_tokens_per_s": 300}]})
    assert cfg.models[0].max_prefill_tokens_per_s == 300.0
    with pytest.raises(ConfigError, match=r"\[\[models\]\]\[0\].max_prefill_tokens_per_s must be >= 0"):
        parse_config({"models": [{"max_prefill_tokens_per_s": -1.0}]})
