"""An independent NumPy reference of the Llama / Qwen2 forward pass, in float64.

It reads the Hugging Face checkpoint itself (``config.json`` and the ``safetensors`` package's
own numpy loader) and shares no code with ``meshd.engine``: per-head loops, K/V repeated per
query head, RoPE by ``rotate_half``, a full causal softmax. Slow and simple on purpose.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import load_file


def load_hf_weights(hf_dir: Path, round_fp16: bool = False) -> dict[str, np.ndarray]:
    files = [hf_dir / "model.safetensors"]
    index = hf_dir / "model.safetensors.index.json"
    if index.exists():
        files = sorted({hf_dir / f for f in json.loads(index.read_text())["weight_map"].values()})
    weights: dict[str, np.ndarray] = {}
    for f in files:
        for name, arr in load_file(str(f)).items():
            if round_fp16:
                arr = arr.astype(np.float16)
            weights[name] = arr.astype(np.float64)
    return weights


def inv_freq(cfg: dict[str, Any]) -> np.ndarray:
    d = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    base = cfg.get("rope_theta", 10000.0)
    freqs = np.array([1.0 / base ** (2 * i / d) for i in range(d // 2)])
    rs = cfg.get("rope_scaling")
    if not rs:
        return np.asarray(freqs)
    kind = rs.get("rope_type", rs.get("type"))
    if kind == "linear":
        return np.asarray(freqs / rs["factor"])
    assert kind == "llama3", kind
    out = []
    old = rs["original_max_position_embeddings"]
    for f in freqs:
        wavelen = 2 * math.pi / f
        if wavelen < old / rs["high_freq_factor"]:
            out.append(f)
        elif wavelen > old / rs["low_freq_factor"]:
            out.append(f / rs["factor"])
        else:
            smooth = (old / wavelen - rs["low_freq_factor"]) / (
                rs["high_freq_factor"] - rs["low_freq_factor"])
            out.append((1 - smooth) * f / rs["factor"] + smooth * f)
    return np.array(out)


class Reference:
    def __init__(self, hf_dir: Path, round_fp16: bool = False) -> None:
        self.cfg = json.loads((hf_dir / "config.json").read_text())
        self.w = load_hf_weights(hf_dir, round_fp16)

    def logits(self, ids: list[int]) -> np.ndarray:
        """Logits [T, V] for every position of ``ids`` (no cache: the whole sequence)."""
        cfg, w = self.cfg, self.w
        nh = cfg["num_attention_heads"]
        kvh = cfg.get("num_key_value_heads") or nh
        d = cfg.get("head_dim") or cfg["hidden_size"] // nh
        eps = cfg["rms_norm_eps"]
        t = len(ids)
        x = w["model.embed_tokens.weight"][ids]
        angles = np.outer(np.arange(t), inv_freq(cfg))  # [T, d/2]
        cos = np.cos(np.concatenate([angles, angles], axis=1))
        sin = np.sin(np.concatenate([angles, angles], axis=1))

        def rms(v: np.ndarray, weight: np.ndarray) -> np.ndarray:
            return np.asarray(v / np.sqrt(np.mean(v * v, axis=-1, keepdims=True) + eps) * weight)

        def lin(v: np.ndarray, name: str) -> np.ndarray:
            out = np.asarray(v @ w[name + ".weight"].T)
            return out + w[name + ".bias"] if name + ".bias" in w else out

        def rotate_half(v: np.ndarray) -> np.ndarray:
            half = v.shape[-1] // 2
            return np.concatenate([-v[..., half:], v[..., :half]], axis=-1)

        for i in range(cfg["num_hidden_layers"]):
            p = f"model.layers.{i}."
            h = rms(x, w[p + "input_layernorm.weight"])
            q = lin(h, p + "self_attn.q_proj").reshape(t, nh, d)
            k = lin(h, p + "self_attn.k_proj").reshape(t, kvh, d)
            v = lin(h, p + "self_attn.v_proj").reshape(t, kvh, d)
            heads = []
            for head in range(nh):
                kv = head // (nh // kvh)
                qh = q[:, head] * cos + rotate_half(q[:, head]) * sin
                kh = k[:, kv] * cos + rotate_half(k[:, kv]) * sin
                scores = qh @ kh.T / math.sqrt(d)
                scores[np.triu(np.ones((t, t), bool), k=1)] = -np.inf
                probs = np.exp(scores - scores.max(axis=1, keepdims=True))
                probs /= probs.sum(axis=1, keepdims=True)
                heads.append(probs @ v[:, kv])
            x = x + lin(np.concatenate(heads, axis=1), p + "self_attn.o_proj")
            h = rms(x, w[p + "post_attention_layernorm.weight"])
            gate = lin(h, p + "mlp.gate_proj")
            x = x + lin(gate / (1 + np.exp(-gate)) * lin(h, p + "mlp.up_proj"),
                        p + "mlp.down_proj")
        x = rms(x, w["model.norm.weight"])
        tied = cfg.get("tie_word_embeddings")
        proj = w["model.embed_tokens.weight"] if tied else w["lm_head.weight"]
        return np.asarray(x @ proj.T)

    def greedy(self, ids: list[int], n: int) -> list[int]:
        out = list(ids)
        for _ in range(n):
            out.append(int(np.argmax(self.logits(out)[-1])))
        return out[len(ids):]
