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
def models(model_dirs: dict[str, Path]) -> dict[str, Model]:
    return {name: load_model(path) for name, path in model_dirs.items()}


@pytest.fixture(params=sorted(CHECKPOINTS))
def arch_name(request: pytest.FixtureRequest) -> str:
    return str(request.param)
