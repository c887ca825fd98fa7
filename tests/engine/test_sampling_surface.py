"""OpenAI's sampling settings in the engine: penalties, logit bias, log probabilities, seeds that
survive a failover, n choices from one prefill, and grammar-constrained output."""

from __future__ import annotations

import json

import numpy as np
import pytest

from meshd.engine import GenerationConfig, Model
from meshd.engine.generation import Generation
from meshd.engine.sampling import (
    apply_logit_bias,
    apply_openai_penalties,
    log_probs,
    process,
    top_choices,
)
from meshd.engine.scheduler import BatchScheduler, prepare
from meshd.errors import ConfigError

from .batch_driver import run_with_joins

LOGITS = np.array([1.0, 3.0, 2.0, 3.0, -1.0], np.float32)
GREEDY = {"temperature": 0.0, "repetition_penalty": 1.0}


@pytest.mark.parametrize(
    ("presence", "frequency", "ids", "counts", "expected"),
    [
        (0.0, 0.0, [1], [3], [1.0, 3.0, 2.0, 3.0, -1.0]),
        (0.5, 0.0, [1, 4], [3, 1], [1.0, 2.5, 2.0, 3.0, -1.5]),  # once, however often
        (0.0, 0.5, [1, 4], [3, 1], [1.0, 1.5, 2.0, 3.0, -1.5]),  # per time generated
        (1.0, 1.0, [0], [2], [-2.0, 3.0, 2.0, 3.0, -1.0]),
        (-1.0, 0.0, [2], [1], [1.0, 3.0, 3.0, 3.0, -1.0]),  # negative: encourages
        (1.0, 0.0, [99], [1], [1.0, 3.0, 2.0, 3.0, -1.0]),  # ids outside the vocabulary
    ],
)
def test_openai_penalties(presence: float, frequency: float, ids: list[int], counts: list[int],
                          expected: list[float]) -> None:
    out = LOGITS.astype(np.float64)
    apply_openai_penalties(out, np.array(ids), np.array(counts, np.float64), presence, frequency)
    np.testing.assert_allclose(out, expected)


def test_logit_bias_adds_and_ignores_ids_outside() -> None:
    out = LOGITS.astype(np.float64)
    apply_logit_bias(out, [(0, 100.0), (3, -100.0), (77, 5.0)])
    np.testing.assert_allclose(out, [101.0, 3.0, 2.0, -97.0, -1.0])


def test_log_probs_and_top_choices() -> None:
    lp = log_probs(LOGITS.astype(np.float64), 1.0)
    assert np.exp(lp).sum() == pytest.approx(1.0)
    assert top_choices(lp, 3) == [(1, pytest.approx(lp[1])), (3, pytest.approx(lp[3])),
                                  (2, pytest.approx(lp[2]))]  # ties to the lower id
    masked = LOGITS.astype(np.float64)
    masked[[1, 3]] = -np.inf
    lp = log_probs(masked, 0.0)  # greedy reports temperature 1
    assert lp[2] == pytest.approx(np.log(np.exp(2) / (np.exp(2) + np.exp(1) + np.exp(-1))))
    assert [t for t, _ in top_choices(lp, 5)] == [2, 0, 4]  # masked tokens are not listed


def test_process_applies_everything_in_order() -> None:
    cfg = GenerationConfig(**GREEDY, presence_penalty=1.0, logit_bias=((4, 10.0),))
    allowed = np.array([True, True, False, True, True])
    z = process(LOGITS, cfg, [], np.array([1]), np.array([1.0]), allowed)
    np.testing.assert_allclose(z, [1.0, 2.0, -np.inf, 3.0, 9.0])


