"""The KV prefix cache: chained block names, LRU under a budget, and reuse that changes no token
(single stream, continuous batching with chunked and fused prefill, pipeline stages, int4)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import trio

from meshd.core.prefix_cache import BLOCK_TOKENS, PrefixCache, block_hashes
from meshd.engine import GenerationConfig, Model, load_model
from meshd.engine.scheduler import BatchScheduler, prepare
from meshd.engine.stagebatch import StageBatcher
from meshd.testing.wait import wait_until

from .batch_driver import run_with_joins

GREEDY = GenerationConfig(max_tokens=10, temperature=0.0, repetition_penalty=1.0)
ONE = GenerationConfig(max_tokens=1, temperature=0.0)


def _ids(model: Model, n: int, seed: int = 0) -> list[int]:
    rng = np.random.default_rng(seed)
    return [int(i) for i in rng.integers(3, min(model.vocab_size, 4000), n)]


@pytest.fixture
def cached(models: dict[str, Model]) -> Any:
    """Turn a model's prefix cache on (a fresh one) for one test, and off again after it."""
    used: list[Model] = []

    def on(name: str, budget: int = 64 << 20) -> Model:
        m = models[name]
        m.set_prefix_budget(budget)
        used.append(m)
        return m

    yield on
    for m in used:
        m.set_prefix_budget(0)


# ------------------------------------------------------------------------- the index (pure)

def test_block_names_chain_over_every_earlier_token_and_the_model() -> None:
    ids = list(range(100, 100 + 3 * BLOCK_TOKENS + 5))
    names = block_hashes(ids, "model-a")
    assert len(names) == 3  # the partial last block has no name
    assert block_hashes(ids[:2 * BLOCK_TOKENS], "model-a") == names[:2]  # a prefix's names
    changed = [7, *ids[1:]]
    assert all(a != b for a, b in zip(block_hashes(changed, "model-a"), names, strict=True))
    assert all(a != b for a, b in zip(block_hashes(ids, "model-b"), names, strict=True))
    later = ids[:BLOCK_TOKENS] + [9] + ids[BLOCK_TOKENS + 1:]
    got = block_hashes(later, "model-a")
    assert got[0] == names[0] and got[1] != names[1] and got[2] != names[2]


def test_match_is_the_longest_stored_run_from_the_first_block() -> None:
    c = PrefixCache(1000, block_tokens=4)
    names = [b"a", b"b", b"c", b"d"]
    c.store("0-4", names[:3], {0: ("A", 10), 1: ("B", 10), 2: ("C", 10)})
    assert c.match("0-4", names) == ["A", "B", "C"]
    c.note_reuse(12)
    assert c.match("0-2", names) == []  # another layer range holds its own KV
    assert c.match("0-4", [b"x", *names[1:]]) == []
    assert c.absent("0-4", names) == [3]
    s = c.statistics()
    assert (s["lookups"], s["hits"], s["reused_tokens"], s["bytes"], s["blocks"]) == \
        (3, 1, 12, 30, 3)


def test_lru_evicts_past_the_budget_tail_first() -> None:
    c = PrefixCache(50, block_tokens=4)
    one, two = [b"1a", b"1b", b"1c"], [b"2a", b"2b", b"2c"]
    c.store("s", one, {i: (f"1{i}", 10) for i in range(3)})
    c.store("s", two, {i: (f"2{i}", 10) for i in range(3)})  # 60 bytes: one block goes
    s = c.statistics()
    assert s["bytes"] == 50 and s["evicted_blocks"] == 1
    assert c.match("s", one) == ["10", "11"]  # the oldest chain lost its tail, not its head
    c.match("s", two)  # now the most recent
    c.store("s", [b"3a"], {0: ("30", 30)})
    assert c.match("s", one) == []  # the least recently used chain went first
    assert c.match("s", two) == ["20", "21"] and c.match("s", [b"3a"]) == ["30"]
    assert c.statistics()["bytes"] <= 50
    c.store("s", [b"big"], {0: ("X", 51)})  # larger than the whole budget: not kept
    assert c.match("s", [b"big"]) == [] and c.match("s", [b"3a"]) == ["30"]


# ------------------------------------------------------------------------- single stream

