"""The encoder's contextual word vectors: the last hidden states before pooling, per word.

An additive helper beside ``Embedder`` (whose graph and session it leaves alone): it opens a
second onnxruntime session of the same encoder graph with one more output, the input of the
pooling (the output of the last ``LayerNormalization``), and averages the states of each word's
word-pieces. The semantic cache's verifier (meshd.cache.align) asks it about the two prompts
of a candidate hit whose words differ by an added run only, so it runs rarely and off the
miss path. The int8 graph is the default, as for ``Embedder``; one text per run, so that a
text's states never depend on another's.
"""

from __future__ import annotations

import tempfile
import threading
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

from meshd.embed.graph import ATTENTION_MASK, INPUT_IDS, UNFUSED_OPTIMIZERS
from meshd.embed.manifest import read_embed_manifest
from meshd.errors import ModelError
from meshd.modeldir.providers import choose_providers

WordStates = tuple[tuple[tuple[int, int], ...], np.ndarray]  # word char spans, [words, dim]


def expose_token_states(model: onnx.ModelProto) -> str:
    """Add the token states that pooling reads (the output of the last ``LayerNormalization``,
    or ``SkipLayerNormalization`` in graphs imported before the plain form, found as the one a
    pooling ``Mul`` -> ``ReduceSum`` or a CLS ``Gather`` consumes, not by node order) to ``model``'s outputs, in place; returns its name."""
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for n in model.graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)

    def pools(name: str) -> bool:
        for n in consumers.get(name, []):
            if n.op_type == "Gather" and n.input[0] == name:
                return True
            if n.op_type == "Mul" and any(c.op_type == "ReduceSum"
                                          for c in consumers.get(n.output[0], [])):
                return True
        return False

    found = [n.output[0] for n in model.graph.node  # (graphs imported before the unfused form
             if n.op_type in ("LayerNormalization", "SkipLayerNormalization")  # keep Skip...)
             and pools(n.output[0])]
    if len(found) != 1:
        raise ModelError("encoder graph: cannot find the token states that pooling reads")
    name = found[0]
    if name not in {o.name for o in model.graph.output}:
        model.graph.output.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, None))
    return name


class TokenStates:
    """``words(text)``: the char spans of a text's words (special tokens left out) and their
    contextual vectors, float32 [words, dim], each row L2-normalised. Thread-safe."""

    def __init__(self, path: str | Path, *, precision: str = "int8", threads: int = 1) -> None:
        from tokenizers import Tokenizer

        path = Path(path)
        m = read_embed_manifest(path)
        graph = path / (m.int8_file if precision == "int8" and m.int8_file else m.graph_file)
        model = onnx.load(str(graph), load_external_data=False)
        external = any(t.data_location == TensorProto.EXTERNAL for t in model.graph.initializer)
        if external:  # the float graph keeps its weights in weights.bin
            onnx.load_external_data_for_model(model, str(path))
        self._out = expose_token_states(model)
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        so.log_severity_level = 3
        so.intra_op_num_threads = threads
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        # From a file, not from bytes: onnxruntime keeps a copy of a model given as bytes
        # (measured: +112 MiB RSS for the int8 graph from bytes, +57 MiB from a file).
        with tempfile.TemporaryDirectory(prefix="meshd-token-states-") as tmp:
            graph_path = Path(tmp) / "encoder-states.onnx"
            onnx.save(model, str(graph_path))
            del model
            self._session: Any = ort.InferenceSession(
                str(graph_path), so, providers=choose_providers(None),
                disabled_optimizers=list(UNFUSED_OPTIMIZERS))
        tok = Tokenizer.from_file(str(path / m.tokenizer_file))
        tok.no_padding()
        tok.enable_truncation(max_length=m.arch.max_seq_length)
        self._tok = tok
        self.precision = precision
        self._lock = threading.Lock()
        self._memo: dict[str, WordStates] = {}

    def words(self, text: str) -> WordStates:
        with self._lock:
            got = self._memo.get(text)
        if got is not None:
            return got
        enc = self._tok.encode(text)
        ids = np.asarray(enc.ids, np.int64)[None]
        (states,) = self._session.run([self._out], {INPUT_IDS: ids,
                                                    ATTENTION_MASK: np.ones_like(ids)})
        got = group_words(enc.word_ids, enc.offsets, np.asarray(states[0], np.float32))
        with self._lock:
            if len(self._memo) >= 256:
                self._memo.pop(next(iter(self._memo)))
            self._memo[text] = got
        return got


def group_words(word_ids: list[int | None], offsets: list[tuple[int, int]],
                states: np.ndarray) -> WordStates:
    """Average the word-pieces of each word (special tokens have no word id), L2-normalise."""
    spans: list[tuple[int, int]] = []
    rows: list[np.ndarray] = []
    last: int | None = None
    for i, w in enumerate(word_ids):
        if w is None:
            last = None
            continue
        if w == last:
            rows[-1] = rows[-1] + states[i]
            spans[-1] = (spans[-1][0], offsets[i][1])
            continue
        spans.append((offsets[i][0], offsets[i][1]))
        rows.append(states[i].astype(np.float32).copy())
        last = w
    if not rows:
        return (), np.zeros((0, states.shape[-1]), np.float32)
    vecs = np.stack(rows)
    vecs /= np.maximum(np.linalg.norm(vecs, axis=1, keepdims=True), 1e-12)
    return tuple(spans), vecs
