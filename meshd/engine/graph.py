"""Build the ONNX graph of any contiguous layer range (a *stage*) of a Llama-family model.

The graph holds no weights: every initializer points into the model's single weights file by
offset (ONNX external data), so a graph for any range can be made at load time in a few
milliseconds and nothing is stored twice. All arithmetic is float32; float16 weights are widened
by a ``Cast`` that onnxruntime folds once when the session is built.

Stage interface (batch 1; ``T`` new tokens, ``C`` cache slots, ``K`` logit rows):

- inputs: ``input_ids`` int64 [T] (first stage) or ``hidden_in`` float32 [T, H];
  ``positions`` int64 [T], which must be ``P, P+1, ...`` where ``P`` is the number of tokens
  already cached; ``logit_rows`` int64 [K] (last stage: which of the T rows to project to
  logits); per layer ``i`` of the range ``past_key.i`` float32 [kv_heads, head_dim, C] (keys
  are stored transposed) and ``past_value.i`` float32 [kv_heads, C, head_dim], of which only
  the first ``P`` slots are read (the rest is masked).
- outputs: ``hidden_out`` float32 [T, H] or ``logits`` float32 [K, V]; per layer
  ``new_key.i`` [kv_heads, head_dim, T] and ``new_value.i`` [kv_heads, T, head_dim], the keys
  (after RoPE) and values of the new tokens, which the caller writes into its cache at slots
  ``P..P+T-1``.

Attention scores the cached keys and the new keys separately and joins only the small score
matrices, so a decode step reads the cache in place and copies nothing of size ``C``; each
query head is one row against its kv head's cache (a matrix-vector product when T = 1), with
the cache as the wide operand in the layout it is stored in. ``KV_LAYOUT`` names this layout;
a stage graph file built for another layout is rebuilt from the weights at load.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from meshd.engine.arch import Arch, rope_inv_freq
from meshd.engine.manifest import TensorEntry
from meshd.engine.planning import EMBED, FINAL_NORM, LM_HEAD, check_range

OPSET = 17
IR_VERSION = 8
KV_LAYOUT = "2"  # keys [kvh, d, C], values [kvh, C, d]; graph metadata key ``meshd.kv_layout``
KV_LAYOUT_KEY = "meshd.kv_layout"
INPUT_IDS, HIDDEN_IN, POSITIONS, LOGIT_ROWS = "input_ids", "hidden_in", "positions", "logit_rows"
HIDDEN_OUT, LOGITS = "hidden_out", "logits"
_ONNX_DTYPE = {"fp32": TensorProto.FLOAT, "fp16": TensorProto.FLOAT16}


def past_key(i: int) -> str:
    return f"past_key.{i}"


def past_value(i: int) -> str:
    return f"past_value.{i}"


def new_key(i: int) -> str:
    return f"new_key.{i}"


def new_value(i: int) -> str:
    return f"new_value.{i}"


class GraphBuilder:
    """Nodes and initializers of one graph; weights as external data into the weights file
    (shared with ``meshd.embed.graph``)."""

    def __init__(self, tensors: Mapping[str, TensorEntry], weights_file: str) -> None:
        self.tensors = tensors
        self.weights_file = weights_file
        self.nodes: list[onnx.NodeProto] = []
        self.inits: dict[str, TensorProto] = {}
        self.fp32: dict[str, str] = {}
        self.count = 0

    def ops(self, op_type: str, inputs: list[str], n_out: int, **attrs: Any) -> list[str]:
        """Add a node; return its ``n_out`` output names."""
        self.count += 1
        outputs = [f"{op_type.lower()}_{self.count}_{k}" for k in range(n_out)]
        self.nodes.append(helper.make_node(op_type, inputs, outputs,
                                           name=f"{op_type}_{self.count}", **attrs))
        return outputs

    def op(self, op_type: str, inputs: list[str], out: str | None = None, **attrs: Any) -> str:
        """Add a one-output node; its output is named ``out`` if given."""
        if out is None:
            return self.ops(op_type, inputs, 1, **attrs)[0]
        self.count += 1
        self.nodes.append(helper.make_node(op_type, inputs, [out],
                                           name=f"{op_type}_{self.count}", **attrs))
        return out

    def const(self, name: str, value: np.ndarray) -> str:
        if name not in self.inits:
            self.inits[name] = numpy_helper.from_array(value, name)
        return name

    def raw(self, name: str) -> tuple[str, str]:
        """The stored tensor (external data) and its dtype."""
        entry = self.tensors[name]
        if name not in self.inits:
            t = TensorProto()
            t.name = name
            t.data_type = _ONNX_DTYPE[entry.dtype]
            t.dims.extend(entry.shape)
            t.data_location = TensorProto.EXTERNAL
            for key, value in (("location", self.weights_file), ("offset", str(entry.offset)),
                               ("length", str(entry.nbytes))):
                kv = t.external_data.add()
                kv.key, kv.value = key, value
            self.inits[name] = t
        return name, entry.dtype

    def weight(self, name: str) -> str:
        """The tensor as float32 (a Cast for float16 storage, folded by onnxruntime)."""
        if name not in self.fp32:
            raw, dtype = self.raw(name)
            self.fp32[name] = raw if dtype == "fp32" else self.op(
                "Cast", [raw], to=TensorProto.FLOAT)
        return self.fp32[name]


def build_stage_graph(arch: Arch, tensors: Mapping[str, TensorEntry], start: int, end: int,
                      weights_file: str = "weights.bin") -> onnx.ModelProto:
    """The ONNX model of layers ``[start, end)``; weights are external references into
    ``weights_file`` (resolved by onnxruntime relative to the model directory)."""
    check_range(arch.num_layers, start, end)
    first, last = start == 0, end == arch.num_layers
    b = GraphBuilder(tensors, weights_file)
    h_dim, d, kvh = arch.hidden_size, arch.head_dim, arch.num_kv_heads
    i64 = np.int64

    inputs = [helper.make_tensor_value_info(POSITIONS, TensorProto.INT64, ["T"])]
    if first:
        inputs.insert(0, helper.make_tensor_value_info(INPUT_IDS, TensorProto.INT64, ["T"]))
        raw, dtype = b.raw(EMBED)
        x = b.op("Gather", [raw, INPUT_IDS])
        if dtype != "fp32":
            x = b.op("Cast", [x], to=TensorProto.FLOAT)
    else:
        inputs.insert(0, helper.make_tensor_value_info(HIDDEN_IN, TensorProto.FLOAT,
                                                       ["T", h_dim]))
        x = HIDDEN_IN
    if last:
        inputs.append(helper.make_tensor_value_info(LOGIT_ROWS, TensorProto.INT64, ["K"]))
    outputs = []
    for i in range(start, end):
        inputs.append(helper.make_tensor_value_info(past_key(i), TensorProto.FLOAT,
                                                    [kvh, d, "C"]))
        inputs.append(helper.make_tensor_value_info(past_value(i), TensorProto.FLOAT,
                                                    [kvh, "C", d]))
        outputs.append(helper.make_tensor_value_info(new_key(i), TensorProto.FLOAT,
                                                     [kvh, d, "T"]))
        outputs.append(helper.make_tensor_value_info(new_value(i), TensorProto.FLOAT,
                                                     [kvh, "T", d]))

    # Shared by every layer: RoPE tables and the attention mask.
    c = b.const
    inv = c("rope_inv_freq", rope_inv_freq(arch))
    pos_f = b.op("Cast", [POSITIONS], to=TensorProto.FLOAT)
    freqs = b.op("Mul", [b.op("Unsqueeze", [pos_f, c("axes_1", np.array([1], i64))]), inv])
    sin_half = b.op("Sin", [freqs])
    cos = b.op("Cos", [b.op("Concat", [freqs, freqs], axis=1)])
    sin = b.op("Concat", [b.op("Neg", [sin_half]), sin_half], axis=1)  # rotate_half's signs
    scale = c("attn_scale", np.array(1.0 / np.sqrt(d), np.float32))
    cos_q, sin_q = b.op("Mul", [cos, scale]), b.op("Mul", [sin, scale])

    t_len = b.op("Shape", [POSITIONS])  # [1]
    c_len = b.op("Slice", [b.op("Shape", [past_key(start)]), c("two", np.array([2], i64)),
                           c("three", np.array([3], i64))])
    zero_s, one_s = c("zero_s", np.array(0, i64)), c("one_s", np.array(1, i64))
    axes0 = c("axes_0", np.array([0], i64))
    p_len = b.op("Slice", [POSITIONS, c("zero", np.array([0], i64)), c("one", np.array([1], i64))])
    j_past = b.op("Range", [zero_s, b.op("Squeeze", [c_len, axes0]), one_s])
    past_bad = b.op("GreaterOrEqual", [j_past, p_len])  # [C]: slot j holds no token yet
    t_idx = b.op("Range", [zero_s, b.op("Squeeze", [t_len, axes0]), one_s])
    new_bad = b.op("Greater", [b.op("Unsqueeze", [t_idx, axes0]),
                               b.op("Unsqueeze", [t_idx, c("axes_1", np.array([1], i64))])])
    past_bad = b.op("Expand", [b.op("Unsqueeze", [past_bad, axes0]),
                               b.op("Concat", [t_len, c_len], axis=0)])
    bad = b.op("Concat", [past_bad, new_bad], axis=1)  # [T, C+T]
    mask = b.op("Where", [bad, c("neg_inf", np.array(-np.inf, np.float32)),
                          c("zero_f", np.array(0.0, np.float32))])  # broadcast over heads
    split_sizes = b.op("Concat", [c_len, t_len], axis=0)

    for i in range(start, end):
        x = _layer(b, arch, i, x, cos, sin, cos_q, sin_q, mask, split_sizes)

    if last:
        x = b.op("Gather", [x, LOGIT_ROWS], axis=0)
        x = _rms_norm(b, x, b.weight(FINAL_NORM), arch.rms_norm_eps)
        head = EMBED if arch.tie_word_embeddings else LM_HEAD
        b.op("Gemm", [x, b.weight(head)], out=LOGITS, transB=1)
        outputs.insert(0, helper.make_tensor_value_info(LOGITS, TensorProto.FLOAT,
                                                        ["K", arch.vocab_size]))
    else:
        b.op("Identity", [x], out=HIDDEN_OUT)
        outputs.insert(0, helper.make_tensor_value_info(HIDDEN_OUT, TensorProto.FLOAT,
                                                        ["T", h_dim]))

    graph = helper.make_graph(b.nodes, f"layers_{start}_{end}", inputs, outputs,
                              initializer=list(b.inits.values()))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="meshd")
    model.ir_version = IR_VERSION
    helper.set_model_props(model, {KV_LAYOUT_KEY: KV_LAYOUT})
    return model


def _rms_norm(b: GraphBuilder, x: str, w: str, eps: float) -> str:
    sq = b.op("Pow", [x, b.const("two_f", np.array(2.0, np.float32))])
    ms = b.op("ReduceMean", [sq], axes=[-1], keepdims=1)
    r = b.op("Sqrt", [b.op("Add", [ms, b.const(f"eps_{eps!r}", np.array(eps, np.float32))])])
    return b.op("Mul", [b.op("Div", [x, r]), w])


def _linear(b: GraphBuilder, x: str, prefix: str, bias: bool) -> str:
    ins = [x, b.weight(prefix + ".weight")]
    if bias:
        ins.append(b.weight(prefix + ".bias"))
    return b.op("Gemm", ins, transB=1)


def _rope(b: GraphBuilder, x: str, cos: str, sin: str, half: str) -> str:
    x1, x2 = b.ops("Split", [x, half], 2, axis=-1)
    return b.op("Add", [b.op("Mul", [x, cos]),
                        b.op("Mul", [b.op("Concat", [x2, x1], axis=-1), sin])])


def _layer(b: GraphBuilder, arch: Arch, i: int, x: str, cos: str, sin: str, cos_q: str, sin_q: str,
           mask: str, split_sizes: str) -> str:
    p = f"model.layers.{i}."
    c = b.const
    d, nh, kvh, g = arch.head_dim, arch.num_heads, arch.num_kv_heads, arch.group_size
    half = c(f"half_{d}", np.array([d // 2, d // 2], np.int64))
    perm = [1, 0, 2]

    h = _rms_norm(b, x, b.weight(p + "input_layernorm.weight"), arch.rms_norm_eps)
    q = _linear(b, h, p + "self_attn.q_proj", arch.qkv_bias)
    k = _linear(b, h, p + "self_attn.k_proj", arch.qkv_bias)
    v = _linear(b, h, p + "self_attn.v_proj", arch.qkv_bias)
    q = b.op("Transpose", [b.op("Reshape", [q, c("shape_q", np.array([-1, nh, d]))])], perm=perm)
    k = b.op("Transpose", [b.op("Reshape", [k, c("shape_kv", np.array([-1, kvh, d]))])], perm=perm)
    v = b.op("Transpose", [b.op("Reshape", [v, c("shape_kv", np.array([-1, kvh, d]))])],
             out=new_value(i), perm=perm)  # [kvh, T, d], the layout of the value cache
    q = _rope(b, q, cos_q, sin_q, half)  # [nh, T, d], already scaled by 1/sqrt(d)
    k_t = b.op("Transpose", [_rope(b, k, cos, sin, half)], out=new_key(i),
               perm=[0, 2, 1])  # [kvh, d, T], the layout of the key cache

    # Grouped-query attention without repeating K/V: the heads of one group share a kv head
    # through a broadcast batch dimension, [kvh, g, T, .] x [kvh, 1, ., .]. With one new token
    # (T = 1) each head's product is a matrix-vector product whose long side is the cache,
    # read in place in the layout it is stored in: keys [kvh, d, C] for the scores, values
    # [kvh, C, d] for the output. onnxruntime runs those as its GEMV kernel; the transposed
    # orientation ([C, d] x [d, g]) pads the narrow side to a full GEMM tile and costs twice as
    # much per cached token.
    axes1 = c("axes_1", np.array([1], np.int64))
    qg = b.op("Reshape", [q, c("shape_qg", np.array([kvh, g, -1, d]))])  # [kvh, g, T, d]
    s_past = b.op("MatMul", [qg, b.op("Unsqueeze", [past_key(i), axes1])])  # [kvh, g, T, C]
    s_new = b.op("MatMul", [qg, b.op("Unsqueeze", [k_t, axes1])])  # [kvh, g, T, T]
    s = b.op("Add", [b.op("Concat", [s_past, s_new], axis=-1), mask])
    probs = b.op("Softmax", [s], axis=-1)
    p_past, p_new = b.ops("Split", [probs, split_sizes], 2, axis=-1)
    o = b.op("Add", [b.op("MatMul", [p_past, b.op("Unsqueeze", [past_value(i), axes1])]),
                     b.op("MatMul", [p_new, b.op("Unsqueeze", [v, axes1])])])  # [kvh, g, T, d]
    o = b.op("Reshape", [o, c("shape_heads", np.array([nh, -1, d]))])
    o = b.op("Reshape", [b.op("Transpose", [o], perm=perm), c("shape_flat", np.array([-1, nh * d]))])
    x = b.op("Add", [x, _linear(b, o, p + "self_attn.o_proj", arch.o_bias)])

    h = _rms_norm(b, x, b.weight(p + "post_attention_layernorm.weight"), arch.rms_norm_eps)
    gate = _linear(b, h, p + "mlp.gate_proj", arch.mlp_bias)
    up = _linear(b, h, p + "mlp.up_proj", arch.mlp_bias)
    act = b.op("Mul", [b.op("Mul", [gate, b.op("Sigmoid", [gate])]), up])
    return b.op("Add", [x, _linear(b, act, p + "mlp.down_proj", arch.mlp_bias)])
