"""Small GGUF files written by the tests (random weights), and a NumPy reference that runs a
GGUF file as llama.cpp does.

``write_gguf`` writes a ``llama`` or ``gemma3`` model with the ``gguf`` package's writer: each
weight matrix in the tensor type asked for (blocks quantized by the ``gguf`` package where it
can, random valid blocks for the k-quants), q and k permuted for interleaved RoPE as llama.cpp's
converter does for ``llama``, Gemma's norms stored as 1 + w, and a byte-level BPE vocabulary.

``GgufReference`` shares no code with meshd.engine: it dequantizes with the ``gguf`` package,
reads tensors by their GGUF names, and applies RoPE the way llama.cpp's graph does (pairs of
adjacent values for ``llama``, halves for ``qwen2`` and ``gemma3``), in float64.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from .test_quant import random_rows

CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
                 "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
                 "{% endif %}")


def _byte_alphabet() -> list[str]:
    """GPT-2's printable stand-ins for the 256 bytes (the byte-level BPE alphabet)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
            *range(ord("®"), ord("ÿ") + 1)]
    chars, n = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + n)
            n += 1
    return [chars[b] for b in range(256)]


def vocabulary(vocab_size: int) -> tuple[list[str], list[int], list[str]]:
    """Tokens, token types and merges of a byte-level BPE of ``vocab_size`` tokens: two
    control tokens, the 256 bytes, then merged pairs of common letters."""
    alphabet = _byte_alphabet()
    tokens = ["<|im_start|>", "<|im_end|>", *alphabet]
    types = [3, 3] + [1] * 256
    merges: list[str] = []
    letters = "etaoinshrdlu"
    for a in letters:
        for b in letters:
            if len(tokens) >= vocab_size:
                break
            merges.append(f"{a} {b}")
            tokens.append(a + b)
            types.append(1)
    while len(tokens) < vocab_size:
        tokens.append(f"<unused{len(tokens)}>")
        types.append(5)
    return tokens, types, merges


def _matrix(rng: np.random.Generator, n: int, k: int, type_name: str
            ) -> tuple[np.ndarray, gguf.GGMLQuantizationType]:
    qtype = getattr(gguf.GGMLQuantizationType, type_name)
    if type_name in ("Q4_K", "Q5_K", "Q6_K"):
        # k-quant weights are d * (6-bit scale) * code: a small d keeps them near 0.1
        return random_rows(type_name, n, k, seed=int(rng.integers(1 << 30)), scale=4e-4), qtype
    w = (rng.standard_normal((n, k)) * 0.08).astype(np.float32)
    if type_name == "F32":
        return w, qtype
    if type_name == "F16":
        return w.astype(np.float16), qtype
    return gguf.quants.quantize(w, qtype), qtype


