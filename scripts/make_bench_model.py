"""Write a random-weight Llama checkpoint in Hugging Face layout, for benchmarks (numpy only).

The default shape is a 138 M-parameter Llama (12 layers, hidden 1024, 16 heads / 4 kv heads of
64, MLP 2816, context 2048), large enough that a decode step is bound by reading the weights,
which is what continuous batching amortises. The tokenizer is the shipped model's (a byte-level
BPE of 4,096 tokens), so text prompts work; the weights are random (the text is noise).

    .venv/bin/python scripts/make_bench_model.py --out build/bench-hf
    .venv/bin/python -m meshd model import build/bench-hf --out build/bench-model --dtype fp16

Nothing is downloaded; no torch.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file


def make(out: Path, *, layers: int, hidden: int, intermediate: int, heads: int, kv_heads: int,
         context: int, seed: int) -> int:
    """Write config.json, model.safetensors (float16), tokenizer files; return the parameter
    count."""
    from meshd.engine import default_model_path

    tok_src = default_model_path()
    manifest = json.loads((tok_src / "manifest.json").read_text())
    vocab = int(manifest["architecture"]["vocab_size"])
    tok = manifest["tokenizer"]
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    d = hidden // heads

    def w(*shape: int) -> np.ndarray:  # Llama's init scale
        return (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(np.float16)

    def norm() -> np.ndarray:
        return np.ones(hidden, np.float16)

    t: dict[str, np.ndarray] = {"model.embed_tokens.weight": w(vocab, hidden)}
    for i in range(layers):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = norm()
        t[p + "self_attn.q_proj.weight"] = w(heads * d, hidden)
        t[p + "self_attn.k_proj.weight"] = w(kv_heads * d, hidden)
        t[p + "self_attn.v_proj.weight"] = w(kv_heads * d, hidden)
        t[p + "self_attn.o_proj.weight"] = w(hidden, heads * d)
        t[p + "post_attention_layernorm.weight"] = norm()
        t[p + "mlp.gate_proj.weight"] = w(intermediate, hidden)
        t[p + "mlp.up_proj.weight"] = w(intermediate, hidden)
        t[p + "mlp.down_proj.weight"] = w(hidden, intermediate)
    t["model.norm.weight"] = norm()
    save_file(t, str(out / "model.safetensors"), metadata={"format": "pt"})
    shutil.copy(tok_src / tok["file"], out / "tokenizer.json")
    (out / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": tok.get("bos_token"), "eos_token": tok.get("eos_token")}))
    eos = tok["eos_token_ids"]
    (out / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": hidden, "intermediate_size": intermediate,
        "num_hidden_layers": layers, "num_attention_heads": heads,
        "num_key_value_heads": kv_heads, "hidden_act": "silu",
        "max_position_embeddings": context, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
        "tie_word_embeddings": True, "vocab_size": vocab,
        "bos_token_id": tok.get("bos_token_id"), "eos_token_id": eos[0] if eos else None,
        "torch_dtype": "float16"}, indent=1))
    return sum(a.size for a in t.values())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--intermediate", type=int, default=2816)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--kv-heads", type=int, default=4)
    parser.add_argument("--context", type=int, default=2048)
    parser.add_argument("--seed", type=int, default=0)
    a = parser.parse_args()
    n = make(a.out, layers=a.layers, hidden=a.hidden, intermediate=a.intermediate,
             heads=a.heads, kv_heads=a.kv_heads, context=a.context, seed=a.seed)
    print(f"wrote {a.out}: {n / 1e6:.1f} M parameters")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
