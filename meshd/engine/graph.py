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
  logits); per layer ``i`` of the range ``past_key.i`` and ``past_value.i`` float32
  [B, kv_heads, C, head_dim]: row ``s`` is sequence ``s``'s cache, of which only the first
  ``P_s`` slots are read. ``T > 1`` with ``B > 1`` only when no sequence has cached anything.
- outputs: ``hidden_out`` float32 [B, T, H] or ``logits`` float32 [K, V]; per layer
  ``present_key.i`` and ``present_value.i``, the same buffers as ``past_key.i`` and
  ``past_value.i`` with the new tokens' keys (after RoPE) and values written at slots
  ``P_s..P_s+T-1``: the caller binds each present output to its past input's buffer
  (onnxruntime's IO binding), so the cache is updated in place and nothing of size ``C`` is
  copied.

A decode step of a batch is ``T = 1``; a prefill chunk of one prompt is ``B = 1``. The weight
products (every ``Gemm``/``MatMulNBits``) run over all ``B*T`` rows at once, which is where
batching gains: a decode step of a larger model is bound by reading the weights, once per step
for the whole batch.

Attention is onnxruntime's ``GroupQueryAttention`` contrib operator, one node a layer: RoPE
(from cos/sin tables of every position, folded when the session is built), the causal mask,
each sequence's own length (``seqlens_k``, from ``positions``), a sliding window for local
layers, grouped kv heads without repeating them, and the write into the shared cache buffer.
(The same attention as standard ops took about 35 nodes a layer; on a small model's decode step
each node's dispatch cost more than its arithmetic.) ``KV_LAYOUT`` names this layout; a stage
graph file built for another layout is rebuilt from the weights at load.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

import numpy as np
import onnx
from onnx import TensorProto, helper

from meshd.engine import q4kernel
from meshd.engine.arch import Arch, rope_inv_freq
from meshd.engine.planning import EMBED, FINAL_NORM, LM_HEAD, QUANT_PARTS, check_range
from meshd.modeldir.manifest import TensorEntry
from meshd.modeldir.onnx_graph import IR_VERSION, OPSET, GraphBuilder

KV_LAYOUT = "4"  # keys and values [B, kvh, C, d], updated in place (present = past buffer)
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
# What a stage graph computes beyond its KV layout, stored in the graph as GRAPH_VERSION_KEY: a
# stage graph file of another version is rebuilt from the weights at load. "3": the head's
# product runs on split activations (QuantGraphBuilder.matmul's ``split_activations``) where
# ``split_head`` says so ("2": always).
GRAPH_VERSION, GRAPH_VERSION_KEY = "3", "meshd.graph_version"
# The split runs the head over twice the rows: its cost grows with the head's share of a step.
# It is taken where the head holds at most this share of the model's weights (SmolLM2-135M 21%:
# about 5% of a lone stream's decode for perplexity 1.0097 of llama.cpp's, against 1.0108;
# Gemma 3 270M, its 262k-token vocabulary 63%: 7-20% for 0.9999 against 1.0005).
SPLIT_HEAD_MAX_SHARE = 0.5


def past_key(i: int) -> str:
    return f"past_key.{i}"


def past_value(i: int) -> str:
    return f"past_value.{i}"


def present_key(i: int) -> str:
    return f"present_key.{i}"


def present_value(i: int) -> str:
    return f"present_value.{i}"


class QuantGraphBuilder(GraphBuilder):
    """A stage graph's builder: ``GraphBuilder`` (meshd.modeldir.onnx_graph) with weight
    products over 4/8-bit blocks (MatMulNBits)."""

    def __init__(self, tensors: Mapping[str, TensorEntry], weights_file: str, *,
                 q4_kernel: bool = False) -> None:
        super().__init__(tensors, weights_file)
        self.block_sums: dict[tuple[str, int], str] = {}
        self.uses_contrib = False
        # 4-bit blocks with minimums run as meshd's MatMulQ4 (meshd.engine.q4kernel)
        self.q4_kernel = q4_kernel
        self.uses_meshd = False

    def quantized(self, name: str) -> bool:
        """Whether ``name`` is stored as 4- or 8-bit blocks (meshd.engine.quant.Blockwise):
        ``name`` the packed codes, ``name.scales``, ``name.zero_points``, maybe ``name.mins``."""
        return self.tensors[name].dtype in ("q4", "q8")

    def matmul(self, x: str, name: str, bias: str | None = None, out: str | None = None, *,
               split_activations: bool = False) -> str:
        """``x @ W.T (+ bias)`` for a weight ``W`` [N, K] stored as ``name``, in whatever form
        it is stored: a Gemm over float weights, or MatMulNBits over 4/8-bit blocks, plus the
        blocks' minimums as a second, 32x smaller product of x's block sums.

        ``split_activations`` (the head): MatMulNBits rounds x to int8 per block; this runs it
        over x's rows split in two, ``Q(x)`` (on that int8 grid, so rounded again unchanged)
        and the rest ``x - Q(x)`` (rounded on a grid ~254x finer), and adds the two products:
        float activations' precision from the int8 kernel, the weights read once."""
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
        split = split_activations and ACCURACY_LEVEL == 4
        # the kernel rounds activations to int8 per block: it is accuracy level 4's product
        if (self.q4_kernel and ACCURACY_LEVEL == 4 and bits == 4 and block == q4kernel.BLOCK
                and has_mins and not split):
            return self._matmul_q4(x, name, n, kb * block, bias, out)
        self.count += 1
        y = (out if out is not None and not has_mins and not split
             else f"matmulnbits_{self.count}_0")
        rows = self._int8_split(x, kb, block) if split else x
        ins = [rows, q, scales, zp] + (["", bias] if bias else [])
        self.nodes.append(helper.make_node(
            "MatMulNBits", ins, [y], name=f"MatMulNBits_{self.count}", domain=MS_DOMAIN,
            K=kb * block, N=n, bits=bits, block_size=block, accuracy_level=ACCURACY_LEVEL))
        if split:
            halves = self.op("Reshape", [y, self.const(f"halves_{n}", np.array([2, -1, n],
                                                                                 np.int64))])
            y = self.op("ReduceSum", [halves, self.const("axes_0", np.array([0], np.int64))],
                        keepdims=0, out=None if has_mins else out)
        if not has_mins:
            return y
        # y + sums @ mins.T in one Gemm (its C input)
        return self.op("Gemm", [self._block_sums(x, kb, block), self._stored(mins), y], out=out,
                       transB=1)

    def _matmul_q4(self, x: str, name: str, n: int, k: int, bias: str | None,
                   out: str | None) -> str:
        """MatMulQ4 over the stored codes, the scales and minimums as float16 (Casts of the
        stored float32 ones, folded when the session is built: exact for Q4_1's float16
        originals). The blocks' zero points are zero wherever there are minimums
        (meshd.engine.quant)."""
        self.uses_meshd = True
        self.count += 1
        half = [self.op("Cast", [self._stored(name + part)], to=TensorProto.FLOAT16)
                for part in (".scales", ".mins")]
        y = out if bias is None else None
        y = self.op(q4kernel.OP, [x, self._stored(name), *half], out=y, domain=q4kernel.DOMAIN,
                    K=k, N=n)
        return y if bias is None else self.op("Add", [y, bias], out=out)

    def _stored(self, name: str) -> str:
        """A stored tensor (external data), or the Concat that joins several
        (``matmuls``)."""
        if name in self.fp32 and "+" in name:
            return self.fp32[name]
        return self.raw(name)[0]

    def matmuls(self, x: str, names: list[str], biases: list[str | None], *,
                split: bool = True) -> list[str]:
        """``x @ W.T (+ bias)`` for several weights read from the same ``x`` (q, k and v; gate
        and up). Matrices stored as blocks of one kind run as one MatMulNBits over their rows
        joined (onnxruntime folds the Concat of initializers when the session is built), whose
        output is split: fewer, larger kernels per layer. With ``split`` false a joined product
        comes back whole, as a list of one (the outputs side by side on the last axis)."""
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
        if not split:
            return [y]
        sizes = self.const("rows_" + "_".join(str(e.shape[0]) for e in entries),
                           np.array([e.shape[0] for e in entries], np.int64))
        return self.ops("Split", [y, sizes], len(names), axis=-1)

    def _int8_split(self, x: str, kb: int, block: int) -> str:
        """[M, K] -> [2M, K]: x's rows rounded to the int8 grid MatMulNBits rounds activations
        to (per block of ``block`` values, a step of the block's largest magnitude / 127), then
        what that rounding left off. Their products add up to x's but for the second rows'
        own rounding, about 1/254 of the first's. A block of zeros stays zeros."""
        c = self.const
        blocks = self.op("Reshape", [x, c(f"blocks_{kb}_{block}", np.array([-1, kb, block],
                                                                            np.int64))])
        step = self.op("Div", [self.op("ReduceMax", [self.op("Abs", [blocks])], axes=[-1],
                                       keepdims=1),
                               c("int8_max", np.array(127.0, np.float32))])
        codes = self.op("Round", [self.op("Div", [blocks, self.op("Max", [
            step, c("tiny_step", np.array(np.finfo(np.float32).tiny, np.float32))])])])
        grid = self.op("Reshape", [self.op("Mul", [codes, step]),
                                   c(f"split_rows_{kb * block}", np.array([-1, kb * block], np.int64))])
        return self.op("Concat", [grid, self.op("Sub", [x, grid])], axis=0)

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


def _elements(entry: TensorEntry) -> int:
    """Weight values a matrix holds (4/8-bit blocks [N, K / block, block bytes] counted as
    [N, K]); 0 for vectors."""
    if len(entry.shape) < 2:
        return 0
    n = int(np.prod(entry.shape))
    return n * 2 if entry.dtype == "q4" else n


def split_head(tensors: Mapping[str, TensorEntry], head: str) -> bool:
    """Whether the head's product runs on split activations: where its weights are at most
    ``SPLIT_HEAD_MAX_SHARE`` of the model's (the whole model's tensors, so that every stage
    and node decides alike)."""
    total = sum(_elements(t) for name, t in tensors.items()
                if not name.endswith(QUANT_PARTS) and "+" not in name)
    return total > 0 and _elements(tensors[head]) <= SPLIT_HEAD_MAX_SHARE * total


def build_stage_graph(arch: Arch, tensors: Mapping[str, TensorEntry], start: int, end: int,
                      weights_file: str = "weights.bin", *, fused: bool = False,
                      q4_kernel: bool = False) -> onnx.ModelProto:
    """The ONNX model of layers ``[start, end)``; weights are external references into
    ``weights_file`` (resolved by onnxruntime relative to the model directory).

    ``fused`` (whole models only) adds a second group of inputs, one prompt chunk
    (``chunk_ids`` [B', T'] with B' 1, or 0 for none; ``chunk_positions``, ``chunk.past_key.i``
    / ``chunk.past_value.i`` against its own cache; outputs ``chunk.present_key.i`` /
    ``chunk.present_value.i``): the weight products run over the decoding rows and the chunk's
    rows together, attention runs per group, and ``logit_rows`` index the B*T decoding rows
    followed by the chunk's T' rows. The chunk's attention sits in an ``If`` on whether there is
    a chunk: a run without one (B' = 0) adds no row to the products, where a one-token idle
    chunk made every lone stream's step 15% slower (onnxruntime's attention takes no empty
    batch: it fails on zero tokens and divides by zero on zero sequences)."""
    check_range(arch.num_layers, start, end)
    first, last = start == 0, end == arch.num_layers
    if fused and not (first and last):
        raise ValueError("a fused graph covers a whole model")
    b = QuantGraphBuilder(tensors, weights_file, q4_kernel=q4_kernel)
    h_dim, d, kvh = arch.hidden_size, arch.head_dim, arch.num_kv_heads
    i64 = np.int64
    c = b.const
    prefixes = ["", CHUNK] if fused else [""]

    inputs = [helper.make_tensor_value_info(POSITIONS, TensorProto.INT64, ["B", "T"])]
    if first:
        inputs.insert(0, helper.make_tensor_value_info(INPUT_IDS, TensorProto.INT64, ["B", "T"]))
        ids = b.op("Reshape", [INPUT_IDS, c("flat", np.array([-1], i64))])
        if fused:
            inputs += [helper.make_tensor_value_info(CHUNK_IDS, TensorProto.INT64, ["B2", "T2"]),
                       helper.make_tensor_value_info(CHUNK_POSITIONS, TensorProto.INT64,
                                                     ["B2", "T2"])]
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
        bn, cn = ("B", "C") if not pre else ("B2", "C2")
        for i in range(start, end):
            for name in (past_key(i), past_value(i)):
                inputs.append(helper.make_tensor_value_info(pre + name, TensorProto.FLOAT,
                                                            [bn, kvh, cn, d]))
            for name in (present_key(i), present_value(i)):
                outputs.append(helper.make_tensor_value_info(pre + name, TensorProto.FLOAT,
                                                             [bn, kvh, cn, d]))

    tables = _rope_tables(b, arch)
    groups = [_group(b, POSITIONS, "")]
    if fused:
        groups.append(_group(b, CHUNK_POSITIONS, CHUNK, optional=True))
        rows = b.op("Concat", [groups[0].rows, groups[1].rows], axis=0)  # split of x's rows
    for i in range(start, end):
        x = _layer(b, arch, i, x, groups, rows if fused else None, tables)

    if last:
        x = b.op("Gather", [x, LOGIT_ROWS], axis=0)
        x = _rms_norm(b, x, b.weight(FINAL_NORM), arch.rms_norm_eps)
        head = EMBED if arch.tie_word_embeddings else LM_HEAD
        b.matmul(x, head, out=LOGITS, split_activations=split_head(tensors, head))
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
    if b.uses_meshd:
        opsets.append(helper.make_opsetid(q4kernel.DOMAIN, 1))
    model = helper.make_model(graph, opset_imports=opsets, producer_name="meshd")
    model.ir_version = IR_VERSION
    helper.set_model_props(model, {KV_LAYOUT_KEY: KV_LAYOUT, GRAPH_VERSION_KEY: GRAPH_VERSION})
    return model



@dataclass(frozen=True)
class _Group:
    """The names one group of sequences' attention uses in every layer (a fused graph has two:
    the decoding rows and the prompt chunk, each against its own cache)."""

    prefix: str  # of its cache inputs and present outputs
    seqlens: str  # int32 [B]: each sequence's cached tokens after this step, minus one
    total: str  # int32 scalar: the longest sequence's tokens after this step
    rows3: str  # [3]: B, T, -1, the shape its rows of x take as [B, T, width]
    rows: str  # [1]: B*T, its rows of x
    b_len: str
    t_len: str
    present: str | None = None  # bool [1], a group that may have no rows: whether it has any


def _group(b: QuantGraphBuilder, positions: str, prefix: str, *,
           optional: bool = False) -> _Group:
    """The per-step values one group's attention needs (``positions`` [B, T]): each sequence's
    length from its last position, and the shape its rows take. An ``optional`` group may have
    no rows (B = 0): its longest length is then 1, not an empty maximum, and ``present`` says
    whether it has rows."""
    c, i64 = b.const, np.int64
    bt = b.op("Shape", [positions])  # [2]: B, T
    b_len = b.op("Slice", [bt, c("zero", np.array([0], i64)), c("one", np.array([1], i64))])
    t_len = b.op("Slice", [bt, c("one", np.array([1], i64)), c("two", np.array([2], i64))])
    last = b.op("ReduceMax", [positions], axes=[1], keepdims=0)  # [B]: P_s + T - 1
    seqlens = b.op("Cast", [last], to=TensorProto.INT32)
    longest = b.op("Concat", [last, c("zero", np.array([0], i64))], axis=0) if optional else last
    total = b.op("Cast", [b.op("Add", [b.op("ReduceMax", [longest], keepdims=0),
                                       c("one_s", np.array(1, i64))])], to=TensorProto.INT32)
    rows3 = b.op("Concat", [b_len, t_len, c("dims_-1", np.array([-1], i64))], axis=0)
    rows = b.op("Mul", [b_len, t_len])
    present = b.op("Cast", [rows], to=TensorProto.BOOL) if optional else None
    return _Group(prefix, seqlens, total, rows3, rows, b_len, t_len, present)


def _rope_tables(b: QuantGraphBuilder, arch: Arch) -> dict[str, tuple[str, str]]:
    """cos and sin [positions, head_dim / 2] of every position of the context (global layers
    under ``"global"``, a model's sliding-window layers under ``"local"``): computed from
    constants, so onnxruntime folds them into initializers when the session is built and the
    graph file stays small."""
    c = b.const
    n = arch.max_position_embeddings
    pos = b.op("Cast", [b.op("Range", [c("zero_s", np.array(0, np.int64)),
                                       c(f"ctx_{n}", np.array(n, np.int64)),
                                       c("one_s", np.array(1, np.int64))])], to=TensorProto.FLOAT)
    pos = b.op("Unsqueeze", [pos, c("axes_1", np.array([1], np.int64))])  # [P, 1]
    out = {}
    kinds = [("global", rope_inv_freq(arch))]
    if arch.sliding_window:
        kinds.append(("local", rope_inv_freq(arch, local=True)))
    for kind, inv in kinds:
        freqs = b.op("Mul", [pos, c(f"rope_inv_freq_{kind}", inv)])  # [P, d/2]
        out[kind] = (b.op("Cos", [freqs]), b.op("Sin", [freqs]))
    return out


def _rms_norm(b: QuantGraphBuilder, x: str, w: str, eps: float) -> str:
    """RMSNorm over the last axis, as onnxruntime's SimplifiedLayerNormalization (a contrib
    operator of the default domain): one node, where Pow/ReduceMean/Sqrt/Div/Mul was five that
    onnxruntime fused only where the normed value had one consumer."""
    return b.op("SimplifiedLayerNormalization", [x, w], axis=-1, epsilon=float(eps))


def _add_rms_norm(b: QuantGraphBuilder, x: str, y: str, w: str, eps: float
                  ) -> tuple[str, str]:
    """RMSNorm of x + y, and x + y: onnxruntime's SkipSimplifiedLayerNormalization (contrib),
    one node where an Add and a norm were two."""
    b.uses_contrib = True
    b.count += 1
    normed, total = f"skipnorm_{b.count}_0", f"skipnorm_{b.count}_3"
    b.nodes.append(helper.make_node("SkipSimplifiedLayerNormalization", [x, y, w],
                                    [normed, "", "", total], name=f"SkipNorm_{b.count}",
                                    domain=MS_DOMAIN, epsilon=float(eps)))
    return normed, total


def _linears(b: QuantGraphBuilder, x: str, prefixes: list[str], bias: bool, *,
             split: bool = True) -> list[str]:
    return b.matmuls(x, [p + ".weight" for p in prefixes],
                     [b.weight(p + ".bias") if bias else None for p in prefixes], split=split)


def _linear(b: QuantGraphBuilder, x: str, prefix: str, bias: bool) -> str:
    return b.matmul(x, prefix + ".weight", b.weight(prefix + ".bias") if bias else None)


def _layer(b: QuantGraphBuilder, arch: Arch, i: int, x: str, groups: list[_Group],
           rows: str | None, tables: dict[str, tuple[str, str]]) -> str:
    """One decoder layer over x [N, H]: the weight products over all N rows at once, attention
    per group (``rows``: how x's rows split between the groups, when there are two). The
    attention's residual sum and the next norm are one node; the layer's last sum stays an Add,
    so that a layer's arithmetic is the same wherever a stage boundary falls."""
    p = f"model.layers.{i}."
    eps = arch.rms_norm_eps
    h = _rms_norm(b, x, b.weight(p + "input_layernorm.weight"), eps)
    # q, k and v, or the three packed side by side (one product, no Split), which the attention
    # takes as they are unless q and k are normed first
    qkv: list[str | None] = list(_linears(
        b, h, [p + "self_attn." + n for n in ("q_proj", "k_proj", "v_proj")], arch.qkv_bias,
        split=arch.qk_norm))
    if len(qkv) == 1:
        qkv += [None, None]
    if arch.qk_norm:
        q, k = qkv[0], qkv[1]
        assert q is not None and k is not None
        qkv[0] = _head_norm(b, q, b.weight(p + "self_attn.q_norm.weight"), arch.head_dim, eps)
        qkv[1] = _head_norm(b, k, b.weight(p + "self_attn.k_norm.weight"), arch.head_dim, eps)
    q, k, v = qkv
    assert q is not None
    if rows is None:
        o = _attention(b, arch, i, q, k, v, groups[0], tables)
    else:
        n = len(groups)
        qs = b.ops("Split", [q, rows], n, axis=0)
        ks: list[str | None] = [None] * n
        vs: list[str | None] = [None] * n
        if k is not None and v is not None:
            ks, vs = list(b.ops("Split", [k, rows], n, axis=0)), list(b.ops("Split", [v, rows], n, axis=0))
        o = b.op("Concat", [_attention(b, arch, i, qq, kk, vv, grp, tables)
                            for qq, kk, vv, grp in zip(qs, ks, vs, groups, strict=True)], axis=0)
    o = _linear(b, o, p + "self_attn.o_proj", arch.o_bias)
    if arch.sandwich_norm:  # Gemma: the attention's output is normed before the residual
        o = _rms_norm(b, o, b.weight(p + "post_attention_layernorm.weight"), eps)
        h, x = _add_rms_norm(b, x, o, b.weight(p + "pre_feedforward_layernorm.weight"), eps)
    else:
        h, x = _add_rms_norm(b, x, o, b.weight(p + "post_attention_layernorm.weight"), eps)
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


def _attention(b: QuantGraphBuilder, arch: Arch, i: int, q: str, k: str | None, v: str | None,
               grp: _Group, tables: dict[str, tuple[str, str]]) -> str:
    """One group's attention in layer ``i``: q [N, nh*d] and k, v [N, kvh*d] of its rows (or q
    the three packed side by side [N, (nh+2kvh)*d] and k, v None); writes the new keys and values
    into the cache (the present outputs) and returns [N, nh*d]. An optional group's attention
    runs under an ``If`` on whether it has rows; without rows it returns [0, nh*d] and its cache
    as it was."""
    width = arch.num_heads * arch.head_dim
    shape_heads = b.const(f"shape_heads_{width}", np.array([-1, width], np.int64))
    if grp.present is None:
        nodes, o, _ = _attention_nodes(b, arch, i, q, k, v, grp, tables)
        b.nodes += nodes
        return b.op("Reshape", [o, shape_heads])
    pre = grp.prefix
    nodes, o, present = _attention_nodes(b, arch, i, q, k, v, grp, tables, outputs=False)
    nodes.append(helper.make_node("Reshape", [o, shape_heads], [o + "_rows"]))
    then = helper.make_graph(nodes, f"{pre}attention_{i}", [],
                             [_any_float(o + "_rows"), *map(_any_float, present)])
    empty = f"{pre}attention_{i}_none"
    otherwise = helper.make_graph(
        [helper.make_node("Constant", [], [empty], value=helper.make_tensor(
            empty, TensorProto.FLOAT, [0, width], [])),
         *(helper.make_node("Identity", [pre + past(i)], [f"{pre}kept_{past(i)}"])
           for past in (past_key, past_value))],
        f"{pre}no_attention_{i}", [],
        [_any_float(empty),
         *(_any_float(f"{pre}kept_{past(i)}") for past in (past_key, past_value))])
    b.count += 1
    out = f"attention_{b.count}"
    b.nodes.append(helper.make_node(
        "If", [grp.present], [out, pre + present_key(i), pre + present_value(i)],
        name=f"If_{b.count}", then_branch=then, else_branch=otherwise))
    return out


def _any_float(name: str) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, None)


def _attention_nodes(b: QuantGraphBuilder, arch: Arch, i: int, q: str, k: str | None,
                     v: str | None, grp: _Group, tables: dict[str, tuple[str, str]], *,
                     outputs: bool = True) -> tuple[list[onnx.NodeProto], str, list[str]]:
    """The nodes of one group's attention (its rows reshaped, GroupQueryAttention), its output
    [B, T, nh*d] and its present caches: the graph's outputs, or (``outputs`` false, inside an
    ``If``) names of their own."""
    local = arch.sliding_window and arch.is_local(i)
    cos, sin = tables["local" if local else "global"]
    pre = grp.prefix
    b.count += 1
    n = b.count
    nodes, ins = [], []
    for j, t in enumerate((q, k, v)):
        if t is None:
            ins.append("")
            continue
        shaped = f"reshape_{n}_{j}"
        nodes.append(helper.make_node("Reshape", [t, grp.rows3], [shaped],
                                      name=f"Reshape_{n}_{j}"))
        ins.append(shaped)
    ins += [pre + past_key(i), pre + past_value(i), grp.seqlens, grp.total, cos, sin]
    o = f"attention_{n}"
    present = ([pre + present_key(i), pre + present_value(i)] if outputs
               else [f"{pre}present_key_{n}", f"{pre}present_value_{n}"])
    nodes.append(helper.make_node(
        "GroupQueryAttention", ins, [o, *present], name=f"GroupQueryAttention_{n}",
        domain=MS_DOMAIN, num_heads=arch.num_heads, kv_num_heads=arch.num_kv_heads, do_rotary=1,
        rotary_interleaved=0, local_window_size=arch.sliding_window if local else -1))
    b.uses_contrib = True
    return nodes, o, present
