"""The semantic cache's pair verifier on onnxruntime: two prompts in, P(same answer) out.

A cross-encoder (both prompts in one input, ``[CLS] cached [SEP] query [SEP]``) made of the
first layers of all-MiniLM-L6-v2 fine-tuned on labelled prompt pairs by
``scripts/train_pair_verifier.py`` (dev-only, torch), plus one linear unit over the mean of
the last hidden states. Only what training changed ships with meshd
(``meshd/data/verifier/pair-verifier-v1.npz``, float16: the layers, the position and
token-type embeddings, the LayerNorms and the head over ``[a, b, |a - b|, a * b]`` of the two
segments' mean last states; ``.json`` beside it says how it was made
and its default thresholds); the word-embedding table, frozen in training, is read from the
embedding model's own ``weights.bin`` (memory-mapped: only the rows of the words seen are
read). The word, position and token-type embeddings are summed in NumPy; the ONNX graph
(built here, in memory, at load, its products quantized to int8 weights: ``quantize_graph``)
takes that sum and holds the rest; the shipped calibration is made on that graph's scores.

The cache (meshd.cache.policy) asks it only about the nearest cached question, and only when
its similarity reaches the calibration's gate, so most misses never pay for it; its score is
served only above the threshold its calibration gives for the request's error bound
(``read_calibration``, meshd.cache.bound). One pair per run (no padding); thread-safe.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from meshd.cache.bound import Calibration
from meshd.embed.embedder import SpinTwin, twin_pays, usable_cores
from meshd.embed.manifest import read_embed_manifest
from meshd.embed.quantize import dynamic_int8, optimize_basic
from meshd.errors import ModelError
from meshd.modeldir.onnx_graph import IR_VERSION, OPSET
from meshd.modeldir.providers import choose_providers

NAME = "pair-verifier-v1"
WORDS = "embeddings.word_embeddings.weight"


def shipped_verifier() -> Path:
    """The weights file shipped in the package data (``.json`` beside it)."""
    return Path(__file__).resolve().parents[1] / "data" / "verifier" / f"{NAME}.npz"


@dataclass(frozen=True, slots=True)
class VerifierInfo:
    """What the ``.json`` beside the weights says."""

    name: str
    layers: int
    max_len: int
    base: str  # the embedding model's identity whose word table it reads


def read_info(npz: Path) -> VerifierInfo:
    path = npz.with_suffix(".json")
    try:
        meta = json.loads(path.read_text())
        return VerifierInfo(str(meta["name"]), int(meta["layers"]), int(meta["max_len"]),
                            str(meta["base"]))
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ModelError(f"{path}: cannot read the pair verifier's description ({err})") from None


def calibration_path(npz: Path) -> Path:
    return npz.with_name(npz.stem + "-calibration.json")


def read_calibration(npz: Path | None = None) -> Calibration:
    """The verifier's calibration (written by ``scripts/calibrate_cache.py``): its scores of the
    labelled near misses of the calibration splits that reached the cosine gate
    (meshd.cache.bound)."""
    path = calibration_path(npz or shipped_verifier())
    try:
        meta = json.loads(path.read_text())
        scores = tuple(sorted((float(s) for s in meta["scores"]), reverse=True))
        return Calibration(float(meta["gate"]), int(meta["near_misses"]), scores,
                           float(meta["confidence"]), str(meta["verifier"]))
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ModelError(f"{path}: cannot read the pair verifier's calibration ({err})") from None


def build_graph(t: dict[str, np.ndarray], layers: int, heads: int, eps: float) -> bytes:
    """x float32 [1, T, H] (the summed embeddings), wa and wb float32 [1, 1, T] (each
    segment's tokens, weights summing to 1) -> p float32 [1, 1]: the serialized model. The
    head reads ``[a, b, |a - b|, a * b]`` of the two segments' mean last states."""
    nodes: list[Any] = []
    inits = [numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in t.items()]

    def op(kind: str, inputs: list[str], out: str, domain: str = "", **attrs: Any) -> str:
        nodes.append(helper.make_node(kind, inputs, [out], domain=domain or None, **attrs))
        return out

    x = op("LayerNormalization", ["x", "ln.w", "ln.b"], "emb", axis=-1, epsilon=eps)
    for i in range(layers):
        p = f"l{i}."
        ctx = op("Attention", [x, p + "qkv.w", p + "qkv.b"], p + "ctx", "com.microsoft",
                 num_heads=heads)
        o = op("Add", [op("MatMul", [ctx, p + "o.w"], p + "o"), p + "o.b"], p + "ob")
        x = op("LayerNormalization", [op("Add", [o, x], p + "r1"), p + "ln1.w", p + "ln1.b"],
               p + "h1", axis=-1, epsilon=eps)
        act = op("BiasGelu", [op("MatMul", [x, p + "inter.w"], p + "i"), p + "inter.b"],
                 p + "act", "com.microsoft")
        o = op("Add", [op("MatMul", [act, p + "out.w"], p + "m"), p + "out.b"], p + "mb")
        x = op("LayerNormalization", [op("Add", [o, x], p + "r2"), p + "ln2.w", p + "ln2.b"],
               p + "h2", axis=-1, epsilon=eps)
    a = op("MatMul", ["wa", x], "a")  # [1, 1, H]: the mean state of the first segment
    b = op("MatMul", ["wb", x], "b")  # and of the second
    diff = op("Abs", [op("Sub", [a, b], "sub")], "diff")
    feats = op("Concat", [a, b, diff, op("Mul", [a, b], "prod")], "feats", axis=-1)
    logit = op("Add", [op("MatMul", [feats, "head.w"], "dot"), "head.b"], "logit")  # [1, 1]
    op("Sigmoid", [logit], "p")
    graph = helper.make_graph(
        nodes, "pair_verifier",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "T", t["ln.w"].shape[0]]),
         helper.make_tensor_value_info("wa", TensorProto.FLOAT, [1, 1, "T"]),
         helper.make_tensor_value_info("wb", TensorProto.FLOAT, [1, 1, "T"])],
        [helper.make_tensor_value_info("p", TensorProto.FLOAT, [1, 1])], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", min(OPSET, 17)),
                                                    helper.make_opsetid("com.microsoft", 1)],
                              producer_name="meshd")
    model.ir_version = IR_VERSION
    return bytes(model.SerializeToString())


