"""meshd's inference engine: Llama-family models on onnxruntime, cut into layer-range stages.

The public API (what the daemon and the CLI call) is re-exported here; see docs/engine.md.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from meshd.engine.generation import TokenEvent
from meshd.engine.manifest import Manifest, read_manifest
from meshd.engine.planning import StageMemory, plan_stages
from meshd.engine.sampling import GenerationConfig, sample
from meshd.engine.tokenizer import Tokenizer

if TYPE_CHECKING:
    from meshd.engine.importer import import_hf
    from meshd.engine.runtime import Model, Stage, StageSession, load_model
    from meshd.modeldir.providers import choose_providers

# Imported on first use: onnxruntime and onnx (~20 MB) stay out of a node that only needs a
# tokenizer (edge tokenization on a node serving no model: docs/edge-tokenization.md).
_LAZY = {"import_hf": "meshd.engine.importer", "Model": "meshd.engine.runtime",
         "Stage": "meshd.engine.runtime", "StageSession": "meshd.engine.runtime",
         "choose_providers": "meshd.modeldir.providers", "load_model": "meshd.engine.runtime"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value

DEFAULT_MODEL = "tiny-en"


def default_model_path() -> Path:
    """The directory of the small model shipped inside the package (``meshd/data/models``)."""
    import meshd.data

    return Path(meshd.data.__file__).resolve().parent / "models" / DEFAULT_MODEL


__all__ = [
    "DEFAULT_MODEL",
    "GenerationConfig",
    "Manifest",
    "Model",
    "Stage",
    "StageMemory",
    "StageSession",
    "TokenEvent",
    "Tokenizer",
    "choose_providers",
    "default_model_path",
    "import_hf",
    "load_model",
    "plan_stages",
    "read_manifest",
    "sample",
]