@pytest.mark.parametrize("name", ["llama", "qwen2", "int4"])
def test_single_stream_reuse_gives_the_same_tokens(models: dict[str, Model], cached: Any,
                                                   name: str) -> None:
    """The one-sequence loop reuses whole 128-token prefill chunks of cached blocks, so the
    chunks after them are the ones an uncached prompt runs: even the int4 model (whose int8
    activations turn last-bit differences into other tokens) gives the same tokens."""
    model = models[name]
    ids = _ids(model, 165)
    want = [e.token_id for e in model.generate_sync(ids, GREEDY)]
    cached(name)
    assert [e.token_id for e in model.generate_sync(ids[:140], ONE)]  # keeps 4 blocks
    events = list(model.generate_sync(ids, GREEDY))
    assert [e.token_id for e in events] == want
    # the first event says how much of the prompt came from the cache (a runner's prefill
    # speed counts only the rest)
    assert [e.cached_tokens for e in events] == [128] + [0] * (len(events) - 1)
    s = model.prefix_cache.statistics()  # type: ignore[union-attr]
    assert s["hits"] == 1 and s["reused_tokens"] == 128
    assert s["blocks"] == 5  # the prompt's full blocks (prefilled tokens only)
    assert [e.token_id for e in model.generate_sync(ids, GREEDY)] == want
    assert model.prefix_cache.statistics()["reused_tokens"] == 256  # type: ignore[union-attr]


def test_a_short_match_is_not_reused_and_the_last_token_is_always_computed(
        models: dict[str, Model], cached: Any) -> None:
    ids = _ids(models["llama"], 5 * BLOCK_TOKENS, seed=3)
    want = [e.token_id for e in models["llama"].generate_sync(ids, GREEDY)]
    whole = ids[:4 * BLOCK_TOKENS]
    want_whole = [e.token_id for e in models["llama"].generate_sync(whole, GREEDY)]
    model = cached("llama")
    assert [e.token_id for e in model.generate_sync(ids[:100], GREEDY)]  # 3 blocks: < a chunk
    assert [e.token_id for e in model.generate_sync(ids, GREEDY)] == want
    assert model.prefix_cache.statistics()["reused_tokens"] == 0  # type: ignore[union-attr]
    assert [e.token_id for e in model.generate_sync(ids, GREEDY)] == want  # 5 blocks kept
    assert model.prefix_cache.statistics()["reused_tokens"] == 128  # type: ignore[union-attr]
    # every block of a 128-token prompt is cached, but its last token must be computed: the
    # 3 blocks before it are less than a chunk, so it is prefilled whole
    assert [e.token_id for e in model.generate_sync(whole, GREEDY)] == want_whole
    assert model.prefix_cache.statistics()["reused_tokens"] == 128  # type: ignore[union-attr]


def test_async_single_stream_reuses_and_keeps(models: dict[str, Model], cached: Any) -> None:
    model = cached("qwen2")
    ids = _ids(model, 150, seed=4)

    async def run() -> list[tuple[int, int]]:
        return [(e.token_id, e.cached_tokens) async for e in model.generate(ids, GREEDY)]

    first, second = trio.run(run), trio.run(run)
    assert [t for t, _ in first] == [t for t, _ in second]
    assert first[0][1] == 0 and second[0][1] == 128  # the second's first event: 128 restored
    assert model.prefix_cache.statistics()["reused_tokens"] == 128  # type: ignore[union-attr]


# ------------------------------------------------------------------------- batching

def _batched(model: Model, prompts: list[list[int]], join_at: dict[int, list[int]],
             cfgs: list[GenerationConfig] | None = None,
             sched: BatchScheduler | None = None) -> tuple[list[list[int]], BatchScheduler]:
    sched = sched or BatchScheduler(model)
    sched.prefill_ms_per_token = 1e9  # chunks of 16 tokens
    cfgs = cfgs or [GREEDY] * len(prompts)
    seqs = [prepare(model, p, c, False) for p, c in zip(prompts, cfgs, strict=True)]
    return run_with_joins(sched, seqs, join_at), sched


