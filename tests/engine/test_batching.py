"""Continuous batching: many sequences per onnxruntime run, each as if it ran alone."""

from __future__ import annotations

import numpy as np
import pytest
import trio

from meshd.engine import GenerationConfig, Model
from meshd.engine.batch import BatchStage
from meshd.engine.scheduler import BatchScheduler, chunk_tokens, prepare
from meshd.testing.wait import wait_until

from .batch_driver import run_with_joins

GREEDY = GenerationConfig(max_tokens=12, temperature=0.0, repetition_penalty=1.0)
PROMPTS = ["Once upon a time", "The quick brown fox jumps over the lazy dog, and then",
           "In", "In the beginning the nodes were without form, and void; and darkness"]


def _cfgs() -> list[GenerationConfig]:
    return [GREEDY,
            GenerationConfig(max_tokens=9, temperature=0.9, top_k=20, seed=7),
            GenerationConfig(max_tokens=14, temperature=0.0, repetition_penalty=1.3),
            GenerationConfig(max_tokens=11, temperature=1.2, top_p=0.8, seed=123)]


@pytest.mark.parametrize("name", ["llama", "qwen2"])
def test_sequences_joining_at_different_steps_match_running_alone(
        models: dict[str, Model], name: str) -> None:
    model = models[name]
    cfgs = _cfgs()
    alone = [[e.token_id for e in model.generate_sync(p, c)] for p, c in zip(PROMPTS, cfgs, strict=False)]
    sched = BatchScheduler(model)
    sched.prefill_ms_per_token = 1e9  # chunks of 16 tokens: the long prompts take 2 steps
    seqs = [prepare(model, p, c, False) for p, c in zip(PROMPTS, cfgs, strict=False)]
    got = run_with_joins(sched, seqs, {0: [0], 2: [1, 2], 5: [3]})  # step -> who joins then
    assert got == alone
    assert sched.stats["max_batch_seen"] >= 3  # they really ran together
    assert sched.stats["decode_runs"] < sum(len(a) for a in alone) - len(alone)
    assert sched.stage.slots == [] and sched.stage.memory_bytes() == 0  # every row was freed


def test_batched_logits_equal_single_sequence_logits(models: dict[str, Model]) -> None:
    """A row's logits do not depend on the other rows (close to float32 rounding)."""
    model = models["llama"]
    stage = model.stage(0, model.num_layers)
    ids = [[5, 6, 7, 8, 9, 10], [11, 12], [13, 14, 15, 16, 17, 18, 19, 20, 21, 22]]
    batch = BatchStage(stage)
    slots = [batch.open(32) for _ in ids]
    for s, p in zip(slots, ids, strict=False):
        batch.step([s], np.array([p]))
    together = batch.step(slots, np.array([[1], [2], [3]]))
    for row, p in enumerate(ids):
        alone = stage.open_session(32).step(np.array(p + [row + 1]), np.arange(len(p) + 1),
                                           last_only=True)
        np.testing.assert_allclose(together[row], alone[0], rtol=0, atol=1e-5)


def test_rows_move_when_a_sequence_leaves_and_the_cache_follows(models: dict[str, Model]) -> None:
    model = models["qwen2"]
    stage = model.stage(0, model.num_layers)
    batch = BatchStage(stage)
    prompts = [[3, 4, 5], [6, 7, 8, 9], [10, 11]]
    slots = [batch.open(32) for _ in prompts]
    for s, p in zip(slots, prompts, strict=False):
        batch.step([s], np.array([p]))
    batch.close(slots[0])  # the last row moves into row 0
    assert slots[2].row == 0 and batch.rows_moved == 1
    out = batch.step([slots[1], slots[2]], np.array([[1], [2]]))  # out of row order
    for row, (p, tok) in enumerate(((prompts[1], 1), (prompts[2], 2))):
        alone = stage.open_session(32).step(np.array(p + [tok]), np.arange(len(p) + 1),
                                           last_only=True)
        np.testing.assert_allclose(out[row], alone[0], rtol=0, atol=1e-5)
    only = batch.step([slots[1]], np.array([[4]]))  # a subset: rows are made contiguous
    want = stage.open_session(32).step(np.array(prompts[1] + [1, 4]), np.arange(6),
                                       last_only=True)
    np.testing.assert_allclose(only[0], want[0], rtol=0, atol=1e-5)


def test_rows_that_never_ran_can_be_closed_in_any_order(models: dict[str, Model]) -> None:
    """Stage sessions are opened (a row) before their first step and may be freed before it."""
    model = models["llama"]
    batch = BatchStage(model.stage(0, model.num_layers))
    a = batch.open(16)
    batch.step([a], np.array([[3, 4]]))
    b, c = batch.open(16), batch.open(16)  # rows beyond the buffers: nothing ran on them
    batch.close(a)  # c (empty) moves into row 0
    batch.close(b)
    assert c.row == 0 and batch.slots == [c]
    batch.step([c], np.array([[5]]))
    batch.close(c)
    assert batch.slots == [] and batch.memory_bytes() == 0


