"""What a node says of a model it serves (meshd.node.model_facts): read from the real importer's
manifest; the parameter count from the architecture equals the tensors' own count."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engine"))

from hf_fixtures import CHAT_TEMPLATE, make_checkpoint  # noqa: E402

from meshd.engine import import_hf  # noqa: E402
from meshd.engine.manifest import read_manifest  # noqa: E402
from meshd.node.model_facts import local_facts, parameter_count  # noqa: E402


@pytest.mark.parametrize("kw", [
    {"arch": "llama", "tie": False},
    {"arch": "llama", "tie": True, "kv_heads": 2},  # as many kv heads as heads
    {"arch": "qwen2", "tie": True, "attention_bias": True},
])
def test_facts_of_an_imported_model(tmp_path: Path, kw: dict[str, Any]) -> None:
    make_checkpoint(tmp_path / "hf", layers=2, hidden=32, seed=3, chat_template=CHAT_TEMPLATE,
                    **kw)
    import_hf(tmp_path / "hf", tmp_path / "model", stages=1, name="tiny")
    manifest = read_manifest(tmp_path / "model")
    assert manifest.dtype == "fp32"
    stored = sum(math.prod(t.shape) for t in manifest.tensors)
    assert parameter_count(manifest.arch) == stored
    facts = local_facts(SimpleNamespace(manifest=manifest))
    assert facts == {"format": "fp32", "architecture": manifest.arch.arch, "parameters": stored,
                     "size_bytes": manifest.weights_bytes, "layers": 2, "hidden_size": 32,
                     "digest": manifest.content_hash, "chat_template": CHAT_TEMPLATE}


def test_an_upstream_model_says_only_that() -> None:
    assert local_facts(SimpleNamespace(base_url="http://127.0.0.1:1/v1")) == {"format": "upstream"}
    assert local_facts(object()) == {}
