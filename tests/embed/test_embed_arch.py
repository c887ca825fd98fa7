"""parse_bert_config: table tests of what is read, defaulted and refused."""

from __future__ import annotations

from typing import Any

import pytest

from meshd.embed.arch import BertArch, bert_tensors, parse_bert_config
from meshd.errors import ModelError

BASE: dict[str, Any] = {"architectures": ["BertModel"], "hidden_size": 384,
                        "intermediate_size": 1536, "num_attention_heads": 12,
                        "num_hidden_layers": 6, "vocab_size": 30522,
                        "max_position_embeddings": 512}
MEAN = {"pooling_mode_mean_tokens": True, "pooling_mode_cls_token": False}
CLS = {"pooling_mode_mean_tokens": False, "pooling_mode_cls_token": True}


def test_minilm_figures() -> None:
    a = parse_bert_config(BASE, pooling_cfg=MEAN, st_cfg={"max_seq_length": 256})
    assert (a.dim, a.head_dim, a.pooling, a.normalize, a.max_seq_length) == (384, 32, "mean",
                                                                            True, 256)
    assert a.layer_norm_eps == 1e-12 and a.type_vocab_size == 2
    assert BertArch.from_json(a.to_json()) == a
    assert len(bert_tensors(a)) == 5 + 6 * 16


@pytest.mark.parametrize(("change", "kwargs", "field"), [
    ({"architectures": ["LlamaForCausalLM"]}, {}, "architectures"),
    ({"hidden_act": "gelu_new"}, {}, "hidden_act"),
    ({"position_embedding_type": "relative_key"}, {}, "position_embedding_type"),
    ({"is_decoder": True}, {}, "is_decoder"),
    ({"num_attention_heads": 5}, {}, "num_attention_heads"),
    ({"num_hidden_layers": 0}, {}, "num_hidden_layers"),
    ({}, {"pooling_cfg": {"pooling_mode_max_tokens": True}}, "pooling"),
    ({}, {"st_cfg": {"max_seq_length": 1024}}, "max_seq_length"),
])
def test_refused_with_the_field_named(change: dict[str, Any], kwargs: dict[str, Any],
                                      field: str) -> None:
    with pytest.raises(ModelError, match=field):
        parse_bert_config({**BASE, **change}, **kwargs)


@pytest.mark.parametrize(("pooling_cfg", "modules", "want"), [
    (None, None, ("mean", True)),
    (CLS, [], ("cls", False)),
    (MEAN, [{"type": "sentence_transformers.models.Normalize"}], ("mean", True)),
])
def test_pooling_and_normalisation(pooling_cfg: dict[str, Any] | None, modules: list[Any] | None,
                                   want: tuple[str, bool]) -> None:
    a = parse_bert_config(BASE, pooling_cfg=pooling_cfg, modules=modules)
    assert (a.pooling, a.normalize) == want
    assert a.max_seq_length == 512  # no sentence_bert_config.json: the position table's length
