"""Build the ONNX graph of a BERT sentence encoder: token ids in, L2-normalised embeddings out.

Like a generative model's stage graph (meshd/engine/graph.py), it is built with the model
folder's ``GraphBuilder`` (meshd/modeldir/onnx_graph.py): the graph holds no weights
(initializers are external references into ``weights.bin``), and float16 storage is widened by
a ``Cast`` that onnxruntime folds when it builds the session.

Interface (``B`` sentences padded to ``T`` tokens):

- inputs: ``input_ids`` int64 [B, T]; ``attention_mask`` int64 [B, T], 1 for a real token,
  0 for padding (padding goes on the right; every row has at least one real token).
- output: ``embedding`` float32 [B, hidden], pooled over the real tokens (mean, or the CLS
  token) and L2-normalised.

Each layer uses onnxruntime's fused BERT operators (domain ``com.microsoft``, on the CPU and
CUDA providers alike) where they pay: ``Attention`` (the query, key and value projections as
one GEMM against their concatenated weights, folded at load, then softmax attention with padded
keys masked) and ``MatMul`` plus ``BiasGelu`` (exact erf GELU). The residual LayerNorms are
plain ``Add`` (bias), ``Add`` (residual) and ``LayerNormalization``: onnxruntime 1.32's CPU
``SkipLayerNormalization`` kernel took about twice as long as the three (7-10% of the int8
graph's CPU for 32 tokens; for the float graph -9% in one run, nothing in another;
docs/embeddings.md), so sessions are built with its fusion turned off (``UNFUSED_OPTIMIZERS``). The same layer in standard operators
throughout measured the same as the fused form on one thread and has 2.5x the operators.
Padded tokens never change a real token's output: their keys are masked, and pooling weighs
rows by the mask.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import onnx
from onnx import TensorProto, helper

from meshd.embed.arch import BertArch
from meshd.modeldir.manifest import TensorEntry
from meshd.modeldir.onnx_graph import IR_VERSION, OPSET, GraphBuilder

INPUT_IDS, ATTENTION_MASK, EMBEDDING = "input_ids", "attention_mask", "embedding"
GRAPH_KIND_KEY, GRAPH_KIND = "meshd.graph", "bert-encoder-1"
# onnxruntime fusions that would undo the plain residual LayerNorms (docstring above); passed
# as ``disabled_optimizers`` to every session of an encoder graph.
UNFUSED_OPTIMIZERS = ("SkipLayerNormFusion",)


def build_encoder_graph(arch: BertArch, tensors: Mapping[str, TensorEntry],
                        weights_file: str = "weights.bin") -> onnx.ModelProto:
    b = GraphBuilder(tensors, weights_file)
    c = b.const
    h = arch.hidden_size
    i64 = np.int64

    ids_shape = b.op("Shape", [INPUT_IDS])  # [2]: B, T
    t_len = b.op("Slice", [ids_shape, c("one", np.array([1], i64)), c("two", np.array([2], i64))])

    raw, dtype = b.raw("embeddings.word_embeddings.weight")
    x = b.op("Gather", [raw, INPUT_IDS])  # [B, T, H]
    if dtype != "fp32":
        x = b.op("Cast", [x], to=TensorProto.FLOAT)
    pos = b.op("Slice", [b.weight("embeddings.position_embeddings.weight"),
                         c("zero", np.array([0], i64)), t_len, c("zero", np.array([0], i64))])
    typ = b.op("Gather", [b.weight("embeddings.token_type_embeddings.weight"),
                          c("zero_s", np.array(0, i64))])  # every token is segment 0
    x = b.op("Add", [b.op("Add", [x, pos]), typ])  # [B, T, H] from here on
    x = _layer_norm(b, x, "embeddings.LayerNorm", arch.layer_norm_eps)

    mask_f = b.op("Cast", [ATTENTION_MASK], to=TensorProto.FLOAT)  # [B, T]
    mask_i = b.op("Cast", [ATTENTION_MASK], to=TensorProto.INT32)  # Attention's raw 2-D mask

    for i in range(arch.num_layers):
        x = _layer(b, arch, i, x, mask_i)

    if arch.pooling == "mean":
        m = b.op("Unsqueeze", [mask_f, c("axes_2", np.array([2], i64))])  # [B, T, 1]
        axes1 = c("axes_1", np.array([1], i64))
        total = b.op("ReduceSum", [b.op("Mul", [x, m]), axes1], keepdims=0)  # [B, H]
        count = b.op("Max", [b.op("ReduceSum", [m, axes1], keepdims=0),
                             c("min_count", np.array(1e-9, np.float32))])  # [B, 1]
        pooled = b.op("Div", [total, count])
    else:
        pooled = b.op("Gather", [x, c("zero_s", np.array(0, i64))], axis=1)
    norm = b.op("Max", [b.op("ReduceL2", [pooled], axes=[-1], keepdims=1),
                        c("min_norm", np.array(1e-12, np.float32))])
    b.op("Div", [pooled, norm], out=EMBEDDING)

    inputs = [helper.make_tensor_value_info(INPUT_IDS, TensorProto.INT64, ["B", "T"]),
              helper.make_tensor_value_info(ATTENTION_MASK, TensorProto.INT64, ["B", "T"])]
    outputs = [helper.make_tensor_value_info(EMBEDDING, TensorProto.FLOAT, ["B", h])]
    graph = helper.make_graph(b.nodes, "bert_encoder", inputs, outputs,
                              initializer=list(b.inits.values()))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET),
                                                    helper.make_opsetid("com.microsoft", 1)],
                              producer_name="meshd")
    model.ir_version = IR_VERSION
    helper.set_model_props(model, {GRAPH_KIND_KEY: GRAPH_KIND})
    return model


def _layer_norm(b: GraphBuilder, x: str, prefix: str, eps: float) -> str:
    return b.op("LayerNormalization", [x, b.weight(prefix + ".weight"), b.weight(prefix + ".bias")],
                axis=-1, epsilon=eps)


def _layer(b: GraphBuilder, arch: BertArch, i: int, x: str, mask_i: str) -> str:
    p = f"encoder.layer.{i}."
    a = p + "attention.self."
    w_qkv = b.op("Concat", [b.weight(a + "query.weight"), b.weight(a + "key.weight"),
                            b.weight(a + "value.weight")], axis=0)
    w_qkv = b.op("Transpose", [w_qkv], perm=[1, 0])  # [H, 3H]
    b_qkv = b.op("Concat", [b.weight(a + "query.bias"), b.weight(a + "key.bias"),
                            b.weight(a + "value.bias")], axis=0)
    ctx = b.op("Attention", [x, w_qkv, b_qkv, mask_i], domain="com.microsoft",
               num_heads=arch.num_heads)
    o = b.op("MatMul", [ctx, _wt(b, p + "attention.output.dense.weight")])
    x = _residual_norm(b, arch, o, x, p + "attention.output.")
    inner = b.op("MatMul", [x, _wt(b, p + "intermediate.dense.weight")])
    act = b.op("BiasGelu", [inner, b.weight(p + "intermediate.dense.bias")], domain="com.microsoft")
    o = b.op("MatMul", [act, _wt(b, p + "output.dense.weight")])
    return _residual_norm(b, arch, o, x, p + "output.")


def _residual_norm(b: GraphBuilder, arch: BertArch, o: str, x: str, prefix: str) -> str:
    """LayerNorm(o + dense bias + x): a sub-layer's output back onto the residual stream."""
    y = b.op("Add", [b.op("Add", [o, b.weight(prefix + "dense.bias")]), x])
    return _layer_norm(b, y, prefix + "LayerNorm", arch.layer_norm_eps)


