"""Shared fixtures: tiny Hugging Face checkpoints and their imported meshd model directories."""

from __future__ import annotations

from pathlib import Path

import pytest

from meshd.engine import Model, import_hf, load_model

from .hf_fixtures import LLAMA_GQA, QWEN2_GQA, make_checkpoint

CHECKPOINTS = {"llama": LLAMA_GQA, "qwen2": QWEN2_GQA}


@pytest.fixture(scope="session")
def hf_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hf")
    return {name: make_checkpoint(root / name, **kw) for name, kw in CHECKPOINTS.items()}


@pytest.fixture(scope="session")
def model_dirs(hf_dirs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
               ) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("meshd")
    out = {}
    for name, hf in hf_dirs.items():
        import_hf(hf, root / name, stages=2)
        out[name] = root / name
    return out


@pytest.fixture(scope="session")
def models(model_dirs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
           ) -> dict[str, Model]:
    """The HF fixtures' models, and "int4": a GGUF-imported llama of 4-bit blocks with
    minimums (Q4_1) and an 8-bit embedding and head (Q8_0), as llama.cpp's Q4_1 files are."""
    from meshd.engine.gguf_import import import_gguf

    from .gguf_fixtures import write_gguf

    out = {name: load_model(path) for name, path in model_dirs.items()}
    root = tmp_path_factory.mktemp("gguf")
    gguf = write_gguf(root / "m.gguf", layers=2, hidden=256, intermediate=512, heads=4,
                      kv_heads=2, types={"attn": "Q4_1", "ffn": "Q4_1", "embed": "Q8_0"})
    import_gguf(gguf, root / "int4")
    out["int4"] = load_model(root / "int4")
    from meshd.engine import graph

    level, graph.ACCURACY_LEVEL = graph.ACCURACY_LEVEL, 0
    try:
        import_gguf(gguf, root / "int4-exact")  # its stage graphs compute in float
    finally:
        graph.ACCURACY_LEVEL = level
    out["int4-exact"] = load_model(root / "int4-exact")
    return out


@pytest.fixture(params=sorted(CHECKPOINTS))
def arch_name(request: pytest.FixtureRequest) -> str:
    return str(request.param)
