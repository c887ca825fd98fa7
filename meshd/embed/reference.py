"""A NumPy reference of the BERT sentence encoder, in float64, one sentence at a time.

It follows the Hugging Face ``BertModel`` forward pass and sentence-transformers' pooling
literally (no padding, no masks, no fused ops), so that the ONNX graph, which batches, pads
and masks, is checked against something written independently. Tests and
``benchmarks/bench_embed.py`` use it; the product never does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from meshd.embed.arch import BertArch

# Abramowitz & Stegun 7.1.26: |erf(x) - approximation| < 1.5e-7 for every x.
_P = 0.3275911
_A = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)


def erf(x: np.ndarray) -> np.ndarray:
    sign = np.sign(x)
    a = np.abs(x)
    t = 1.0 / (1.0 + _P * a)
    poly = t * (_A[0] + t * (_A[1] + t * (_A[2] + t * (_A[3] + t * _A[4]))))
    return np.asarray(sign * (1.0 - poly * np.exp(-a * a)))


def gelu(x: np.ndarray) -> np.ndarray:
    """The exact (erf) GELU of Hugging Face's ``hidden_act="gelu"``."""
    return np.asarray(0.5 * x * (1.0 + erf(x / np.sqrt(2.0))))


def layer_norm(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return np.asarray((x - mu) / np.sqrt(var + eps) * w + b)


def encode_one(weights: Mapping[str, np.ndarray], arch: BertArch, ids: Sequence[int]
               ) -> np.ndarray:
    """The embedding of one token sequence (special tokens included), float64 [dim]."""
    def w(name: str) -> np.ndarray:
        return np.asarray(weights[name], dtype=np.float64)

    t = len(ids)
    nh, d = arch.num_heads, arch.head_dim
    x = (np.asarray(weights["embeddings.word_embeddings.weight"][list(ids)], np.float64)
         + w("embeddings.position_embeddings.weight")[:t]
         + w("embeddings.token_type_embeddings.weight")[0])
    x = layer_norm(x, w("embeddings.LayerNorm.weight"), w("embeddings.LayerNorm.bias"),
                   arch.layer_norm_eps)
    for i in range(arch.num_layers):
        p = f"encoder.layer.{i}."

        def dense(v: np.ndarray, name: str, p: str = p) -> np.ndarray:
            return np.asarray(v @ w(f"{p}{name}.weight").T + w(f"{p}{name}.bias"))

        q = dense(x, "attention.self.query").reshape(t, nh, d).transpose(1, 0, 2)
        k = dense(x, "attention.self.key").reshape(t, nh, d).transpose(1, 0, 2)
        v = dense(x, "attention.self.value").reshape(t, nh, d).transpose(1, 0, 2)
        s = q @ k.transpose(0, 2, 1) / np.sqrt(d)
        s = np.exp(s - s.max(-1, keepdims=True))
        probs = s / s.sum(-1, keepdims=True)
        ctx = (probs @ v).transpose(1, 0, 2).reshape(t, nh * d)
        x = layer_norm(x + dense(ctx, "attention.output.dense"),
                       w(f"{p}attention.output.LayerNorm.weight"),
                       w(f"{p}attention.output.LayerNorm.bias"), arch.layer_norm_eps)
        h = gelu(dense(x, "intermediate.dense"))
        x = layer_norm(x + dense(h, "output.dense"), w(f"{p}output.LayerNorm.weight"),
                       w(f"{p}output.LayerNorm.bias"), arch.layer_norm_eps)
    pooled = x.mean(0) if arch.pooling == "mean" else x[0]
    return np.asarray(pooled / max(float(np.linalg.norm(pooled)), 1e-12))


def encode_reference(weights: Mapping[str, np.ndarray], arch: BertArch,
                     batch: Sequence[Sequence[int]]) -> np.ndarray:
    """Embeddings of each token sequence, float64 [n, dim], L2-normalised."""
    wide = {k: (v if k == "embeddings.word_embeddings.weight" else np.asarray(v, np.float64))
            for k, v in weights.items()}
    return np.stack([encode_one(wide, arch, ids) for ids in batch])
