"""Pure helpers over an ``Arch``: which tensors a layer range needs, how to cut layers into
stages, and how much memory a stage needs. No I/O; the importer, the runtime, ``inspect`` and
(later) the shard planner all call these.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from meshd.engine.arch import Arch
from meshd.errors import LocalError

EMBED = "model.embed_tokens.weight"
FINAL_NORM = "model.norm.weight"
LM_HEAD = "lm_head.weight"
FP32_BYTES = 4
# Typical stored bytes per weight of a quantized model: codes, a float32 scale, a zero point and
# (for llama.cpp's Q4_1/Q4_K) a float32 minimum per block of 32
QUANT_BYTES_PER_VALUE = {"int4": 0.5 + 9 / 32, "int8": 1 + 5 / 32}
# The companions stored beside a 4/8-bit tensor NAME, as NAME + suffix (``.mins`` optional)
QUANT_PARTS = (".scales", ".zero_points", ".mins")


def layer_tensors(arch: Arch, i: int) -> list[tuple[str, tuple[int, ...]]]:
    """(Hugging Face name, shape) of every tensor of decoder layer ``i``."""
    h, d, inter = arch.hidden_size, arch.head_dim, arch.intermediate_size
    q, kv = arch.num_heads * d, arch.num_kv_heads * d
    p = f"model.layers.{i}."
    out: list[tuple[str, tuple[int, ...]]] = [
        (p + "input_layernorm.weight", (h,)),
        (p + "self_attn.q_proj.weight", (q, h)),
        (p + "self_attn.k_proj.weight", (kv, h)),
        (p + "self_attn.v_proj.weight", (kv, h)),
        (p + "self_attn.o_proj.weight", (h, q)),
        (p + "post_attention_layernorm.weight", (h,)),
        (p + "mlp.gate_proj.weight", (inter, h)),
        (p + "mlp.up_proj.weight", (inter, h)),
        (p + "mlp.down_proj.weight", (h, inter)),
    ]
    if arch.qkv_bias:
        out += [(p + "self_attn.q_proj.bias", (q,)), (p + "self_attn.k_proj.bias", (kv,)),
                (p + "self_attn.v_proj.bias", (kv,))]
    if arch.o_bias:
        out.append((p + "self_attn.o_proj.bias", (h,)))
    if arch.mlp_bias:
        out += [(p + "mlp.gate_proj.bias", (inter,)), (p + "mlp.up_proj.bias", (inter,)),
                (p + "mlp.down_proj.bias", (h,))]
    if arch.qk_norm:
        out += [(p + "self_attn.q_norm.weight", (d,)), (p + "self_attn.k_norm.weight", (d,))]
    if arch.sandwich_norm:
        out += [(p + "pre_feedforward_layernorm.weight", (h,)),
                (p + "post_feedforward_layernorm.weight", (h,))]
    return out


def model_tensors(arch: Arch) -> list[tuple[str, tuple[int, ...]]]:
    """Every tensor the whole model needs, in storage order."""
    out: list[tuple[str, tuple[int, ...]]] = [(EMBED, (arch.vocab_size, arch.hidden_size))]
    for i in range(arch.num_layers):
        out += layer_tensors(arch, i)
    out.append((FINAL_NORM, (arch.hidden_size,)))
    if not arch.tie_word_embeddings:
        out.append((LM_HEAD, (arch.vocab_size, arch.hidden_size)))
    return out


def stage_tensor_names(arch: Arch, start: int, end: int) -> list[str]:
    """Names of the tensors that the stage of layers ``[start, end)`` reads."""
    check_range(arch.num_layers, start, end)
    names: list[str] = []
    if start == 0:
        names.append(EMBED)
    for i in range(start, end):
        names += [n for n, _ in layer_tensors(arch, i)]
    if end == arch.num_layers:
        names.append(FINAL_NORM)
        head = EMBED if arch.tie_word_embeddings else LM_HEAD
        if head not in names:
            names.append(head)
    return names


def check_range(num_layers: int, start: int, end: int) -> None:
    if not (0 <= start < end <= num_layers):
        raise LocalError(f"layer range [{start}, {end}) is not inside [0, {num_layers})")


def plan_stages(num_layers: int, n: int) -> list[tuple[int, int]]:
    """Cut ``num_layers`` into ``n`` contiguous ranges whose sizes differ by at most one
    (the larger ranges first)."""
    if not 1 <= n <= num_layers:
        raise LocalError(f"cannot cut {num_layers} layers into {n} stages")
    base, extra = divmod(num_layers, n)
    out, start = [], 0
    for k in range(n):
        size = base + (1 if k < extra else 0)
        out.append((start, start + size))
        start += size
    return out


# Tokens per onnxruntime run when a long input (a prompt) is prefilled: bounds the attention
# score buffers, which are [heads, chunk, cached tokens].
PREFILL_CHUNK_TOKENS = 128
# What one onnxruntime CPU session costs before any weights (measured: about 10 MiB).
RUNTIME_OVERHEAD_BYTES = 10 * 2**20
# Score-sized buffers alive at once in one layer's attention (scores, joined, masked, softmax,
# the two halves of the split).
_SCORE_BUFFERS = 6
# The allocator's arena grows in steps, so working buffers are counted twice.
_ARENA_SLACK = 2


@dataclass(frozen=True, slots=True)
class StageMemory:
    """Estimated bytes a stage needs (see docs/model-format.md, "Memory estimate").

    Weights are counted as float32 because every stage computes in float32 (float16 weights
    are widened once, when the session is built)."""

    weights_bytes: int
    load_bytes: int
    kv_bytes_per_token: int
    score_bytes_per_token: int
    work_bytes: int
    overhead_bytes: int = RUNTIME_OVERHEAD_BYTES

    def total(self, tokens: int) -> int:
        """Peak bytes of a session holding ``tokens`` tokens, prefilled in chunks."""
        return (self.overhead_bytes + self.weights_bytes + self.load_bytes + self.work_bytes
                + (self.kv_bytes_per_token + self.score_bytes_per_token) * tokens)

    def to_json(self) -> dict[str, int]:
        return {"weights_bytes": self.weights_bytes, "load_bytes": self.load_bytes,
                "kv_bytes_per_token": self.kv_bytes_per_token,
                "score_bytes_per_token": self.score_bytes_per_token,
                "work_bytes": self.work_bytes, "overhead_bytes": self.overhead_bytes}


def stage_memory(arch: Arch, start: int, end: int, dtype: str = "fp32",
                 stored: Mapping[str, tuple[str, int]] | None = None) -> StageMemory:
    """The estimate for layers ``[start, end)`` whose weights are stored as ``dtype``.

    ``stored`` (name -> (tensor dtype, bytes), every tensor of the weights file) makes it
    exact for 4/8-bit models, whose matrices stay at their stored width in memory; without it
    a quantized model is estimated from typical bytes per value."""
    shapes = dict(model_tensors(arch))
    names = stage_tensor_names(arch, start, end)
    numel = sum(_numel(shapes[n]) for n in names)
    if stored is not None:
        parts = [stored[n + part] for n in names for part in ("", *QUANT_PARTS)
                 if n + part in stored]
        # float16 weights are read as they are stored, then widened: the stored copy stays
        # counted (the allocator rarely hands it back to the system).
        load = sum(nbytes for kind, nbytes in parts if kind == "fp16")
        weights = sum(nbytes * (2 if kind == "fp16" else 1) for kind, nbytes in parts)
    elif dtype in QUANT_BYTES_PER_VALUE:
        load, weights = 0, int(numel * QUANT_BYTES_PER_VALUE[dtype])
    else:
        weights = numel * FP32_BYTES
        load = 0 if dtype == "fp32" else numel * 2
    kv = 2 * (end - start) * arch.num_kv_heads * arch.head_dim * FP32_BYTES
    chunk = PREFILL_CHUNK_TOKENS
    scores = _SCORE_BUFFERS * arch.num_heads * chunk * FP32_BYTES
    # Live activations of one layer per token of a chunk: the residual, the normed input, q/k/v
    # and the attention output, and the three MLP buffers.
    q = arch.num_heads * arch.head_dim
    per_token = (4 * arch.hidden_size + 3 * q + 3 * arch.intermediate_size) * FP32_BYTES
    return StageMemory(weights, load, kv, scores, _ARENA_SLACK * chunk * per_token)


# Below this many float32 weight bytes a stage runs on one intra-op thread: its ops are so small
# that waking more threads costs more than it saves (measured on the shipped model).
SINGLE_THREAD_WEIGHTS_BYTES = 64 * 2**20


def default_threads(weights_bytes: int) -> int:
    """onnxruntime intra-op threads for a stage when the caller names none (0: onnxruntime's
    own default, one per physical core)."""
    return 1 if weights_bytes < SINGLE_THREAD_WEIGHTS_BYTES else 0


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n
