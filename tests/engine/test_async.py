"""``Model.generate`` from trio: several sessions at once on one model, streaming, early exit."""

from __future__ import annotations

import numpy as np
import trio

from meshd.engine import GenerationConfig, Model, TokenEvent

GREEDY = GenerationConfig(max_tokens=10, temperature=0.0, repetition_penalty=1.0)
PROMPTS = ["Once upon a time", "The quick brown fox", "In the beginning the nodes"]


def test_concurrent_sessions_match_sync(models: dict[str, Model]) -> None:
    model = models["llama"]
    expected = {p: [e.token_id for e in model.generate_sync(p, GREEDY)] for p in PROMPTS}
    got: dict[str, list[TokenEvent]] = {}
    limiter = trio.CapacityLimiter(2)

    async def one(prompt: str) -> None:
        got[prompt] = [ev async for ev in model.generate(prompt, GREEDY, limiter=limiter)]

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            for p in PROMPTS:
                nursery.start_soon(one, p)

    trio.run(main)
    for p in PROMPTS:
        assert [e.token_id for e in got[p]] == expected[p]
        assert got[p][-1].finish_reason in ("eos", "length")
    stats = model.statistics()
    whole = [s for s in stats["stages"] if s["layers"] == [0, model.num_layers]][0]
    assert whole["sessions_open"] == 0 and whole["kv_bytes"] == 0  # every cache was freed
    assert whole["sessions_opened"] >= 2 * len(PROMPTS)


def test_early_exit_and_default_limiter(models: dict[str, Model]) -> None:
    model = models["qwen2"]
    cfg = GenerationConfig(max_tokens=50, temperature=0.7, seed=1)

    async def main() -> list[int]:
        out = []
        agen = model.generate([0, 5, 6, 7], cfg)
        async for ev in agen:
            out.append(ev.token_id)
            if len(out) == 3:
                break
        await agen.aclose()  # type: ignore[attr-defined]
        return out

    tokens = trio.run(main)
    assert len(tokens) == 3
    assert model.limiter.total_tokens == 1
    sync = [e.token_id for e in model.generate_sync([0, 5, 6, 7], cfg)][:3]
    assert tokens == sync


def test_logits_are_float32(models: dict[str, Model]) -> None:
    model = models["llama"]
    out = model.stage(0, model.num_layers).open_session().step(np.array([0, 5]), np.arange(2))
    assert out.dtype == np.float32


def test_runtime_conforms_to_the_protocols(models: dict[str, Model]) -> None:
    from meshd.engine.protocols import ModelRunner, StageLike, StageSessionLike

    runner: ModelRunner = models["llama"]  # checked by mypy; here only that it type-checks
    stage: StageLike = runner.stage(0, 1)
    session: StageSessionLike = stage.open_session(4)
    assert session.length == 0
    session.free()
