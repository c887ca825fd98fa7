"""meshd's inference engine: Llama-family models on onnxruntime, cut into layer-range stages.

The public API (what the daemon and the CLI call) is re-exported here; see docs/engine.md.
"""

from __future__ import annotations

from pathlib import Path

from meshd.engine.generation import TokenEvent
from meshd.engine.importer import import_hf
from meshd.engine.manifest import Manifest, read_manifest
from meshd.engine.planning import StageMemory, plan_stages
from meshd.engine.runtime import Model, Stage, StageSession, choose_providers, load_model
from meshd.engine.sampling import GenerationConfig, sample
from meshd.engine.tokenizer import Tokenizer

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
