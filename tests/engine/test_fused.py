"""Stall-free admission: a decode step and a prompt chunk in one onnxruntime call, and the
join of the prefilled prompt into the decoding rows (meshd/engine/fused.py, batch.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from meshd.engine import GenerationConfig, Model, load_model
from meshd.engine.batch import BatchStage
from meshd.engine.fused import FusedStep
from meshd.engine.scheduler import BatchScheduler, prepare

from .batch_driver import run_with_joins

GREEDY = GenerationConfig(max_tokens=10, temperature=0.0, repetition_penalty=1.0)
SEEDED = GenerationConfig(max_tokens=10, temperature=1.1, top_k=30, seed=11)


def test_fused_step_equals_a_decode_step_and_a_chunk_run_apart(models: dict[str, Model]) -> None:
    model = models["llama"]
    whole = model.stage(0, model.num_layers)
    fused = FusedStep(model.stage(0, model.num_layers, fused=True))
    main, pre = BatchStage(whole), BatchStage(whole)
    prompts = [[5, 6, 7, 8], [9, 10], [11, 12, 13, 14, 15, 16, 17]]
    slots = [main.open(32) for _ in prompts]
    for s, p in zip(slots, prompts, strict=True):
        main.step([s], np.array([p]))
    long = list(range(20, 45))
    p = pre.open(len(long) + 4)
    pre.reserve(len(long))
    pre.step([p], np.array([long[:9]]))
    # the rows out of row order, as the scheduler may hand them
    order = [slots[2], slots[0], slots[1]]
    dec, first = fused.run(main, order, np.array([[1], [2], [3]]), pre, p,
                           np.array(long[9:]), chunk_logits=True)
    assert first is not None and p.length == len(long)
    for row, (k, tok) in enumerate(((2, 1), (0, 2), (1, 3))):
        alone = whole.open_session(32).step(np.array(prompts[k] + [tok]),
                                            np.arange(len(prompts[k]) + 1), last_only=True)
        np.testing.assert_allclose(dec[row], alone[0], rtol=0, atol=1e-5)
    want = whole.open_session(64).step(np.array(long), np.arange(len(long)), last_only=True)
    np.testing.assert_allclose(first, want[0], rtol=0, atol=1e-5)
    # the caches the step wrote are those a run apart writes: the next steps agree too
    joined = main.adopt(pre, p)
    assert pre.slots == [] and joined.length == len(long)
    nxt = main.step([slots[0], joined], np.array([[4], [5]]))
    want = whole.open_session(64).step(np.array(long + [5]), np.arange(len(long) + 1),
                                       last_only=True)
    np.testing.assert_allclose(nxt[1], want[0], rtol=0, atol=1e-5)


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("name", ["llama", "qwen2", "int4"])
def test_prompts_joining_mid_decode_match_running_alone(models: dict[str, Model], name: str,
                                                        fused: bool,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Greedy and seeded sequences, long prompts admitted in chunks while others decode.

    "int4" is a 4-bit model whose MatMulNBits compute in float here ("int4-exact"): at the
    default accuracy level its kernels for one row and for many sum in different orders, and
    the int8 rounding of the next layer's activations can turn those last bits into a changed
    token late in a sampled sequence (docs/engine.md), as in llama.cpp's batched kernels."""
    from meshd.engine import graph

    monkeypatch.setattr(graph, "ACCURACY_LEVEL", 0)  # for the fused graph, built on demand
    model = models["int4-exact" if name == "int4" else name]
    rng = np.random.default_rng(3)
    prompts = [[int(t) for t in rng.integers(3, 200, n)] for n in (5, 70, 3, 41)]
    cfgs = [GREEDY, SEEDED, SEEDED, GREEDY]
    alone = [[e.token_id for e in model.generate_sync(p, c)]
             for p, c in zip(prompts, cfgs, strict=True)]
    sched = BatchScheduler(model, fused=fused)
    sched.prefill_ms_per_token = 1e9  # 16-token chunks: the long prompts take several steps
    seqs = [prepare(model, p, c, False) for p, c in zip(prompts, cfgs, strict=True)]
    got = run_with_joins(sched, seqs, {0: [0], 2: [1, 2], 4: [3]})
    assert got == alone
    assert (sched.stats["fused_runs"] > 0) == fused
    assert sched.stage.slots == [] and sched.pre.slots == []
    assert sched.stage.memory_bytes() == 0 and sched.pre.memory_bytes() == 0


