"""Figures of a BERT sentence encoder, read from a Hugging Face / sentence-transformers directory.

``parse_bert_config`` is a pure function: the dicts of ``config.json`` and the optional
sentence-transformers files (``modules.json``, ``1_Pooling/config.json``,
``sentence_bert_config.json``) in, a ``BertArch`` or a ``ModelError`` naming the field out.
``bert_tensors`` lists the tensors an encoder reads, in the order the importer stores them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from meshd.errors import ModelError
from meshd.modeldir.arch import arch_from_json, check_positive_ints

# Hugging Face ``architectures`` entries of the BERT family that we import as sentence
# encoders. Heads (masked LM, classification) are dropped: only the encoder is kept.
BERT_ARCHITECTURES = ("BertModel", "BertForMaskedLM", "BertForPreTraining",
                      "BertForSequenceClassification")
POOLINGS = ("mean", "cls")
HF_FIELD_NAMES = {"num_layers": "num_hidden_layers", "num_heads": "num_attention_heads"}

EMBED_TENSORS = ("embeddings.word_embeddings.weight", "embeddings.position_embeddings.weight",
                 "embeddings.token_type_embeddings.weight", "embeddings.LayerNorm.weight",
                 "embeddings.LayerNorm.bias")


@dataclass(frozen=True, slots=True)
class BertArch:
    """What the encoder graph needs. Names follow the manifest (docs/embeddings.md)."""

    arch: str  # "bert"
    num_layers: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    vocab_size: int
    max_position_embeddings: int
    type_vocab_size: int
    layer_norm_eps: float
    pooling: str  # "mean" (masked mean of the last hidden states) or "cls"
    normalize: bool  # L2-normalise the pooled vector (the Embedder always does)
    max_seq_length: int  # longer inputs are truncated to this many tokens, specials included

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def dim(self) -> int:
        """Length of one embedding."""
        return self.hidden_size

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Any, source: str = "manifest.json") -> BertArch:
        return arch_from_json(cls, data, source)

    def validate(self, source: str, names: dict[str, str] | None = None) -> None:
        names = names or {}
        check_positive_ints(self, ("num_layers", "hidden_size", "intermediate_size", "num_heads",
                                   "vocab_size", "max_position_embeddings", "type_vocab_size",
                                   "max_seq_length"), source, names)
        if self.arch != "bert":
            raise ModelError(f"{source}: arch={self.arch!r} is not 'bert'")
        if self.hidden_size % self.num_heads:
            raise ModelError(f"{source}: hidden_size={self.hidden_size} is not a multiple of "
                             f"num_attention_heads={self.num_heads}")
        if not self.layer_norm_eps > 0:
            raise ModelError(f"{source}: layer_norm_eps={self.layer_norm_eps!r} must be positive")
        if self.pooling not in POOLINGS:
            raise ModelError(f"{source}: pooling={self.pooling!r} is not supported "
                             f"(supported: {', '.join(POOLINGS)})")
        if self.max_seq_length > self.max_position_embeddings:
            raise ModelError(f"{source}: max_seq_length={self.max_seq_length} exceeds "
                             f"max_position_embeddings={self.max_position_embeddings}")


def is_bert_config(cfg: dict[str, Any]) -> bool:
    archs = cfg.get("architectures")
    return isinstance(archs, list) and bool(archs) and archs[0] in BERT_ARCHITECTURES


def parse_bert_config(cfg: dict[str, Any], *, pooling_cfg: dict[str, Any] | None = None,
                      modules: list[Any] | None = None, st_cfg: dict[str, Any] | None = None,
                      source: str = "config.json") -> BertArch:
    """Read a BERT config; the sentence-transformers files are optional. Without them the
    encoder mean-pools and normalises (what all-MiniLM-style models do) and reads up to
    ``max_position_embeddings`` tokens."""
    if not is_bert_config(cfg):
        raise ModelError(f"{source}: architectures={cfg.get('architectures')!r} is not a BERT "
                         f"model (supported: {', '.join(BERT_ARCHITECTURES)})")
    act = cfg.get("hidden_act", "gelu")
    if act != "gelu":
        raise ModelError(f"{source}: hidden_act={act!r} is not supported (only 'gelu')")
    pos = cfg.get("position_embedding_type", "absolute")
    if pos != "absolute":
        raise ModelError(f"{source}: position_embedding_type={pos!r} is not supported "
                         "(only 'absolute')")
    if cfg.get("is_decoder"):
        raise ModelError(f"{source}: is_decoder=true is not supported (encoders only)")

    def need(name: str) -> Any:
        if name not in cfg:
            raise ModelError(f"{source}: field {name!r} is missing")
        return cfg[name]

    max_pos = cfg.get("max_position_embeddings", 512)
    max_len = (st_cfg or {}).get("max_seq_length", max_pos)
    arch = BertArch(
        arch="bert",
        num_layers=need("num_hidden_layers"),
        hidden_size=need("hidden_size"),
        intermediate_size=need("intermediate_size"),
        num_heads=need("num_attention_heads"),
        vocab_size=need("vocab_size"),
        max_position_embeddings=max_pos,
        type_vocab_size=cfg.get("type_vocab_size", 2),
        layer_norm_eps=float(cfg.get("layer_norm_eps", 1e-12)),
        pooling=_pooling(pooling_cfg),
        normalize=_normalizes(modules),
        max_seq_length=max_len if isinstance(max_len, int) else -1,
    )
    arch.validate(source, HF_FIELD_NAMES)
    return arch


def _pooling(cfg: dict[str, Any] | None) -> str:
    if cfg is None:
        return "mean"
    modes = [k for k, v in cfg.items() if k.startswith("pooling_mode_") and v is True]
    if modes == ["pooling_mode_mean_tokens"]:
        return "mean"
    if modes == ["pooling_mode_cls_token"]:
        return "cls"
    raise ModelError(f"1_Pooling/config.json: pooling {', '.join(modes) or 'none'} is not "
                     "supported (mean tokens or the CLS token)")


def _normalizes(modules: list[Any] | None) -> bool:
    if modules is None:
        return True
    return any(isinstance(m, dict) and str(m.get("type", "")).endswith(".Normalize")
               for m in modules)


def layer_tensors(arch: BertArch, i: int) -> list[tuple[str, tuple[int, ...]]]:
    h, f = arch.hidden_size, arch.intermediate_size
    p = f"encoder.layer.{i}."
    out: list[tuple[str, tuple[int, ...]]] = []
    for name in ("query", "key", "value"):
        out += [(f"{p}attention.self.{name}.weight", (h, h)),
                (f"{p}attention.self.{name}.bias", (h,))]
    out += [(f"{p}attention.output.dense.weight", (h, h)), (f"{p}attention.output.dense.bias", (h,)),
            (f"{p}attention.output.LayerNorm.weight", (h,)),
            (f"{p}attention.output.LayerNorm.bias", (h,)),
            (f"{p}intermediate.dense.weight", (f, h)), (f"{p}intermediate.dense.bias", (f,)),
            (f"{p}output.dense.weight", (h, f)), (f"{p}output.dense.bias", (h,)),
            (f"{p}output.LayerNorm.weight", (h,)), (f"{p}output.LayerNorm.bias", (h,))]
    return out


def bert_tensors(arch: BertArch) -> list[tuple[str, tuple[int, ...]]]:
    """Every tensor the encoder reads, with its shape (Hugging Face naming without the
    ``bert.`` prefix that head models add)."""
    h = arch.hidden_size
    shapes = ((arch.vocab_size, h), (arch.max_position_embeddings, h), (arch.type_vocab_size, h),
              (h,), (h,))
    out = list(zip(EMBED_TENSORS, shapes, strict=True))
    for i in range(arch.num_layers):
        out += layer_tensors(arch, i)
    return out
