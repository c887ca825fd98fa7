"""The real all-MiniLM-L6-v2 from the meshd[edge] extra (installed by the test extra), imported
on first use into a temporary cache directory, against the NumPy reference and against the
similarities sentence-transformers publishes for it."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
from threadpoolctl import threadpool_limits

from meshd.embed import Embedder, default_embedding_model, load_embedder
from meshd.embed.reference import encode_reference

from .sentences import SENTENCES

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return default_embedding_model(cache_dir=tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="module")
def minilm(model_dir: Path) -> Embedder:
    return load_embedder(model_dir)


def test_matches_numpy_reference_on_50_sentences(minilm: Embedder, tmp_path: Path) -> None:
    # The reference reads the checkpoint as shipped, not the weights file our importer wrote.
    from safetensors.numpy import load_file

    from meshd.embed.package import packaged_zip

    with zipfile.ZipFile(packaged_zip()[0]) as zf:
        zf.extract("model.safetensors", tmp_path)
    weights = load_file(str(tmp_path / "model.safetensors"))
    ids = minilm.token_ids(SENTENCES)
    assert max(len(i) for i in ids) == 256  # the long one is truncated
    got = minilm.embed(SENTENCES)
    with threadpool_limits(1):  # OpenBLAS threads on a busy 2-core box: 30x slower
        want = encode_reference(weights, minilm.manifest.arch, ids)
    cos_err = 1 - np.sum(got * want, axis=1)
    assert float(np.max(np.abs(cos_err))) < 1e-4
    assert float(np.max(np.abs(got - want))) < 1e-4


def test_published_sentence_transformers_similarities(minilm: Embedder) -> None:
    # sentence-transformers' README quickstart prints this matrix for all-MiniLM-L6-v2.
    v = minilm.embed(["The weather is lovely today.", "It's so sunny outside!",
                      "He drove to the stadium."])
    want = np.array([[1.0, 0.6660, 0.1046], [0.6660, 1.0, 0.1411], [0.1046, 0.1411, 1.0]])
    np.testing.assert_allclose(v @ v.T, want, atol=6e-5)


def test_interface(minilm: Embedder) -> None:
    assert minilm.dim == 384 and minilm.max_tokens == 256
    assert minilm.identity.startswith("all-minilm-l6-v2@")
    v = minilm.embed(["a", "b"])
    assert v.dtype == np.float32 and v.shape == (2, 384)
    np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)


def test_second_use_reads_the_cache(model_dir: Path) -> None:
    mtime = (model_dir / "weights.bin").stat().st_mtime_ns
    assert default_embedding_model(cache_dir=model_dir.parents[1]) == model_dir
    assert (model_dir / "weights.bin").stat().st_mtime_ns == mtime


def test_cli_embed_json_without_daemon(model_dir: Path) -> None:
    env = {"MESHD_CACHE_DIR": str(model_dir.parents[1]), "PATH": "/usr/bin:/bin",
           "PYTHONPATH": str(ROOT), "MESHD_SOCKET": "/nonexistent.sock"}
    r = subprocess.run([sys.executable, "-m", "meshd", "embed", "--json", "How do I reset my "
                        "password?"], capture_output=True, text=True, env=env, timeout=120,
                       check=False)
    assert r.returncode == 0, r.stderr
    row = json.loads(r.stdout)
    assert row["model"] == "all-minilm-l6-v2" and len(row["embedding"]) == 384
    assert abs(float(np.linalg.norm(row["embedding"])) - 1) < 1e-5


def test_missing_extra_is_one_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from meshd.embed import package
    from meshd.errors import ModelError

    monkeypatch.setattr(package, "PACKAGE", "no-such-package-for-meshd")
    with pytest.raises(ModelError, match=r"pip install 'meshd\[edge\]'"):
        load_embedder()


def test_int8_within_cosine_bound_of_float(minilm: Embedder, model_dir: Path) -> None:
    # The int8 graph (docs/embeddings.md "int8"): measured min 0.9695, mean 0.9906 on these.
    q = load_embedder(model_dir, precision="int8")
    a, b = minilm.embed(SENTENCES), q.embed(SENTENCES)
    cos = np.sum(a * b, axis=1)
    assert float(cos.min()) > 0.95 and float(cos.mean()) > 0.985
    # Pair similarities move much less than the vectors do (what the cache compares).
    v = q.embed(["The weather is lovely today.", "It's so sunny outside!",
                 "He drove to the stadium."])
    want = np.array([[1.0, 0.6660, 0.1046], [0.6660, 1.0, 0.1411], [0.1046, 0.1411, 1.0]])
    np.testing.assert_allclose(v @ v.T, want, atol=0.03)
    assert q.identity == minilm.identity + "+int8"


@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_auto_spin_takes_the_twin_session_only_on_a_free_core(
        model_dir: Path, precision: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # spin="auto" (the default) holds a spinning twin of the session and takes it when the
    # kernel counts no other runnable task; both give the same vectors, bit for bit.
    from meshd.embed import embedder as mod

    plain = load_embedder(model_dir, threads=2, precision=precision, spin=False)
    auto = load_embedder(model_dir, threads=2, precision=precision)
    assert plain.statistics()["spin"] == "off" and auto.statistics()["spin"] == "auto"
    texts = SENTENCES[:4]

    def each(e: Embedder) -> np.ndarray:  # one run per text, as the cache calls it
        return np.concatenate([e.embed([t]) for t in texts])

    # the warm-up run at load may have spun too (it reads the real /proc/loadavg): count from here
    before = auto.statistics()["spin_runs"]
    monkeypatch.setattr(mod, "_runnable", lambda: 1)  # only the caller: spin
    spun = each(auto)
    assert auto.statistics()["spin_runs"] == before + len(texts)
    monkeypatch.setattr(mod, "_runnable", lambda: 3)  # two others runnable: sleep
    slept = each(auto)
    assert auto.statistics()["spin_runs"] == before + len(texts)
    assert np.array_equal(spun, slept) and np.array_equal(spun, each(plain))
    assert load_embedder(model_dir, threads=1, precision=precision).statistics()["spin"] == "off"
    assert mod._runnable() is not None  # this box has /proc/loadavg: the twin is real here
