"""Fixtures for tests that run real daemons: a tiny random Llama imported with the real importer.

Daemons load it as their default model through $MESHD_DEFAULT_MODEL, so these tests exercise
the real engine (onnxruntime) while staying fast on a 2-core machine.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engine"))

from hf_fixtures import make_checkpoint  # noqa: E402

from meshd.engine import import_hf  # noqa: E402


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("tiny-model")
    make_checkpoint(root / "hf", layers=4, hidden=32, seed=7)
    out = root / "model"
    import_hf(root / "hf", out, stages=2, name="tiny")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MESHD_DEFAULT_MODEL", str(out))
        yield out


@pytest.fixture(scope="module")
def shipped_model() -> Iterator[None]:
    """Daemons started while this is active serve the shipped tiny-en, even after another module
    asked for ``tiny_model`` (a session fixture: its $MESHD_DEFAULT_MODEL stays set for the rest
    of the session, and the daemons inherit it)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("MESHD_DEFAULT_MODEL", raising=False)
        yield
