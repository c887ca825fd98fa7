"""Bad checkpoints and bad model directories get one clear line naming the file or field."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from meshd.engine import import_hf, load_model
from meshd.errors import LocalError, ModelError

from .hf_fixtures import make_checkpoint


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_checkpoint(tmp_path_factory.mktemp("pristine") / "hf", layers=1, shards=1)


@pytest.fixture
def hf(pristine: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(pristine, tmp_path / "hf"))


def edit_config(hf: Path, **changes: object) -> None:
    cfg = json.loads((hf / "config.json").read_text())
    cfg.update(changes)
    (hf / "config.json").write_text(json.dumps(cfg))


def edit_weights(hf: Path, fn: Callable[[dict[str, np.ndarray]], object]) -> None:
    weights = load_file(str(hf / "model.safetensors"))
    fn(weights)
    save_file(weights, str(hf / "model.safetensors"))


CASES: dict[str, tuple[Callable[[Path], object], str]] = {
    "architecture": (lambda h: edit_config(h, architectures=["GPT2LMHeadModel"]),
                     r"config.json: architectures='GPT2LMHeadModel' is not supported"),
    "activation": (lambda h: edit_config(h, hidden_act="gelu"), r"hidden_act='gelu'"),
    "rope-type": (lambda h: edit_config(h, rope_scaling={"rope_type": "yarn", "factor": 4.0}),
                  r"rope_scaling.rope_type='yarn' is not supported"),
    "sliding-window": (lambda h: edit_config(h, use_sliding_window=True), r"use_sliding_window"),
    "gqa-heads": (lambda h: edit_config(h, num_key_value_heads=3),
                  r"not a multiple of num_key_value_heads=3"),
    "missing-field": (lambda h: edit_config(h, num_hidden_layers=None),
                      r"num_hidden_layers=None must be a positive integer"),
    "no-config": (lambda h: (h / "config.json").unlink(), r"config.json is missing"),
    "no-weights": (lambda h: (h / "model.safetensors").unlink(), r"no weights"),
    "missing-tensor": (lambda h: edit_weights(h, lambda w: w.pop("model.norm.weight")),
                       r"tensor 'model.norm.weight' is missing"),
    "missing-lm-head": (lambda h: edit_weights(h, lambda w: w.pop("lm_head.weight")),
                        r"'lm_head.weight' is missing \(config.json has tie_word_embeddings"),
    "shape": (lambda h: edit_config(h, intermediate_size=40),
              r"model.safetensors: tensor 'model.layers.0.mlp.gate_proj.weight' has shape "
              r"\[48, 32\], config.json implies \[40, 32\]"),
    "truncated": (lambda h: (h / "model.safetensors").write_bytes(
        (h / "model.safetensors").read_bytes()[:-100]), r"model.safetensors: corrupt"),
    "garbage-header": (lambda h: (h / "model.safetensors").write_bytes(
        b"\x10\x00\x00\x00\x00\x00\x00\x00not json at all!" + b"\0" * 64),
        r"model.safetensors: corrupt safetensors file \(header is not JSON\)"),
    "tiny-file": (lambda h: (h / "model.safetensors").write_bytes(b"abc"), r"corrupt"),
    "no-tokenizer": (lambda h: (h / "tokenizer.json").unlink(), r"tokenizer.json is missing"),
    "bad-tokenizer": (lambda h: (h / "tokenizer.json").write_text("{}"),
                      r"tokenizer.json: cannot load"),
    "small-vocab": (lambda h: edit_config(h, vocab_size=100), r"tokenizer.json: \d+ tokens"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_import_errors(case: str, hf: Path, tmp_path: Path) -> None:
    breaker, pattern = CASES[case]
    breaker(hf)
    with pytest.raises(ModelError, match=pattern) as info:
        import_hf(hf, tmp_path / "out")
    assert "\n" not in str(info.value)
    assert not (tmp_path / "out").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["hf"]  # no half-written directory left


def test_missing_shard(tmp_path: Path) -> None:
    hf = make_checkpoint(tmp_path / "hf", layers=1, shards=2)
    (hf / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(ModelError, match=r"shard 'model-00002-of-00002.safetensors' is missing"):
        import_hf(hf, tmp_path / "out")


def test_fp16_overflow(hf: Path, tmp_path: Path) -> None:
    edit_weights(hf, lambda w: w["model.norm.weight"].__setitem__(0, 1e6))
    with pytest.raises(ModelError, match="overflows float16"):
        import_hf(hf, tmp_path / "out", dtype="fp16")


def test_output_directory_rules(hf: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(LocalError, match="already exists"):
        import_hf(hf, out)
    with pytest.raises(LocalError, match="not a meshd model"):
        import_hf(hf, out, force=True)
    assert (out / "keep.txt").read_text() == "mine"
    model = tmp_path / "model"
    import_hf(hf, model)
    import_hf(hf, model, force=True, name="again")
    assert json.loads((model / "manifest.json").read_text())["name"] == "again"
    with pytest.raises(LocalError, match="dtype"):
        import_hf(hf, tmp_path / "x", dtype="int3")
    with pytest.raises(LocalError, match="cannot cut 1 layers into 2 stages"):
        import_hf(hf, tmp_path / "x", stages=2)


@pytest.fixture
def model_dir(hf: Path, tmp_path: Path) -> Path:
    import_hf(hf, tmp_path / "model")
    return tmp_path / "model"


def flip_byte(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


def test_hash_mismatch_at_load(model_dir: Path) -> None:
    manifest = json.loads((model_dir / "manifest.json").read_text())
    tensor = manifest["weights"]["tensors"][3]
    flip_byte(model_dir / "weights.bin", tensor["offset"] + 5)
    with pytest.raises(ModelError, match=f"weights.bin: hash mismatch in tensor "
                                         f"'{tensor['name']}'"):
        load_model(model_dir)


LOAD_CASES: dict[str, tuple[Callable[[Path], object], str]] = {
    "truncated-weights": (lambda d: (d / "weights.bin").write_bytes(
        (d / "weights.bin").read_bytes()[:-10]), r"weights.bin: size \d+ bytes, manifest says"),
    "no-weights": (lambda d: (d / "weights.bin").unlink(), r"weights file is missing"),
    "tokenizer-swapped": (lambda d: (d / "tokenizer.json").write_text(
        (d / "tokenizer.json").read_text() + " "), r"tokenizer.json: hash mismatch"),
    "stage-graph-corrupt": (lambda d: flip_byte(d / "layers-0-1.onnx", 10),
                            r"layers-0-1.onnx: hash mismatch"),
    "no-manifest": (lambda d: (d / "manifest.json").unlink(), r"no manifest.json"),
    "manifest-not-json": (lambda d: (d / "manifest.json").write_text("{"), r"not valid JSON"),
    "manifest-version": (lambda d: _edit_manifest(d, format_version=99),
                         r"format_version=99 is not supported"),
    "manifest-field": (lambda d: _edit_manifest(d, weights={}), r"malformed manifest"),
    "manifest-path": (lambda d: _edit_manifest(d, stages=[
        {"layers": [0, 1], "file": "../x.onnx", "sha256": "0"}]), r"must be a plain name"),
}


def _edit_manifest(d: Path, **changes: object) -> None:
    data = json.loads((d / "manifest.json").read_text())
    data.update(changes)
    (d / "manifest.json").write_text(json.dumps(data))


@pytest.mark.parametrize("case", sorted(LOAD_CASES))
def test_load_errors(case: str, model_dir: Path) -> None:
    breaker, pattern = LOAD_CASES[case]
    breaker(model_dir)
    with pytest.raises(ModelError, match=pattern) as info:
        load_model(model_dir)
    assert "\n" not in str(info.value)


def test_unknown_provider(model_dir: Path) -> None:
    with pytest.raises(LocalError, match="execution provider NoSuchExecutionProvider"):
        load_model(model_dir, providers=["NoSuchExecutionProvider"])


def test_stage_graph_from_another_layout_is_refused(model_dir: Path) -> None:
    import hashlib

    import onnx

    graph_file = model_dir / "layers-0-1.onnx"
    proto = onnx.load(str(graph_file), load_external_data=False)
    outputs = list(proto.graph.output)
    outputs[1], outputs[2] = outputs[2], outputs[1]  # another builder's output order
    del proto.graph.output[:]
    proto.graph.output.extend(outputs)
    data = proto.SerializeToString()
    graph_file.write_bytes(data)
    manifest = json.loads((model_dir / "manifest.json").read_text())
    manifest["stages"][0]["sha256"] = hashlib.sha256(data).hexdigest()
    (model_dir / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ModelError, match="re-import the model"):
        load_model(model_dir)


@pytest.mark.parametrize(
    ("available", "requested", "chosen"),
    [
        (["CPUExecutionProvider"], None, ["CPUExecutionProvider"]),
        # onnxruntime-gpu on a GPU server or a Jetson: CUDA first, CPU behind it for the rest
        (["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"], None,
         ["CUDAExecutionProvider", "CPUExecutionProvider"]),
        # TensorRT only when named (the cache shape changes every step)
        (["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"],
         ["TensorrtExecutionProvider"], ["TensorrtExecutionProvider", "CPUExecutionProvider"]),
    ],
)
def test_providers_are_chosen_automatically(monkeypatch: pytest.MonkeyPatch, available: list[str],
                                            requested: list[str] | None, chosen: list[str]) -> None:
    from meshd.modeldir import providers

    monkeypatch.setattr(providers.ort, "get_available_providers", lambda: available)
    assert providers.choose_providers(requested) == chosen
