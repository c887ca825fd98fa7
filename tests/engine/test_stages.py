"""Stage splits, the stage session API and the KV cache."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from meshd.engine import GenerationConfig, Model, StageSession, load_model, runtime
from meshd.errors import LocalError

from .reference import Reference

PROMPT = "The quick brown fox jumps over"
GREEDY = GenerationConfig(max_tokens=8, temperature=0.0, repetition_penalty=1.0)


def splits(n: int) -> list[list[tuple[int, int]]]:
    """Every way to cut layers [0, n) into contiguous ranges."""
    out = []
    for k in range(n):
        for cuts in itertools.combinations(range(1, n), k):
            bounds = [0, *cuts, n]
            out.append(list(itertools.pairwise(bounds)))
    return out


def run_chain(sessions: list[StageSession], x: np.ndarray, positions: np.ndarray,
              last_only: bool = False) -> np.ndarray:
    for i, s in enumerate(sessions):
        x = s.step(x, positions, last_only=last_only and i == len(sessions) - 1)
    return x


def chain_greedy(model: Model, split: list[tuple[int, int]], ids: list[int], n: int
                 ) -> tuple[np.ndarray, list[int]]:
    sessions = [model.stage(a, b).open_session(len(ids) + n) for a, b in split]
    prefill = run_chain(sessions, np.array(ids), np.arange(len(ids)))
    tokens = [int(np.argmax(prefill[-1]))]
    for _ in range(n - 1):
        pos = np.array([sessions[0].length])
        logits = run_chain(sessions, np.array(tokens[-1:]), pos, last_only=True)
        tokens.append(int(np.argmax(logits[-1])))
    return prefill, tokens


def test_splits_helper() -> None:
    assert splits(3) == [[(0, 3)], [(0, 1), (1, 3)], [(0, 2), (2, 3)],
                         [(0, 1), (1, 2), (2, 3)]]
    assert len(splits(4)) == 8


def test_every_split_matches_unsplit(arch_name: str, models: dict[str, Model]) -> None:
    model = models[arch_name]
    ids = model.tokenizer.encode(PROMPT)
    whole_logits, whole_tokens = chain_greedy(model, [(0, model.num_layers)], ids, 8)
    for split in splits(model.num_layers):
        logits, tokens = chain_greedy(model, split, ids, 8)
        np.testing.assert_allclose(logits, whole_logits, rtol=0, atol=1e-4, err_msg=str(split))
        assert tokens == whole_tokens, split


def test_kv_cache_decode_equals_recompute(arch_name: str, hf_dirs: dict[str, Path],
                                          models: dict[str, Model]) -> None:
    model = models[arch_name]
    ids = model.tokenizer.encode(PROMPT)
    cached = [e.token_id for e in model.generate_sync(ids, GREEDY)]
    recomputed = []
    seq = list(ids)
    stage = model.stage(0, model.num_layers)
    for _ in range(len(cached)):
        fresh = stage.open_session(len(seq))  # no cache: the whole sequence every time
        token = int(np.argmax(fresh.step(np.array(seq), np.arange(len(seq)))[-1]))
        recomputed.append(token)
        seq.append(token)
    assert cached == recomputed
    assert cached == Reference(hf_dirs[arch_name]).greedy(ids, len(cached))


def test_chunked_prefill_and_cache_growth(models: dict[str, Model],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runtime, "CACHE_CHUNK_TOKENS", 4)  # grow the cache every few tokens
    model = models["llama"]
    ids = model.tokenizer.encode(PROMPT + " the lazy dog")
    stage = model.stage(0, model.num_layers)
    whole = stage.open_session(len(ids)).step(np.array(ids), np.arange(len(ids)))
    s = stage.open_session(len(ids))
    parts = []
    for a, b in ((0, 5), (5, 6), (6, 13), (13, len(ids))):
        parts.append(s.step(np.array(ids[a:b]), np.arange(a, b)))
        assert s.length == b
        assert s.capacity >= b
    np.testing.assert_allclose(np.concatenate(parts), whole, rtol=0, atol=1e-4)
    assert s.memory_bytes() == 2 * model.num_layers * 2 * s.capacity * 16 * 4


def test_long_inputs_run_in_chunks(models: dict[str, Model],
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    model = models["qwen2"]
    ids = np.array(model.tokenizer.encode(PROMPT + " the lazy dog"))
    stage = model.stage(0, model.num_layers)
    whole = stage.open_session().step(ids, np.arange(len(ids)))
    monkeypatch.setattr(runtime, "PREFILL_CHUNK_TOKENS", 4)
    chunked = stage.open_session().step(ids, np.arange(len(ids)))
    last = stage.open_session().step(ids, np.arange(len(ids)), last_only=True)
    np.testing.assert_allclose(chunked, whole, rtol=0, atol=1e-4)
    np.testing.assert_allclose(last, whole[-1:], rtol=0, atol=1e-4)
    middle = model.stage(1, 3).open_session()
    h = np.random.default_rng(0).standard_normal((len(ids), model.hidden_size))
    assert middle.step(h, np.arange(len(ids))).shape == (len(ids), model.hidden_size)


def test_last_only_returns_last_row(models: dict[str, Model]) -> None:
    model = models["qwen2"]
    ids = model.tokenizer.encode(PROMPT)
    stage = model.stage(0, model.num_layers)
    full = stage.open_session().step(np.array(ids), np.arange(len(ids)))
    last = stage.open_session().step(np.array(ids), np.arange(len(ids)), last_only=True)
    assert last.shape == (1, model.vocab_size)
    np.testing.assert_allclose(last[0], full[-1], rtol=0, atol=1e-5)


def test_session_misuse_is_a_clear_error(models: dict[str, Model]) -> None:
    model = models["llama"]
    first = model.stage(0, 2).open_session(8)
    middle = model.stage(2, 3).open_session(8)
    with pytest.raises(LocalError, match="positions must run 0..1"):
        first.step(np.array([3, 4]), np.array([1, 2]))
    with pytest.raises(LocalError, match="token ids"):
        first.step(np.zeros((2, model.hidden_size), np.float32), np.arange(2))
    with pytest.raises(LocalError, match="vocabulary"):
        first.step(np.array([model.vocab_size]), np.arange(1))
    with pytest.raises(LocalError, match="hidden states"):
        middle.step(np.array([1, 2]), np.arange(2))
    with pytest.raises(LocalError, match="session is full"):
        first.step(np.arange(9), np.arange(9))
    hidden = first.step(np.array([3, 4]), np.arange(2))
    assert hidden.shape == (2, model.hidden_size) and hidden.dtype == np.float32
    assert first.length == 2 and first.memory_bytes() > 0
    first.free()
    assert first.memory_bytes() == 0
    with pytest.raises(LocalError, match="freed"):
        first.step(np.array([5]), np.array([2]))
    with pytest.raises(LocalError, match="max_tokens"):
        model.stage(0, 1).open_session(model.context_length + 1)


def test_partial_load(model_dirs: dict[str, Path], models: dict[str, Model]) -> None:
    part = load_model(model_dirs["llama"], layers=(1, 3))
    assert part.layers == (1, 3) and part.num_layers == 4
    with pytest.raises(LocalError, match="not loaded"):
        part.stage(0, 2)
    with pytest.raises(LocalError, match="every layer"):
        next(part.generate_sync("hello"))
    whole = models["llama"]
    ids = whole.tokenizer.encode(PROMPT)
    pos = np.arange(len(ids))
    h = whole.stage(0, 1).open_session().step(np.array(ids), pos)
    a = part.stage(1, 2).open_session().step(h, pos)
    b = whole.stage(1, 2).open_session().step(h, pos)
    np.testing.assert_array_equal(a, b)
    with pytest.raises(LocalError, match="not inside"):
        load_model(model_dirs["llama"], layers=(2, 9))


def test_prebuilt_stage_files_run_in_bare_onnxruntime(model_dirs: dict[str, Path],
                                                      models: dict[str, Model]) -> None:
    model = models["llama"]
    stages = model.manifest.stages
    assert [(s.start, s.end) for s in stages] == [(0, 2), (2, 4)]
    bare = ort.InferenceSession(str(model_dirs["llama"] / stages[0].file),
                                providers=["CPUExecutionProvider"])
    ids = np.array(model.tokenizer.encode(PROMPT))
    feeds = {"input_ids": ids[None], "positions": np.arange(len(ids))[None]}
    for i in (0, 1):
        feeds[f"past_key.{i}"] = np.zeros((1, 2, len(ids), 16), np.float32)  # [B, kvh, C, d]
        feeds[f"past_value.{i}"] = np.zeros((1, 2, len(ids), 16), np.float32)
    hidden = bare.run(["hidden_out"], feeds)[0]
    ours = model.stage(0, 2).open_session().step(ids, np.arange(len(ids)))
    np.testing.assert_allclose(hidden[0], ours, rtol=0, atol=1e-5)


@pytest.mark.parametrize("kept", [(), ("meshd.kv_layout",)])
def test_a_graph_file_of_an_older_meshd_is_rebuilt(kept: tuple[str, ...],
                                                   model_dirs: dict[str, Path],
                                                   models: dict[str, Model], tmp_path: Path,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    """Stage files written before the KV layout was named (no ``meshd.kv_layout``) would read
    the cache the wrong way round, and those from before the graph version (the head's split
    activations) compute other logits than the fused graph: the loader must rebuild them from
    the weights instead."""
    import hashlib
    import json
    import shutil

    import onnx

    from meshd.engine import graph as g

    d = tmp_path / "m"
    shutil.copytree(model_dirs["llama"], d)
    man = json.loads((d / "manifest.json").read_text())
    entry = man["stages"][0]
    proto = onnx.load(str(d / entry["file"]), load_external_data=False)
    props = [(p.key, p.value) for p in proto.metadata_props if p.key in kept]
    del proto.metadata_props[:]
    onnx.helper.set_model_props(proto, dict(props))
    data = proto.SerializeToString()
    (d / entry["file"]).write_bytes(data)
    entry["sha256"] = hashlib.sha256(data).hexdigest()
    (d / "manifest.json").write_text(json.dumps(man))
    assert runtime._graph_props(data)[:2] == (g.KV_LAYOUT if kept else None, None)
    with caplog.at_level("WARNING", logger="meshd.engine.runtime"):
        old = load_model(d, layers=tuple(entry["layers"]))
    assert "stage graph rebuilt" in caplog.text
    ids = np.array(old.tokenizer.encode(PROMPT))
    start, end = entry["layers"]
    want = models["llama"].stage(start, end).open_session().step(ids, np.arange(len(ids)))
    got = old.stage(start, end).open_session().step(ids, np.arange(len(ids)))
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
    assert runtime._graph_props((model_dirs["llama"] / entry["file"]).read_bytes())[:2] == (
        g.KV_LAYOUT, g.GRAPH_VERSION)
