"""The onnxruntime adapter of a sentence encoder: texts in, L2-normalised float32 vectors out.

``load_embedder`` checks the directory's files against its manifest and builds one session
(of the float graph, or with ``precision="int8"`` of the int8 one), then runs it once so the
first caller does not pay for onnxruntime's first-run allocations. ``Embedder.embed``
tokenizes (truncating to the model's ``max_seq_length``), sorts the texts by length so that
each batch of up to ``batch_size`` pads little, runs the encoder and returns the rows in the
caller's order; one text takes a shorter path (no sorting, no padding, no copies). The int8
graph runs one text per call, so that a text's vector never depends on the rest of its batch.
An ``Embedder`` may be shared by any number of threads.

With ``spin="auto"`` (the default) and two or more threads, the embedder holds a second
session of the same graph whose idle threads spin-wait while a ``run`` lasts (and stop when it
returns: onnxruntime's ``session.force_spinning_stop``), and each call takes it only when the
kernel counts no other runnable task that would need a core (``meshd.core.spin``; Linux's
``/proc/loadavg``, read per call in ~10-20 us). The two sessions give bit-identical vectors.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from meshd.core.spin import spin_pays
from meshd.embed.graph import ATTENTION_MASK, EMBEDDING, INPUT_IDS, UNFUSED_OPTIMIZERS
from meshd.embed.manifest import EmbedManifest, read_embed_manifest
from meshd.errors import LocalError, ModelError
from meshd.modeldir.providers import choose_providers
from meshd.modeldir.weights import file_sha256

log = logging.getLogger(__name__)
DEFAULT_BATCH_SIZE = 64
PRECISIONS = ("fp32", "int8")
SPIN_MODES = (False, True, "auto")
LOADAVG = "/proc/loadavg"


class SpinTwin:
    """A session and its spinning twin (None: none): ``session()`` is the one a call takes,
    the twin only when ``spin_pays`` (no other runnable task needs a core); ``spun`` counts
    the calls it took. Used by the embedder and the pair verifier."""

    def __init__(self, session: Any, twin: Any, *, cores: int, threads: int) -> None:
        self.plain: Any = session
        self.twin: Any = twin
        self.cores = cores
        self.threads = threads
        self.spun = 0
        self._lock = threading.Lock()

    def session(self) -> Any:
        if self.twin is not None and spin_pays(_runnable(), self.cores, self.threads):
            with self._lock:
                self.spun += 1
            return self.twin
        return self.plain

    def close(self) -> None:
        self.plain = self.twin = None


def twin_pays(threads: int, cores: int) -> bool:
    """Whether a spinning twin can pay: two threads or more on two cores or more, and a kernel
    that says how many tasks are runnable (Linux's /proc/loadavg)."""
    return threads >= 2 and cores >= 2 and _runnable() is not None


class Embedder:
    """One loaded sentence encoder. ``embed(texts) -> float32 [n, dim]``, rows of norm 1."""

    def __init__(self, path: Path, manifest: EmbedManifest, tokenizer: Any,
                 session: ort.InferenceSession, *, batch_size: int, threads: int,
                 precision: str = "fp32", spin_session: ort.InferenceSession | None = None,
                 cores: int | None = None) -> None:
        self.path = path
        self.manifest = manifest
        self.batch_size = batch_size
        self.threads = threads
        self.precision = precision
        self._tok = tokenizer
        # ``session`` and its spinning twin (spin="auto"; None if none)
        self._sessions = SpinTwin(session, spin_session, cores=cores or usable_cores(),
                                  threads=threads)
        self._lock = threading.Lock()
        self._texts = 0
        self._batches = 0
        self._busy_s = 0.0

    @property
    def name(self) -> str:
        return self.manifest.name

    @property
    def identity(self) -> str:
        """``name@sha256-prefix`` of the weights (``+int8`` for the int8 graph): two embedders
        with equal identities give equal vectors, so caches key on it."""
        return self.manifest.identity + ("" if self.precision == "fp32" else "+" + self.precision)

    @property
    def dim(self) -> int:
        return self.manifest.arch.dim

    @property
    def max_tokens(self) -> int:
        """Longer texts are truncated to this many tokens (special tokens included)."""
        return self.manifest.arch.max_seq_length

    @property
    def provider(self) -> str:
        return str(self._sessions.plain.get_providers()[0])

    def token_ids(self, texts: Sequence[str]) -> list[list[int]]:
        """The token ids the encoder sees for each text (after truncation)."""
        _check_texts(texts)
        if len(texts) == 1:
            return [list(self._tok.encode(texts[0]).ids)]
        return [list(e.ids) for e in self._tok.encode_batch(list(texts))]

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Embeddings of ``texts``: float32 [len(texts), dim], each row L2-normalised."""
        t0 = time.perf_counter()
        if len(texts) == 1 and isinstance(texts[0], str) and not isinstance(texts, str):
            row = np.asarray(self._tok.encode(texts[0]).ids, np.int64)[None]
            out = self._run_arrays(row, np.ones_like(row))
            with self._lock:
                self._texts += 1
                self._batches += 1
                self._busy_s += time.perf_counter() - t0
            return out
        ids = self.token_ids(texts)
        out = np.empty((len(ids), self.dim), np.float32)
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
        batches = 0
        for start in range(0, len(order), self.batch_size):
            rows = order[start:start + self.batch_size]
            out[rows] = self._run([ids[i] for i in rows])
            batches += 1
        with self._lock:
            self._texts += len(ids)
            self._batches += batches
            self._busy_s += time.perf_counter() - t0
        return out

    def embed_ids(self, batch: Sequence[Sequence[int]]) -> np.ndarray:
        """Embeddings of token id sequences (special tokens included), one padded batch."""
        if not batch:
            return np.empty((0, self.dim), np.float32)
        return self._run(batch)

    def _run(self, batch: Sequence[Sequence[int]]) -> np.ndarray:
        if self.precision == "int8" and len(batch) > 1:
            # Dynamic quantization scales each activation by the whole batch's range, so a
            # row would depend on its neighbours and padding: run the rows one by one.
            return np.concatenate([self._run([ids]) for ids in batch])
        t = max(len(ids) for ids in batch)
        input_ids = np.zeros((len(batch), t), np.int64)
        mask = np.zeros((len(batch), t), np.int64)
        for r, ids in enumerate(batch):
            input_ids[r, :len(ids)] = ids
            mask[r, :len(ids)] = 1
        return self._run_arrays(input_ids, mask)

    def _run_arrays(self, input_ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        try:
            (emb,) = self._sessions.session().run([EMBEDDING], {INPUT_IDS: input_ids,
                                                                 ATTENTION_MASK: mask})
        except Exception as err:  # onnxruntime's own exception types
            raise ModelError(f"{self.name}: onnxruntime failed: {_first_line(err)}") from None
        return np.asarray(emb, np.float32)

    def statistics(self) -> dict[str, Any]:
        with self._lock:
            return {"model": self.name, "identity": self.identity, "dim": self.dim,
                    "precision": self.precision, "provider": self.provider,
                    "threads": self.threads, "texts": self._texts,
                    "spin": "auto" if self._sessions.twin is not None else "off",
                    "spin_runs": self._sessions.spun,
                    "batches": self._batches, "busy_s": round(self._busy_s, 3)}

    def close(self) -> None:
        self._sessions.close()


def usable_cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def _runnable() -> int | None:
    """Tasks the kernel counts as runnable now, the caller included; None where unknown."""
    try:
        fd = os.open(LOADAVG, os.O_RDONLY)
    except OSError:
        return None
    try:
        return int(os.read(fd, 128).split()[3].split(b"/")[0])
    except (OSError, ValueError, IndexError):
        return None
    finally:
        os.close(fd)


def _check_texts(texts: Sequence[str]) -> None:
    if isinstance(texts, str) or not all(isinstance(t, str) for t in texts):
        raise LocalError("embed() takes a list of strings")


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return text[0] if text else type(err).__name__


def load_embedder(path: str | Path | None = None, *, threads: int | None = None,
                  providers: list[str] | tuple[str, ...] | None = None, verify: bool = True,
                  batch_size: int = DEFAULT_BATCH_SIZE, spin: bool | str = "auto",
                  precision: str = "fp32", warm: bool = True) -> Embedder:
    """Load an embedding model directory (default: all-MiniLM-L6-v2 from the ``meshd[edge]``
    extra, imported into the user's cache on first use). ``verify`` checks the weights' sha256
    (the file size and the graph's and tokenizer's hashes are always checked). ``threads``:
    onnxruntime intra-op threads (default: onnxruntime's, one per core). ``spin``: whether idle
    intra-op threads spin-wait. ``False``: never (they sleep between operators); ``True``:
    always (onnxruntime's own default: on a small shared box a spinning thread takes CPU from
    everything else, 32 tokens on 2 threads at load 7: 44.9 ms p50 without spinning, 58.1 ms
    with); ``"auto"`` (the default): a second session of the graph spins during its runs only,
    and a call takes it only when no other runnable task needs a core (module docstring; with
    one thread, on a GPU provider, or where ``/proc/loadavg`` is missing, as ``False``; +7-16
    MiB for the int8 graph). ``precision``: ``"fp32"`` (the float graph) or
    ``"int8"`` (the int8 graph written at import, about 2x less CPU per embedding; vectors
    within cosine ~0.97 of the float ones, docs/embeddings.md); the two give different
    ``identity`` strings. ``warm``: run the session once before returning."""
    from tokenizers import Tokenizer

    t0 = time.perf_counter()
    if path is None:
        from meshd.embed.package import default_embedding_model
        path = default_embedding_model()
    path = Path(path)
    if batch_size < 1:
        raise LocalError("batch_size must be >= 1")
    if precision not in PRECISIONS:
        raise LocalError(f"precision={precision!r} is not supported ({', '.join(PRECISIONS)})")
    m = read_embed_manifest(path)
    graph_file, graph_sha = m.graph_file, m.graph_sha256
    if precision == "int8":
        if not m.int8_file:
            raise ModelError(f"{path}: this model has no int8 graph (imported by an older meshd); "
                             "import it again with: meshd model import HF_DIR --out DIR --force")
        graph_file, graph_sha = m.int8_file, m.int8_sha256
    weights = path / m.weights_file
    try:
        size = weights.stat().st_size
    except FileNotFoundError:
        raise ModelError(f"{weights}: weights file is missing") from None
    if size != m.weights_bytes:
        raise ModelError(f"{m.weights_file}: size {size} bytes, manifest says {m.weights_bytes} "
                         "(truncated or replaced?)")
    if verify and file_sha256(weights) != m.weights_sha256:
        raise ModelError(f"{m.weights_file}: hash mismatch (the file is corrupt or does not "
                         "belong to this manifest)")
    for name, want in ((graph_file, graph_sha), (m.tokenizer_file, m.tokenizer_sha256)):
        try:
            data = (path / name).read_bytes()
        except OSError:
            raise ModelError(f"{path}: {name} is missing") from None
        if hashlib.sha256(data).hexdigest() != want:
            raise ModelError(f"{name}: hash mismatch (not this model's file)")
    try:
        tok = Tokenizer.from_file(str(path / m.tokenizer_file))
    except Exception as err:  # the library raises a bare Exception on any parse error
        raise ModelError(f"{m.tokenizer_file}: cannot load ({_first_line(err)})") from None
    tok.no_padding()
    tok.enable_truncation(max_length=m.arch.max_seq_length)
    if threads is not None and threads < 1:
        raise LocalError("threads must be >= 1")
    if spin not in SPIN_MODES:
        raise LocalError(f"spin={spin!r} is not supported (False, True or 'auto')")
    cores = usable_cores()
    n_threads = threads or cores  # onnxruntime's default: one per core
    twin = spin == "auto" and twin_pays(n_threads, cores)
    try:
        session = open_session(path / graph_file, threads=threads, spin=spin is True,
                               providers=providers)
        twin = twin and session.get_providers()[0] == "CPUExecutionProvider"
        spin_session = (open_session(path / graph_file, threads=threads, spin=True,
                                     spin_stop=True, providers=providers) if twin else None)
    except Exception as err:
        raise ModelError(f"{m.name}: onnxruntime cannot build the session: "
                         f"{_first_line(err)}") from None
    emb = Embedder(path, m, tok, session, batch_size=batch_size, threads=n_threads,
                   precision=precision, spin_session=spin_session, cores=cores)
    if warm:  # onnxruntime allocates and pre-packs on the first run (measured: docs/embeddings.md)
        emb.embed_ids([[0] * 8])
        if spin_session is not None:
            ids = np.zeros((1, 8), np.int64)
            spin_session.run([EMBEDDING], {INPUT_IDS: ids, ATTENTION_MASK: np.ones_like(ids)})
    log.info("embedding model loaded name=%s dim=%d precision=%s provider=%s load_ms=%.1f",
             m.name, emb.dim, precision, emb.provider, (time.perf_counter() - t0) * 1e3)
    return emb


def open_session(graph: Path, *, threads: int | None = None, spin: bool = False,
                 spin_stop: bool = False, providers: list[str] | tuple[str, ...] | None = None,
                 optimized_model_path: Path | None = None,
                 profile_prefix: str | None = None) -> ort.InferenceSession:
    """The onnxruntime session of an encoder graph, as ``load_embedder`` builds it: all graph
    optimisations but the fusions of ``UNFUSED_OPTIMIZERS`` (meshd.embed.graph), spin-waiting
    as asked (``spin_stop``: only while a ``run`` lasts). ``optimized_model_path``: also write the optimised graph there (tests);
    ``profile_prefix``: turn onnxruntime's profiler on (benchmarks)."""
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.log_severity_level = 3
    so.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
    if spin_stop:
        so.add_session_config_entry("session.force_spinning_stop", "1")
    if threads is not None:
        so.intra_op_num_threads = threads
    if optimized_model_path is not None:
        so.optimized_model_filepath = str(optimized_model_path)
    if profile_prefix is not None:
        so.enable_profiling = True
        so.profile_file_prefix = profile_prefix
    return ort.InferenceSession(str(graph), so, providers=choose_providers(providers),
                                disabled_optimizers=list(UNFUSED_OPTIMIZERS))