@pytest.mark.parametrize("bad", [
    {"presence_penalty": 2.5}, {"frequency_penalty": -3}, {"logit_bias": ((1, 101.0),)},
    {"logit_bias": ((-1, 1.0),)}, {"logprobs": 21}, {"logprobs": -1}, {"n": 0}, {"n": 9},
])
def test_bad_settings_are_refused(bad: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        GenerationConfig(**bad)  # type: ignore[arg-type]


def _run(model: Model, cfg: GenerationConfig, prompt: list[int]) -> tuple[list[int], str]:
    evs = list(model.generate_sync(prompt, cfg))
    return [e.token_id for e in evs], "".join(e.text for e in evs)


def test_seeded_sampling_resumes_after_a_failover(models: dict[str, Model]) -> None:
    """A node resuming after k tokens (prompt + those k, ``after``) makes the tokens the first
    node would have made: same draws, same penalties."""
    model = models["llama"]
    prompt = model.encode_prompt("Once upon a time")
    cfg = GenerationConfig(max_tokens=12, temperature=1.0, top_k=0, seed=42,
                           frequency_penalty=0.7, presence_penalty=0.3)
    whole, _ = _run(model, cfg, prompt)
    assert whole == _run(model, cfg, prompt)[0]  # the same seed, the same text
    for k in (1, 5):
        resumed = GenerationConfig(max_tokens=12 - k, temperature=1.0, top_k=0, seed=42,
                                   frequency_penalty=0.7, presence_penalty=0.3,
                                   after=tuple(whole[:k]))
        assert whole[:k] + _run(model, resumed, prompt + whole[:k])[0] == whole


def test_logprobs_come_with_each_token(models: dict[str, Model]) -> None:
    model = models["llama"]
    cfg = GenerationConfig(max_tokens=5, **GREEDY, logprobs=3)
    for ev in model.generate_sync("Once upon", cfg):
        text, lp, top = ev.logprob  # type: ignore[misc]
        assert text == model.tokenizer.token_text(ev.token_id)
        assert lp <= 0 and len(top) == 3
        assert top[0][1] == pytest.approx(lp)  # greedy: the chosen token is the likeliest
        assert [v for _, v in top] == sorted((v for _, v in top), reverse=True)


def test_logit_bias_forces_a_token(models: dict[str, Model]) -> None:
    model = models["llama"]
    target = model.tokenizer.encode("fox", add_special_tokens=False)[0]
    ids, _ = _run(model, GenerationConfig(max_tokens=4, **GREEDY,
                                          logit_bias=((target, 100.0),)), [5, 6, 7])
    assert ids == [target] * 4


def test_n_choices_share_one_prefill(models: dict[str, Model]) -> None:
    """n choices: one prompt prefilled once, then n rows; choice 0 is the request with n = 1,
    and each choice i > 0 is seeded apart."""
    model = models["llama"]
    cfg = GenerationConfig(max_tokens=8, temperature=1.0, top_k=0, seed=3, n=3)
    sched = BatchScheduler(model)
    seq = prepare(model, "Once upon a time", cfg, False)
    got: dict[int, list[int]] = {0: [], 1: [], 2: []}
    for _ in range(100):
        if not sched.busy and _ > 0:
            break
        if _ == 0:
            sched.add(seq)
        for s in sched.step():
            for e in s.events:
                got[e.choice].append(e.token_id)
            s.events.clear()
    assert sched.stats["prefill_chunks"] == 1 and sched.stats["max_batch_seen"] == 3
    single = GenerationConfig(max_tokens=8, temperature=1.0, top_k=0, seed=3)
    assert got[0] == _run(model, single, model.encode_prompt("Once upon a time"))[0]
    assert all(len(v) == 8 for v in got.values())
    assert len({tuple(v) for v in got.values()}) == 3  # different draws per choice
    assert sched.stage.slots == [] and sched.pre.slots == []


def test_grammar_constrains_output_to_the_schema(models: dict[str, Model]) -> None:
    """Whatever the (random, tiny) model prefers, a constrained generation is valid JSON of
    the schema, and ends when the grammar does; batched or alone, the same tokens. (Bounded
    values: a random model would fill an unbounded number until max_tokens.)"""
    jsonschema = pytest.importorskip("jsonschema")
    from meshd.engine.constrain import schema_grammar

    model = models["llama"]
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"},
                                               "n": {"type": "integer", "minimum": 0, "maximum": 99},
                                               "color": {"enum": ["red", "green"]}},
              "required": ["ok", "n", "color"], "additionalProperties": False}
    grammar = schema_grammar(schema)
    cfg = GenerationConfig(max_tokens=60, temperature=0.0, repetition_penalty=1.0,
                           grammar=grammar)
    evs = list(model.generate_sync("Once upon a time", cfg))
    text = "".join(e.text for e in evs)
    jsonschema.validate(json.loads(text), schema)
    assert evs[-1].finish_reason == "eos"
    sampled = GenerationConfig(max_tokens=60, temperature=1.5, top_k=0, seed=9, grammar=grammar)
    for seed in range(3):
        text = "".join(e.text for e in model.generate_sync("The", GenerationConfig(
            **{**_fields(sampled), "seed": seed})))
        jsonschema.validate(json.loads(text), schema)
    sched = BatchScheduler(model)
    seqs = [prepare(model, "Once upon a time", cfg, False), prepare(model, "In", cfg, False)]
    got = run_with_joins(sched, seqs, {0: [0], 1: [1]})
    assert got[0] == [e.token_id for e in evs]
    assert sched.mask_trace and max(n for n, _ in sched.mask_trace) == 2


def _fields(cfg: GenerationConfig) -> dict[str, object]:
    return {k: getattr(cfg, k) for k in cfg.__dataclass_fields__}


def test_generation_without_grammar_is_unconstrained(models: dict[str, Model]) -> None:
    model = models["llama"]
    gen = Generation([5, 6], GenerationConfig(max_tokens=2, **GREEDY), model.tokenizer)
    assert gen.matcher() is None and not gen.constrained