def quantize_graph(graph: bytes) -> bytes:
    """``build_graph``'s model with int8 weights in the layers' products and attention, as the
    embedding's int8 graph (``meshd.embed.quantize.dynamic_int8``); the segment pooling and the
    head stay float. 2.6 ms per pair against 4.0 for the float graph on the 2-core box (warm,
    300 held-out pairs); the calibration is made on its scores."""
    import tempfile

    import onnx

    try:
        with tempfile.TemporaryDirectory(prefix="meshd-verifier-") as tmp:
            basic, quantized = Path(tmp) / "basic.onnx", Path(tmp) / "int8.onnx"
            optimize_basic(graph, basic)
            model = onnx.load(str(basic))
            for i, node in enumerate(model.graph.node):
                node.name = node.name or f"n{i}_{node.output[0]}"
            floats = [n.name for n in model.graph.node if n.output[0] in ("a", "b", "dot")]
            dynamic_int8(model, quantized, exclude=floats)
            return quantized.read_bytes()
    except Exception as err:  # onnxruntime's and onnx's own exception types
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise ModelError(f"pair verifier: int8 quantization failed: {first}") from None


def _session(graph: bytes, threads: int, *, spin: bool) -> Any:
    """A session of the verifier's graph; ``spin``: its idle intra-op threads spin-wait while
    a ``run`` lasts, and only then (``session.force_spinning_stop``)."""
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.log_severity_level = 3
    so.intra_op_num_threads = threads
    so.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
    if spin:
        so.add_session_config_entry("session.force_spinning_stop", "1")
    return ort.InferenceSession(graph, so, providers=choose_providers(None))


