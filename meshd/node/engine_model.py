"""The local engine as the runner sees it: load a model directory (``meshd.engine``) with the
config's engine settings, and adapt it to the runner (``EngineModel``).

``meshd.engine`` (onnxruntime, ~20 MB) is imported only when a model is loaded, so a relay or
router-only node never imports it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from meshd.config import Config

PROVIDERS = {
    "cpu": "CPUExecutionProvider",
    "cuda": "CUDAExecutionProvider",
    "tensorrt": "TensorrtExecutionProvider",
}


def default_model_dir() -> Path:
    """The shipped model, unless $MESHD_DEFAULT_MODEL names another model directory."""
    from meshd import engine

    env = os.environ.get("MESHD_DEFAULT_MODEL")
    return Path(env) if env else engine.default_model_path()


def load_engine_model(cfg: Config, path: Path, layers: tuple[int, int] | None) -> Any:
    """``meshd.engine.load_model`` with the config's providers, threads and workers."""
    from meshd import engine

    providers = None if cfg.engine.providers == "auto" else [PROVIDERS[cfg.engine.providers]]
    return engine.load_model(path, providers=providers, layers=layers,
                             threads=cfg.engine.threads or None,
                             max_concurrent_runs=cfg.engine.workers)


class EngineModel:
    """Adapts ``meshd.engine.Model`` to what the runner needs."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.num_layers = model.num_layers
        self.hidden_size = model.hidden_size

    def encode_prompt(self, text: str, *, chat: bool = False) -> list[int]:
        return list(self.model.encode_prompt(text, chat=chat))

    def encode_messages(self, messages: list[Any]) -> list[int]:
        return list(self.model.tokenizer.encode_chat(messages))

    @property
    def context_length(self) -> int:
        return int(self.model.context_length)

    def generate(self, prompt: list[int], cfg: Any) -> Any:
        return self.model.generate(prompt, cfg)
