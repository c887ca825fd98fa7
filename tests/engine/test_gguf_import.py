"""GGUF import: small GGUF files written by the tests (random weights, each tensor type) import
and match a NumPy reference that runs the GGUF as llama.cpp does; refusals name what is wrong
and leave nothing behind."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from meshd.engine import load_model
from meshd.errors import LocalError, ModelError

from .gguf_fixtures import GgufReference, write_gguf

pytest.importorskip("gguf")
from meshd.engine.gguf_import import import_gguf  # noqa: E402

IDS = [5, 77, 140, 9, 201, 33, 64, 250, 3, 18, 120, 45]
# float32 graph against the float64 reference on the same values
ATOL = 2e-4

# each GGML type in a role of a model; blocks of 256 (k-quants) need rows of 256
CASES = {
    "llama-f32": ("llama", {}),
    "llama-f16-q8_0": ("llama", {"attn": "F16", "ffn": "Q8_0", "embed": "Q8_0"}),
    "llama-q4_0-q4_1": ("llama", {"attn": "Q4_0", "ffn": "Q4_1", "embed": "Q8_0"}),
    "llama-q5_0-q5_1-bf16": ("llama", {"attn": "Q5_0", "ffn": "Q5_1", "embed": "BF16"}),
    "llama-q4_k-q6_k-untied": ("llama", {"attn": "Q4_K", "ffn": "Q6_K", "embed": "Q4_K",
                                         "output": "Q6_K"}),
    "gemma3-q5_k-q8_0": ("gemma3", {"attn": "Q5_K", "ffn": "Q8_0", "embed": "Q8_0"}),
    "qwen2-q8_0-q4_1-biases": ("qwen2", {"attn": "Q8_0", "ffn": "Q4_1", "embed": "F16"}),
}


@pytest.fixture(autouse=True)
def _float_dot_products(monkeypatch: pytest.MonkeyPatch) -> None:
    """MatMulNBits computes in float here (accuracy_level 0), so the comparison is exact to
    float32 rounding; the default level 4 rounds activations to int8 per block as llama.cpp
    does, measured as perplexity in docs/benchmarks.md."""
    from meshd.engine import graph

    monkeypatch.setattr(graph, "ACCURACY_LEVEL", 0)


@pytest.mark.parametrize("case", sorted(CASES))
def test_gguf_import_matches_llama_cpp_semantics(case: str, tmp_path: Path) -> None:
    family, types = CASES[case]
    layers = 7 if family == "gemma3" else 2  # gemma3: six local layers then a global one
    gguf_path = write_gguf(tmp_path / "m.gguf", family=family, types=types, layers=layers,
                           hidden=256, intermediate=512, heads=4, kv_heads=2,
                           tie="output" not in types, window=4)
    manifest = import_gguf(gguf_path, tmp_path / "out")
    assert manifest.arch.arch == family
    model = load_model(tmp_path / "out")
    session = model.stage(0, model.num_layers).open_session(len(IDS))
    got = session.step(np.array(IDS), np.arange(len(IDS)))
    want = GgufReference(gguf_path).logits(IDS)
    assert np.abs(want).max() > 0.5
    np.testing.assert_allclose(got, want, rtol=0, atol=ATOL)


def test_gguf_decode_step_by_step_equals_whole_prompt(tmp_path: Path) -> None:
    """The cache path (one token at a time, sliding window crossing) equals one whole pass."""
    gguf_path = write_gguf(tmp_path / "m.gguf", family="gemma3", layers=6, window=3,
                           types={"attn": "Q4_0", "ffn": "Q4_1", "embed": "Q8_0"})
    import_gguf(gguf_path, tmp_path / "out")
    model = load_model(tmp_path / "out")
    whole = model.stage(0, model.num_layers).open_session(len(IDS)).step(
        np.array(IDS), np.arange(len(IDS)))
    session = model.stage(0, model.num_layers).open_session(len(IDS))
    rows = [session.step(np.array([i]), np.array([p]))[-1] for p, i in enumerate(IDS)]
    np.testing.assert_allclose(np.stack(rows), whole, rtol=0, atol=2e-4)


def test_requantized_import_is_close_and_named(tmp_path: Path) -> None:
    gguf_path = write_gguf(tmp_path / "m.gguf", types={"attn": "F16", "ffn": "F16"})
    m = import_gguf(gguf_path, tmp_path / "q", dtype="int4")
    assert m.dtype == "int4"
    assert {t.dtype for t in m.tensors} >= {"q4", "q8"}
    f = import_gguf(gguf_path, tmp_path / "f")
    assert f.dtype == "fp16"


def test_unknown_architecture_is_refused_in_one_line_and_nothing_is_left(tmp_path: Path) -> None:
    gguf_path = write_gguf(tmp_path / "m.gguf")
    raw = gguf_path.read_bytes().replace(b"llama", b"mamba", 1)
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(raw)
    with pytest.raises(ModelError, match=r"general.architecture='mamba' is not supported"):
        import_gguf(bad, tmp_path / "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.gguf", "m.gguf"]


def test_not_a_gguf_file_and_bad_dtype(tmp_path: Path) -> None:
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf at all" * 10)
    with pytest.raises(ModelError, match="junk.gguf: not a readable GGUF file"):
        import_gguf(junk, tmp_path / "out")
    with pytest.raises(LocalError, match="dtype='int3' is not supported"):
        import_gguf(junk, tmp_path / "out", dtype="int3")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_a_three_stage_pipeline_of_a_4bit_model_equals_the_whole(family: str, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch
                                                                 ) -> None:
    """Stages of a quantized model pass float32 hidden states: cut in three, the greedy tokens
    and logits equal the single stage's, at the default accuracy level too."""
    from meshd.engine import graph

    from .test_stages import chain_greedy

    monkeypatch.setattr(graph, "ACCURACY_LEVEL", 4)
    gguf_path = write_gguf(tmp_path / "m.gguf", family=family, layers=6,
                           types={"attn": "Q4_0", "ffn": "Q4_1", "embed": "Q8_0"})
    import_gguf(gguf_path, tmp_path / "out", stages=3)
    model = load_model(tmp_path / "out")
    whole_logits, whole_tokens = chain_greedy(model, [(0, 6)], IDS, 8)
    logits, tokens = chain_greedy(model, [(0, 2), (2, 4), (4, 6)], IDS, 8)
    np.testing.assert_allclose(logits, whole_logits, rtol=0, atol=1e-4)
    assert tokens == whole_tokens
