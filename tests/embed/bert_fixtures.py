"""A tiny random BERT sentence encoder in exact Hugging Face / sentence-transformers layout.

``make_bert`` writes ``config.json``, ``model.safetensors`` (with the int64 ``position_ids``
buffer real checkpoints carry), a WordPiece ``tokenizer.json`` built with the ``tokenizers``
library, and optionally the sentence-transformers files (``modules.json``,
``1_Pooling/config.json``, ``sentence_bert_config.json``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import save_file

VOCAB_TEXT = ("the a mesh node peer route stage cache answer question what is how do i reset my "
         "password weather lovely today sunny outside he drove to stadium 1 2 3 4 5 6 7 8 9 0 "
         ". , ? !")
WORDS = VOCAB_TEXT.split()
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def make_tokenizer(path: Path) -> int:
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

    vocab = {t: i for i, t in enumerate(SPECIALS + sorted(set(WORDS)) + [f"##{c}" for c in "sed"])}
    tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]", max_input_chars_per_word=100))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", vocab["[CLS]"]),
                                                 ("[SEP]", vocab["[SEP]"])])
    tok.enable_padding(length=16)  # as the real all-MiniLM file does; the Embedder undoes it
    tok.save(str(path))
    return len(vocab)


def make_bert(out: Path, *, layers: int = 2, hidden: int = 32, heads: int = 4,
              intermediate: int = 64, max_pos: int = 64, prefix: str = "",
              pooling: str | None = "mean", max_seq_length: int | None = 24, seed: int = 0,
              std: float = 0.3, arch: str = "BertModel", extra: dict[str, Any] | None = None
              ) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    vocab = make_tokenizer(out / "tokenizer.json") + 3  # a few ids the tokenizer never makes
    rng = np.random.default_rng(seed)

    def w(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * std).astype(np.float32)

    def ln(name: str) -> dict[str, np.ndarray]:
        return {f"{name}.weight": (1 + 0.1 * rng.standard_normal(hidden)).astype(np.float32),
                f"{name}.bias": w(hidden)}

    t: dict[str, np.ndarray] = {
        "embeddings.word_embeddings.weight": w(vocab, hidden),
        "embeddings.position_embeddings.weight": w(max_pos, hidden),
        "embeddings.token_type_embeddings.weight": w(2, hidden),
        "embeddings.position_ids": np.arange(max_pos, dtype=np.int64)[None],
        **ln("embeddings.LayerNorm"),
    }
    for i in range(layers):
        p = f"encoder.layer.{i}."
        for n in ("query", "key", "value"):
            t[f"{p}attention.self.{n}.weight"] = w(hidden, hidden)
            t[f"{p}attention.self.{n}.bias"] = w(hidden)
        t[f"{p}attention.output.dense.weight"] = w(hidden, hidden)
        t[f"{p}attention.output.dense.bias"] = w(hidden)
        t.update(ln(f"{p}attention.output.LayerNorm"))
        t[f"{p}intermediate.dense.weight"] = w(intermediate, hidden)
        t[f"{p}intermediate.dense.bias"] = w(intermediate)
        t[f"{p}output.dense.weight"] = w(hidden, intermediate)
        t[f"{p}output.dense.bias"] = w(hidden)
        t.update(ln(f"{p}output.LayerNorm"))
    save_file({prefix + k: v for k, v in t.items()}, str(out / "model.safetensors"))
    cfg = {"architectures": [arch], "model_type": "bert", "hidden_act": "gelu",
           "hidden_size": hidden, "intermediate_size": intermediate, "layer_norm_eps": 1e-12,
           "max_position_embeddings": max_pos, "num_attention_heads": heads,
           "num_hidden_layers": layers, "type_vocab_size": 2, "vocab_size": vocab,
           "position_embedding_type": "absolute", **(extra or {})}
    (out / "config.json").write_text(json.dumps(cfg))
    if pooling is not None:
        (out / "1_Pooling").mkdir(exist_ok=True)
        (out / "1_Pooling" / "config.json").write_text(json.dumps({
            "word_embedding_dimension": hidden,
            "pooling_mode_cls_token": pooling == "cls",
            "pooling_mode_mean_tokens": pooling == "mean",
            "pooling_mode_max_tokens": False, "pooling_mode_mean_sqrt_len_tokens": False}))
        (out / "modules.json").write_text(json.dumps([
            {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {"idx": 1, "name": "1", "path": "1_Pooling",
             "type": "sentence_transformers.models.Pooling"},
            {"idx": 2, "name": "2", "path": "2_Normalize",
             "type": "sentence_transformers.models.Normalize"}]))
    if max_seq_length is not None:
        (out / "sentence_bert_config.json").write_text(json.dumps(
            {"max_seq_length": max_seq_length, "do_lower_case": False}))
    return out


def read_weights(hf_dir: Path, prefix: str = "") -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    return {k[len(prefix):]: v for k, v in load_file(str(hf_dir / "model.safetensors")).items()}
