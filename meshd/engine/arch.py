"""Architecture figures of a Llama-family model, read from a Hugging Face ``config.json``.

``parse_hf_config`` is a pure function: a dict in, an ``Arch`` or a ``ModelError`` naming the
field out. ``rope_inv_freq`` turns the RoPE settings (including Llama 3 frequency scaling) into
the inverse frequencies that the stage graphs embed as a constant.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from meshd.errors import ModelError
from meshd.modeldir.arch import arch_from_json, check_positive_ints

# Hugging Face ``architectures`` entries we import, and the family each one maps to.
SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
}
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")
# onnxruntime's GroupQueryAttention (meshd.engine.graph) takes head sizes of multiples of 16
HEAD_DIM_MULTIPLE = 16
ACTIVATIONS = ("silu", "gelu_tanh")
# Our field names where Hugging Face's config.json spells them differently.
HF_FIELD_NAMES = {"num_layers": "num_hidden_layers", "num_heads": "num_attention_heads",
                  "num_kv_heads": "num_key_value_heads"}


@dataclass(frozen=True, slots=True)
class Arch:
    """The figures a stage graph needs. Names follow the manifest (see docs/model-format.md)."""

    arch: str
    num_layers: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    max_position_embeddings: int
    rope_theta: float
    rms_norm_eps: float
    tie_word_embeddings: bool
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    rope_scaling: dict[str, Any] | None = field(default=None)
    # Gemma 3 (from GGUF; Llama and Qwen2 keep the defaults): the MLP's activation ("silu" or
    # "gelu_tanh"), RMSNorm of each head's q and k, norms after attention and after the MLP as
    # well as before, the embedding multiplied by embed_scale, and local layers: all but every
    # global_every-th layer attend to the last sliding_window positions only, with RoPE base
    # rope_local_theta (0: no local layers)
    act: str = "silu"
    qk_norm: bool = False
    sandwich_norm: bool = False
    embed_scale: float = 1.0
    sliding_window: int = 0
    global_every: int = 0
    rope_local_theta: float = 0.0

    def is_local(self, layer: int) -> bool:
        """Whether ``layer`` attends only within the sliding window (Gemma 3: five local
        layers, then one global)."""
        return bool(self.sliding_window) and (layer + 1) % self.global_every != 0

    @property
    def group_size(self) -> int:
        return self.num_heads // self.num_kv_heads

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any], source: str = "manifest.json") -> Arch:
        return arch_from_json(cls, data, source)

    def validate(self, source: str, names: dict[str, str] | None = None) -> None:
        """Raise ``ModelError`` naming the bad field (spelled as in ``names``, if given)."""
        names = names or {}
        check_positive_ints(self, ("num_layers", "hidden_size", "intermediate_size", "num_heads",
                                   "num_kv_heads", "head_dim", "vocab_size",
                                   "max_position_embeddings"), source, names)
        if self.num_heads % self.num_kv_heads:
            raise ModelError(
                f"{source}: num_attention_heads={self.num_heads} is not a multiple of "
                f"num_key_value_heads={self.num_kv_heads}"
            )
        if self.head_dim % HEAD_DIM_MULTIPLE:
            raise ModelError(f"{source}: head_dim={self.head_dim} is not a multiple of "
                             f"{HEAD_DIM_MULTIPLE}, which onnxruntime's attention operator "
                             "(GroupQueryAttention) needs")
        if not self.rms_norm_eps > 0:
            raise ModelError(f"{source}: rms_norm_eps={self.rms_norm_eps!r} must be positive")
        if not self.rope_theta > 0:
            raise ModelError(f"{source}: rope_theta={self.rope_theta!r} must be positive")
        if self.rope_scaling is not None:
            _check_rope_scaling(self.rope_scaling, source)
        if self.act not in ACTIVATIONS:
            raise ModelError(f"{source}: act={self.act!r} is not supported "
                             f"({', '.join(ACTIVATIONS)})")
        if self.sliding_window and (self.global_every < 1 or not self.rope_local_theta > 0):
            raise ModelError(f"{source}: sliding_window needs global_every >= 1 and "
                             "rope_local_theta > 0")


def parse_hf_config(cfg: dict[str, Any], source: str = "config.json") -> Arch:
    """Read a Hugging Face config dict; raise ``ModelError`` naming the unsupported field."""
    archs = cfg.get("architectures")
    if not isinstance(archs, list) or not archs:
        raise ModelError(f"{source}: field 'architectures' is missing")
    family = SUPPORTED_ARCHITECTURES.get(archs[0])
    if family is None:
        raise ModelError(
            f"{source}: architectures={archs[0]!r} is not supported "
            f"(supported: {', '.join(sorted(SUPPORTED_ARCHITECTURES))})"
        )
    act = cfg.get("hidden_act", "silu")
    if act != "silu":
        raise ModelError(f"{source}: hidden_act={act!r} is not supported (only 'silu')")
    if cfg.get("use_sliding_window"):
        raise ModelError(f"{source}: use_sliding_window=true is not supported")
    if cfg.get("pretraining_tp", 1) not in (1, None):
        raise ModelError(f"{source}: pretraining_tp={cfg['pretraining_tp']!r} is not supported")

    def need(name: str) -> Any:
        if name not in cfg:
            raise ModelError(f"{source}: field {name!r} is missing")
        return cfg[name]

    hidden = need("hidden_size")
    heads = need("num_attention_heads")
    head_dim = cfg.get("head_dim") or (hidden // heads if isinstance(hidden, int) and heads else 0)
    attention_bias = bool(cfg.get("attention_bias", False))
    qwen = family == "qwen2"
    scaling = cfg.get("rope_scaling")
    if scaling is not None:
        if not isinstance(scaling, dict):
            raise ModelError(f"{source}: rope_scaling must be an object or null")
        scaling = _normalise_rope_scaling(scaling, source)
    arch = Arch(
        arch=family,
        num_layers=need("num_hidden_layers"),
        hidden_size=hidden,
        intermediate_size=need("intermediate_size"),
        num_heads=heads,
        num_kv_heads=cfg.get("num_key_value_heads") or heads,
        head_dim=head_dim,
        vocab_size=need("vocab_size"),
        max_position_embeddings=cfg.get("max_position_embeddings", 2048),
        rope_theta=float(cfg.get("rope_theta", 10000.0)),
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        qkv_bias=qwen or attention_bias,
        o_bias=attention_bias and not qwen,
        mlp_bias=bool(cfg.get("mlp_bias", False)),
        rope_scaling=scaling,
    )
    arch.validate(source, HF_FIELD_NAMES)
    return arch


def _normalise_rope_scaling(scaling: dict[str, Any], source: str) -> dict[str, Any] | None:
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "default":
        return None
    out = {k: v for k, v in scaling.items() if k != "type"}
    out["rope_type"] = kind
    _check_rope_scaling(out, source)
    return out


def _check_rope_scaling(scaling: dict[str, Any], source: str) -> None:
    kind = scaling.get("rope_type")
    if kind not in SUPPORTED_ROPE_TYPES:
        raise ModelError(
            f"{source}: rope_scaling.rope_type={kind!r} is not supported "
            f"(supported: {', '.join(SUPPORTED_ROPE_TYPES)})"
        )
    need = {"linear": ("factor",),
            "llama3": ("factor", "low_freq_factor", "high_freq_factor",
                       "original_max_position_embeddings")}.get(kind, ())
    for key in need:
        if not isinstance(scaling.get(key), int | float):
            raise ModelError(f"{source}: rope_scaling.{key} is missing or not a number")


def rope_inv_freq(arch: Arch, *, local: bool = False) -> np.ndarray:
    """Inverse RoPE frequencies [head_dim/2] as float32, with any frequency scaling applied
    (``local``: of a sliding-window layer, with its own base and no scaling)."""
    d = arch.head_dim
    theta = arch.rope_local_theta if local else arch.rope_theta
    inv = 1.0 / (theta ** (np.arange(0, d, 2, dtype=np.float64) / d))
    s = arch.rope_scaling
    if s is None or local:
        return inv.astype(np.float32)
    if s["rope_type"] == "linear":
        return (inv / float(s["factor"])).astype(np.float32)
    # llama3: leave high frequencies alone, divide low ones by factor, blend in between.
    factor = float(s["factor"])
    low, high = float(s["low_freq_factor"]), float(s["high_freq_factor"])
    old_ctx = float(s["original_max_position_embeddings"])
    low_wavelen, high_wavelen = old_ctx / low, old_ctx / high
    wavelen = 2 * math.pi / inv
    scaled = np.where(wavelen > low_wavelen, inv / factor, inv)
    smooth = (old_ctx / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    mid = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return np.where(mid, blended, scaled).astype(np.float32)
