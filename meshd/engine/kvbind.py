"""Binding a stage's KV cache buffers to an onnxruntime IO binding.

A stage graph (``graph.py``) takes each layer's cache as ``past_key.i`` / ``past_value.i`` and
returns the same buffers, with the new tokens written in, as ``present_key.i`` /
``present_value.i``. Binding one ``OrtValue`` over the caller's numpy buffer to both makes
onnxruntime update the cache in place: no copy of the cache in or out of a run.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import onnxruntime as ort

from meshd.engine import graph as g


def bind_cache(binding: ort.IOBinding, layers: Iterable[int], keys: Sequence[np.ndarray],
               values: Sequence[np.ndarray], prefix: str = "") -> None:
    """Bind layer ``layers[j]``'s cache buffers ``keys[j]`` and ``values[j]`` (C-contiguous
    float32 [B, kv_heads, C, head_dim]) as its past inputs and its present outputs (graph
    names with ``prefix``)."""
    for layer, k, v in zip(layers, keys, values, strict=True):
        for past, present, arr in ((g.past_key(layer), g.present_key(layer), k),
                                   (g.past_value(layer), g.present_value(layer), v)):
            value = ort.OrtValue.ortvalue_from_numpy(arr)
            binding.bind_ortvalue_input(prefix + past, value)
            binding.bind_ortvalue_output(prefix + present, value)
