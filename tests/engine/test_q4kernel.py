"""meshd's 4-bit kernel (meshd/engine/kernels/matmul_q4.c, built by meshd.engine.q4kernel):
the operator against a NumPy reference that rounds the activations the same way, its errors,
how it is built and what happens without it, and a GGUF model's graph that uses it."""

from __future__ import annotations

import collections
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from meshd.engine import graph, load_model, q4kernel
from meshd.engine.gguf_import import import_gguf
from meshd.engine.runtime import Model

from .gguf_fixtures import GgufReference, write_gguf

IDS = [5, 77, 140, 9, 201, 33, 64, 250, 3, 18, 120, 45]


def _library() -> Path:
    st = q4kernel.status()
    if st.library is None:
        pytest.skip(f"meshd's 4-bit kernel is not built here: {st.reason}")
    return st.library


def _blocks(rng: np.random.Generator, n: int, k: int) -> tuple[np.ndarray, ...]:
    """Codes [N, K/32, 32] in value order, their packed bytes (the even one low), float16
    scales and minimums [N, K/32]."""
    codes = rng.integers(0, 16, (n, k // 32, 32), dtype=np.uint8)
    packed = (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)
    scales = (rng.random((n, k // 32)) * 0.02 + 1e-3).astype(np.float16)
    mins = (-rng.random((n, k // 32)) * 0.1).astype(np.float16)
    return codes, packed, scales, mins


def reference(x: np.ndarray, codes: np.ndarray, scales: np.ndarray,
              mins: np.ndarray) -> np.ndarray:
    """x's rows rounded to int8 per block of 32 (step = the block's largest magnitude / 127,
    float32, ties to even) against ``scale * code + min``; the minimums' term over the rounded
    codes' sums, as llama.cpp's Q8_1 activations do. Float64 sums."""
    k = x.shape[-1]
    xb = x.reshape(-1, k // 32, 32).astype(np.float32)
    step = (np.abs(xb).max(-1) / np.float32(127)).astype(np.float32)
    inv = np.where(step > 0, np.float32(1) / np.where(step > 0, step, 1), 0).astype(np.float32)
    q = np.rint(xb * inv[..., None]).astype(np.float64)
    dots = np.einsum("mbi,nbi->mnb", q, codes.astype(np.float64))
    s, m = scales.astype(np.float64), mins.astype(np.float64)
    y = (dots * s[None] * step[:, None, :]).sum(-1)
    y += ((step * q.sum(-1))[:, None, :] * m[None]).sum(-1)
    return y.reshape(*x.shape[:-1], codes.shape[0])


def _session(n: int, k: int, packed: np.ndarray, scales: np.ndarray, mins: np.ndarray,
             threads: int = 2) -> ort.InferenceSession:
    node = helper.make_node(q4kernel.OP, ["x", "q", "s", "m"], ["y"], domain=q4kernel.DOMAIN,
                            K=k, N=n)
    g = helper.make_graph([node], "q4", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                       None)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(packed, "q"),
                           numpy_helper.from_array(scales, "s"),
                           numpy_helper.from_array(mins, "m")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                                helper.make_opsetid(q4kernel.DOMAIN, 1)])
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.register_custom_ops_library(str(_library()))
    return ort.InferenceSession(model.SerializeToString(), so,
                                providers=["CPUExecutionProvider"])


# (N, K, X's leading shape): one row (a decode step), the tails of every tiling (rows of 8,
# tasks of 16 columns, minimums 8 blocks at a time), a 3-D X
@pytest.mark.parametrize("n,k,lead", [(960, 576, (1,)), (37, 64, (5,)), (100, 1536, (9,)),
                                      (33, 32, (2,)), (17, 320, (2, 3)), (576, 576, (16,))])
def test_the_operator_equals_the_reference(n: int, k: int, lead: tuple[int, ...]) -> None:
    rng = np.random.default_rng(n * k)
    codes, packed, scales, mins = _blocks(rng, n, k)
    x = rng.standard_normal((*lead, k)).astype(np.float32)
    x[..., :32] = 0.0  # a block of zeros: step 0, no division by it
    got = _session(n, k, packed, scales, mins).run(None, {"x": x})[0]
    want = reference(x, codes, scales, mins)
    assert got.shape == (*lead, n)
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-6 * np.abs(want).max())


def test_one_row_equals_the_same_row_among_others_and_any_thread_count() -> None:
    """A decode step's row and a prompt's rows run different tilings: each output is the same
    sum in the same order either way, so a token decoded alone equals it decoded in a batch."""
    rng = np.random.default_rng(7)
    codes, packed, scales, mins = _blocks(rng, 200, 576)
    x = rng.standard_normal((6, 576)).astype(np.float32)
    many = _session(200, 576, packed, scales, mins).run(None, {"x": x})[0]
    one = _session(200, 576, packed, scales, mins, threads=1)
    for r in range(6):
        np.testing.assert_array_equal(one.run(None, {"x": x[r:r + 1]})[0][0], many[r])


def test_a_wrong_width_is_an_error_not_a_crash() -> None:
    rng = np.random.default_rng(3)
    _, packed, scales, mins = _blocks(rng, 8, 64)
    s = _session(8, 64, packed, scales, mins)
    with pytest.raises(Exception, match="MatMulQ4: X's last dimension is not K"):
        s.run(None, {"x": np.zeros((1, 96), np.float32)})
    assert s.run(None, {"x": np.ones((1, 64), np.float32)})[0].shape == (1, 8)


@pytest.fixture()
def fresh(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """q4kernel with its cache folder in tmp_path and its once-a-process answers forgotten."""
    monkeypatch.setenv("MESHD_CACHE_DIR", str(tmp_path / "cache"))
    q4kernel.status.cache_clear()
    q4kernel.library.cache_clear()
    yield tmp_path / "cache" / "kernels"
    q4kernel.status.cache_clear()
    q4kernel.library.cache_clear()


def test_built_once_into_the_cache_folder(fresh: Path) -> None:
    _library()
    st = q4kernel.status()
    assert st.library is not None and st.library.parent == fresh
    assert st.reason in ("avx512vnni", "avxvnni", "avx2", "c")
    built = st.library.stat().st_mtime_ns
    q4kernel.status.cache_clear()
    assert q4kernel.status().library == st.library
    assert st.library.stat().st_mtime_ns == built  # found, not built again
    assert [p.name for p in fresh.iterdir()] == [st.library.name]


def test_without_a_header_compiler_or_with_it_switched_off_it_says_why(
        fresh: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(q4kernel, "header_dirs", lambda: [tmp_path / "none"])
    st = q4kernel.status()
    assert st.library is None
    assert "no onnxruntime C API header" in st.reason and "scripts/ort_header.sh" in st.reason
    monkeypatch.undo()
    monkeypatch.setenv("MESHD_CACHE_DIR", str(fresh.parent))
    q4kernel.status.cache_clear()
    if q4kernel._find_header() is None:
        pytest.skip("no onnxruntime C API header here (scripts/ort_header.sh)")
    monkeypatch.setenv("CC", "false")  # a compiler that fails
    q4kernel.status.cache_clear()
    st = q4kernel.status()
    assert st.library is None and st.reason.startswith("the build failed")
    assert not fresh.exists() or list(fresh.iterdir()) == []  # nothing half written
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    q4kernel.status.cache_clear()
    assert q4kernel.status().reason.startswith("no C compiler")
    monkeypatch.delenv("CC")
    monkeypatch.setenv("MESHD_Q4_KERNEL", "0")
    q4kernel.status.cache_clear()
    assert q4kernel.status() == q4kernel.KernelStatus(None, "MESHD_Q4_KERNEL=0")


def _op_types(model: Model) -> list[str]:
    """The operators of the whole-model graph ``model`` builds."""
    m = model.manifest
    built = graph.build_stage_graph(m.arch, {t.name: t for t in m.tensors}, 0, m.arch.num_layers,
                                    q4_kernel=model._q4_kernel is not None)
    return [n.op_type for n in built.graph.node]


def test_a_q4_1_model_runs_on_the_kernel_and_matches_the_reference(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A GGUF model whose feed-forward is Q4_1 and attention Q4_K (both with minimums) runs its
    4-bit products as MatMulQ4 (no second product of the minimums), as close to the float
    reference as MatMulNBits' int8 activations are; decoded a token at a time it equals the
    whole prompt's pass (the one-row and many-row tilings give the same sums)."""
    _library()
    gguf = write_gguf(tmp_path / "m.gguf", family="llama", layers=2, hidden=256,
                      intermediate=512, heads=4, kv_heads=2,
                      types={"attn": "Q4_K", "ffn": "Q4_1", "embed": "Q8_0"})
    import_gguf(gguf, tmp_path / "out")
    want = GgufReference(gguf).logits(IDS)

    def logits() -> tuple[np.ndarray, list[str]]:
        model = load_model(tmp_path / "out")
        stage = model.stage(0, model.num_layers)
        return stage.open_session(len(IDS)).step(np.array(IDS), np.arange(len(IDS))), \
            _op_types(model)

    got, ops = logits()
    # a layer: q, k and v joined, o, gate and up joined, down
    assert ops.count(q4kernel.OP) == 2 * 4 and "MatMulNBits" in ops  # the 8-bit head stays
    # no minimums' product (a Gemm over block sums); the one ReduceSum adds the split head's
    # halves (graph.QuantGraphBuilder.matmul)
    assert "Gemm" not in ops and ops.count("ReduceSum") == 1, collections.Counter(ops)
    monkeypatch.setenv("MESHD_Q4_KERNEL", "0")
    q4kernel.status.cache_clear()
    q4kernel.library.cache_clear()
    try:
        plain, plain_ops = logits()
    finally:
        q4kernel.status.cache_clear()
        q4kernel.library.cache_clear()
    assert q4kernel.OP not in plain_ops and "Gemm" in plain_ops
    assert np.abs(want).max() > 0.5
    kernel_err, plain_err = np.abs(got - want).max(), np.abs(plain - want).max()
    assert kernel_err <= 1.5 * plain_err + 1e-3, (kernel_err, plain_err)

    monkeypatch.delenv("MESHD_Q4_KERNEL")
    model = load_model(tmp_path / "out")
    session = model.stage(0, model.num_layers).open_session(len(IDS))
    rows = [session.step(np.array([i]), np.array([p]))[-1] for p, i in enumerate(IDS)]
    np.testing.assert_allclose(np.stack(rows), got, rtol=0, atol=1e-4)


def test_a_damaged_library_in_the_cache_is_built_again(fresh: Path) -> None:
    include, cc = q4kernel._find_header(), q4kernel._compiler()
    if include is None or cc is None:
        pytest.skip("no onnxruntime C API header or C compiler here (scripts/ort_header.sh)")
    lib = fresh / f"matmul_q4-{q4kernel._key(cc, include)}.so"  # never loaded in this process
    fresh.mkdir(parents=True)
    lib.write_bytes(b"not a shared library")  # as a full disk or a killed copy might leave it
    st = q4kernel.status()
    assert st.library == lib and st.reason in ("avx512vnni", "avxvnni", "avx2", "c")
    assert lib.stat().st_size > 1000


def test_a_header_newer_than_the_runtime_is_refused(fresh: Path, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A newer header's OrtApi would be asked of an older library, which has none to give."""
    newer = tmp_path / "include"
    newer.mkdir()
    (newer / q4kernel.HEADER).write_text("#define ORT_API_VERSION 999\n")
    monkeypatch.setattr(q4kernel, "header_dirs", lambda: [newer])
    st = q4kernel.status()
    assert st.library is None
    assert "C API version 999, newer than this onnxruntime's" in st.reason
    (newer / q4kernel.HEADER).write_text("/* no version here */\n")
    q4kernel.status.cache_clear()
    st = q4kernel.status()
    assert st.library is None and "names no C API version" in st.reason


def test_a_build_without_a_vector_path_is_not_used(fresh: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Plain C (an ARM board: a Jetson) would be slower than onnxruntime's NEON kernels."""
    if q4kernel._find_header() is None or q4kernel._compiler() is None:
        pytest.skip("no onnxruntime C API header or C compiler here (scripts/ort_header.sh)")
    monkeypatch.setattr(q4kernel, "_vector_path", lambda lib: "c")
    st = q4kernel.status()
    assert st.library is None and st.reason.startswith("no vector path for this CPU")


def test_without_the_kernel_the_daemon_log_warns_once_with_the_reason(
        fresh: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(q4kernel, "header_dirs", lambda: [tmp_path / "none"])
    with caplog.at_level("INFO", logger="meshd.engine.q4kernel"):
        assert q4kernel.library() is None and q4kernel.library() is None
    warned = [r for r in caplog.records if r.levelname == "WARNING"]
    assert len(warned) == 1 and "no onnxruntime C API header" in warned[0].getMessage()
    caplog.clear()
    monkeypatch.setenv("MESHD_Q4_KERNEL", "0")  # switched off on purpose: no warning
    q4kernel.status.cache_clear()
    q4kernel.library.cache_clear()
    with caplog.at_level("INFO", logger="meshd.engine.q4kernel"):
        assert q4kernel.library() is None
    assert [r.levelname for r in caplog.records] == ["INFO"]