class PairVerifier:
    """``probability(cached, query)``: the verifier's P(the cached answer is right for the
    query). ``embed_dir``: the imported embedding model whose word table the verifier reads
    (the default model when None). ``threads``: onnxruntime intra-op threads (0: its default,
    one per core; on 2 cores 3.2 ms p50 per candidate against 4.8 on one thread). ``spin``:
    with two threads or more, keep a second session whose idle threads spin-wait during its
    runs and take it when no other runnable task needs a core (``meshd.core.spin``, as the
    embedder's ``spin="auto"``); both sessions give bit-identical scores."""

    def __init__(self, npz: str | Path | None = None, embed_dir: str | Path | None = None, *,
                 threads: int = 0, spin: bool = True) -> None:
        from tokenizers import Tokenizer

        npz = Path(npz) if npz is not None else shipped_verifier()
        self.info = read_info(npz)
        if embed_dir is None:
            from meshd.embed.package import default_embedding_model
            embed_dir = default_embedding_model()
        embed_dir = Path(embed_dir)
        self.embed_dir = embed_dir
        m = read_embed_manifest(embed_dir)
        if m.identity != self.info.base:
            raise ModelError(f"{npz.name}: trained on {self.info.base}, not {m.identity}")
        entry = next(e for e in m.tensors if e.name == WORDS)
        if entry.dtype != "fp32":
            raise ModelError(f"{embed_dir}: the pair verifier needs fp32 word embeddings")
        blob = np.memmap(embed_dir / m.weights_file, np.uint8, mode="r")
        self._words = np.frombuffer(blob[entry.offset:entry.offset + entry.nbytes],
                                    np.float32).reshape(entry.shape)
        try:
            with np.load(npz) as z:
                t = {k: z[k].astype(np.float32) for k in z.files}
        except (OSError, ValueError) as err:
            raise ModelError(f"{npz}: cannot read the pair verifier ({err})") from None
        self._pos, self._typ = t.pop("pos"), t.pop("typ")
        graph = quantize_graph(build_graph(t, self.info.layers, m.arch.num_heads,
                                           m.arch.layer_norm_eps))
        plain = _session(graph, threads, spin=False)
        # The spinning twin (as the embedder's): taken for a call only when no other task needs
        # a core; None with one thread, on a GPU provider or without /proc/loadavg.
        cores = usable_cores()
        self.threads = threads or cores  # onnxruntime's default: one per core
        twin = (spin and twin_pays(self.threads, cores)
                and plain.get_providers()[0] == "CPUExecutionProvider")
        self._sessions = SpinTwin(plain, _session(graph, threads, spin=True) if twin else None,
                                  cores=cores, threads=self.threads)
        tok = Tokenizer.from_file(str(embed_dir / m.tokenizer_file))
        tok.no_padding()
        tok.enable_truncation(max_length=min(self.info.max_len, len(self._pos)))
        self._tok = tok
        self._lock = threading.Lock()
        self.calls = 0

    @property
    def spin_calls(self) -> int:
        """The calls its spinning twin took."""
        return self._sessions.spun

    def inputs(self, cached: str, query: str) -> dict[str, np.ndarray]:
        """The graph's inputs for the pair: the summed embeddings of ``[CLS] cached [SEP]
        query [SEP]`` and each segment's pooling weights."""
        enc = self._tok.encode(cached, query)
        ids = np.asarray(enc.ids, np.int64)
        types = np.asarray(enc.type_ids)
        x = self._words[ids] + self._pos[:len(ids)] + self._typ[types]
        wa = (types == 0).astype(np.float32)
        wb = (types == 1).astype(np.float32)
        wa /= max(float(wa.sum()), 1.0)
        wb /= max(float(wb.sum()), 1.0)
        return {"x": x[None].astype(np.float32), "wa": wa[None, None], "wb": wb[None, None]}

    def probability(self, cached: str, query: str) -> float:
        feeds = self.inputs(cached, query)
        try:
            (p,) = self._sessions.session().run(["p"], feeds)
        except Exception as err:  # onnxruntime's own exception types
            raise ModelError(f"pair verifier: onnxruntime failed: {err}") from None
        with self._lock:
            self.calls += 1
        return float(p[0, 0])
