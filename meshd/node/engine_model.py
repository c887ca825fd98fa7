"""The local engine as the runner sees it: load a model directory (``meshd.engine``) with the
config's engine settings, and adapt it to the runner (``EngineModel``).

``meshd.engine`` (onnxruntime, ~20 MB) is imported only when a model is loaded, so a relay or
router-only node never imports it.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from meshd.config import Config

log = logging.getLogger(__name__)

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
    # a batching model serves every run from its fused graph: one session, one copy of weights
    return engine.load_model(path, providers=providers, layers=layers,
                             threads=cfg.engine.threads or None,
                             max_concurrent_runs=cfg.engine.workers,
                             fused=cfg.engine.batching and cfg.engine.fused_prefill,
                             prefix_cache_bytes=cfg.engine.prefix_cache_mb << 20,
                             keep_answers=cfg.engine.keep_answers)


class EngineModel:
    """Adapts ``meshd.engine.Model`` to what the runner needs."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.num_layers = model.num_layers
        self.hidden_size = model.hidden_size
        self._tokenizer_identity: str | None = None

    def _tokenizer_source(self) -> tuple[bytes, Any]:
        from meshd.core.tokident import TokenizerMeta

        info = self.model.manifest.tokenizer
        data = (Path(self.model.path) / info.file).read_bytes()
        return data, TokenizerMeta(info.bos_token_id, tuple(info.eos_token_ids), info.bos_token,
                                   info.eos_token, info.chat_template)

    def tokenizer_identity(self) -> str:
        """The identity of this model's tokenizer (meshd.core.tokident), computed once."""
        if self._tokenizer_identity is None:
            from meshd.core.tokident import tokenizer_identity

            self._tokenizer_identity = tokenizer_identity(*self._tokenizer_source())
        return self._tokenizer_identity

    def tokenizer_bundle(self) -> bytes | None:
        """The tokenizer as peers fetch it (a file read: call it from a worker thread); None if
        the file no longer has the identity this node advertises."""
        from meshd.core.tokident import encode_bundle, tokenizer_identity

        data, meta = self._tokenizer_source()
        if tokenizer_identity(data, meta) != self.tokenizer_identity():
            log.warning("tokenizer changed on disk model=%s", self.model.manifest.name)
            return None
        return encode_bundle(data, meta)

    def encode_prompt(self, text: str, *, chat: bool = False) -> list[int]:
        return list(self.model.encode_prompt(text, chat=chat))

    def encode_messages(self, messages: list[Any], *, tools: list[Any] | None = None) -> list[int]:
        return list(self.model.tokenizer.encode_chat(messages, tools=tools))

    @property
    def weight_format(self) -> str:
        """How the weights are stored (the manifest's dtype: fp32, fp16, int4, int8)."""
        return str(self.model.manifest.dtype)

    @property
    def kv_bytes_per_layer_token(self) -> int:
        """KV cache bytes per token per layer: float32 keys and values of every KV head."""
        arch = self.model.manifest.arch
        return 2 * int(arch.num_kv_heads) * int(arch.head_dim) * 4

    @property
    def context_length(self) -> int:
        return int(self.model.context_length)

    @property
    def vocab_size(self) -> int:
        return int(self.model.vocab_size)

    @property
    def batcher(self) -> Any:
        """The model's batch scheduler (None when only some layers are loaded: stages are
        batched by the stage server)."""
        lo, hi = self.model.layers
        return self.model.batcher if (lo, hi) == (0, self.num_layers) else None

    def generate(self, prompt: list[int], cfg: Any) -> Any:
        return self.model.generate(prompt, cfg)

    def prefix_sketch(self, start: int, end: int) -> bytes:
        """The advert's sketch of the prefixes cached for layers [start, end)."""
        from meshd.core.prefix_cache import layer_space

        cache = self.model.prefix_cache
        return b"" if cache is None else cache.sketch(layer_space(start, end))

    def prefix_cache_statistics(self) -> dict[str, Any] | None:
        """The model's KV prefix cache ([engine] prefix_cache_mb; None: it keeps none)."""
        cache = self.model.prefix_cache
        return None if cache is None else dict(cache.statistics())

    @property
    def manifest(self) -> Any:
        """The loaded model's manifest (docs/model-format.md), which ``meshd.node.model_facts``
        describes the model from."""
        return self.model.manifest
