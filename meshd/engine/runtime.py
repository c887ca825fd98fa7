"""The onnxruntime adapter: load a model directory, build stage sessions, run steps.

``load_model`` checks the weights it will use against the manifest's hashes and builds the
session of the loaded layer range. ``Model.stage`` builds (and caches) the session of any
contiguous sub-range on demand. A ``StageSession`` owns one request's KV cache for its layers:
plain numpy buffers that onnxruntime reads in place, grown in chunks, so a decode step copies
nothing the size of the cache. Foreign (onnxruntime) errors become meshd errors here.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import threading
import time
import weakref
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from meshd.core.modelid import of_manifest
from meshd.core.prefix_cache import PrefixCache
from meshd.engine import graph as g
from meshd.engine import kvmem, planning, q4kernel
from meshd.engine.generation import TokenEvent
from meshd.engine.kvbind import bind_cache
from meshd.engine.manifest import Manifest, StageEntry, read_manifest
from meshd.engine.planning import StageMemory, check_range, stage_memory, stage_tensor_names
from meshd.engine.prefix import StagePrefixes, stage_prefixes
from meshd.engine.run import generate_async, generate_sync
from meshd.engine.sampling import GenerationConfig
from meshd.engine.scheduler import Batcher
from meshd.engine.tokenizer import Tokenizer
from meshd.engine.weights import verify_weights
from meshd.errors import LocalError, ModelError
from meshd.modeldir.pages import page_out, paging_out, trim_heap
from meshd.modeldir.providers import choose_providers

log = logging.getLogger(__name__)

# The KV cache grows by this many slots at least (an eighth of its size beyond that): attention
# reads every slot, so little slack; growing copies the cache, so not too often.
CACHE_CHUNK_TOKENS = 64
PREFILL_CHUNK_TOKENS = planning.PREFILL_CHUNK_TOKENS
_EXTERNAL_FOLDER = "session.model_external_initializers_file_folder_path"
_STOP_SPINNING = "session.force_spinning_stop"


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return text[0] if text else type(err).__name__


class Stage:
    """The compiled graph of layers ``[start, end)``; shared by every session opened on it."""

    def __init__(self, model: Model, start: int, end: int, session: ort.InferenceSession, *,
                 fused: bool = False) -> None:
        self.model = model
        self.start, self.end = start, end
        self.fused = fused  # the graph also takes one prompt chunk (``graph.build_stage_graph``)
        self.is_first = start == 0
        self.is_last = end == model.num_layers
        self.memory: StageMemory = stage_memory(model.manifest.arch, start, end,
                                                 model.manifest.dtype,
                                                 model.manifest.stored_bytes())
        self._session = session
        self.provider: str = session.get_providers()[0]
        self._device = "cuda" if self.provider in ("CUDAExecutionProvider",
                                                   "TensorrtExecutionProvider") else "cpu"
        self.output_names = [o.name for o in session.get_outputs()]
        arch = model.manifest.arch
        expected = [g.LOGITS if self.is_last else g.HIDDEN_OUT]
        for i in range(start, end):
            expected += [g.present_key(i), g.present_value(i)]
        if fused:
            expected += [g.CHUNK + name for name in expected[1:]]
        key_shape = session.get_outputs()[1].shape if len(expected) > 2 else []
        key_dims = [key_shape[1], key_shape[3]] if len(key_shape) == 4 else []
        if self.output_names != expected or key_dims != [arch.num_kv_heads, arch.head_dim]:
            raise ModelError(f"{model.manifest.name} layers [{start}, {end}): the stage graph "
                             "does not have the outputs this meshd expects (re-import the model)")
        # a fused graph run for one group only: its chunk group gets no rows (and empty caches)
        kvh, d = arch.num_kv_heads, arch.head_dim
        self._idle = [np.zeros((0, kvh, 1, d), np.float32)
                      for _ in range(2 * self.num_layers if fused else 0)]
        self._open: weakref.WeakSet[StageSession] = weakref.WeakSet()
        self._open_lock = threading.Lock()
        self.sessions_opened = 0

    @property
    def num_layers(self) -> int:
        return self.end - self.start

    def open_session(self, max_tokens: int | None = None) -> StageSession:
        """A new KV cache for one request, holding at most ``max_tokens`` tokens (default: the
        model's context length)."""
        ctx = self.model.manifest.arch.max_position_embeddings
        if max_tokens is None:
            max_tokens = ctx
        if not 1 <= max_tokens <= ctx:
            raise LocalError(f"max_tokens={max_tokens} must be in [1, {ctx}] (the context)")
        session = StageSession(self, max_tokens)
        with self._open_lock:
            self._open.add(session)
            self.sessions_opened += 1
        return session

    def statistics(self) -> dict[str, Any]:
        with self._open_lock:
            live = [s for s in self._open if not s.freed]
        return {"layers": [self.start, self.end], "provider": self.provider,
                "sessions_opened": self.sessions_opened, "sessions_open": len(live),
                "kv_bytes": sum(s.memory_bytes() for s in live)}

    def binding(self) -> ort.IOBinding:
        """A new IO binding for runs of the main group only: on a fused graph, with no chunk
        (so one session serves decode steps, prompt chunks and both fused)."""
        b = self._session.io_binding()
        if self.fused:
            b.bind_cpu_input(g.CHUNK_IDS, np.zeros((0, 1), np.int64))
            b.bind_cpu_input(g.CHUNK_POSITIONS, np.zeros((0, 1), np.int64))
            bind_cache(b, range(self.start, self.end), self._idle[0::2], self._idle[1::2],
                       g.CHUNK)
        return b

    def _run(self, binding: ort.IOBinding) -> None:
        try:
            self._session.run_with_iobinding(binding)
        except Exception as err:  # onnxruntime raises its own Fail/InvalidArgument types
            raise ModelError(
                f"stage [{self.start}, {self.end}): onnxruntime failed: {_first_line(err)}"
            ) from None

    def __repr__(self) -> str:
        return f"Stage({self.model.manifest.name!r}, [{self.start}, {self.end}), {self.provider})"


class StageSession:
    """One request's state on one stage. Not thread-safe: one ``step`` at a time.

    ``step(x, positions)`` runs ``T`` new tokens: ``x`` is int64 token ids [T] on a first stage,
    float32 hidden states [T, H] otherwise; ``positions`` must be ``length .. length+T-1``. It
    returns hidden states [T, H], or on the last stage logits [T, V] (only the last row,
    [1, V], with ``last_only=True``).
    """

    def __init__(self, stage: Stage, max_tokens: int) -> None:
        arch = stage.model.manifest.arch
        self.stage = stage
        self.max_tokens = max_tokens
        self.length = 0
        self._shape = (arch.num_kv_heads, arch.head_dim)
        self._hidden = arch.hidden_size
        self._vocab = arch.vocab_size
        self._keys: list[np.ndarray] = []
        self._values: list[np.ndarray] = []
        self._binding: ort.IOBinding | None = stage.binding()
        self._capacity = 0
        self._bound_shape: tuple[int, int] | None = None
        self._outputs: list[np.ndarray] = []
        self._freed = False

    @property
    def capacity(self) -> int:
        """Cache slots allocated now (grows in chunks up to ``max_tokens``)."""
        return self._capacity

    def memory_bytes(self) -> int:
        """Bytes held by this session's KV cache."""
        return sum(a.nbytes for a in self._keys) + sum(a.nbytes for a in self._values)

    @property
    def freed(self) -> bool:
        return self._freed

    def cache(self) -> list[np.ndarray]:
        """Per layer the key and value buffers of this session (views, a batch of one)."""
        return [a for kv in zip(self._keys, self._values, strict=True) for a in kv]

    def reserve(self, need: int) -> None:
        """Grow the cache now to hold ``need`` tokens (before restoring a cached prefix)."""
        if need > self.max_tokens:
            raise LocalError(f"session is full: {need} tokens > max_tokens={self.max_tokens}")
        self._ensure_capacity(need)

    def restored(self, n: int) -> None:
        """The first ``n`` tokens' keys and values were written through ``cache()`` (a
        reused prefix): the next step starts at position ``n``."""
        if self.length or not 0 <= n <= self._capacity:
            raise LocalError(f"cannot restore {n} tokens into a session holding {self.length} "
                             f"of {self._capacity}")
        self.length = n

    def free(self) -> None:
        """Drop the cache; the session cannot be used afterwards."""
        self._keys, self._values = [], []
        self._binding = None
        self._capacity = 0
        self._freed = True

    def step(self, x: np.ndarray, positions: np.ndarray, *, last_only: bool = False) -> np.ndarray:
        if self._freed or self._binding is None:
            raise LocalError("stage session was freed")
        positions = np.asarray(positions)
        if positions.ndim != 1 or positions.shape[0] < 1 or positions.dtype.kind not in "iu":
            raise LocalError("positions must be a non-empty 1-D integer array")
        t = int(positions.shape[0])
        if positions[0] != self.length or (t > 1 and np.any(np.diff(positions) != 1)):
            raise LocalError(f"positions must run {self.length}..{self.length + t - 1} "
                             f"(this session holds {self.length} tokens)")
        if self.length + t > self.max_tokens:
            raise LocalError(f"session is full: {self.length} + {t} tokens > max_tokens="
                             f"{self.max_tokens}")
        x = self._check_input(x, t)
        self._ensure_capacity(self.length + t)
        if t <= PREFILL_CHUNK_TOKENS:
            return self._run_chunk(x, t, last_only)
        # Long inputs run in chunks: the attention scores of a chunk are [heads, chunk, cache],
        # so peak memory stays bounded whatever the prompt length.
        outs = []
        for a in range(0, t, PREFILL_CHUNK_TOKENS):
            b = min(t, a + PREFILL_CHUNK_TOKENS)
            out = self._run_chunk(x[a:b], b - a, last_only)
            if not last_only or b == t:
                outs.append(out)
        return outs[0] if len(outs) == 1 else np.concatenate(outs)

    def _run_chunk(self, x: np.ndarray, t: int, last_only: bool) -> np.ndarray:
        stage = self.stage
        assert self._binding is not None
        b = self._binding
        b.bind_cpu_input(g.INPUT_IDS if stage.is_first else g.HIDDEN_IN, x[None])  # batch of 1
        p = self.length
        b.bind_cpu_input(g.POSITIONS, np.arange(p, p + t, dtype=np.int64)[None])
        if stage.is_last:
            rows = np.array([t - 1], np.int64) if last_only else np.arange(t, dtype=np.int64)
            b.bind_cpu_input(g.LOGIT_ROWS, rows)
        k = 1 if last_only else t
        if (t, k) != self._bound_shape:
            self._bind_main_output(t, k)
        stage._run(b)  # writes the new keys and values into the cache buffers in place
        self.length += t
        out = self._outputs[0]
        return out.reshape(-1, out.shape[-1]).copy()

    def _bind_main_output(self, t: int, k: int) -> None:
        """Bind a numpy buffer as the logits or hidden output, so onnxruntime writes results
        straight into it; reused by every run of the same shape (every decode step)."""
        stage, b = self.stage, self._binding
        assert b is not None
        main = (k, self._vocab) if stage.is_last else (1, t, self._hidden)
        self._outputs = [np.empty(main, np.float32)]
        b.bind_ortvalue_output(stage.output_names[0],
                               ort.OrtValue.ortvalue_from_numpy(self._outputs[0]))
        self._bound_shape = (t, k)

    def _check_input(self, x: np.ndarray, t: int) -> np.ndarray:
        x = np.asarray(x)
        if self.stage.is_first:
            if x.shape != (t,) or x.dtype.kind not in "iu":
                raise LocalError(f"a first stage takes token ids of shape [{t}], got "
                                 f"{x.dtype}{list(x.shape)}")
            if x.min() < 0 or x.max() >= self._vocab:
                raise LocalError(f"token id outside the vocabulary [0, {self._vocab})")
            return np.ascontiguousarray(x, dtype=np.int64)
        if x.shape != (t, self._hidden) or x.dtype.kind != "f":
            raise LocalError(f"stage [{self.stage.start}, {self.stage.end}) takes hidden states "
                             f"[{t}, {self._hidden}], got {x.dtype}{list(x.shape)}")
        return np.ascontiguousarray(x, dtype=np.float32)

    def _ensure_capacity(self, need: int) -> None:
        if need <= self._capacity:
            return
        grown = max(need, self._capacity + max(CACHE_CHUNK_TOKENS, self._capacity // 8))
        # a whole number of chunks even past max_tokens: attention's arithmetic over the cache
        # depended in its last bits on the slot count (KV layout 3, SmolLM2 Q4_1: 151 slots and
        # 192 give other keys from layer 2 on), so a capacity cut to max_tokens would make a
        # quantized model's tokens depend on the max_tokens asked for, and a reused prefix's
        # keys differ from the ones the prompt computes
        cap = -(-grown // CACHE_CHUNK_TOKENS) * CACHE_CHUNK_TOKENS
        kvh, d = self._shape
        keep = self.length
        keys, values, b = self._keys, self._values, self._binding
        assert b is not None
        # one layer at a time, rebinding it at once (the binding holds what it is bound to):
        # a growth holds one layer's buffers twice, not the whole cache
        for j, layer in enumerate(range(self.stage.start, self.stage.end)):
            k = kvmem.zeros((1, kvh, cap, d))  # [1, kv_heads, slot, head_dim]
            v = kvmem.zeros((1, kvh, cap, d))
            if keep:
                k[:, :, :keep] = keys[j][:, :, :keep]
                v[:, :, :keep] = values[j][:, :, :keep]
            if j < len(keys):
                keys[j], values[j] = k, v
            else:
                keys.append(k)
                values.append(v)
            bind_cache(b, [layer], [k], [v])
        self._capacity = cap


class Model:
    """A loaded model directory (all layers, or the range given to ``load_model``)."""

    def __init__(self, path: Path, manifest: Manifest, tokenizer: Tokenizer,
                 providers: list[str], layers: tuple[int, int], threads: int | None,
                 max_concurrent_runs: int, prefix_cache_bytes: int = 0,
                 keep_answers: bool = True) -> None:
        self.path = path
        self.manifest = manifest
        self.tokenizer = tokenizer
        self.providers = providers
        self.layers = layers
        self.threads = threads
        self.max_concurrent_runs = max_concurrent_runs
        self._stages: dict[tuple[int, int, bool], Stage] = {}
        self._lock = threading.Lock()
        self._limiter: Any = None
        self._batcher: Batcher | None = None
        self.prefix_cache: PrefixCache | None = None
        self.set_prefix_budget(prefix_cache_bytes)
        # with a prefix cache, the batch prefills finished answers again to keep their KV
        # (``scheduler.BatchScheduler``'s ``keep_answers``)
        self.keep_answers = keep_answers

    def set_prefix_budget(self, budget_bytes: int) -> None:
        """Keep finished requests' KV blocks under ``budget_bytes`` (0: keep none); a new
        budget starts an empty cache (docs/engine.md, "Prefix cache")."""
        if budget_bytes < 0:
            raise LocalError("the prefix cache budget must be >= 0 bytes")
        self.prefix_cache = PrefixCache(budget_bytes) if budget_bytes else None

    def prefixes(self, start: int, end: int) -> StagePrefixes | None:
        """The prefix cache as the stage ``[start, end)`` uses it (None: none kept)."""
        return stage_prefixes(self.prefix_cache, self.model_identity, start, end)

    @property
    def model_identity(self) -> str:
        """What the model is (``meshd.core.modelid``, as adverts carry it): the identity its
        prefix blocks are named with, so an entry node names a request's blocks the same way."""
        return of_manifest(self.manifest.source or {}, self.manifest.content_hash)

    @property
    def num_layers(self) -> int:
        return self.manifest.arch.num_layers

    @property
    def hidden_size(self) -> int:
        return self.manifest.arch.hidden_size

    @property
    def vocab_size(self) -> int:
        return self.manifest.arch.vocab_size

    @property
    def context_length(self) -> int:
        return self.manifest.arch.max_position_embeddings

    @property
    def provider(self) -> str:
        """The execution provider that runs the loaded range (e.g. ``CPUExecutionProvider``)."""
        return self.stage(*self.layers).provider

    @property
    def limiter(self) -> Any:
        """The ``trio.CapacityLimiter`` bounding concurrent onnxruntime runs of this model."""
        if self._limiter is None:
            import trio

            self._limiter = trio.CapacityLimiter(self.max_concurrent_runs)
        return self._limiter

    @property
    def batcher(self) -> Batcher:
        """This model's continuous-batching scheduler (``meshd.engine.scheduler.Batcher``).
        While its task runs (``await nursery.start(model.batcher.run)``), ``generate`` streams
        through it: every running generation decodes in one onnxruntime call per step."""
        if self._batcher is None:
            self._batcher = Batcher(self)
        return self._batcher

    def stage(self, start: int, end: int, *, fused: bool = False) -> Stage:
        """The stage of layers ``[start, end)`` (inside the loaded range), built on first use;
        ``fused``: the whole model's graph that also takes one prompt chunk (the batch
        scheduler's decode step with a chunk, ``meshd.engine.fused``). Once the fused graph is
        built it also serves every plain request for the whole model (``Stage.binding``), so a
        batching model holds one copy of its weights, not two."""
        lo, hi = self.layers
        check_range(self.num_layers, start, end)
        if not (lo <= start and end <= hi):
            raise LocalError(f"layers [{start}, {end}) are not loaded (loaded: [{lo}, {hi}))")
        with self._lock:
            stage = self._stages.get((start, end, fused)) or (
                self._stages.get((start, end, True)) if not fused else None)
            if stage is None:
                stage = Stage(self, start, end, self._build_session(start, end, fused),
                              fused=fused)
                self._stages[(start, end, fused)] = stage
            return stage

    def statistics(self) -> dict[str, Any]:
        """What ``meshd status`` shows about this model: the stages built and their sessions."""
        with self._lock:
            stages = [st.statistics() for _, st in sorted(self._stages.items())]
        return {"model": self.manifest.name, "version": self.manifest.version,
                "content_sha256": self.manifest.content_hash, "layers": list(self.layers),
                "stages": stages,
                "batch": self._batcher.statistics() if self._batcher is not None else None,
                "prefix_cache": (self.prefix_cache.statistics()
                                 if self.prefix_cache is not None else None)}

    def close(self) -> None:
        """Drop every built stage session (open stage sessions must not be used afterwards)."""
        with self._lock:
            self._stages.clear()

    def _session_options(self, start: int, end: int) -> ort.SessionOptions:
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        so.log_severity_level = 3
        weights = stage_memory(self.manifest.arch, start, end, self.manifest.dtype,
                               self.manifest.stored_bytes()).weights_bytes
        so.intra_op_num_threads = self.threads or planning.default_threads(weights)
        # Idle intra-op threads spin between the operators of a run, not after it: onnxruntime
        # otherwise lets them spin on after every run, about 55 ms of a core each time (measured,
        # 1.32, 2 threads), taken from the embedder, the sockets and the client on a small box.
        so.add_session_config_entry(_STOP_SPINNING, "1")
        if self._q4_kernel is not None:
            so.register_custom_ops_library(str(self._q4_kernel))
        return so

    @functools.cached_property
    def _q4_kernel(self) -> Path | None:
        """meshd's 4-bit kernel library where it serves this model: built here, on the CPU
        (it is a CPU operator), for a model with 4-bit blocks with minimums."""
        names = {t.name for t in self.manifest.tensors}
        if list(self.providers) != ["CPUExecutionProvider"] or not any(
                t.dtype == "q4" and t.name + ".mins" in names for t in self.manifest.tensors):
            return None
        return q4kernel.library()

    def _build_session(self, start: int, end: int, fused: bool = False) -> ort.InferenceSession:
        so = self._session_options(start, end)
        prebuilt = _prebuilt(self.manifest.stages, start, end)
        source: str | bytes
        if prebuilt is not None:  # checked even when the fused graph is built instead of it
            path = self.path / prebuilt.file
            try:
                data = path.read_bytes()
            except OSError as err:
                raise ModelError(f"{path}: cannot read stage graph ({err.strerror})") from None
            if hashlib.sha256(data).hexdigest() != prebuilt.sha256:
                raise ModelError(f"{path}: hash mismatch (corrupt stage graph)")
            source = str(path)
            if fused:
                prebuilt = None
            else:
                layout, version, levels = _graph_props(data)
                if (layout, version) != (g.KV_LAYOUT, g.GRAPH_VERSION):
                    log.warning("stage graph rebuilt file=%s reason=%s", prebuilt.file,
                                "built by an older meshd (another KV-cache layout or graph "
                                "version; `meshd model import --force` stores the new one)")
                    prebuilt = None
                elif self._q4_kernel is not None and levels <= {g.ACCURACY_LEVEL}:
                    # the stored graph's 4-bit products are MatMulNBits: built again with
                    # meshd's kernel (a graph stored at another accuracy level, a
                    # diagnostic's, is kept)
                    prebuilt = None
        if prebuilt is None:
            arch, tensors = self.manifest.arch, {t.name: t for t in self.manifest.tensors}
            source = g.build_stage_graph(arch, tensors, start, end, self.manifest.weights_file,
                                         fused=fused, q4_kernel=self._q4_kernel is not None
                                         ).SerializeToString()
            so.add_session_config_entry(_EXTERNAL_FOLDER, str(self.path))
        t0 = time.perf_counter()
        weights = self.path / self.manifest.weights_file
        try:
            # the file's pages go as the repacking leaves them, not all after it
            with paging_out(weights):
                sess = ort.InferenceSession(source, so, providers=self.providers)
        except Exception as err:
            raise ModelError(f"{self.manifest.name} layers [{start}, {end}): onnxruntime "
                             f"cannot build the session: {_first_line(err)}") from None
        # the weights file's pages were read once, to repack the 4/8-bit matrices
        paged = page_out(weights)
        trim_heap()  # and the C heap's pages freed while building (the graph, its protobuf)
        log.info("stage built model=%s layers=%d-%d provider=%s build_ms=%.1f paged_out_mb=%.1f",
                 self.manifest.name, start, end, sess.get_providers()[0],
                 (time.perf_counter() - t0) * 1e3, paged / 2**20)
        return sess

    def encode_prompt(self, prompt: str | list[int], *, chat: bool = False) -> list[int]:
        """Token ids of a prompt: ids pass through, text is encoded (as one user message
        through the chat template when ``chat`` is true)."""
        if isinstance(prompt, str):
            return self.tokenizer.encode_prompt(prompt, chat=chat)
        ids = [int(i) for i in prompt]
        if any(not 0 <= i < self.vocab_size for i in ids):
            raise LocalError(f"prompt token id outside the vocabulary [0, {self.vocab_size})")
        return ids

    def generate(self, prompt: str | list[int], cfg: GenerationConfig | None = None, *,
                 chat: bool = False, limiter: Any = None) -> AsyncIterator[TokenEvent]:
        """Stream ``TokenEvent``s from trio: ``async for ev in model.generate(prompt, cfg)``.
        While the model's batcher runs (``batcher``), the request joins the batch; otherwise it
        runs its own loop, each onnxruntime step in a worker thread under ``limiter`` (default:
        the model's own, ``max_concurrent_runs`` wide). Leaving the loop early frees the KV
        cache."""
        if self._batcher is not None and self._batcher.running and limiter is None:
            return self._batcher.generate(prompt, cfg, chat=chat)
        return generate_async(self, prompt, cfg, chat=chat, limiter=limiter)

    def generate_sync(self, prompt: str | list[int], cfg: GenerationConfig | None = None, *,
                      chat: bool = False) -> Iterator[TokenEvent]:
        """The same stream, computed in the calling thread (for the CLI and scripts)."""
        return generate_sync(self, prompt, cfg, chat=chat)


def _graph_props(data: bytes) -> tuple[str | None, str | None, frozenset[int]]:
    """The KV-cache layout and graph version a stage graph file was built for (None: before
    they were named), and the accuracy levels its MatMulNBits run at."""
    import onnx

    model = onnx.load_from_string(data)
    props = {p.key: p.value for p in model.metadata_props}
    levels = frozenset(a.i for n in model.graph.node if n.op_type == "MatMulNBits"
                       for a in n.attribute if a.name == "accuracy_level")
    return props.get(g.KV_LAYOUT_KEY), props.get(g.GRAPH_VERSION_KEY), levels


def _prebuilt(stages: tuple[StageEntry, ...], start: int, end: int) -> StageEntry | None:
    for s in stages:
        if (s.start, s.end) == (start, end):
            return s
    return None


def load_model(path: str | Path, *, providers: list[str] | tuple[str, ...] | None = None,
               layers: tuple[int, int] | None = None, threads: int | None = None,
               max_concurrent_runs: int = 1, verify: bool = True, fused: bool = False,
               prefix_cache_bytes: int = 0, keep_answers: bool = True) -> Model:
    """Load a meshd model directory, checking the hashes of the weights it needs (unless
    ``verify`` is false; the file size is always checked), and build the session of ``layers``
    (half open; default: every layer). ``fused`` (whole models): build the fused graph, which
    the batch scheduler needs and which serves plain runs too, as the model's only session.
    ``prefix_cache_bytes``: the budget of the model's KV prefix cache (0: none;
    docs/engine.md, "Prefix cache"); ``keep_answers``: with it, the batch scheduler also keeps
    finished answers' KV, prefilled again while no prompt waits."""
    t0 = time.perf_counter()
    path = Path(path)
    manifest = read_manifest(path)
    n = manifest.arch.num_layers
    span = (0, n) if layers is None else (int(layers[0]), int(layers[1]))
    check_range(n, *span)
    if max_concurrent_runs < 1:
        raise LocalError("max_concurrent_runs must be >= 1")
    # Every sub-range of the span reads a subset of the span's tensors.
    verify_weights(path, manifest, stage_tensor_names(manifest.arch, *span) if verify else ())
    tok_path = path / manifest.tokenizer.file
    try:
        tok_bytes = tok_path.read_bytes()
    except OSError:
        raise ModelError(f"{path}: {manifest.tokenizer.file} is missing") from None
    if hashlib.sha256(tok_bytes).hexdigest() != manifest.tokenizer.sha256:
        raise ModelError(f"{tok_path}: hash mismatch (not this model's tokenizer)")
    tokenizer = Tokenizer(tok_path, manifest.tokenizer)
    model = Model(path, manifest, tokenizer, choose_providers(providers), span, threads,
                  max_concurrent_runs, prefix_cache_bytes, keep_answers)
    stage = model.stage(*span, fused=fused and span == (0, n))
    log.info("model loaded name=%s layers=%d-%d provider=%s load_ms=%.1f", manifest.name,
             span[0], span[1], stage.provider, (time.perf_counter() - t0) * 1e3)
    return model