def test_a_chunk_rides_in_the_decode_step_and_the_join_grows_into_prepared_buffers(
        models: dict[str, Model]) -> None:
    model = models["llama"]
    sched = BatchScheduler(model)
    sched.prefill_ms_per_token = 1e9  # 16-token chunks
    short = prepare(model, [5, 6, 7], GenerationConfig(max_tokens=60, temperature=0.0), False)
    sched.add(short)
    sched.step()
    cap = sched.stage.capacity
    long_ids = [int(t) for t in np.random.default_rng(0).integers(3, 300, 200)]
    long = prepare(model, long_ids, GREEDY, False)
    sched.add(long)
    runs = sched.stage.runs
    steps = 0
    while long.prefilled < len(long_ids):
        before = len(short.events)
        sched.step()
        assert len(short.events) == before + 1  # the running stream got a token every step
        steps += 1
    assert steps == 13  # ceil(200 / 16), one call each: no decode step of its own
    assert sched.stage.runs == runs and sched.stats["fused_runs"] == 13
    # the join grew the rows into buffers zeroed a part a step while the prompt was prefilled
    assert sched.stage.grown_into_prepared == 1
    assert sched.stage.prepared_bytes > 0 and sched.stage.zeroed_at_join == 0
    assert sched.stage.capacity > cap >= 0 and long in sched.running
    assert long.slot is not None and long.slot.length == len(long_ids)


def test_a_model_loaded_fused_serves_every_run_from_its_one_session(
        model_dirs: dict[str, Path], models: dict[str, Model]) -> None:
    """``load_model(fused=True)`` (a batching daemon) builds only the fused graph: plain runs
    (its own loop, batched decode steps, a prompt's chunks) go through it with the chunk group
    idle, and give what the plain graph gives."""
    model = load_model(model_dirs["llama"], fused=True)
    plain = models["llama"]
    prompt = [5, 6, 7, 8, 9]
    want = [e.token_id for e in plain.generate_sync(prompt, GREEDY)]
    assert [e.token_id for e in model.generate_sync(prompt, GREEDY)] == want
    whole = model.stage(0, model.num_layers)
    assert whole.fused and whole is model.stage(0, model.num_layers, fused=True)
    assert [st["layers"] for st in model.statistics()["stages"]] == [[0, model.num_layers]]
    sched = BatchScheduler(model)
    seqs = [prepare(model, p, GREEDY, False) for p in (prompt, [11, 12, 13])]
    got = run_with_joins(sched, seqs, {0: [0], 2: [1]})
    assert got == [want, [e.token_id for e in plain.generate_sync([11, 12, 13], GREEDY)]]
    assert len(model.statistics()["stages"]) == 1  # the scheduler built no second session


def test_a_run_without_a_chunk_adds_no_row_to_the_weight_products(
        models: dict[str, Model], tmp_path: Path) -> None:
    """A fused graph run for the decoding rows alone binds no chunk rows (the chunk's attention
    sits under an If): its 4-bit products see the same rows as the plain graph's, so prompt and
    decode logits are the plain graph's exactly. An idle one-token chunk was one more row in
    every product (another kernel path, other rounding) and 15% of a lone stream's step."""
    # a copy of the model: pages of a weights file mapped by two models are not handed back,
    # which test_kv_memory would count
    shutil.copytree(models["int4"].path, tmp_path / "int4")
    plain, fused = (load_model(tmp_path / "int4", fused=f) for f in (False, True))
    n = plain.num_layers
    prompt = np.array([5, 6, 7, 8, 9])
    runs = []
    for model in (plain, fused):
        session = model.stage(0, n).open_session(16)
        first = session.step(prompt, np.arange(5), last_only=True)
        runs.append((first, session.step(np.array([3]), np.array([5]), last_only=True)))
    assert fused.stage(0, n).fused and not plain.stage(0, n).fused
    for got, want in zip(runs[1], runs[0], strict=True):
        np.testing.assert_array_equal(got, want)