def test_a_long_prompt_is_prefilled_in_chunks_between_decode_steps(
        models: dict[str, Model]) -> None:
    model = models["llama"]
    sched = BatchScheduler(model)
    sched.prefill_ms_per_token = 1e9  # 16-token chunks
    short = prepare(model, [5, 6, 7], GenerationConfig(max_tokens=40, temperature=0.0), False)
    sched.add(short)
    sched.step()
    long_ids = list(np.random.default_rng(0).integers(3, 300, 100))
    long = prepare(model, long_ids, GREEDY, False)
    sched.add(long)
    gaps = 0
    while long.prefilled < len(long_ids):
        before = len(short.events)
        sched.step()
        assert len(short.events) == before + 1  # the running stream got a token every step
        gaps += 1
    assert gaps == 7  # ceil(100 / 16)


@pytest.mark.parametrize(("budget", "per_token", "want"), [
    (50.0, 0.0, 64), (50.0, 1.0, 48), (50.0, 0.1, 128), (50.0, 10.0, 16), (100.0, 1.5, 64)])
def test_chunk_size_follows_the_measured_prefill_speed(budget: float, per_token: float,
                                                       want: int) -> None:
    assert chunk_tokens(budget, per_token) == want


def test_batcher_streams_concurrent_generations(models: dict[str, Model]) -> None:
    model = models["llama"]
    cfgs = _cfgs()
    alone = [[e.token_id for e in model.generate_sync(p, c)] for p, c in zip(PROMPTS, cfgs, strict=False)]
    got: dict[int, list[int]] = {}

    async def one(i: int) -> None:
        got[i] = [ev.token_id async for ev in model.generate(PROMPTS[i], cfgs[i])]

    async def early() -> list[int]:
        out = []
        agen = model.generate("Abandoned early", GenerationConfig(max_tokens=30, seed=1))
        async for ev in agen:
            out.append(ev.token_id)
            if len(out) == 2:
                break
        await agen.aclose()  # type: ignore[attr-defined]
        return out

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(model.batcher.run)
            async with trio.open_nursery() as streams:
                for i in range(len(PROMPTS)):
                    streams.start_soon(one, i)
                streams.start_soon(early)
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert [got[i] for i in range(len(PROMPTS))] == alone
    stats = model.statistics()["batch"]
    assert stats["running"] == 0 and stats["waiting"] == 0 and stats["kv_bytes"] == 0
    assert stats["max_batch_seen"] >= 2
    assert not model.batcher.running


@pytest.mark.parametrize("split", [False, True])
def test_stage_batcher_steps_sessions_together_like_stage_sessions(
        models: dict[str, Model], split: bool) -> None:
    """Pipeline stages: the sessions on one stage step together, and each gets exactly what a
    StageSession gives it: a whole-model stage, and a first (ids in) + last (hidden in,
    logits out) chain."""
    from meshd.engine.stagebatch import StageBatcher

    model = models["llama"]
    n = model.num_layers
    stages = [model.stage(0, 2), model.stage(2, n)] if split else [model.stage(0, n)]
    prompts = [[5, 6, 7], [8, 9, 10, 11, 12, 13, 14], [15, 16], [17, 18, 19, 20]]
    steps = 8
    want = []
    for p in prompts:
        chain = [st.open_session(32) for st in stages]
        outs = []
        for x, pos in [(np.array(p), np.arange(len(p)))] + [
                (np.array([k + 1]), np.array([len(p) + k])) for k in range(steps)]:
            for j, sess in enumerate(chain):
                x = sess.step(x, pos, last_only=j == len(chain) - 1)
            outs.append(x)
        want.append(outs)
    got: dict[int, list[np.ndarray]] = {}

    async def session(i: int, batchers: list[StageBatcher]) -> None:
        p = prompts[i]
        chain = [b.open(32) for b in batchers]
        outs = []
        for x, pos in [(np.array(p), np.arange(len(p)))] + [
                (np.array([k + 1]), np.array([len(p) + k])) for k in range(steps)]:
            for j, h in enumerate(chain):
                x = await h.step(x, pos, last_only=j == len(chain) - 1)
            outs.append(x)
        for h in chain:
            h.free()
        got[i] = outs

    async def main() -> list[StageBatcher]:
        batchers = [StageBatcher(st) for st in stages]
        async with trio.open_nursery() as nursery:
            for b in batchers:
                nursery.start_soon(b.run)
            async with trio.open_nursery() as sessions:
                for i in range(len(prompts)):
                    sessions.start_soon(session, i, batchers)
            await wait_until(lambda: not any(b.pending for b in batchers), 30)
            nursery.cancel_scope.cancel()
        return batchers

    batchers = trio.run(main)
    for i in range(len(prompts)):
        for g_, w in zip(got[i], want[i], strict=True):
            np.testing.assert_allclose(g_, w, rtol=0, atol=1e-4)
    for b in batchers:
        assert b.statistics()["rows"] == 0 and b.batch.memory_bytes() == 0
    if not split:  # one stage: the sessions that wait during a run step together in the next
        assert batchers[0].stats["max_batch_seen"] >= 2
        assert batchers[0].stats["decode_runs"] < batchers[0].stats["decode_steps"]
