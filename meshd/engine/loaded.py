"""A loaded model and its compiled stages, as the modules that drive them see them.

``meshd.engine.runtime`` defines ``Model`` and ``Stage`` and imports the modules that drive
them: ``run`` (one generation's own loop) and ``scheduler`` (continuous batching, with ``batch``
and ``fused``, the batched KV caches and the fused step). Those take ``LoadedModel`` and
``CompiledStage`` rather than runtime's classes, so none of them imports runtime back; mypy
checks that ``Model`` and ``Stage`` conform where runtime hands itself over.
"""

from __future__ import annotations

from typing import Any, Protocol

import onnxruntime as ort

from meshd.engine.manifest import Manifest
from meshd.engine.prefix import StagePrefixes
from meshd.engine.protocols import StageSessionLike
from meshd.engine.tokenizer import Tokenizer


class CompiledStage(Protocol):
    """The onnxruntime session of layers ``[start, end)`` (``runtime.Stage``)."""

    @property
    def model(self) -> LoadedModel: ...

    @property
    def start(self) -> int: ...

    @property
    def end(self) -> int: ...

    @property
    def fused(self) -> bool: ...  # the graph also takes one prompt chunk

    @property
    def is_first(self) -> bool: ...

    @property
    def is_last(self) -> bool: ...

    @property
    def output_names(self) -> list[str]: ...

    @property
    def _session(self) -> ort.InferenceSession: ...  # batch and fused bind their own buffers

    def binding(self) -> ort.IOBinding: ...  # for one group's runs (a fused graph's chunk idle)

    def _run(self, binding: ort.IOBinding) -> None: ...

    def open_session(self, max_tokens: int | None = None) -> StageSessionLike: ...


class LoadedModel(Protocol):
    """A loaded model directory (``runtime.Model``)."""

    @property
    def manifest(self) -> Manifest: ...

    @property
    def tokenizer(self) -> Tokenizer: ...

    @property
    def layers(self) -> tuple[int, int]: ...  # the loaded range

    @property
    def num_layers(self) -> int: ...

    @property
    def context_length(self) -> int: ...

    @property
    def limiter(self) -> Any: ...  # the trio.CapacityLimiter of its onnxruntime runs

    @property
    def keep_answers(self) -> bool: ...  # the batch keeps finished answers' KV (its prefix cache)

    def stage(self, start: int, end: int, *, fused: bool = False) -> CompiledStage: ...

    def encode_prompt(self, prompt: str | list[int], *, chat: bool = False) -> list[int]: ...

    def prefixes(self, start: int, end: int) -> StagePrefixes | None: ...  # the prefix cache
