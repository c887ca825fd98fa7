"""Import of tiny random BERT checkpoints, and the encoder graph against the NumPy reference."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from meshd.cli.main import main
from meshd.embed import EmbedManifest, import_bert, load_embedder, read_embed_manifest
from meshd.embed.embedder import open_session
from meshd.embed.graph import EMBEDDING, unfuse_skip_layer_norm
from meshd.embed.quantize import INT8_SCHEME
from meshd.embed.reference import encode_reference
from meshd.errors import LocalError, ModelError

from .bert_fixtures import make_bert, read_weights

TEXTS = ["what is the weather today?", "the mesh", "", "how do i reset my password?",
         "He drove to the stadium. The node is sunny outside, 1 2 3 4 5 6 7 8 9 0!",
         "unknown wörds ☃ stay [UNK]", "a " * 40]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("bert")
    hf = make_bert(root / "hf")
    out = root / "tiny"
    import_bert(hf, out)
    return hf, out


def _reference(hf: Path, out: Path, texts: list[str], prefix: str = "") -> np.ndarray:
    emb = load_embedder(out)
    return encode_reference(read_weights(hf, prefix), emb.manifest.arch, emb.token_ids(texts))


def test_graph_matches_reference_with_padding(tiny: tuple[Path, Path]) -> None:
    hf, out = tiny
    emb = load_embedder(out, threads=1)
    got = emb.embed(TEXTS)
    want = _reference(hf, out, TEXTS)
    assert got.dtype == np.float32 and got.shape == (len(TEXTS), 32)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-6)
    assert float(np.max(1 - np.sum(got * want, axis=1))) < 1e-6
    np.testing.assert_allclose(got, want, atol=1e-5)
    # One at a time (no padding) gives the same rows as the padded batch.
    one = np.concatenate([emb.embed([t]) for t in TEXTS])
    np.testing.assert_allclose(one, got, atol=1e-5)
    # Batches smaller than the input, and the empty input.
    small = load_embedder(out, batch_size=2)
    np.testing.assert_allclose(small.embed(TEXTS), got, atol=1e-5)
    assert emb.embed([]).shape == (0, 32)


def test_truncation_to_max_seq_length(tiny: tuple[Path, Path]) -> None:
    _, out = tiny
    emb = load_embedder(out)
    ids = emb.token_ids(["the " * 100])[0]
    assert len(ids) == emb.max_tokens == 24
    assert ids[0] == 2 and ids[-1] == 3  # [CLS] ... [SEP] survive truncation
    np.testing.assert_allclose(emb.embed(["the " * 100]), emb.embed(["the " * 22]), atol=1e-6)


def test_manifest_and_identity(tiny: tuple[Path, Path]) -> None:
    _, out = tiny
    m = read_embed_manifest(out)
    assert m.name == "tiny" and m.arch.pooling == "mean" and m.arch.max_seq_length == 24
    assert m.source["dtypes"] == ["F32"]
    assert "embeddings.position_ids" not in {t.name for t in m.tensors}
    emb = load_embedder(out)
    assert emb.identity == f"tiny@{m.weights_sha256[:16]}"
    assert emb.statistics()["dim"] == 32


@pytest.mark.parametrize("variant", ["fp16", "bert-prefix", "cls"])
def test_variants_match_reference(tmp_path: Path, variant: str) -> None:
    prefix = "bert." if variant == "bert-prefix" else ""
    hf = make_bert(tmp_path / "hf", prefix=prefix, pooling="cls" if variant == "cls" else "mean",
                   arch="BertForMaskedLM" if prefix else "BertModel", seed=3)
    out = tmp_path / "m"
    import_bert(hf, out, dtype="fp16" if variant == "fp16" else "fp32")
    got = load_embedder(out).embed(TEXTS)
    weights = read_weights(hf, prefix)
    if variant == "fp16":
        weights = {k: v.astype(np.float16).astype(np.float32) if v.dtype == np.float32 else v
                   for k, v in weights.items()}
    want = encode_reference(weights, read_embed_manifest(out).arch,
                            load_embedder(out).token_ids(TEXTS))
    np.testing.assert_allclose(got, want, atol=1e-5)


def test_missing_tensor_and_bad_shape(tmp_path: Path) -> None:
    from safetensors.numpy import load_file, save_file

    hf = make_bert(tmp_path / "hf")
    tensors = load_file(str(hf / "model.safetensors"))
    del tensors["encoder.layer.1.output.dense.bias"]
    save_file(tensors, str(hf / "model.safetensors"))
    with pytest.raises(ModelError, match="encoder.layer.1.output.dense.bias"):
        import_bert(hf, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    cfg = json.loads((hf / "config.json").read_text())
    (hf / "config.json").write_text(json.dumps({**cfg, "intermediate_size": 65}))
    with pytest.raises(ModelError, match="shape"):
        import_bert(hf, tmp_path / "out")


def test_corrupt_files_are_refused(tiny: tuple[Path, Path], tmp_path: Path) -> None:
    import shutil

    _, out = tiny
    bad = tmp_path / "bad"
    shutil.copytree(out, bad)
    data = bytearray((bad / "weights.bin").read_bytes())
    data[100] ^= 0xFF
    (bad / "weights.bin").write_bytes(bytes(data))
    with pytest.raises(ModelError, match="hash mismatch"):
        load_embedder(bad)
    load_embedder(bad, verify=False)  # size still right: loads when asked not to hash
    (bad / "weights.bin").write_bytes(bytes(data[:-64]))
    with pytest.raises(ModelError, match="size"):
        load_embedder(bad, verify=False)
    with pytest.raises(ModelError, match="no manifest.json"):
        load_embedder(tmp_path)


def test_existing_output_needs_force(tiny: tuple[Path, Path]) -> None:
    hf, out = tiny
    with pytest.raises(LocalError, match="--force"):
        import_bert(hf, out)


def test_cli_model_import_dispatches_bert(tiny: tuple[Path, Path], tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    hf, _ = tiny
    assert main(["model", "import", str(hf), "--out", str(tmp_path / "m"), "--name", "t"]) == 0
    assert "bert encoder, 2 layers, dim 32, mean pooling" in capsys.readouterr().out
    assert main(["model", "inspect", str(tmp_path / "m")]) == 0
    assert "embedding model" in capsys.readouterr().out
    assert main(["model", "import", str(hf), "--out", str(tmp_path / "n"), "--stages", "2"]) == 1
    assert "--stages" in capsys.readouterr().err
    assert main(["embed", "--model", str(tmp_path / "m"), "--json", "the mesh"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert row["model"] == "t" and len(row["embedding"]) == 32
    assert main(["embed", "--model", str(tmp_path / "m"), "--int8", "--json", "the mesh"]) == 0
    q = json.loads(capsys.readouterr().out)["embedding"]
    assert q != row["embedding"] and float(np.dot(q, row["embedding"])) > 0.9
    assert main(["model", "import", str(hf), "--out", str(tmp_path / "f"), "--no-int8"]) == 0
    assert "int8" not in capsys.readouterr().out
    assert not (tmp_path / "f" / "encoder-int8.onnx").exists()


def test_embed_does_not_import_torch() -> None:
    import subprocess
    import sys

    code = ("import sys; import meshd.embed, meshd.cli.embed; from meshd.embed import package; "
            "package.packaged_zip(); print('torch' in sys.modules, 'all_minilm_l6_v2' in "
            "sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "False False"  # nor is the model package imported (its __init__ prints)


def test_int8_graph_written_at_import(tiny: tuple[Path, Path]) -> None:
    _, out = tiny
    m = read_embed_manifest(out)
    assert m.int8_file == "encoder-int8.onnx" and (out / m.int8_file).is_file()
    assert m.int8_scheme == INT8_SCHEME
    for graph in (m.graph_file, m.int8_file):  # residual LayerNorms in plain operators
        ops = {n.op_type for n in onnx.load(str(out / graph), load_external_data=False).graph.node}
        assert "LayerNormalization" in ops and "SkipLayerNormalization" not in ops
    # The unchanged float tensors (embedding tables, norms, biases) stay in weights.bin.
    assert (out / m.int8_file).stat().st_size < (out / m.weights_file).stat().st_size
    f32, q = load_embedder(out), load_embedder(out, precision="int8")
    assert q.identity == f32.identity + "+int8" and q.statistics()["precision"] == "int8"
    a, b = f32.embed(TEXTS), q.embed(TEXTS)
    np.testing.assert_allclose(np.linalg.norm(b, axis=1), 1.0, atol=1e-5)
    assert float(np.min(np.sum(a * b, axis=1))) > 0.9  # tiny random weights: a loose bound
    # A text's int8 vector does not depend on the rest of its batch (nor on padding).
    one = np.concatenate([q.embed([t]) for t in TEXTS])
    np.testing.assert_array_equal(one, b)


def test_int8_missing_or_corrupt(tiny: tuple[Path, Path], tmp_path: Path) -> None:
    import shutil

    from meshd.embed.quantize import ensure_int8

    _, out = tiny
    bad = tmp_path / "bad"
    shutil.copytree(out, bad)
    data = bytearray((bad / "encoder-int8.onnx").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (bad / "encoder-int8.onnx").write_bytes(bytes(data))
    with pytest.raises(ModelError, match="encoder-int8.onnx: hash mismatch"):
        load_embedder(bad, precision="int8")
    load_embedder(bad)  # the float graph is unaffected
    with pytest.raises(LocalError, match="precision"):
        load_embedder(out, precision="fp8")
    # A directory imported by an older meshd: no int8 section. Loading says how to fix it;
    # ensure_int8 (used for the default model's cache) adds it.
    old = tmp_path / "old"
    shutil.copytree(out, old)
    (old / "encoder-int8.onnx").unlink()
    doc = json.loads((old / "manifest.json").read_text())
    del doc["int8"]
    (old / "manifest.json").write_text(json.dumps(doc))
    with pytest.raises(ModelError, match="no int8 graph.*meshd model import"):
        load_embedder(old, precision="int8")
    assert ensure_int8(old).int8_file == "encoder-int8.onnx"
    np.testing.assert_array_equal(load_embedder(old, precision="int8").embed(TEXTS),
                                  load_embedder(out, precision="int8").embed(TEXTS))


def _ops(path: Path) -> list[str]:
    return [n.op_type for n in onnx.load(str(path), load_external_data=False).graph.node]


def test_sessions_keep_residual_norms_unfused(tiny: tuple[Path, Path], tmp_path: Path) -> None:
    # onnxruntime's CPU SkipLayerNormalization took about twice the time of Add + Add +
    # LayerNormalization (docs/benchmarks.md): the embedder's sessions must not fuse them back.
    # onnxruntime does so by default in the int8 graph (not in the float one).
    import shutil

    out = tmp_path / "m"  # the optimised graphs refer to weights.bin beside them
    shutil.copytree(tiny[1], out)
    ours = out / "ours.onnx"
    open_session(out / "encoder-int8.onnx", threads=1, optimized_model_path=ours)
    assert "SkipLayerNormalization" not in _ops(ours) and "LayerNormalization" in _ops(ours)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    fused = out / "fused.onnx"
    so.optimized_model_filepath = str(fused)
    ort.InferenceSession(str(out / "encoder-int8.onnx"), so, providers=["CPUExecutionProvider"])
    assert _ops(fused).count("SkipLayerNormalization") == 4  # 2 layers x 2
    # Such a graph (as an older meshd wrote) is rewritten with the same results.
    model = onnx.load(str(fused))
    assert unfuse_skip_layer_norm(model) == 4
    onnx.save(model, str(out / "unfused.onnx"))
    assert "SkipLayerNormalization" not in _ops(out / "unfused.onnx")
    emb = load_embedder(out, threads=1, precision="int8")
    ids = [emb.token_ids([t])[0] for t in TEXTS]
    want = np.concatenate([emb.embed_ids([i]) for i in ids])
    for graph in (fused, out / "unfused.onnx"):
        sess = ort.InferenceSession(str(graph), providers=["CPUExecutionProvider"])
        got = np.concatenate([sess.run([EMBEDDING], {
            "input_ids": np.array([i], np.int64),
            "attention_mask": np.ones((1, len(i)), np.int64)})[0] for i in ids])
        assert float(np.min(np.sum(got * want, axis=1))) > 0.9999


def test_ensure_int8_rewrites_an_older_scheme(tiny: tuple[Path, Path], tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil
    import threading

    from meshd.embed import quantize
    from meshd.embed.quantize import ensure_int8

    _, out = tiny
    old = tmp_path / "old"
    shutil.copytree(out, old)
    doc = json.loads((old / "manifest.json").read_text())
    doc["int8"]["scheme"] = "ort-dynamic-s8-per-channel"  # written before the unfused norms
    (old / "manifest.json").write_text(json.dumps(doc))
    mtime = (old / "encoder-int8.onnx").stat().st_mtime_ns
    # Daemons starting together on one cache: one of them rewrites it, the others wait.
    writes, real = [], quantize.with_int8
    monkeypatch.setattr(quantize, "with_int8", lambda d, m: writes.append(d) or real(d, m))
    got: list[EmbedManifest] = []
    threads = [threading.Thread(target=lambda: got.append(ensure_int8(old))) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(writes) == 1 and len(got) == 3
    assert {g.int8_scheme for g in got} == {INT8_SCHEME} == {read_embed_manifest(old).int8_scheme}
    assert (old / "encoder-int8.onnx").stat().st_mtime_ns != mtime
    assert "SkipLayerNormalization" not in _ops(old / "encoder-int8.onnx")
    np.testing.assert_array_equal(load_embedder(old, precision="int8").embed(TEXTS),
                                  load_embedder(out, precision="int8").embed(TEXTS))
    before = (old / "encoder-int8.onnx").stat().st_mtime_ns
    ensure_int8(old)  # current: left alone
    assert (old / "encoder-int8.onnx").stat().st_mtime_ns == before

