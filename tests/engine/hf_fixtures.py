"""Tiny random checkpoints in exact Hugging Face layout, written from numpy.

``make_checkpoint`` writes ``config.json``, ``model.safetensors`` (or shards and their index,
with the ``safetensors`` package), ``tokenizer.json`` (a byte-level BPE trained with the
``tokenizers`` library on a few sentences) and ``tokenizer_config.json``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import save_file

TEXT = [
    "Once upon a time there was a little mesh of computers that liked to talk.",
    "The quick brown fox jumps over the lazy dog, and the dog did not mind at all.",
    "In the beginning the nodes gossiped about their load and their latency.",
    "A stage is a range of layers; a route is a chain of stages across the mesh.",
    "She said hello to the world, and the world said hello back to her.",
]
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def make_tokenizer(path: Path, vocab_size: int = 300) -> int:
    """Write a byte-level BPE tokenizer.json; returns its vocabulary size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=["<s>", "</s>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(TEXT, trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", 0)])
    tok.save(str(path))
    return int(tok.get_vocab_size())


def make_checkpoint(
    out: Path,
    *,
    arch: str = "llama",
    layers: int = 4,
    hidden: int = 32,
    intermediate: int = 48,
    heads: int = 2,
    kv_heads: int = 1,
    head_dim: int | None = None,
    vocab: int = 320,
    tie: bool = False,
    dtype: Any = np.float32,
    shards: int = 1,
    rope_scaling: dict[str, Any] | None = None,
    attention_bias: bool = False,
    max_pos: int = 256,
    seed: int = 0,
    std: float = 0.2,
    chat_template: str | None = None,
) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    d = head_dim or hidden // heads
    qwen = arch == "qwen2"

    def w(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * std).astype(dtype)

    def norm() -> np.ndarray:
        return (1.0 + 0.1 * rng.standard_normal(hidden)).astype(dtype)

    t: dict[str, np.ndarray] = {"model.embed_tokens.weight": w(vocab, hidden)}
    for i in range(layers):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = norm()
        t[p + "self_attn.q_proj.weight"] = w(heads * d, hidden)
        t[p + "self_attn.k_proj.weight"] = w(kv_heads * d, hidden)
        t[p + "self_attn.v_proj.weight"] = w(kv_heads * d, hidden)
        t[p + "self_attn.o_proj.weight"] = w(hidden, heads * d)
        if qwen or attention_bias:
            t[p + "self_attn.q_proj.bias"] = w(heads * d)
            t[p + "self_attn.k_proj.bias"] = w(kv_heads * d)
            t[p + "self_attn.v_proj.bias"] = w(kv_heads * d)
        if attention_bias and not qwen:
            t[p + "self_attn.o_proj.bias"] = w(hidden)
        t[p + "post_attention_layernorm.weight"] = norm()
        t[p + "mlp.gate_proj.weight"] = w(intermediate, hidden)
        t[p + "mlp.up_proj.weight"] = w(intermediate, hidden)
        t[p + "mlp.down_proj.weight"] = w(hidden, intermediate)
        # Hugging Face checkpoints sometimes carry buffers that importers must ignore.
        t[p + "self_attn.rotary_emb.inv_freq"] = np.ones(d // 2, dtype)
    t["model.norm.weight"] = norm()
    if not tie:
        t["lm_head.weight"] = w(vocab, hidden)

    names = sorted(t)
    if shards == 1:
        save_file(t, str(out / "model.safetensors"), metadata={"format": "pt"})
    else:
        weight_map = {}
        for k in range(shards):
            fname = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
            part = {n: t[n] for n in names[k::shards]}
            save_file(part, str(out / fname), metadata={"format": "pt"})
            weight_map.update(dict.fromkeys(part, fname))
        (out / "model.safetensors.index.json").write_text(json.dumps(
            {"metadata": {"total_size": sum(a.nbytes for a in t.values())},
             "weight_map": weight_map}))

    n_tok = make_tokenizer(out / "tokenizer.json")
    assert n_tok <= vocab
    cfg: dict[str, Any] = {
        "architectures": ["Qwen2ForCausalLM" if qwen else "LlamaForCausalLM"],
        "model_type": arch,
        "hidden_size": hidden,
        "intermediate_size": intermediate,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "hidden_act": "silu",
        "max_position_embeddings": max_pos,
        "rms_norm_eps": 1e-6 if qwen else 1e-5,
        "rope_theta": 1000000.0 if qwen else 10000.0,
        "rope_scaling": rope_scaling,
        "tie_word_embeddings": tie,
        "vocab_size": vocab,
        "bos_token_id": 0,
        "eos_token_id": 1,
        "torch_dtype": "float16" if dtype == np.float16 else "float32",
    }
    if head_dim is not None:
        cfg["head_dim"] = head_dim
    if qwen:
        cfg["use_sliding_window"] = False
    else:
        cfg["attention_bias"] = attention_bias
        cfg["mlp_bias"] = False
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    tcfg: dict[str, Any] = {"bos_token": "<s>", "eos_token": "</s>",
                            "tokenizer_class": "PreTrainedTokenizerFast"}
    if chat_template:
        tcfg["chat_template"] = chat_template
    (out / "tokenizer_config.json").write_text(json.dumps(tcfg, indent=1))
    return out


LLAMA_GQA: dict[str, Any] = {
    "arch": "llama", "layers": 4, "hidden": 64, "heads": 4, "kv_heads": 2, "tie": False,
    "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                     "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
    "chat_template": CHAT_TEMPLATE,
}
QWEN2_GQA: dict[str, Any] = {
    "arch": "qwen2", "layers": 4, "heads": 6, "kv_heads": 2, "hidden": 96, "tie": True,
    "seed": 1,
}
