"""A GGUF file read as a meshd model: its architecture figures, tensor names and vocabulary.

``arch_from_gguf`` is pure (metadata dict in, ``Arch`` out, or one ``ModelError`` line naming
what is unsupported); ``read_gguf_model`` reads the file's head (meshd.engine.gguf_meta) and
maps its tensors to Hugging Face names; their bytes are read through a memory map.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from meshd.engine.arch import Arch
from meshd.engine.gguf_meta import TensorInfo, read_gguf
from meshd.engine.gguf_vocab import GgufTokenizer, tokenizer_from_gguf
from meshd.engine.planning import EMBED, FINAL_NORM, LM_HEAD
from meshd.errors import ModelError
from meshd.modeldir.weights import file_sha256

FAMILIES = ("llama", "qwen2", "gemma3")

# Hugging Face tensor names (inside "model.layers.N.") -> GGUF names (inside "blk.N.")
_LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.weight": "attn_k.weight", "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight", "self_attn.o_proj.bias": "attn_output.bias",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
# Gemma 3's four norms a layer: around attention and around the MLP. Its GGUF names the norm
# after attention "post_attention_norm" and the one before the MLP "ffn_norm".
_GEMMA_LAYER_NAMES = {
    **_LAYER_NAMES,
    "post_attention_layernorm.weight": "post_attention_norm.weight",
    "pre_feedforward_layernorm.weight": "ffn_norm.weight",
    "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
}
_TOP_NAMES = {EMBED: "token_embd.weight", FINAL_NORM: "output_norm.weight",
              LM_HEAD: "output.weight"}
_LAYER = re.compile(r"model\.layers\.(\d+)\.(.+)")


def gguf_tensor_name(name: str, family: str = "llama") -> str:
    """The GGUF name of the Hugging Face tensor ``name``."""
    if name in _TOP_NAMES:
        return _TOP_NAMES[name]
    m = _LAYER.fullmatch(name)
    names = _GEMMA_LAYER_NAMES if family == "gemma3" else _LAYER_NAMES
    if m is None or m.group(2) not in names:
        raise ModelError(f"no GGUF name for tensor {name!r}")
    return f"blk.{m.group(1)}.{names[m.group(2)]}"


def arch_from_gguf(meta: Mapping[str, Any], tensor_names: set[str], source: str) -> Arch:
    """The ``Arch`` of a GGUF file from its metadata and the names of its tensors."""
    family = meta.get("general.architecture")
    if family not in FAMILIES:
        raise ModelError(f"{source}: general.architecture={family!r} is not supported "
                         f"(supported: {', '.join(FAMILIES)})")

    def need(key: str) -> Any:
        full = f"{family}.{key}"
        if full not in meta:
            raise ModelError(f"{source}: metadata {full} is missing")
        return meta[full]

    def opt(key: str, default: Any) -> Any:
        return meta.get(f"{family}.{key}", default)

    if "rope_freqs.weight" in tensor_names:
        raise ModelError(f"{source}: tensor rope_freqs.weight (Llama 3.1 RoPE frequency "
                         "factors) is not supported")
    scaling = opt("rope.scaling.type", "none")
    if scaling not in ("none", "linear"):
        raise ModelError(f"{source}: {family}.rope.scaling.type={scaling!r} is not supported "
                         "(none, linear)")
    hidden, heads = int(need("embedding_length")), int(need("attention.head_count"))
    kv_heads = opt("attention.head_count_kv", heads)
    if isinstance(kv_heads, list):
        raise ModelError(f"{source}: a per-layer {family}.attention.head_count_kv is not "
                         "supported")
    head_dim = int(opt("attention.key_length", hidden // heads))
    if int(opt("attention.value_length", head_dim)) != head_dim:
        raise ModelError(f"{source}: {family}.attention.value_length differs from key_length")
    vocab = meta.get(f"{family}.vocab_size") or len(meta.get("tokenizer.ggml.tokens") or [])
    gemma = family == "gemma3"
    extra: dict[str, Any] = {}
    if gemma:
        window = int(opt("attention.sliding_window", 0))
        extra = {"act": "gelu_tanh", "qk_norm": True, "sandwich_norm": True,
                 "embed_scale": float(np.float32(np.sqrt(hidden))),
                 "sliding_window": window, "global_every": 6 if window else 0,
                 "rope_local_theta": 10000.0}
    arch = Arch(
        arch=family,
        num_layers=int(need("block_count")),
        hidden_size=hidden,
        intermediate_size=int(need("feed_forward_length")),
        num_heads=heads,
        num_kv_heads=int(kv_heads),
        head_dim=head_dim,
        vocab_size=int(vocab),
        max_position_embeddings=int(opt("context_length", 2048)),
        rope_theta=float(opt("rope.freq_base", 10000.0)),
        rms_norm_eps=float(opt("attention.layer_norm_rms_epsilon", 1e-6)),
        tie_word_embeddings="output.weight" not in tensor_names,
        qkv_bias="blk.0.attn_q.bias" in tensor_names,
        o_bias="blk.0.attn_output.bias" in tensor_names,
        mlp_bias=False,
        rope_scaling=({"rope_type": "linear", "factor": float(need("rope.scaling.factor"))}
                      if scaling == "linear" else None),
        **extra,
    )
    arch.validate(source)
    return arch


def unpermute_rows(n_rows: int, n_heads: int) -> np.ndarray:
    """Row order that undoes llama.cpp's q/k permutation for interleaved RoPE: GGUF row
    ``2i + half`` of a head is Hugging Face row ``half * d/2 + i``."""
    d = n_rows // n_heads
    return np.arange(n_rows).reshape(n_heads, d // 2, 2).swapaxes(1, 2).reshape(n_rows)


_FLOAT_VIEWS = {"F32": "<f4", "F16": "<f2", "BF16": "<u2"}


@dataclass
class GgufTensor:
    """A tensor of the file: its GGML type name and its bytes (a memory map), as a float
    array for F32/F16 (BF16 as raw uint16) or raw bytes for block formats."""

    name: str
    type_name: str
    shape: tuple[int, ...]  # ggml order: the row length first
    data: np.ndarray


@dataclass
class GgufModel:
    path: Path
    family: str
    title: str
    file_type: int | None
    file_sha256: str
    arch: Arch
    vocab: GgufTokenizer
    _infos: dict[str, TensorInfo]
    _map: np.ndarray | None = None

    def tensor(self, gguf_name: str) -> GgufTensor:
        info = self._infos.get(gguf_name)
        if info is None:
            raise ModelError(f"{self.path.name}: tensor {gguf_name} is missing")
        if not info.nbytes:
            raise ModelError(f"{self.path.name}: tensor {gguf_name} has type {info.type_name}, "
                             "which meshd does not read")
        if self._map is None:
            self._map = np.memmap(self.path, np.uint8, "r")
        if info.start + info.nbytes > len(self._map):
            raise ModelError(f"{self.path.name}: tensor {gguf_name} runs past the end of the "
                             "file (truncated?)")
        raw = self._map[info.start:info.start + info.nbytes]
        view = _FLOAT_VIEWS.get(info.type_name)
        data = raw.view(view) if view else raw
        return GgufTensor(info.name, info.type_name, info.shape, data)

    def tensor_types(self) -> set[str]:
        return {t.type_name for t in self._infos.values()}

    def rows_permutation(self, name: str) -> np.ndarray | None:
        """For q and k of a ``llama`` GGUF, the row order back to Hugging Face layout."""
        if self.family != "llama":
            return None
        a = self.arch
        if name.endswith(("self_attn.q_proj.weight", "self_attn.q_proj.bias")):
            return unpermute_rows(a.num_heads * a.head_dim, a.num_heads)
        if name.endswith(("self_attn.k_proj.weight", "self_attn.k_proj.bias")):
            return unpermute_rows(a.num_kv_heads * a.head_dim, a.num_kv_heads)
        return None

    def close(self) -> None:
        self._map = None  # numpy unmaps it when the last view is gone


def read_gguf_model(path: Path) -> GgufModel:
    """Open a GGUF file: its metadata read and checked, its tensors located, not yet read."""
    meta, infos = read_gguf(path)
    tensors = {t.name: t for t in infos}
    arch = arch_from_gguf(meta, set(tensors), path.name)
    vocab = tokenizer_from_gguf(meta)
    if vocab.vocab_size > arch.vocab_size:
        raise ModelError(f"{path.name}: {vocab.vocab_size} tokens but the model's vocabulary "
                         f"has {arch.vocab_size} rows")
    return GgufModel(path, arch.arch, str(meta.get("general.name", "")),
                     meta.get("general.file_type"), file_sha256(path), arch, vocab, tensors)