@pytest.mark.parametrize("name", ["llama", "int4-exact"])
def test_batch_reuse_with_fused_chunks_gives_the_same_tokens(
        models: dict[str, Model], cached: Any, name: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A prompt whose prefix is cached joins while another sequence decodes: its remaining
    chunks run fused with the decode steps, and every sequence's tokens are unchanged. (The
    int4 model computes in float here, as in test_fused.py: at the default accuracy level a
    fused row's last bits depend on the rows beside it, with or without reuse.)"""
    from meshd.engine import graph

    monkeypatch.setattr(graph, "ACCURACY_LEVEL", 0)  # for the fused graph, built on demand
    model = models[name]
    long_cfg = GenerationConfig(max_tokens=30, temperature=0.0, repetition_penalty=1.0)
    other, ids = _ids(model, 20, seed=5), _ids(model, 4 * BLOCK_TOKENS + 7, seed=6)
    want, _ = _batched(model, [other, ids], {0: [0], 2: [1]}, [long_cfg, GREEDY])
    cached(name)
    _batched(model, [ids[:3 * BLOCK_TOKENS + 1]], {0: [0]}, [ONE])
    got, sched = _batched(model, [other, ids], {0: [0], 2: [1]}, [long_cfg, GREEDY])
    assert got == want
    assert sched.stats["fused_runs"] >= 1  # the remaining chunk rode a decode step
    s = model.prefix_cache.statistics()  # type: ignore[union-attr]
    assert s["reused_tokens"] == 3 * BLOCK_TOKENS
    assert sched.stage.slots == [] and sched.pre.slots == []  # every row freed
    seq = prepare(model, ids, ONE, False)  # once more, alone: its first event says what it reused
    sched.add(seq)
    while not seq.events:
        sched.step()
    assert seq.events[0].cached_tokens == 4 * BLOCK_TOKENS


def test_batch_shares_a_system_prompt_between_concurrent_requests(
        models: dict[str, Model], cached: Any) -> None:
    """The first request's prompt blocks are kept as soon as its prefill ends, so requests that
    arrive later with the same system prompt reuse it while the first still decodes; sampled
    settings give the same tokens too."""
    model = models["qwen2"]
    system = _ids(model, 3 * BLOCK_TOKENS, seed=7)
    prompts = [system + _ids(model, 5 + i, seed=10 + i) for i in range(3)]
    cfgs = [GenerationConfig(max_tokens=12, temperature=0.0, repetition_penalty=1.0),
            GenerationConfig(max_tokens=8, temperature=0.9, top_k=20, seed=3),
            GenerationConfig(max_tokens=8, temperature=0.7, seed=9)]
    want, _ = _batched(model, prompts, {0: [0], 1: [1, 2]}, cfgs)
    cached("qwen2")
    got, sched = _batched(model, prompts, {0: [0], 1: [1, 2]}, cfgs)
    assert got == want
    assert model.prefix_cache.statistics()["reused_tokens"] == 2 * 3 * BLOCK_TOKENS  # type: ignore


def test_an_evicted_prefix_is_prefilled_again_and_answers_the_same(
        models: dict[str, Model], cached: Any) -> None:
    model = models["llama"]
    a, b = _ids(model, 3 * BLOCK_TOKENS + 2, seed=20), _ids(model, 3 * BLOCK_TOKENS + 2, seed=21)
    want, _ = _batched(model, [a], {0: [0]})
    arch = model.manifest.arch
    per_block = 2 * arch.num_layers * arch.num_kv_heads * arch.head_dim * 4 * BLOCK_TOKENS
    cached("llama", budget=3 * per_block)  # room for one request's blocks, not two
    _batched(model, [a], {0: [0]})
    _batched(model, [b], {0: [0]})  # evicts a's blocks
    s = model.prefix_cache.statistics()  # type: ignore[union-attr]
    assert s["evicted_blocks"] >= 3 and s["bytes"] <= 3 * per_block
    got, _ = _batched(model, [a], {0: [0]})
    assert got == want
    assert model.prefix_cache.statistics()["hits"] == s["hits"]  # type: ignore[union-attr]


def _idle(sched: BatchScheduler) -> None:
    """Step until the scheduler has nothing left (the answers it keeps included)."""
    steps = 0
    while sched.busy and steps < 400:
        sched.step()
        steps += 1
    assert not sched.busy


def test_a_finished_answer_is_kept_and_the_next_turn_prefills_only_its_message(
        models: dict[str, Model], cached: Any) -> None:
    """With ``keep_answers``, a finished sequence's prompt and answer are prefilled again once
    the batch is idle and their blocks kept: the conversation's next turn (the history, the
    answer and a new message) reuses past the answer, where prompts' blocks alone stop at the
    first turn's prompt, and its tokens are those of a prefill from token 0."""
    model = models["llama"]
    first = _ids(model, 3 * BLOCK_TOKENS + 7, seed=42)
    cfg = GenerationConfig(max_tokens=64, temperature=0.0, repetition_penalty=1.0)
    (answer,), _ = _batched(model, [first], {0: [0]}, [cfg])
    kept = (len(first) + len(answer)) // BLOCK_TOKENS * BLOCK_TOKENS
    assert kept >= 5 * BLOCK_TOKENS  # the answer fills blocks of its own
    second = first + answer + _ids(model, 9, seed=39)
    (want,), _ = _batched(model, [second], {0: [0]}, [cfg])

    for keep, reused in ((False, 96), (True, kept)):
        cached("llama")
        sched = BatchScheduler(model, keep_answers=keep)
        sched.prefill_ms_per_token = 1e9  # chunks of 16 tokens
        (got,), _ = _batched(model, [first], {0: [0]}, [cfg], sched)
        assert got == answer
        _idle(sched)
        assert sched.stats["answers_kept"] == int(keep)
        # the answer is prefilled after the prompt's 3 kept blocks (96 tokens)
        assert sched.stats["answer_tokens_prefilled"] == (
            len(first) + len(answer) - 96 if keep else 0)
        seq = prepare(model, second, cfg, False)
        (got,) = run_with_joins(sched, [seq], {0: [0]})
        assert (got, seq.cached) == (want, reused)
        assert sched.pre.slots == [] and sched.stage.slots == []
        s = model.prefix_cache.statistics()  # type: ignore[union-attr]
        assert (s["lookups"], s["hits"]) == (2, 1)  # the two turns: the answer's restore is not


def test_a_prompt_pauses_an_answer_being_kept_and_it_resumes(
        models: dict[str, Model], cached: Any) -> None:
    """A finished answer is prefilled only while no prompt waits: a prompt arriving meanwhile
    takes the step (what the answer prefilled so far is kept) and the answer resumes from its
    kept blocks afterwards; both conversations answer as they would alone."""
    model = models["llama"]
    cfg = GenerationConfig(max_tokens=64, temperature=0.0, repetition_penalty=1.0)
    a, b = _ids(model, 2 * BLOCK_TOKENS + 3, seed=50), _ids(model, 40, seed=51)
    (want_a,), _ = _batched(model, [a], {0: [0]}, [cfg])
    (want_b,), _ = _batched(model, [b], {0: [0]}, [cfg])
    cached("llama")
    sched = BatchScheduler(model, keep_answers=True)
    sched.prefill_ms_per_token = 1e9
    seq = prepare(model, a, cfg, False)
    sched.add(seq)
    got_a: list[int] = []
    while not sched.warming:  # until a's answer is done and waits to be kept
        for s in sched.step():
            got_a += [e.token_id for e in s.events]
            s.events.clear()
    assert got_a == want_a
    sched.step()  # the answer's first chunk
    assert sched.warming[0].slot is not None and sched.warming[0].prefilled < len(a) + len(got_a)
    seq = prepare(model, b, cfg, False)
    assert run_with_joins(sched, [seq], {0: [0]}) == [want_b]  # b arrives: a's answer pauses
    assert sched.stats["answers_paused"] >= 1 and sched.stats["answers_kept"] == 2
    assert sched.pre.slots == [] and sched.stage.slots == []
    again = a + want_a + _ids(model, 5, seed=52)
    (want,), _ = _batched(model, [again], {0: [0]}, [GREEDY])
    seq = prepare(model, again, GREEDY, False)
    assert run_with_joins(sched, [seq], {0: [0]}) == [want]
    assert seq.cached == (len(a) + len(want_a) - 1) // 32 * 32 // 16 * 16


def test_answers_waiting_are_bounded_and_dropped_with_their_rows(
        models: dict[str, Model], cached: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """At most ``QUEUE`` finished answers wait to be kept (the oldest not being prefilled goes
    first), and ``drop_answers`` (a failed step, the batcher's end) frees the row of the one
    being prefilled."""
    from meshd.core.answer_keep import QUEUE

    model = models["llama"]
    cached("llama")
    sched = BatchScheduler(model, keep_answers=True)
    sched.prefill_ms_per_token = 1e9
    monkeypatch.setattr(sched, "answer_chunk", lambda: 0)  # none is prefilled: they queue
    cfg = GenerationConfig(max_tokens=40, temperature=0.0, repetition_penalty=1.0)
    prompts = [_ids(model, 30, seed=100 + i) for i in range(QUEUE + 3)]
    outs = run_with_joins(sched, [prepare(model, p, cfg, False) for p in prompts],
                          {0: list(range(len(prompts)))}, max_steps=150)
    assert all(outs) and not sched.running and not sched.waiting
    assert len(sched.warming) == QUEUE and sched.stats["answers_dropped"] == 3
    monkeypatch.setattr(sched, "answer_chunk", lambda: 16)
    sched.step()  # the oldest left starts its prefill
    assert sched.warming[0].slot is not None and sched.pre.slots
    sched.drop_answers()
    assert not sched.warming and not sched.busy and sched.pre.slots == []
    assert sched.stats["answers_dropped"] == 3 + QUEUE and sched.stats["answers_kept"] == 0


def test_an_answer_rides_the_streams_steps_only_where_its_chunk_fits(
        models: dict[str, Model], cached: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Beside decoding streams a finished answer is prefilled only in chunks that fit a quarter
    of their step (``answer_chunk``): where none fits, it waits for the streams to end; where
    one does, it is kept while they decode, and their tokens are unchanged either way."""
    model = models["llama"]
    short = GenerationConfig(max_tokens=40, temperature=0.0, repetition_penalty=1.0)
    long_cfg = GenerationConfig(max_tokens=120, temperature=0.0, repetition_penalty=1.0)
    a, other = _ids(model, 2 * BLOCK_TOKENS + 3, seed=60), _ids(model, 30, seed=61)
    want, _ = _batched(model, [a, other], {0: [0, 1]}, [short, long_cfg])
    assert len(want[0]) < len(want[1])  # a's answer ends while the other stream decodes
    for fits, during in ((0, False), (16, True)):
        cached("llama")
        sched = BatchScheduler(model, keep_answers=True)
        monkeypatch.setattr(sched, "answer_chunk",
                            lambda fits=fits, sched=sched: fits if sched.running else 16)
        kept_while_decoding = []
        seqs = [prepare(model, p, c, False) for p, c in ((a, short), (other, long_cfg))]
        got: list[list[int]] = [[], []]
        for s in seqs:
            sched.add(s)
        while sched.busy:
            for s in sched.step():
                got[seqs.index(s)] += [e.token_id for e in s.events]
                s.events.clear()
            kept_while_decoding.append(bool(sched.running) and sched.stats["answers_kept"] > 0)
        assert got == want
        assert sched.stats["answers_kept"] == 2
        assert any(kept_while_decoding) == during


# ------------------------------------------------------------------------- pipeline stages

async def _pipeline(model: Model, cuts: list[int], ids: list[int], max_new: int) -> tuple[
        list[int], int]:
    """Greedy decode through StageBatchers of ``[cuts[i], cuts[i+1])``: each stage restores
    its own layers' cached prefix, the chain agrees on the shortest, and each keeps its prompt
    blocks when freed. Returns the tokens and the prefix length reused."""
    stages = [StageBatcher(model.stage(a, b)) for a, b in zip(cuts, cuts[1:], strict=False)]
    out: list[int] = []
    async with trio.open_nursery() as nursery:
        for sb in stages:
            await nursery.start(sb.run)
        handles = [sb.open(len(ids) + max_new) for sb in stages]
        reused = min([await h.reuse(ids) for h in handles])
        for h in handles:
            h.truncate(reused)
        x: np.ndarray = np.asarray(ids[reused:], np.int64)
        while len(out) < max_new:
            pos = np.arange(handles[0].length, handles[0].length + len(x), dtype=np.int64)
            for h in handles:  # hidden states of every token between stages
                x = await h.step(x, pos, last_only=h is handles[-1])
            out.append(int(np.argmax(x[-1])))
            x = np.asarray(out[-1:], np.int64)
        for h in handles:
            h.free(ids)
        await wait_until(lambda: not any(sb.pending for sb in stages), 30.0)
        nursery.cancel_scope.cancel()
    return out, reused


@pytest.mark.parametrize("name", ["llama", "int4"])
def test_pipeline_stages_each_reuse_their_own_layers(models: dict[str, Model], cached: Any,
                                                     name: str) -> None:
    model = models[name]
    n = model.num_layers
    cuts = [0, n // 2, n]
    ids = _ids(model, 5 * BLOCK_TOKENS + 4, seed=30)
    want, none = trio.run(_pipeline, model, cuts, ids, 8)
    assert none == 0
    cached(name)
    trio.run(_pipeline, model, cuts, ids[:140], 1)
    got, reused = trio.run(_pipeline, model, cuts, ids, 8)
    assert (got, reused) == (want, 128)
    blocks = model.prefix_cache._blocks  # type: ignore[union-attr]
    assert {space for space, _ in blocks} == {f"0-{n // 2}", f"{n // 2}-{n}"}
    # a stage that lost its blocks makes the chain fall back to what every stage holds
    for key in [k for k in blocks if k[0] == f"{n // 2}-{n}"]:
        del blocks[key]
    got, reused = trio.run(_pipeline, model, cuts, ids, 8)
    assert (got, reused) == (want, 0)


# ------------------------------------------------------------------------- the real model

@pytest.fixture(scope="module")
def real_int4(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SmolLM2-135M-Instruct Q4_1, imported from the GGUF ``find_gguf`` finds (as CI has it)."""
    from meshd.engine.gguf_import import import_gguf
    from meshd.testing.gguf_corpus import find_gguf

    gguf, why = find_gguf("smollm2")
    if gguf is None:
        pytest.skip(why)
    out = tmp_path_factory.mktemp("real") / "smol-q41"
    import_gguf(gguf, out)
    return out


def test_real_int4_model_reuse_gives_the_same_tokens(real_int4: Path) -> None:
    model = load_model(real_int4)
    ids = model.encode_prompt("You are a helpful assistant. " * 30 + "What is the capital of")
    assert len(ids) > 160
    cfg = GenerationConfig(max_tokens=8, temperature=0.0, repetition_penalty=1.0)
    alone = [e.token_id for e in model.generate_sync(ids, cfg)]
    batched, _ = _batched(model, [ids], {0: [0]}, [cfg])
    model.set_prefix_budget(64 << 20)
    head = ids[:150]
    assert [e.token_id for e in model.generate_sync(head, ONE)]
    assert [e.token_id for e in model.generate_sync(ids, cfg)] == alone
    sched = BatchScheduler(model)
    _batched(model, [head], {0: [0]}, [ONE], sched)
    assert _batched(model, [ids], {0: [0]}, [cfg], sched)[0] == batched
    s = model.prefix_cache.statistics()  # type: ignore[union-attr]
    assert s["hits"] >= 2 and s["reused_tokens"] >= 2 * 128


def test_the_advert_sketch_holds_what_the_entry_node_computes(models: dict[str, Model],
                                                              cached: Any) -> None:
    """A node advertises a sketch of the names of its cached prefixes at 4, 8, 12... blocks,
    named with the model's identity as adverts carry it, so an entry node that tokenizes a
    request computes names that match (meshd.core.prefix_names)."""
    from meshd.core.prefix_names import block_hashes as names_of
    from meshd.core.prefix_names import matched_tokens
    from meshd.node.engine_model import EngineModel

    model = cached("llama")
    ids = _ids(model, 165, seed=40)
    assert [e.token_id for e in model.generate_sync(ids, ONE)]
    n = model.num_layers
    advertised = EngineModel(model).prefix_sketch(0, n)
    names = names_of(ids, model.model_identity)
    assert model.model_identity.startswith("meshd:")
    assert len(advertised) == 8  # 5 blocks held: the 4-block prefix is in it
    assert matched_tokens(names, advertised) == 128
    assert matched_tokens(names_of(ids, "meshd:other"), advertised) == 0
    assert EngineModel(model).prefix_sketch(0, n // 2) == b""  # no stage of it holds any


def test_real_int4_chat_next_turn_reuses_the_kept_answer(real_int4: Path) -> None:
    """A real conversation through SmolLM2's chat template: the answer's text, sent back as
    the assistant message, encodes to the tokens generated (so the next turn's prompt starts
    with the first turn's prompt and answer), the second turn reuses the blocks the batch kept
    of both, and answers as a prefill of the whole history does."""
    model = load_model(real_int4)
    tok = model.tokenizer
    cfg = GenerationConfig(max_tokens=60, temperature=0.0, repetition_penalty=1.0)
    chat = [{"role": "user", "content": "Tell me about the city of Lyon in France."}]
    first = tok.encode_chat(chat)
    model.set_prefix_budget(64 << 20)
    sched = BatchScheduler(model, keep_answers=True)
    (answer,), _ = _batched(model, [first], {0: [0]}, [cfg], sched)
    assert sched.stats["answers_kept"] == 1
    text = tok.decode(answer)
    chat += [{"role": "assistant", "content": text},
             {"role": "user", "content": "And what is it famous for?"}]
    second = tok.encode_chat(chat)
    assert second[:len(first) + len(answer)] == first + answer  # the round trip holds
    seq = prepare(model, second, cfg, False)
    (got,) = run_with_joins(sched, [seq], {0: [0]})
    assert seq.cached == (len(first) + len(answer)) // BLOCK_TOKENS * BLOCK_TOKENS // 16 * 16
    assert seq.cached > len(first)
    model.set_prefix_budget(0)
    (want,), _ = _batched(model, [second], {0: [0]}, [cfg])
    assert got == want
