"""Pure helpers: stage plans, tensor sets, memory estimates, config parsing."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from meshd.engine.arch import Arch, parse_hf_config, rope_inv_freq
from meshd.engine.planning import (
    EMBED,
    FINAL_NORM,
    LM_HEAD,
    default_threads,
    model_tensors,
    plan_stages,
    stage_memory,
    stage_tensor_names,
)
from meshd.errors import LocalError, ModelError

ARCH = Arch(arch="llama", num_layers=6, hidden_size=64, intermediate_size=128, num_heads=4,
            num_kv_heads=2, head_dim=16, vocab_size=100, max_position_embeddings=128,
            rope_theta=10000.0, rms_norm_eps=1e-5, tie_word_embeddings=True, qkv_bias=False,
            o_bias=False, mlp_bias=False)


@pytest.mark.parametrize(
    ("layers", "n", "expected"),
    [
        (6, 1, [(0, 6)]),
        (6, 2, [(0, 3), (3, 6)]),
        (7, 3, [(0, 3), (3, 5), (5, 7)]),
        (22, 4, [(0, 6), (6, 12), (12, 17), (17, 22)]),
        (4, 4, [(0, 1), (1, 2), (2, 3), (3, 4)]),
    ],
)
def test_plan_stages(layers: int, n: int, expected: list[tuple[int, int]]) -> None:
    assert plan_stages(layers, n) == expected


@pytest.mark.parametrize(("layers", "n"), [(4, 0), (4, 5)])
def test_plan_stages_rejects(layers: int, n: int) -> None:
    with pytest.raises(LocalError):
        plan_stages(layers, n)


def test_stage_tensors_tied_and_untied() -> None:
    first = stage_tensor_names(ARCH, 0, 2)
    assert first[0] == EMBED and FINAL_NORM not in first
    assert all(".layers.0." in n or ".layers.1." in n for n in first[1:])
    last = stage_tensor_names(ARCH, 4, 6)
    assert last[-2:] == [FINAL_NORM, EMBED]  # tied: the embedding is the head
    untied = replace(ARCH, tie_word_embeddings=False)
    assert stage_tensor_names(untied, 4, 6)[-1] == LM_HEAD
    whole = stage_tensor_names(ARCH, 0, 6)
    assert whole.count(EMBED) == 1
    assert sorted(whole) == sorted(n for n, _ in model_tensors(ARCH))
    with pytest.raises(LocalError):
        stage_tensor_names(ARCH, 3, 3)


def test_stage_memory_adds_up() -> None:
    whole = stage_memory(ARCH, 0, 6)
    halves = [stage_memory(ARCH, 0, 3), stage_memory(ARCH, 3, 6)]
    n_params = sum(int(np.prod(s)) for _, s in model_tensors(ARCH))
    assert whole.weights_bytes == n_params * 4
    # Both ends of a tied model hold the embedding.
    assert sum(h.weights_bytes for h in halves) == whole.weights_bytes + 100 * 64 * 4
    assert whole.kv_bytes_per_token == 2 * 6 * 2 * 16 * 4
    assert sum(h.kv_bytes_per_token for h in halves) == whole.kv_bytes_per_token
    assert whole.total(10) - whole.total(0) == 10 * (
        whole.kv_bytes_per_token + whole.score_bytes_per_token)
    assert whole.total(0) == whole.weights_bytes + whole.work_bytes + whole.overhead_bytes
    assert whole.load_bytes == 0
    assert stage_memory(ARCH, 0, 6, "fp16").load_bytes == whole.weights_bytes // 2


def base_config(**changes: object) -> dict[str, object]:
    cfg: dict[str, object] = {
        "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 100,
    }
    cfg.update(changes)
    return cfg


def test_parse_defaults_and_qwen_biases() -> None:
    a = parse_hf_config(base_config())
    assert (a.num_kv_heads, a.head_dim, a.qkv_bias, a.rope_scaling) == (4, 16, False, None)
    q = parse_hf_config(base_config(architectures=["Qwen2ForCausalLM"], attention_bias=True))
    assert (q.arch, q.qkv_bias, q.o_bias) == ("qwen2", True, False)
    b = parse_hf_config(base_config(attention_bias=True, rope_scaling={"type": "default"}))
    assert (b.qkv_bias, b.o_bias, b.rope_scaling) == (True, True, None)


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"architectures": []}, "architectures"),
        ({"hidden_size": None}, "hidden_size"),
        ({"rope_scaling": "big"}, "rope_scaling"),
        ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "rope_scaling.low_freq_factor"),
        ({"pretraining_tp": 2}, "pretraining_tp"),
    ],
)
def test_parse_errors_name_the_field(changes: dict[str, object], field: str) -> None:
    with pytest.raises(ModelError, match=field.replace(".", r"\.")):
        parse_hf_config(base_config(**changes))


def test_llama3_rope_scaling_keeps_high_frequencies() -> None:
    scaled = replace(ARCH, rope_theta=500000.0, rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192})
    plain = rope_inv_freq(replace(scaled, rope_scaling=None))
    got = rope_inv_freq(scaled)
    assert got[0] == plain[0]  # the highest frequency is untouched
    assert got[-1] == pytest.approx(plain[-1] / 8)  # the lowest is divided by the factor


@pytest.mark.parametrize(("weights", "threads"), [(0, 1), (63 * 2**20, 1), (64 * 2**20, 0),
                                                  (2**34, 0)])
def test_default_threads(weights: int, threads: int) -> None:
    assert default_threads(weights) == threads
