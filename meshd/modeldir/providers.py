"""The onnxruntime execution providers a model's sessions run on, for every kind of model."""

from __future__ import annotations

import onnxruntime as ort

from meshd.errors import LocalError

# Chosen automatically, best first, when the caller names no providers. TensorRT is used only
# when asked for: the cache changes shape as it grows, and TensorRT rebuilds engines for new
# shapes.
AUTO_PROVIDERS = ("CUDAExecutionProvider", "CPUExecutionProvider")


def choose_providers(requested: list[str] | tuple[str, ...] | None = None) -> list[str]:
    """The providers ``requested`` (each must be available: ``LocalError`` naming it), else the
    best available of ``AUTO_PROVIDERS``; the CPU's always last."""
    available = ort.get_available_providers()
    if requested:
        for name in requested:
            if name not in available:
                raise LocalError(f"execution provider {name} is not available "
                                 f"(available: {', '.join(available)})")
        chosen = list(requested)
    else:
        chosen = [p for p in AUTO_PROVIDERS if p in available]
    if "CPUExecutionProvider" not in chosen:
        chosen.append("CPUExecutionProvider")
    return chosen
