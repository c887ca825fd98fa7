"""The int8 variant of an imported encoder: ``encoder-int8.onnx`` beside ``encoder.onnx``.

onnxruntime's dynamic quantization (``onnxruntime.quantization.quantize_dynamic``): the weights
of every ``MatMul`` and ``Attention`` become int8 (signed, one scale per output channel), the
activations are quantized per call, and onnxruntime runs ``DynamicQuantizeMatMul`` and
``QAttention`` kernels. LayerNorms, GELU, pooling and the embedding tables stay float32; the
residual LayerNorms are plain ``Add``/``LayerNormalization`` nodes (rewritten from
``SkipLayerNormalization`` where the float graph predates that form: meshd.embed.graph).

The float graph keeps its weights in ``weights.bin`` as ``[out, in]`` tensors that onnxruntime
transposes when it builds a session; the quantizer needs them as initializers, so we first let
onnxruntime write the graph after its basic (provider-independent) optimisations, which folds
those transposes, then quantize that. Tensors that came out unchanged (the embedding tables,
LayerNorm weights, biases) are pointed back into ``weights.bin`` rather than copied, so the
int8 file holds only the quantized weights (about 11 MB for all-MiniLM-L6-v2, against 86 MB
of float weights).

Why it is optional and what it costs in accuracy: docs/embeddings.md ("int8").
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import tempfile
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from meshd.embed.graph import unfuse_skip_layer_norm
from meshd.embed.manifest import EmbedManifest, read_embed_manifest
from meshd.errors import ModelError

log = logging.getLogger(__name__)
INT8_FILE = "encoder-int8.onnx"
# What the manifest records; bumped when the int8 graph meshd writes changes, so that
# ``ensure_int8`` rewrites the graphs it manages. "-2": residual LayerNorms unfused (7-10% less
# CPU; same vectors to ~1e-7).
INT8_SCHEME = "ort-dynamic-s8-per-channel-2"


def optimize_basic(source: str | bytes, out: Path) -> None:
    """Write the graph ``source`` (a file or its bytes) to ``out`` after onnxruntime's basic,
    provider-independent optimisations (which fold the weights' transposes)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    so.optimized_model_filepath = str(out)
    so.log_severity_level = 3
    ort.InferenceSession(source, so, providers=["CPUExecutionProvider"])


def dynamic_int8(model: Any, out: Path, *, exclude: Sequence[str] = ()) -> None:
    """Write ``model`` (an onnx ``ModelProto``) to ``out`` quantized as every int8 graph of
    meshd is (the module's docstring): the weights of its ``MatMul`` and ``Attention`` nodes,
    but those named in ``exclude``, signed int8 with one scale per output channel."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quiet = logging.root.manager.disable
    logging.disable(logging.WARNING)  # the quantizer logs a line per tensor to the root logger
    try:
        quantize_dynamic(model, out, op_types_to_quantize=["MatMul", "Attention"],
                         per_channel=True, nodes_to_exclude=list(exclude),
                         weight_type=QuantType.QInt8,
                         extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})
    finally:
        logging.disable(quiet)


def quantize_encoder(directory: Path, manifest: EmbedManifest, out_name: str = INT8_FILE
                     ) -> tuple[str, str]:
    """Write ``directory/out_name`` from the directory's float graph; returns (file name,
    sha256). The file is written to a temporary name and renamed into place."""
    import onnx
    from onnx.external_data_helper import load_external_data_for_model

    directory = Path(directory)
    with tempfile.TemporaryDirectory(dir=directory, prefix=".quantize-") as tmp:
        basic = Path(tmp) / "basic.onnx"
        try:
            optimize_basic(str(directory / manifest.graph_file), basic)
            model = onnx.load(str(basic), load_external_data=False)
            load_external_data_for_model(model, str(directory))  # references into weights.bin
            quantized = Path(tmp) / "int8.onnx"
            dynamic_int8(model, quantized)
            out = onnx.load(str(quantized))
            unfuse_skip_layer_norm(out)
        except Exception as err:  # onnxruntime's and onnx's own exception types
            first = (str(err).strip().splitlines() or [type(err).__name__])[0]
            raise ModelError(f"{manifest.name}: int8 quantization failed: {first}") from None
        _share_weights(out, directory, manifest)
        data = out.SerializeToString()
        part = Path(tmp) / out_name
        part.write_bytes(data)
        os.replace(part, directory / out_name)
    return out_name, hashlib.sha256(data).hexdigest()


def with_int8(directory: Path, manifest: EmbedManifest) -> EmbedManifest:
    """Quantize the directory's graph; the manifest that names the int8 file (not written)."""
    name, sha = quantize_encoder(directory, manifest)
    return replace(manifest, int8_file=name, int8_sha256=sha, int8_scheme=INT8_SCHEME)


def ensure_int8(directory: Path) -> EmbedManifest:
    """Add the int8 graph to a directory imported without one (by an older meshd), or rewrite
    one of an older scheme, rewriting its manifest; a no-op when it has a current one. For
    directories meshd manages (the default model's cache); ``load_embedder`` never writes into
    a user's model directory (an older int8 graph there still loads, only slower)."""
    m = read_embed_manifest(directory)
    if _current(directory, m):
        return m
    # Several daemons of one user may start on the same cache at once: one writes, the others
    # wait for it and then find the graph current.
    with open(directory / ".int8.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        m = read_embed_manifest(directory)
        if _current(directory, m):
            return m
        log.warning("writing the int8 graph of an embedding model dir=%s old_scheme=%s",
                    directory, m.int8_scheme or "none")
        m = with_int8(directory, m)
        m.write(directory)
        return m


def _current(directory: Path, m: EmbedManifest) -> bool:
    return bool(m.int8_file) and (directory / m.int8_file).is_file() and m.int8_scheme == INT8_SCHEME


def _share_weights(model: object, directory: Path, manifest: EmbedManifest) -> None:
    """Point float32 initializers that equal a tensor of ``weights.bin`` back at it."""
    from onnx import TensorProto
    from onnx.external_data_helper import set_external_data

    entries = {t.name: t for t in manifest.tensors if t.dtype == "fp32"}
    if not entries:
        return
    blob = np.memmap(directory / manifest.weights_file, np.uint8, mode="r")
    for init in model.graph.initializer:  # type: ignore[attr-defined]
        e = entries.get(init.name)
        if (e is None or init.data_type != TensorProto.FLOAT or tuple(init.dims) != e.shape
                or len(init.raw_data) != e.nbytes
                or bytes(blob[e.offset:e.offset + e.nbytes]) != init.raw_data):
            continue
        set_external_data(init, manifest.weights_file, offset=e.offset, length=e.nbytes)
        init.data_location = TensorProto.EXTERNAL
        init.ClearField("raw_data")