def unfuse_skip_layer_norm(model: onnx.ModelProto) -> int:
    """Rewrite each ``SkipLayerNormalization`` node (graphs written before the plain form, and
    the int8 graphs quantized from them) as ``Add``, ``Add``, ``LayerNormalization``, in place;
    returns how many were rewritten. Same arithmetic (vectors equal to ~1e-7)."""
    nodes, n = [], 0
    for node in model.graph.node:
        if (node.op_type != "SkipLayerNormalization" or len(node.input) < 4
                or not node.output[0] or any(node.output[1:])):  # mean/inv_std outputs used
            nodes.append(node)
            continue
        x, skip, gamma, beta = node.input[:4]
        bias = node.input[4] if len(node.input) > 4 else ""
        eps = next((helper.get_attribute_value(a) for a in node.attribute if a.name == "epsilon"),
                   1e-12)
        out = node.output[0]
        if bias:
            nodes.append(helper.make_node("Add", [x, bias], [out + "_biased"]))
            x = out + "_biased"
        nodes.append(helper.make_node("Add", [x, skip], [out + "_residual"]))
        nodes.append(helper.make_node("LayerNormalization", [out + "_residual", gamma, beta], [out],
                                      axis=-1, epsilon=eps))
        n += 1
    if n:
        del model.graph.node[:]
        model.graph.node.extend(nodes)
    return n


def _wt(b: GraphBuilder, name: str) -> str:
    """A [out, in] weight as [in, out] for MatMul (folded by onnxruntime)."""
    return b.op("Transpose", [b.weight(name)], perm=[1, 0])
