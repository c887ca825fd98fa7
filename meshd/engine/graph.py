"""Build the ONNX graph of any contiguous layer range (a *stage*) of a Llama-family model.

The graph holds no weights: every initializer points into the model's single weights file by
offset (ONNX external data), so a graph for any range can be made at load time in a few
milliseconds and nothing is stored twice. All arithmetic is float32; float16 weights are widened
by a ``Cast`` that onnxruntime folds once when the session is built.

Stage interface (``B`` sequences of ``T`` new tokens each, ``C`` cache slots, ``K`` logit rows):

- inputs: ``input_ids`` int64 [B, T] (first stage) or ``hidden_in`` float32 [B, T, H];
  ``positions`` int64 [B, T], where row ``s`` must be ``P_s, P_s+1, ...`` and ``P_s`` is the
  number of tokens sequence ``s`` has cached (each sequence has its own position);
  ``logit_rows`` int64 [K] (last stage: which of the B*T rows, sequence-major, to project to
  logits); per layer ``i`` of the range ``past_key.i`` float32 [B, kv_heads, head_dim, C]
  (keys are stored transposed) and ``past_value.i`` float32 [B, kv_heads, C, head_dim]: row
  ``s`` is sequence ``s``'s cache, of which only the first ``P_s`` slots are read (the rest is
  masked).
- outputs: ``hidden_out`` float32 [B, T, H] or ``logits`` float32 [K, V]; per layer
  ``new_key.i`` [B, kv_heads, head_dim, T] and ``new_value.i`` [B, kv_heads, T, head_dim], the
  keys (after RoPE) and values of the new tokens, which the caller writes into each
  sequence's cache at slots ``P_s..P_s+T-1``.

A decode step of a batch is ``T = 1``; a prefill chunk of one prompt is ``B = 1``. The weight
products (every ``Gemm``) run over all ``B*T`` rows at once, which is where batching gains: a
decode step of a larger model is bound by reading the weights, once per step for the whole
batch.

Attention scores the cached keys and the new keys separately and joins only the small score
matrices, so a decode step reads the cache in place and copies nothing of size ``C``; each
query head is one row against its kv head's cache (a matrix-vector product when T = 1), with
the cache as the wide operand in the layout it is stored in. ``KV_LAYOUT`` names this layout;
a stage graph file built for another layout is rebuilt from the weights at load.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

import numpy as np
import onnx
from onnx import TensorProto, helper

from meshd.engine.arch import Arch, rope_inv_freq
from meshd.engine.planning import EMBED, FINAL_NORM, LM_HEAD, check_range
from meshd.modeldir.manifest import TensorEntry
from meshd.modeldir.onnx_graph import IR_VERSION, OPSET, GraphBuilder

KV_LAYOUT = "3"  # keys [B, kvh, d, C], values [B, kvh, C, d]; graph metadata key ``meshd.kv_layout``
KV_LAYOUT_KEY = "meshd.kv_layout"
INPUT_IDS, HIDDEN_IN, POSITIONS, LOGIT_ROWS = "input_ids", "hidden_in", "positions", "logit_rows"
HIDDEN_OUT, LOGITS = "hidden_out", "logits"
# A fused graph's second group (one prompt chunk): its inputs and outputs are these names, and
# the chunk's cache inputs/outputs are the per-layer names with this prefix.
CHUNK, CHUNK_IDS, CHUNK_POSITIONS = "chunk.", "chunk_ids", "chunk_positions"
# onnxruntime's contrib operators (MatMulNBits): the domain a quantized model's graph imports
MS_DOMAIN = "com.microsoft"
# MatMulNBits' accuracy_level: 4 quantizes the activations to int8 per block and runs integer
# dot products, the fastest CPU path (measured on a SmolLM2 decode step: docs/engine.md)
ACCURACY_LEVEL = 4


def past_key(i: int) -> str:
    return f"past_key.{i}"


def past_value(i: int) -> str:
    return f"past_value.{i}"


def new_key(i: int) -> str:
    return f"new_key.{i}"


def new_value(i: int) -> str:
    return f"new_value.{i}"


class QuantGraphBuilder(GraphBuilder):
    """A stage graph's builder: ``GraphBuilder`` (meshd.modeldir.onnx_graph) with weight
    products over 4/8-bit blocks (MatMulNBits)."""

    def __init__(self, tensors: Mapping[str, TensorEntry], weights_file: str) -> None:
        super().__init__(tensors, weights_file)
        self.block_sums: dict[tuple[str, int], str] = {}
        self.uses_contrib = False

    def quantized(self, name: str) -> bool:
        """Whether ``name`` is stored as 4- or 8-bit blocks (meshd.engine.quant.Blockwise):
        ``name`` the packed codes, ``name.scales``, ``name.zero_points``, maybe ``name.mins``."""
        return self.tensors[name].dtype in ("q4", "q8")

    def matmul(self, x: str, name: str, bias: str | None = None, out: str | None = None) -> str:
        """``x @ W.T (+ bias)`` for a weight ``W`` [N, K] stored as ``name``, in whatever form
        it is stored: a Gemm over float weights, or MatMulNBits over 4/8-bit blocks, plus the
        blocks' minimums as a second, 32x smaller product of x's block sums."""
        if not self.quantized(name):
            ins = [x, self.weight(name)] + ([bias] if bias else [])
            return self.op("Gemm", ins, out=out, transB=1)
        self.uses_contrib = True
        entry = self.tensors[name]
        n, kb, blob = entry.shape
        bits = 4 if entry.dtype == "q4" else 8
        block = blob * 8 // bits
        q, scales, zp = (self._stored(name + part) for part in ("", ".scales", ".zero_points"))
        mins = name + ".mins"
        has_mins = mins in self.tensors or mins in self.fp32
        self.count += 1
        y = out if out is not None and not has_mins else f"matmulnbits_{self.count}_0"
        ins = [x, q, scales, zp] + (["", bias] if bias else [])
        self.nodes.append(helper.make_node(
            "MatMulNBits", ins, [y], name=f"MatMulNBits_{self.count}", domain=MS_DOMAIN,
            K=kb * block, N=n, bits=bits, block_size=block, accuracy_level=ACCURACY_LEVEL))
        if not has_mins:
            return y
        # y + sums @ mins.T in one Gemm (its C input)
        return self.op("Gemm", [self._block_sums(x, kb, block), self._stored(mins), y], out=out,
                       transB=1)

    def _stored(self, name: str) -> str:
        """A stored tensor (external data), or the Concat that joins several
        (``matmuls``)."""
        if name in self.fp32 and "+" in name:
            return self.fp32[name]
        return self.raw(name)[0]

    def matmuls(self, x: str, names: list[str], biases: list[str | None]) -> list[str]:
        """``x @ W.T (+ bias)`` for several weights read from the same ``x`` (q, k and v; gate
        and up). Matrices stored as blocks of one kind run as one MatMulNBits over their rows
        joined (onnxruntime folds the Concat of initializers when the session is built), whose
        output is split: fewer, larger kernels per layer."""
        entries = [self.tensors[n] for n in names]
        kinds = {(e.dtype, e.shape[1:], n + ".mins" in self.tensors)
                 for e, n in zip(entries, names, strict=True)}
        if len(names) < 2 or not all(self.quantized(n) for n in names) or len(kinds) != 1 \
                or (any(biases) and not all(biases)):
            return [self.matmul(x, n, b) for n, b in zip(names, biases, strict=True)]
        joined = "+".join(names)
        if joined not in self.tensors:
            e0 = entries[0]
            rows = sum(e.shape[0] for e in entries)
            for part in ("", ".scales", ".zero_points", ".mins"):
                if names[0] + part not in self.tensors:
                    continue
                parts = [self.raw(n + part)[0] for n in names]
                self.fp32[joined + part] = self.op("Concat", parts, axis=0)
            self.tensors = {**self.tensors, joined: replace(e0, name=joined,
                                                            shape=(rows, *e0.shape[1:]))}
        bias = self.op("Concat", [b for b in biases if b], axis=0) if biases[0] else None
        y = self.matmul(x, joined, bias)
        sizes = self.const("rows_" + "_".join(str(e.shape[0]) for e in entries),
                           np.array([e.shape[0] for e in entries], np.int64))
        return self.ops("Split", [y, sizes], len(names), axis=-1)

    def _block_sums(self, x: str, kb: int, block: int) -> str:
        """[N, K] -> [N, K / block]: the sum of each block of x's values (shared by every
        weight with minimums that reads x)."""
        key = (x, block)
        if key not in self.block_sums:
            shape = self.const(f"blocks_{kb}_{block}", np.array([-1, kb, block], np.int64))
            self.block_sums[key] = self.op("ReduceSum", [self.op("Reshape", [x, shape]),
                                                         self.const("axes_m1", np.array([-1], np.int64))],
                                           keepdims=0)
        return self.block_sums[key]

    def gather_rows(self, name: str, ids: str) -> str:
        """Rows ``ids`` of the matrix stored as ``name``, as float32 [len(ids), K]: a Gather
        (and a Cast) for float storage; for 4/8-bit blocks the gathered rows alone are
        dequantized, so a tied embedding and LM head share one quantized copy."""
        raw, dtype = self.raw(name)
        if not self.quantized(name):
            x = self.op("Gather", [raw, ids])
            return x if dtype == "fp32" else self.op("Cast", [x], to=TensorProto.FLOAT)
        entry = self.tensors[name]
        _, kb, blob = entry.shape
        c, f32 = self.const, TensorProto.FLOAT
        codes = self.op("Cast", [self.op("Gather", [raw, ids])], to=f32)  # [M, kb, blob]
        zp = self.op("Cast", [self.op("Gather", [self.raw(name + ".zero_points")[0], ids])],
                     to=f32)
        if dtype == "q4":
            codes = self._nibbles(codes, [-1, kb, blob * 2])
            zp = self.op("Slice", [self._nibbles(zp, [-1, 2 * ((kb + 1) // 2)]),
                                   c("zero", np.array([0], np.int64)),
                                   c(f"len_{kb}", np.array([kb], np.int64)),
                                   c("axes_1", np.array([1], np.int64))])
        last = c("axes_m1", np.array([-1], np.int64))
        scales = self.op("Gather", [self.raw(name + ".scales")[0], ids])  # [M, kb]
        x = self.op("Mul", [self.op("Sub", [codes, self.op("Unsqueeze", [zp, last])]),
                            self.op("Unsqueeze", [scales, last])])
        if name + ".mins" in self.tensors:
            mins = self.op("Gather", [self.raw(name + ".mins")[0], ids])
            x = self.op("Add", [x, self.op("Unsqueeze", [mins, last])])
        return self.op("Reshape", [x, c(f"rows_{kb}_{blob}_{dtype}",
                                        np.array([-1, kb * blob * (2 if dtype == "q4" else 1)],
                                                 np.int64))])

    def _nibbles(self, packed: str, shape: list[int]) -> str:
        """float codes of packed bytes -> the two 4-bit codes of each byte, low one first,
        reshaped to ``shape``."""
        c = self.const
        hi = self.op("Floor", [self.op("Div", [packed, c("sixteen", np.array(16.0, np.float32))])])
        lo = self.op("Sub", [packed, self.op("Mul", [hi, c("sixteen", np.array(16.0, np.float32))])])
        last = c("axes_m1", np.array([-1], np.int64))
        pair = self.op("Concat", [self.op("Unsqueeze", [lo, last]),
                                  self.op("Unsqueeze", [hi, last])], axis=-1)
        return self.op("Reshape", [pair, c("shape_" + "_".join(map(str, shape)).replace("-", "m"),
                                           np.array(shape, np.int64))])


def build_stage_graph(arch: Arch, tensors: Mapping[str, TensorEntry], start: int, end: int,
                      weights_file: str = "weights.bin", *, fused: bool = False
                      ) -> onnx.ModelProto:
    """The ONNX model of layers ``[start, end)``; weights are external references into
    ``weights_file`` (resolved by onnxruntime relative to the model directory).

    ``fused`` (whole models only) adds a second group of inputs, one prompt chunk
    (``chunk_ids`` [1, T'], ``chunk_positions``, ``chunk.past_key.i`` / ``chunk.past_value.i``
    against its own cache; outputs ``chunk.new_key.i`` / ``chunk.new_value.i``): the weight
    products run over the decoding rows and the chunk's rows together, attention runs per group,
    and ``logit_rows`` index the B*T decoding rows followed by the chunk's T' rows."""
    check_range(arch.num_layers, start, end)
    first, last = start == 0, end == arch.num_layers
    if fused and not (first and last):
        raise ValueError("a fused graph covers a whole model")
    b = QuantGraphBuilder(tensors, weights_file)
    h_dim, d, kvh = arch.hidden_size, arch.head_dim, arch.num_kv_heads
    i64 = np.int64
    c = b.const
    prefixes = ["", CHUNK] if fused else [""]

    inputs = [helper.make_tensor_value_info(POSITIONS, TensorProto.INT64, ["B", "T"])]
    if first:
        inputs.insert(0, helper.make_tensor_value_info(INPUT_IDS, TensorProto.INT64, ["B", "T"]))
        ids = b.op("Reshape", [INPUT_IDS, c("flat", np.array([-1], i64))])
        if fused:
            inputs += [helper.make_tensor_value_info(CHUNK_IDS, TensorProto.INT64, [1, "T2"]),
                       helper.make_tensor_value_info(CHUNK_POSITIONS, TensorProto.INT64,
                                                     [1, "T2"])]
            ids = b.op("Concat", [ids, b.op("Reshape", [CHUNK_IDS, c("flat", np.array([-1], i64))])],
                       axis=0)
        x = b.gather_rows(EMBED, ids)
        if arch.embed_scale != 1.0:
            x = b.op("Mul", [x, c("embed_scale", np.array(arch.embed_scale, np.float32))])
    else:
        inputs.insert(0, helper.make_tensor_value_info(HIDDEN_IN, TensorProto.FLOAT,
                                                       ["B", "T", h_dim]))
        x = b.op("Reshape", [HIDDEN_IN, c("shape_rows", np.array([-1, h_dim], i64))])
    # x is [N, H] with N = B*T rows (sequence-major) through every layer.
    if last:
        inputs.append(helper.make_tensor_value_info(LOGIT_ROWS, TensorProto.INT64, ["K"]))
    outputs = []
    for pre in prefixes:
        bn, cn, tn = ("B", "C", "T") if not pre else (1, "C2", "T2")
        for i in range(start, end):
            inputs.append(helper.make_tensor_value_info(pre + past_key(i), TensorProto.FLOAT,
                                                        [bn, kvh, d, cn]))
            inputs.append(helper.make_tensor_value_info(pre + past_value(i), TensorProto.FLOAT,
                                                        [bn, kvh, cn, d]))
            outputs.append(helper.make_tensor_value_info(pre + new_key(i), TensorProto.FLOAT,
                                                         [bn, kvh, d, tn]))
            outputs.append(helper.make_tensor_value_info(pre + new_value(i), TensorProto.FLOAT,
                                                         [bn, kvh, tn, d]))

    groups = [_group(b, arch, POSITIONS, past_key(start), "")]
    if fused:
        groups.append(_group(b, arch, CHUNK_POSITIONS, CHUNK + past_key(start), CHUNK))
        rows = b.op("Concat", [groups[0].rows, groups[1].rows], axis=0)  # split of x's rows
    for i in range(start, end):
        x = _layer(b, arch, i, x, groups, rows if fused else None)

    if last:
        x = b.op("Gather", [x, LOGIT_ROWS], axis=0)
        x = _rms_norm(b, x, b.weight(FINAL_NORM), arch.rms_norm_eps)
        head = EMBED if arch.tie_word_embeddings else LM_HEAD
        b.matmul(x, head, out=LOGITS)
        outputs.insert(0, helper.make_tensor_value_info(LOGITS, TensorProto.FLOAT,
                                                        ["K", arch.vocab_size]))
    else:
        out_shape = b.op("Concat", [groups[0].b_len, groups[0].t_len, c(f"h_{h_dim}", np.array([h_dim], i64))], axis=0)
        b.op("Reshape", [x, out_shape], out=HIDDEN_OUT)
        outputs.insert(0, helper.make_tensor_value_info(HIDDEN_OUT, TensorProto.FLOAT,
                                                        ["B", "T", h_dim]))

    graph = helper.make_graph(b.nodes, f"layers_{start}_{end}", inputs, outputs,
                              initializer=list(b.inits.values()))
    opsets = [helper.make_opsetid("", OPSET)]
    if b.uses_contrib:
        opsets.append(helper.make_opsetid(MS_DOMAIN, 1))
    model = helper.make_model(graph, opset_imports=opsets, producer_name="meshd")
    model.ir_version = IR_VERSION
    helper.set_model_props(model, {KV_LAYOUT_KEY: KV_LAYOUT})
    return model



@dataclass(frozen=True)
class _Group:
    """The names one group of sequences' attention uses in every layer (a fused graph has two:
    the decoding rows and the prompt chunk, each against its own cache)."""

    prefix: str  # of its cache inputs and new key/value outputs
    cos: str
    sin: str
    cos_q: str
    sin_q: str
    mask: str
    split_sizes: str
    shapes: dict[str, str]
    rows: str  # [1]: B*T, its rows of x
    b_len: str
    t_len: str
    local: tuple[str, str, str, str, str] | None = None  # sliding-window layers' cos, sin,
    # cos_q, sin_q and mask


def _group(b: QuantGraphBuilder, arch: Arch, positions: str, first_key: str, prefix: str) -> _Group:
    """RoPE tables and the attention mask of one group (``positions`` [B, T], caches whose
    first layer's keys are ``first_key``); a model with sliding-window layers also gets their
    tables and mask (``local``)."""
    c, i64, d, kvh = b.const, np.int64, arch.head_dim, arch.num_kv_heads
    axes0, axes1, axes2 = (c(f"axes_{k}", np.array([k], i64)) for k in range(3))
    bt = b.op("Shape", [positions])  # [2]: B, T
    b_len = b.op("Slice", [bt, c("zero", np.array([0], i64)), c("one", np.array([1], i64))])
    t_len = b.op("Slice", [bt, c("one", np.array([1], i64)), c("two", np.array([2], i64))])
    pos_f = b.op("Cast", [b.op("Reshape", [positions, c("flat", np.array([-1], i64))])],
                 to=TensorProto.FLOAT)
    # [B, 1, T, d]: broadcast over the heads of [B, heads, T, d]
    one = c("one", np.array([1], i64))
    rope_shape = b.op("Concat", [b_len, one, t_len, c(f"d_{d}", np.array([d], i64))], axis=0)
    tables = _rope_tables(b, c("rope_inv_freq", rope_inv_freq(arch)), pos_f, rope_shape, d)

    c_len = b.op("Slice", [b.op("Shape", [first_key]), c("three", np.array([3], i64)),
                           c("four", np.array([4], i64))])
    zero_s, one_s = c("zero_s", np.array(0, i64)), c("one_s", np.array(1, i64))
    # slot j of sequence s holds a token iff j < positions[s, 0] (the tokens it has cached)
    p_len = b.op("Slice", [positions, c("zero", np.array([0], i64)), c("one", np.array([1], i64)),
                           axes1])  # [B, 1]
    j_past = b.op("Range", [zero_s, b.op("Squeeze", [c_len, axes0]), one_s])  # [C]
    past_bad = b.op("GreaterOrEqual", [j_past, b.op("Unsqueeze", [p_len, axes2])])  # [B, 1, C]
    t_idx = b.op("Range", [zero_s, b.op("Squeeze", [t_len, axes0]), one_s])
    new_bad = b.op("Greater", [b.op("Unsqueeze", [t_idx, axes0]),
                               b.op("Unsqueeze", [t_idx, axes1])])  # [T, T]
    btc = b.op("Concat", [b_len, t_len, c_len], axis=0)
    btt = b.op("Concat", [b_len, t_len, t_len], axis=0)
    bad = b.op("Concat", [b.op("Expand", [past_bad, btc]), b.op("Expand", [new_bad, btt])],
               axis=2)  # [B, T, C+T]
    axes12 = c("axes_12", np.array([1, 2], i64))
    neg_inf, zero_f = c("neg_inf", np.array(-np.inf, np.float32)), c("zero_f", np.array(0.0, np.float32))
    mask = b.op("Where", [b.op("Unsqueeze", [bad, axes12]), neg_inf, zero_f])  # [B, 1, 1, T, C+T]
    local = None
    if arch.sliding_window:
        # a local layer's query at position p also masks the keys at positions <= p - window
        window = c("window", np.array(arch.sliding_window, i64))
        far_past = b.op("GreaterOrEqual", [b.op("Sub", [b.op("Unsqueeze", [positions, axes2]),
                                                        j_past]), window])  # [B, T, C]
        far_new = b.op("GreaterOrEqual", [b.op("Sub", [b.op("Unsqueeze", [t_idx, axes1]),
                                                       b.op("Unsqueeze", [t_idx, axes0])]),
                                          window])  # [T, T]
        far = b.op("Concat", [far_past, b.op("Expand", [far_new, btt])], axis=2)
        local_mask = b.op("Where", [b.op("Unsqueeze", [b.op("Or", [bad, far]), axes12]),
                                    neg_inf, zero_f])
        local = (*_rope_tables(b, c("rope_inv_freq_local", rope_inv_freq(arch, local=True)),
                               pos_f, rope_shape, d), local_mask)
    split_sizes = b.op("Concat", [c_len, t_len], axis=0)
    nh, g = arch.num_heads, arch.group_size

    def shape(*parts: str | list[int]) -> str:
        ins = [p if isinstance(p, str) else c("dims_" + "_".join(map(str, p)), np.array(p, i64))
               for p in parts]
        return b.op("Concat", ins, axis=0)

    shapes = {"q": shape(b_len, [-1, nh, d]), "kv": shape(b_len, [-1, kvh, d]),
              "qg": shape(b_len, [kvh, g, -1, d]), "heads": shape(b_len, [nh, -1, d])}
    rows = b.op("Mul", [b_len, t_len])
    return _Group(prefix, *tables, mask, split_sizes, shapes, rows, b_len, t_len, local)


def _rope_tables(b: QuantGraphBuilder, inv: str, pos_f: str, rope_shape: str, d: int
                 ) -> tuple[str, str, str, str]:
    """cos and sin [B, 1, T, d] for keys, and for queries already scaled by 1/sqrt(d)."""
    freqs = b.op("Mul", [b.op("Unsqueeze", [pos_f, b.const("axes_1", np.array([1], np.int64))]),
                         inv])  # [N, d/2]
    sin_half = b.op("Sin", [freqs])
    cos = b.op("Cos", [b.op("Concat", [freqs, freqs], axis=1)])
    sin = b.op("Concat", [b.op("Neg", [sin_half]), sin_half], axis=1)  # rotate_half's signs
    cos, sin = b.op("Reshape", [cos, rope_shape]), b.op("Reshape", [sin, rope_shape])
    scale = b.const("attn_scale", np.array(1.0 / np.sqrt(d), np.float32))
    return cos, sin, b.op("Mul", [cos, scale]), b.op("Mul", [sin, scale])


def _rms_norm(b: QuantGraphBuilder, x: str, w: str, eps: float) -> str:
    """RMSNorm over the last axis, as onnxruntime's SimplifiedLayerNormalization (a contrib
    operator of the default domain): one node, where Pow/ReduceMean/Sqrt/Div/Mul was five that
    onnxruntime fused only where the normed value had one consumer."""
    return b.op("SimplifiedLayerNormalization", [x, w], axis=-1, epsilon=float(eps))


def _linears(b: QuantGraphBuilder, x: str, prefixes: list[str], bias: bool) -> list[str]:
    return b.matmuls(x, [p + ".weight" for p in prefixes],
                     [b.weight(p + ".bias") if bias else None for p in prefixes])


def _linear(b: QuantGraphBuilder, x: str, prefix: str, bias: bool) -> str:
    return b.matmul(x, prefix + ".weight", b.weight(prefix + ".bias") if bias else None)


def _rope(b: QuantGraphBuilder, x: str, cos: str, sin: str, half: str) -> str:
    x1, x2 = b.ops("Split", [x, half], 2, axis=-1)
    return b.op("Add", [b.op("Mul", [x, cos]),
                        b.op("Mul", [b.op("Concat", [x2, x1], axis=-1), sin])])


def _layer(b: QuantGraphBuilder, arch: Arch, i: int, x: str, groups: list[_Group],
           rows: str | None) -> str:
    """One decoder layer over x [N, H]: the weight products over all N rows at once, attention
    per group (``rows``: how x's rows split between the groups, when there are two)."""
    p = f"model.layers.{i}."
    eps = arch.rms_norm_eps
    h = _rms_norm(b, x, b.weight(p + "input_layernorm.weight"), eps)
    q, k, v = _linears(b, h, [p + "self_attn." + n for n in ("q_proj", "k_proj", "v_proj")],
                       arch.qkv_bias)
    if arch.qk_norm:
        q = _head_norm(b, q, b.weight(p + "self_attn.q_norm.weight"), arch.head_dim, eps)
        k = _head_norm(b, k, b.weight(p + "self_attn.k_norm.weight"), arch.head_dim, eps)
    if rows is None:
        o = _attention(b, arch, i, q, k, v, groups[0])
    else:
        parts = zip(*(b.ops("Split", [t, rows], len(groups), axis=0) for t in (q, k, v)),
                    strict=True)
        o = b.op("Concat", [_attention(b, arch, i, qq, kk, vv, grp)
                            for (qq, kk, vv), grp in zip(parts, groups, strict=True)], axis=0)
    o = _linear(b, o, p + "self_attn.o_proj", arch.o_bias)
    if arch.sandwich_norm:  # Gemma: the attention's output is normed before the residual
        o = _rms_norm(b, o, b.weight(p + "post_attention_layernorm.weight"), eps)
        x = b.op("Add", [x, o])
        h = _rms_norm(b, x, b.weight(p + "pre_feedforward_layernorm.weight"), eps)
    else:
        x = b.op("Add", [x, o])
        h = _rms_norm(b, x, b.weight(p + "post_attention_layernorm.weight"), eps)
    gate, up = _linears(b, h, [p + "mlp.gate_proj", p + "mlp.up_proj"], arch.mlp_bias)
    act = b.op("Mul", [_activation(b, gate, arch.act), up])
    m = _linear(b, act, p + "mlp.down_proj", arch.mlp_bias)
    if arch.sandwich_norm:
        m = _rms_norm(b, m, b.weight(p + "post_feedforward_layernorm.weight"), eps)
    return b.op("Add", [x, m])


def _activation(b: QuantGraphBuilder, x: str, act: str) -> str:
    if act == "silu":
        return b.op("Mul", [x, b.op("Sigmoid", [x])])
    # gelu with the tanh approximation (opset 17 has no Gelu): 0.5 x (1 + tanh(a (x + 0.044715 x^3)))
    c = b.const
    cube = b.op("Mul", [b.op("Mul", [x, x]), x])
    inner = b.op("Mul", [b.op("Add", [x, b.op("Mul", [cube, c("gelu_k", np.array(0.044715, np.float32))])]),
                         c("gelu_a", np.array(np.sqrt(2 / np.pi), np.float32))])
    one_plus = b.op("Add", [b.op("Tanh", [inner]), c("one_f", np.array(1.0, np.float32))])
    return b.op("Mul", [b.op("Mul", [x, one_plus]), c("half_f", np.array(0.5, np.float32))])


def _head_norm(b: QuantGraphBuilder, x: str, w: str, d: int, eps: float) -> str:
    """RMSNorm of each head's d values of x [N, heads*d] (Gemma 3's q and k norms)."""
    heads = b.op("Reshape", [x, b.const(f"per_head_{d}", np.array([0, -1, d], np.int64))])
    normed = _rms_norm(b, heads, w, eps)
    return b.op("Reshape", [normed, b.const("shape_rows_keep", np.array([0, -1], np.int64))])


def _attention(b: QuantGraphBuilder, arch: Arch, i: int, q: str, k: str, v: str, grp: _Group) -> str:
    """One group's attention in layer ``i``: q [N, nh*d], k and v [N, kvh*d] of its rows;
    writes its new keys and values (outputs) and returns [N, nh*d]."""
    c = b.const
    d = arch.head_dim
    half = c(f"half_{d}", np.array([d // 2, d // 2], np.int64))
    perm = [0, 2, 1, 3]
    shapes, pre = grp.shapes, grp.prefix
    # [N, heads*d] -> [B, heads, T, d]
    q = b.op("Transpose", [b.op("Reshape", [q, shapes["q"]])], perm=perm)  # [B, nh, T, d]
    k = b.op("Transpose", [b.op("Reshape", [k, shapes["kv"]])], perm=perm)  # [B, kvh, T, d]
    v = b.op("Transpose", [b.op("Reshape", [v, shapes["kv"]])],
             out=pre + new_value(i), perm=perm)  # [B, kvh, T, d], the layout of the value cache
    cos, sin, cos_q, sin_q, mask = grp.cos, grp.sin, grp.cos_q, grp.sin_q, grp.mask
    if grp.local is not None and arch.is_local(i):
        cos, sin, cos_q, sin_q, mask = grp.local
    q = _rope(b, q, cos_q, sin_q, half)  # [B, nh, T, d], already scaled by 1/sqrt(d)
    k_t = b.op("Transpose", [_rope(b, k, cos, sin, half)], out=pre + new_key(i),
               perm=[0, 1, 3, 2])  # [B, kvh, d, T], the layout of the key cache

    # Grouped-query attention without repeating K/V: the heads of one group share a kv head
    # through a broadcast batch dimension, [B, kvh, g, T, .] x [B, kvh, 1, ., .]. With one new
    # token (T = 1) each head's product is a matrix-vector product whose long side is the cache,
    # read in place in the layout it is stored in: keys [B, kvh, d, C] for the scores, values
    # [B, kvh, C, d] for the output. onnxruntime runs those as its GEMV kernel; the transposed
    # orientation ([C, d] x [d, g]) pads the narrow side to a full GEMM tile and costs twice as
    # much per cached token. Each sequence reads only its own cache row.
    axes2 = c("axes_2", np.array([2], np.int64))
    qg = b.op("Reshape", [q, shapes["qg"]])  # [B, kvh, g, T, d]
    s_past = b.op("MatMul", [qg, b.op("Unsqueeze", [pre + past_key(i), axes2])])
    s_new = b.op("MatMul", [qg, b.op("Unsqueeze", [k_t, axes2])])  # [B, kvh, g, T, T]
    s = b.op("Add", [b.op("Concat", [s_past, s_new], axis=-1), mask])
    probs = b.op("Softmax", [s], axis=-1)
    p_past, p_new = b.ops("Split", [probs, grp.split_sizes], 2, axis=-1)
    o = b.op("Add", [b.op("MatMul", [p_past, b.op("Unsqueeze", [pre + past_value(i), axes2])]),
                     b.op("MatMul", [p_new, b.op("Unsqueeze", [v, axes2])])])  # [B, kvh, g, T, d]
    o = b.op("Reshape", [o, shapes["heads"]])  # [B, nh, T, d]
    o = b.op("Transpose", [o], perm=perm)  # [B, T, nh, d]
    return b.op("Reshape", [o, c("shape_flat", np.array([-1, arch.num_heads * d]))])
