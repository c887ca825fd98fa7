"""Imported models against the independent NumPy reference (tests/engine/reference.py)."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from meshd.engine import Model, import_hf, load_model

from .hf_fixtures import make_checkpoint
from .reference import Reference

PROMPT = "Once upon a time the mesh said hello to the world."
ATOL = 1e-4


def full_logits(model: Model, ids: list[int]) -> np.ndarray:
    session = model.stage(0, model.num_layers).open_session(len(ids))
    return session.step(np.array(ids), np.arange(len(ids)))


def test_logits_match_reference(arch_name: str, hf_dirs: dict[str, Path],
                                models: dict[str, Model]) -> None:
    model = models[arch_name]
    ids = model.tokenizer.encode(PROMPT)
    assert len(ids) > 10
    expected = Reference(hf_dirs[arch_name]).logits(ids)
    got = full_logits(model, ids)
    assert got.shape == (len(ids), model.vocab_size)
    np.testing.assert_allclose(got, expected, rtol=0, atol=ATOL)
    assert np.abs(expected).max() > 1.0  # the comparison is not between near-zero numbers


VARIANTS: dict[str, tuple[dict[str, Any], dict[str, Any], bool]] = {
    # name: (checkpoint options, import options, compare with fp16-rounded reference weights)
    "sharded": ({"shards": 3, "layers": 2}, {}, False),
    "fp16-checkpoint": ({"dtype": np.float16, "layers": 2, "tie": True}, {"dtype": "fp16"},
                        False),
    "fp32-to-fp16": ({"layers": 2}, {"dtype": "fp16"}, True),
    "llama-attention-bias-linear-rope": (
        {"attention_bias": True, "layers": 2, "kv_heads": 1,
         "rope_scaling": {"type": "linear", "factor": 2.0}}, {}, False),
    "head-dim-override-mha": ({"layers": 2, "heads": 2, "kv_heads": 2, "head_dim": 32}, {},
                              False),
    "qwen2-untied": ({"arch": "qwen2", "layers": 2, "kv_heads": 1}, {}, False),
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_variants_match_reference(variant: str, tmp_path: Path) -> None:
    ckpt_opts, import_opts, rounded = VARIANTS[variant]
    hf = make_checkpoint(tmp_path / "hf", seed=7, **ckpt_opts)
    manifest = import_hf(hf, tmp_path / "out", **import_opts)
    assert manifest.dtype == import_opts.get("dtype", "fp32")
    model = load_model(tmp_path / "out")
    ids = model.tokenizer.encode(PROMPT)
    expected = Reference(hf, round_fp16=rounded).logits(ids)
    np.testing.assert_allclose(full_logits(model, ids), expected, rtol=0, atol=ATOL)


def _to_bf16_file(src: Path, dst: Path) -> None:
    """Rewrite a float32 safetensors file as bfloat16 (by hand: numpy has no bfloat16)."""
    raw = src.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    body, out_header, offset = [], {}, 0
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        a, b = meta["data_offsets"]
        bits = np.frombuffer(raw[8 + n + a:8 + n + b], np.uint32)
        data = (bits >> 16).astype("<u2").tobytes()
        out_header[name] = {"dtype": "BF16", "shape": meta["shape"],
                            "data_offsets": [offset, offset + len(data)]}
        body.append(data)
        offset += len(data)
    h = json.dumps(out_header).encode()
    dst.write_bytes(struct.pack("<Q", len(h)) + h + b"".join(body))


def test_bf16_checkpoint_reads_like_its_fp32_twin(tmp_path: Path) -> None:
    hf = make_checkpoint(tmp_path / "hf", layers=1)
    # Truncate the fp32 weights to bf16 precision so both checkpoints hold the same values.
    from safetensors.numpy import load_file, save_file

    weights = load_file(str(hf / "model.safetensors"))
    truncated = {k: (v.view(np.uint32) & 0xFFFF0000).view(np.float32) for k, v in weights.items()}
    save_file(truncated, str(hf / "model.safetensors"))
    bf = tmp_path / "bf"
    bf.mkdir()
    for f in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        (bf / f).write_bytes((hf / f).read_bytes())
    _to_bf16_file(hf / "model.safetensors", bf / "model.safetensors")
    a = import_hf(hf, tmp_path / "a")
    b = import_hf(bf, tmp_path / "b")
    assert a.weights_sha256 == b.weights_sha256
    assert b.source["dtypes"] == ["BF16"]


def dequantized_weights(directory: Path) -> dict[str, np.ndarray]:
    """Every weight of a meshd model directory as float64, 4/8-bit blocks dequantized by
    meshd.engine.quant (the reference then runs on exactly the values the model holds)."""
    from meshd.engine.manifest import read_manifest
    from meshd.engine.quant import Blockwise

    manifest = read_manifest(directory)
    raw = (directory / manifest.weights_file).read_bytes()
    np_types = {"fp32": "<f4", "fp16": "<f2", "q4": "u1", "q8": "u1", "u8": "u1"}

    def array(name: str) -> np.ndarray:
        t = manifest.tensor(name)
        return np.frombuffer(raw, np_types[t.dtype], t.nbytes // np.dtype(np_types[t.dtype]).itemsize,
                             t.offset).reshape(t.shape)

    out = {}
    for t in manifest.tensors:
        if t.dtype in ("q4", "q8"):
            bits = 4 if t.dtype == "q4" else 8
            mins = t.name + ".mins"
            b = Blockwise(bits, t.shape[2] * 8 // bits, array(t.name), array(t.name + ".scales"),
                          array(t.name + ".zero_points"),
                          array(mins) if any(x.name == mins for x in manifest.tensors) else None)
            out[t.name] = b.dequantize().astype(np.float64)
        elif t.dtype in ("fp32", "fp16") and not t.name.endswith((".scales", ".mins")):
            out[t.name] = array(t.name).astype(np.float64)
    return out


@pytest.mark.parametrize("dtype", ["int4", "int8"])
@pytest.mark.parametrize("tie", [False, True])
def test_quantized_import_matches_reference_on_its_blocks(dtype: str, tie: bool, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The blocks are read exactly: with MatMulNBits computing in float (accuracy_level 0) the
    model equals the reference on its own dequantized weights to float32 rounding (ATOL). The
    default level 4 also rounds the activations to int8 per block, as llama.cpp's quantized dot
    products do; its effect is measured as perplexity (docs/benchmarks.md)."""
    from meshd.engine import graph

    monkeypatch.setattr(graph, "ACCURACY_LEVEL", 0)
    hf = make_checkpoint(tmp_path / "hf", seed=7, layers=2, hidden=64, intermediate=128,
                         heads=4, kv_heads=2, tie=tie)
    manifest = import_hf(hf, tmp_path / "out", dtype=dtype)
    assert manifest.dtype == dtype
    kinds = {t.dtype for t in manifest.tensors}
    assert {"q8", "u8", "fp32"} <= kinds and (("q4" in kinds) == (dtype == "int4"))
    model = load_model(tmp_path / "out")
    ids = model.tokenizer.encode(PROMPT)
    ref = Reference(hf)
    float_logits = ref.logits(ids)
    ref.w = dequantized_weights(tmp_path / "out")
    expected = ref.logits(ids)
    got = full_logits(model, ids)
    np.testing.assert_allclose(got, expected, rtol=0, atol=ATOL)
    # the quantization is real: the float model's logits are far from these
    assert np.abs(float_logits - expected).max() > 0.1