def permute_rows(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's converter's q/k row order for interleaved RoPE (on rows of any dtype)."""
    return (w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2)
            .reshape(w.shape))


def write_gguf(path: Path, *, family: str = "llama", types: dict[str, str] | None = None,
               layers: int = 2, hidden: int = 256, intermediate: int = 512, heads: int = 4,
               kv_heads: int = 2, head_dim: int | None = None, vocab: int = 300,
               tie: bool = True, window: int = 4, seed: int = 0) -> Path:
    """A GGUF model with random weights; ``types`` maps a role ("attn", "ffn", "embed",
    "output") to a GGML tensor type name (default F32). Rows of k-quants are 256 wide, so
    ``hidden`` and ``intermediate`` are multiples of 256 when one is asked for."""
    types = {"attn": "F32", "ffn": "F32", "embed": "F32", "output": "F32", **(types or {})}
    rng = np.random.default_rng(seed)
    d = head_dim or hidden // heads
    w = gguf.GGUFWriter(str(path), family)
    w.add_name(f"test-{family}")
    w.add_block_count(layers)
    w.add_context_length(256)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(intermediate)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_key_length(d)
    w.add_value_length(d)
    w.add_rope_freq_base(10000.0 if family != "gemma3" else 1000000.0)
    w.add_layer_norm_rms_eps(1e-6)
    if family == "gemma3":
        w.add_sliding_window(window)
    tokens, token_types, merges = vocabulary(vocab)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list(tokens)
    w.add_token_types(token_types)
    w.add_token_merges(merges)
    w.add_bos_token_id(0)
    w.add_eos_token_id(1)
    w.add_add_bos_token(False)
    w.add_chat_template(CHAT_TEMPLATE)

    def add(name: str, role: str, n: int, k: int, perm_heads: int = 0) -> None:
        data, qtype = _matrix(rng, n, k, types[role])
        if perm_heads:
            data = permute_rows(data, perm_heads)
        w.add_tensor(name, data, raw_dtype=qtype)

    def norm(name: str, n: int) -> None:
        value = 1.0 + 0.1 * rng.standard_normal(n)
        w.add_tensor(name, value.astype(np.float32))

    add("token_embd.weight", "embed", vocab, hidden)
    llama = family == "llama"
    for i in range(layers):
        p = f"blk.{i}."
        norm(p + "attn_norm.weight", hidden)
        add(p + "attn_q.weight", "attn", heads * d, hidden, heads if llama else 0)
        add(p + "attn_k.weight", "attn", kv_heads * d, hidden, kv_heads if llama else 0)
        add(p + "attn_v.weight", "attn", kv_heads * d, hidden)
        if family == "qwen2":  # Qwen2's q, k and v carry biases
            for name, n in (("attn_q", heads * d), ("attn_k", kv_heads * d), ("attn_v", kv_heads * d)):
                w.add_tensor(p + name + ".bias", (0.1 * rng.standard_normal(n)).astype(np.float32))
        add(p + "attn_output.weight", "attn", hidden, heads * d)
        norm(p + "ffn_norm.weight", hidden)
        add(p + "ffn_gate.weight", "ffn", intermediate, hidden)
        add(p + "ffn_up.weight", "ffn", intermediate, hidden)
        add(p + "ffn_down.weight", "ffn", hidden, intermediate)
        if family == "gemma3":
            norm(p + "attn_q_norm.weight", d)
            norm(p + "attn_k_norm.weight", d)
            norm(p + "post_attention_norm.weight", hidden)
            norm(p + "post_ffw_norm.weight", hidden)
    norm("output_norm.weight", hidden)
    if not tie:
        add("output.weight", "output", vocab, hidden)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


class GgufReference:
    """A GGUF model run as llama.cpp's graph runs it, in float64 NumPy (whole sequence, no
    cache)."""

    def __init__(self, path: Path) -> None:
        r = gguf.GGUFReader(str(path))
        self.meta: dict[str, Any] = {k: f.contents() for k, f in r.fields.items()
                                     if not k.startswith("GGUF.")}
        self.family = self.meta["general.architecture"]
        self.w: dict[str, np.ndarray] = {}
        for t in r.tensors:
            shape = tuple(int(s) for s in reversed(t.shape))
            self.w[t.name] = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type
                                                    ).reshape(shape).astype(np.float64)

    def _m(self, key: str) -> Any:
        return self.meta[f"{self.family}.{key}"]

    def logits(self, ids: list[int]) -> np.ndarray:
        w, fam = self.w, self.family
        nh, kvh = self._m("attention.head_count"), self._m("attention.head_count_kv")
        d = self._m("attention.key_length")
        eps = self._m("attention.layer_norm_rms_epsilon")
        gemma = fam == "gemma3"
        t = len(ids)
        x = w["token_embd.weight"][ids]
        if gemma:
            x = x * math.sqrt(self._m("embedding_length"))

        def rms(v: np.ndarray, weight: np.ndarray) -> np.ndarray:
            return np.asarray(v / np.sqrt(np.mean(v * v, axis=-1, keepdims=True) + eps) * weight)

        def rope(v: np.ndarray, base: float) -> np.ndarray:  # v [T, d]
            inv = base ** (-np.arange(0, d, 2) / d)
            ang = np.outer(np.arange(t), inv)  # [T, d/2]
            c, s = np.cos(ang), np.sin(ang)
            if fam == "llama":  # pairs (2i, 2i+1)
                a, b = v[:, 0::2], v[:, 1::2]
                out = np.empty_like(v)
                out[:, 0::2], out[:, 1::2] = a * c - b * s, a * s + b * c
                return out
            a, b = v[:, : d // 2], v[:, d // 2:]  # halves (NEOX)
            return np.concatenate([a * c - b * s, a * s + b * c], axis=1)

        def gelu_tanh(v: np.ndarray) -> np.ndarray:
            return np.asarray(0.5 * v * (1 + np.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v ** 3))))

        layers = self._m("block_count")
        window = self.meta.get(f"{fam}.attention.sliding_window", 0)
        for i in range(layers):
            p = f"blk.{i}."
            local = gemma and window and (i + 1) % 6 != 0
            base = 10000.0 if local else self._m("rope.freq_base")
            h = rms(x, w[p + "attn_norm.weight"])
            def lin(v: np.ndarray, name: str) -> np.ndarray:
                out = v @ w[name + ".weight"].T
                return np.asarray(out + w[name + ".bias"] if name + ".bias" in w else out)

            q = lin(h, p + "attn_q").reshape(t, nh, d)
            k = lin(h, p + "attn_k").reshape(t, kvh, d)
            v = lin(h, p + "attn_v").reshape(t, kvh, d)
            if gemma:
                q, k = rms(q, w[p + "attn_q_norm.weight"]), rms(k, w[p + "attn_k_norm.weight"])
            heads = []
            for head in range(nh):
                kv = head // (nh // kvh)
                qh, kh = rope(q[:, head], base), rope(k[:, kv], base)
                scores = qh @ kh.T / math.sqrt(d)
                qpos, kpos = np.arange(t)[:, None], np.arange(t)[None, :]
                masked = kpos > qpos
                if local:
                    masked |= qpos - kpos >= window
                scores[masked] = -np.inf
                probs = np.exp(scores - scores.max(axis=1, keepdims=True))
                probs /= probs.sum(axis=1, keepdims=True)
                heads.append(probs @ v[:, kv])
            o = np.concatenate(heads, axis=1) @ w[p + "attn_output.weight"].T
            x = x + rms(o, w[p + "post_attention_norm.weight"]) if gemma else x + o
            h = rms(x, w[p + "ffn_norm.weight"])
            gate, up = h @ w[p + "ffn_gate.weight"].T, h @ w[p + "ffn_up.weight"].T
            act = gelu_tanh(gate) if gemma else gate / (1 + np.exp(-gate))
            m = (act * up) @ w[p + "ffn_down.weight"].T
            x = x + (rms(m, w[p + "post_ffw_norm.weight"]) if gemma else m)
        x = rms(x, w["output_norm.weight"])
        head = w.get("output.weight", w["token_embd.weight"])
        return np.asarray(x @ head.T)
