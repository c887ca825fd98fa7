"""The narrow interfaces the daemon uses, so that it can run on a fake engine in tests.

``meshd.engine.runtime`` implements them with onnxruntime; a fake (for ``meshd/testing``) only
has to return arrays of the right shapes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Protocol

import numpy as np

from meshd.engine.generation import TokenEvent
from meshd.engine.manifest import Manifest
from meshd.engine.sampling import GenerationConfig


class StageSessionLike(Protocol):
    @property
    def length(self) -> int: ...

    def step(self, x: np.ndarray, positions: np.ndarray, *,
             last_only: bool = False) -> np.ndarray: ...

    def memory_bytes(self) -> int: ...

    def cache(self) -> list[np.ndarray]: ...  # per layer key and value buffers (views)

    def reserve(self, need: int) -> None: ...

    def restored(self, n: int) -> None: ...  # n tokens written through cache() (a prefix)

    def free(self) -> None: ...


class StageLike(Protocol):
    @property
    def start(self) -> int: ...

    @property
    def end(self) -> int: ...

    @property
    def provider(self) -> str: ...

    def open_session(self, max_tokens: int | None = None) -> StageSessionLike: ...


class ModelRunner(Protocol):
    @property
    def manifest(self) -> Manifest: ...

    @property
    def provider(self) -> str: ...

    @property
    def num_layers(self) -> int: ...

    @property
    def hidden_size(self) -> int: ...

    def stage(self, start: int, end: int) -> StageLike: ...

    def generate(self, prompt: str | list[int], cfg: GenerationConfig | None = None, *,
                 chat: bool = False, limiter: Any = None) -> AsyncIterator[TokenEvent]: ...

    def statistics(self) -> dict[str, Any]: ...
