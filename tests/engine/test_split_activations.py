"""The head's product on split activations (``graph.QuantGraphBuilder.matmul``): at the default
accuracy level MatMulNBits rounds the activations to int8 per block; split into their int8-grid
part and the rest, in one product over twice the rows, they come out nearly as precise as float
ones. Real onnxruntime sessions over 4/8-bit blocks, against float64 NumPy."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from meshd.engine import graph as g
from meshd.engine import quant
from meshd.modeldir.manifest import TensorEntry
from meshd.modeldir.onnx_graph import IR_VERSION, OPSET

K, N = 256, 96


def _blocks(bits: int, mins: bool, block: int = quant.BLOCK) -> quant.Blockwise:
    rng = np.random.default_rng(bits)
    blocks = quant.quantize(rng.standard_normal((N, K)).astype(np.float32), bits, block)
    if not mins:
        return blocks
    # a "scale and minimum" format (Q4_1, Q4_K): a float minimum per block on top
    kb = K // blocks.block_size
    return quant.Blockwise(blocks.bits, blocks.block_size, blocks.q, blocks.scales,
                           blocks.zero_points, rng.uniform(-0.3, 0.3, (N, kb)).astype(np.float32))


def _session(tmp_path: Path, w: quant.Blockwise, *,
             split: bool) -> tuple[ort.InferenceSession, list[str]]:
    """A session of the one product ``x @ w.T``, and its graph's op types."""
    parts = {"w": ("q4" if w.bits == 4 else "q8", w.q), "w.scales": ("fp32", w.scales),
             "w.zero_points": ("u8", w.zero_points)}
    if w.mins is not None:
        parts["w.mins"] = ("fp32", w.mins)
    tensors, offset = {}, 0
    with open(tmp_path / "weights.bin", "wb") as f:
        for name, (dtype, arr) in parts.items():
            data = np.ascontiguousarray(arr).tobytes()
            f.write(data)
            tensors[name] = TensorEntry(name, dtype, arr.shape, offset, len(data), "")
            offset += len(data)
    b = g.QuantGraphBuilder(tensors, "weights.bin")
    b.matmul("x", "w", out="y", split_activations=split)
    graph = helper.make_graph(b.nodes, "product",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["M", K])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["M", N])],
                              initializer=list(b.inits.values()))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET),
                                                    helper.make_opsetid(g.MS_DOMAIN, 1)])
    model.ir_version = IR_VERSION
    path = tmp_path / f"product-{split}.onnx"
    path.write_bytes(model.SerializeToString())
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    return (ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"]),
            [n.op_type for n in b.nodes])


def _activations() -> np.ndarray:
    rng = np.random.default_rng(7)
    x = rng.standard_normal((5, K)).astype(np.float32)
    x[1, 3] = 40.0  # an outlier: its block's int8 step is 40/127
    x[2] = 0.0  # a row of zeros stays zeros (no division by a zero step)
    x[3, :32] = 0.0  # and so does a block of zeros
    return x


# 8-bit blocks of 16: Q6_K's sub-blocks (an untied head in Q6_K), the activations cut alike
@pytest.mark.parametrize(("bits", "mins", "block"), [(4, False, 32), (4, True, 32), (8, False, 32),
                                                     (8, False, 16)])
def test_split_activations_are_nearly_as_precise_as_float_ones(tmp_path: Path, bits: int,
                                                               mins: bool, block: int) -> None:
    assert g.ACCURACY_LEVEL == 4  # the default: int8 activations
    w = _blocks(bits, mins, block)
    x = _activations()
    want = x.astype(np.float64) @ w.dequantize().astype(np.float64).T
    plain = _session(tmp_path, w, split=False)[0].run(None, {"x": x})[0]
    sess, ops = _session(tmp_path, w, split=True)
    split = sess.run(None, {"x": x})[0]
    err_plain = np.abs(plain - want).max()
    err_split = np.abs(split - want).max()
    assert err_plain > 1e-2  # int8 activations: a visible error
    assert err_split < err_plain / 100  # split: about 1/254 of it, and float32 rounding
    assert "Round" in ops
    assert np.all(split[2] == 0.0)
    # each row's result does not depend on the other rows of the batch
    for i in range(len(x)):
        alone = sess.run(None, {"x": x[i:i + 1]})[0]
        np.testing.assert_allclose(alone[0], split[i], rtol=0, atol=1e-5)


def test_split_is_only_for_int8_activations(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """At a float accuracy level there is nothing to split: the graph is the plain product."""
    monkeypatch.setattr(g, "ACCURACY_LEVEL", 0)
    w = _blocks(4, True)
    x = _activations()
    want = x.astype(np.float64) @ w.dequantize().astype(np.float64).T
    sess, ops = _session(tmp_path, w, split=True)
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], want, rtol=0, atol=1e-3)
    assert "Round" not in ops and "Concat" not in ops


def _entry(name: str, dtype: str, shape: tuple[int, ...]) -> TensorEntry:
    return TensorEntry(name, dtype, shape, 0, 0, "")


@pytest.mark.parametrize(("vocab", "split"), [(49152, True), (262144, False)])
def test_the_head_is_split_where_it_is_at_most_half_the_weights(vocab: int, split: bool) -> None:
    """SmolLM2-135M's shapes (its head 21% of the weights) against a 262k-token vocabulary on
    the same layers (the head 59%): there the split's second rows would cost most of a step."""
    head = "model.embed_tokens.weight"
    tensors = {head: _entry(head, "q8", (vocab, 18, 32)),
               head + ".scales": _entry(head + ".scales", "fp32", (vocab, 18)),
               "model.norm.weight": _entry("model.norm.weight", "fp32", (576,))}
    for i in range(30):  # q4: [N, K / 32, 16 bytes]
        for part, n, kb in (("q", 576, 18), ("k", 192, 18), ("v", 192, 18), ("o", 576, 18),
                            ("gate", 1536, 18), ("up", 1536, 18), ("down", 576, 48)):
            name = f"model.layers.{i}.{part}.weight"
            tensors[name] = _entry(name, "q4", (n, kb, 16))
            tensors[name + ".mins"] = _entry(name + ".mins", "fp32", (n, kb))
    assert g.split_head(tensors, head) is split
