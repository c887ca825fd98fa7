"""[[models]] max_decode_tokens_per_s: the runner paces decoding, so measured speeds show it."""

from __future__ import annotations

import time

import pytest
import trio

from meshd.config import parse_config
from meshd.engine import GenerationConfig
from meshd.errors import ConfigError
from meshd.node.runner import Runner, Served
from meshd.testing.fake_model import FakeModel


def run_once(cap: float, tokens: int) -> tuple[float, Served]:
    runner = Runner()
    s = Served(name="m", model=FakeModel(), layer_start=0, layer_end=4, num_layers=4,
               max_concurrency=2, max_queue=4, max_decode_tps=cap)
    runner.add(s)

    async def go() -> float:
        t0 = time.perf_counter()
        got = [t async for t in runner.generate("m", [1, 2, 3], GenerationConfig(max_tokens=tokens))]
        assert len(got) == tokens
        return time.perf_counter() - t0

    return trio.run(go), s


def test_a_capped_model_decodes_at_the_cap_and_measures_it() -> None:
    elapsed, s = run_once(20.0, 11)  # 10 decode steps at 20/s: at least 0.5 s
    assert elapsed >= 0.5
    assert 10.0 <= s.decode_tps <= 20.0 + 1e-6  # never above the cap (a busy box may be slower)


def test_no_cap_by_default() -> None:
    elapsed, s = run_once(0.0, 11)
    assert elapsed < 0.5 and s.decode_tps > 100.0


def test_the_cap_is_validated() -> None:
    assert parse_config({"models": [{"max_decode_tokens_per_s": 7}]}).models[0].max_decode_tokens_per_s == 7.0
    with pytest.raises(ConfigError, match=r"\[\[models\]\]\[0\].max_decode_tokens_per_s must be >= 0"):
        parse_config({"models": [{"max_decode_tokens_per_s": -1.0}]})
