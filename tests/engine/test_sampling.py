"""The pure numpy sampler: table tests and seeded statistics."""

from __future__ import annotations

import numpy as np
import pytest

from meshd.engine import GenerationConfig, sample
from meshd.engine.sampling import apply_repetition_penalty, filter_probs
from meshd.errors import ConfigError

LOGITS = np.array([1.0, 3.0, 2.0, 3.0, -1.0], np.float32)


def cfg(**kw: object) -> GenerationConfig:
    base: dict[str, object] = {"temperature": 1.0, "top_k": 0, "top_p": 1.0,
                               "repetition_penalty": 1.0}
    base.update(kw)
    return GenerationConfig(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("config", "history", "expected"),
    [
        (cfg(temperature=0.0), [], 1),  # greedy; ties go to the lowest id
        (cfg(temperature=0.0, repetition_penalty=2.0), [1], 3),  # 3.0/2 < 3.0
        (cfg(temperature=0.0, repetition_penalty=2.0), [1, 3], 2),
        (cfg(temperature=0.0, repetition_penalty=2.0), [4], 1),  # negatives are multiplied
        (cfg(top_k=1), [], 1),  # top-1 keeps only the maxima (ties at the k-th value stay)
        (cfg(top_p=1e-6), [], 1),  # the nucleus of tiny mass is the single best token
    ],
)
def test_deterministic_choices(config: GenerationConfig, history: list[int],
                               expected: int) -> None:
    for seed in range(5):
        got = sample(LOGITS, history, config, np.random.default_rng(seed))
        assert got in ((1, 3) if config.top_k == 1 else (expected,))


@pytest.mark.parametrize(
    ("penalty", "history", "expected"),
    [
        (1.0, [0, 1], [1.0, 3.0, 2.0, 3.0, -1.0]),
        (2.0, [0, 4, 4], [0.5, 3.0, 2.0, 3.0, -2.0]),
        (2.0, [], [1.0, 3.0, 2.0, 3.0, -1.0]),
        (2.0, [99, -1], [1.0, 3.0, 2.0, 3.0, -1.0]),  # ids outside the vocabulary are ignored
    ],
)
def test_repetition_penalty(penalty: float, history: list[int], expected: list[float]) -> None:
    np.testing.assert_allclose(apply_repetition_penalty(LOGITS, history, penalty), expected)


def test_filters() -> None:
    p = filter_probs(LOGITS.astype(np.float64), 1.0, 2, 1.0)
    assert set(np.flatnonzero(p)) == {1, 3}
    np.testing.assert_allclose(p[[1, 3]], [0.5, 0.5])
    p = filter_probs(LOGITS.astype(np.float64), 1.0, 0, 0.8)
    assert set(np.flatnonzero(p)) == {1, 2, 3}  # 0.39 + 0.39 < 0.8 <= 0.39 + 0.39 + 0.14
    assert p.sum() == pytest.approx(1.0)
    flat = filter_probs(LOGITS.astype(np.float64), 1e6, 0, 1.0)
    np.testing.assert_allclose(flat, 0.2, atol=1e-5)  # a huge temperature flattens


def test_sampling_follows_the_distribution() -> None:
    rng = np.random.default_rng(1234)
    c = cfg(temperature=1.0)
    counts = np.bincount([sample(LOGITS, [], c, rng) for _ in range(4000)], minlength=5)
    expected = np.exp(LOGITS) / np.exp(LOGITS).sum() * 4000
    assert np.all(np.abs(counts - expected) < 5 * np.sqrt(expected) + 5)


def test_seed_reproduces() -> None:
    logits = np.random.default_rng(0).standard_normal(1000)
    c = cfg(temperature=0.9, top_k=50, top_p=0.9)
    a = [sample(logits, [], c, np.random.default_rng(7)) for _ in range(3)]
    b = [sample(logits, [], c, np.random.default_rng(7)) for _ in range(3)]
    assert a == b


@pytest.mark.parametrize(
    ("field", "value"),
    [("max_tokens", 0), ("temperature", -1.0), ("top_k", -1), ("top_p", 0.0), ("top_p", 1.5),
     ("repetition_penalty", 0.0), ("stop", "abc"), ("stop", ("",))],
)
def test_config_validation(field: str, value: object) -> None:
    with pytest.raises(ConfigError, match=field if field != "stop" else "stop"):
        GenerationConfig(**{field: value})  # type: ignore[arg-type]
