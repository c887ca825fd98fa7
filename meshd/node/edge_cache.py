"""The entry node's semantic cache as a daemon service: ``meshd.cache.SemanticCache`` with the
embedding model, loaded off the event loop at start, used from worker threads.

The embedding model (about 90 MB, a few seconds of CPU) is loaded on the first request the cache
could take part in, in a worker thread, so a node that never sees one stays light; until it is
loaded (and for good, if the ``meshd[edge]`` extra is missing or the file cannot be opened)
every lookup is a ``skip`` with the reason, said once in the log. The semantic lookup (``start_lookup``) and ``insert`` run in worker threads
(one at a time: the embedding takes most of a core). Inserting happens after the answer has
gone to the client, in this service's own nursery, so it never delays a response; so does
writing a hit's ``last_used`` and hit count (``SemanticCache.flush``): a hit reads SQLite and
the index and writes nothing. The very same prompt again is looked up on the event loop (one
indexed read, never waiting for the cache's lock), everything else in a worker thread. The embedding graph is ``[cache] embed_precision`` (int8 by
default: about half the CPU per prompt of fp32 and the same decisions on the labelled pairs,
docs/cache.md); ``/v1/embeddings``, retrieval and the tier classifier use the float graph.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

import trio

from meshd.config import Config

log = logging.getLogger(__name__)


def cache_policy(c: Any, embed_dir: Path) -> tuple[Any, dict[str, Any]]:
    """The policy and the verifier ``[cache] verifier`` names (docs/cache.md), as
    ``(policy, SemanticCache keyword arguments)``: ``pair`` (the default), the learned pair
    verifier shipped with meshd with its own threshold and bound unless ``threshold`` /
    ``verifier_min_p`` are set, and the lexical guards in front of it only if its defaults were
    chosen with them; ``words``, guards v4's verifier of an added run (a second
    session of the embedding graph, +64.5 MiB); ``off``, the guards and the threshold only."""
    from meshd.cache import FixedThreshold

    if c.verifier == "pair":
        from meshd.embed.pair_verifier import PairVerifier

        pv = PairVerifier(embed_dir=embed_dir)
        policy = FixedThreshold(threshold=c.threshold or pv.info.threshold,
                                pair_min_p=c.verifier_min_p or pv.info.min_p, guards=pv.info.guards)
        return policy, {"pair_verifier": pv.probability}
    policy = FixedThreshold(threshold=c.threshold or 0.85)
    if c.verifier == "words":
        from meshd.embed.token_states import TokenStates

        # reads the encoder's word vectors of a candidate's two prompts: a second session of
        # the same graph, used only above the threshold
        states = TokenStates(embed_dir, precision=c.embed_precision)
        return policy, {"word_states": states.words}
    return policy, {}


def _close(cache: Any) -> None:
    try:
        cache.close()
    except Exception as e:  # a daemon that stops must not fail on its cache
        log.warning("semantic cache not closed cleanly error=%r", e)


class PendingLookup:
    """A semantic lookup running in the cache service's nursery: ``set`` once, awaited by
    ``result``."""

    def __init__(self) -> None:
        self._done = trio.Event()
        self.value: Any = None
        # perf_counter times: started here, began in the worker thread, answered there
        self.created = time.perf_counter()
        self.began: float | None = None
        self.answered: float | None = None

    def set(self, value: Any) -> None:
        if not self._done.is_set():
            self.value = value
            self._done.set()

    @property
    def done(self) -> bool:
        return self._done.is_set()

    async def result(self) -> Any:
        await self._done.wait()
        return self.value


class EdgeCache:
    def __init__(self, config: Config) -> None:
        self.config = config
        c = config.cache
        self.path = config.path(c.path) if c.path else config.path(config.node.data_dir) / "semantic-cache.db"
        self.cache: Any = None  # meshd.cache.SemanticCache once loaded
        self.state = "off" if not c.enabled else "idle"
        self.reason = "disabled in [cache]" if not c.enabled else "loads on the first cacheable request"
        self._limiter = trio.CapacityLimiter(1)
        self._nursery: trio.Nursery | None = None
        self._flush_pending = False
        self._float: Any = None  # the float embedder, when the cache's is int8 (float_embedder)
        self._float_lock = threading.Lock()  # worker threads of the API and of retrieval ask
        self.stats = {"hits": 0, "misses": 0, "skips": 0, "inserts": 0, "errors": 0}

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """The service's nursery (loading, lookups, inserts, flushes) until the daemon stops;
        then, once they have all ended, the cache is closed: the hits' counters written and
        each HNSW graph saved beside the file, so that the next start loads the graphs
        instead of rebuilding them from every row (``SemanticCache.close``)."""
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                task_status.started()
                await trio.sleep_forever()
        finally:
            self._nursery = None
            cache, self.cache = self.cache, None
            if cache is not None:
                with trio.CancelScope(shield=True):
                    await trio.to_thread.run_sync(_close, cache)

    def load(self) -> None:
        """Start loading the model and the cache file (once); lookups skip until it is done."""
        if self.state == "idle" and self._nursery is not None:
            self.state, self.reason = "loading", "the embedding model is loading"
            self._nursery.start_soon(self._load)

    async def _load(self) -> None:
        try:
            self.cache = await trio.to_thread.run_sync(self._open)
            self.state, self.reason = "ready", ""
            log.info("semantic cache ready path=%s entries=%d", self.path, len(self.cache))
        except Exception as e:  # the extra is missing, the model or file is unusable
            self.state, self.reason = "off", str(e).splitlines()[0][:300]
            log.warning("semantic cache off reason=%s", self.reason)

    def _open(self) -> Any:
        from meshd.cache import CacheLimits, SemanticCache
        from meshd.embed import load_embedder

        c = self.config.cache
        self.path.parent.mkdir(parents=True, exist_ok=True)
        limits = CacheLimits(max_entries=c.max_entries, max_bytes=int(c.max_size_mb * 2**20),
                             ttl_s=c.ttl_s)
        embedder = load_embedder(precision=c.embed_precision)
        policy, verifiers = cache_policy(c, embedder.path)
        return SemanticCache(self.path, embedder, policy=policy, limits=limits, **verifiers)

    @property
    def ready(self) -> bool:
        return self.cache is not None

    def lookup_exact(self, req: Any) -> Any:
        """On the event loop: the hit for the very same prompt (one indexed SQLite read, no
        thread hop: each can wait tens of ms for a core on a loaded box); None when the
        semantic lookup must decide (not cached word for word, or the cache is busy in a worker
        thread); False when the cache is off or still loading (the first call starts it)."""
        if self.cache is None:
            self.load()
            self.stats["skips"] += 1
            return False
        try:
            got = self.cache.lookup_exact(req, blocking=False)
        except Exception:
            self.stats["errors"] += 1
            log.exception("semantic cache lookup failed")
            return False
        if got is not None:
            self._count(got)
        return got

    def start_lookup(self, req: Any) -> PendingLookup:
        """Start the semantic lookup of ``req`` in this service's nursery (a worker thread
        embeds the prompt) and return at once; ``await pending.result()`` gives the ``Lookup``
        (None on an error). The entry chain routes and starts the model meanwhile."""
        pending = PendingLookup()
        if self._nursery is None:
            pending.set(None)
        else:
            self._nursery.start_soon(self._run_pending, req, pending)
        return pending

    async def _run_pending(self, req: Any, pending: PendingLookup) -> None:
        try:
            pending.set(await self._semantic(req, pending))
        finally:
            pending.set(None)  # no-op once set; a cancelled lookup still wakes its waiter

    async def _semantic(self, req: Any, pending: PendingLookup) -> Any:
        cache = self.cache

        def work() -> Any:
            pending.began = time.perf_counter()
            got = cache.lookup(req)
            pending.answered = time.perf_counter()
            return got

        try:
            got = await trio.to_thread.run_sync(work, limiter=self._limiter)
        except Exception:
            self.stats["errors"] += 1
            log.exception("semantic cache lookup failed")
            return None
        self._count(got)
        return got

    def _count(self, got: Any) -> None:
        key = {"hit": "hits", "skip": "skips"}.get(got.kind, "misses")
        self.stats[key] += 1
        if got.kind == "hit" and not self._flush_pending and self._nursery is not None:
            self._flush_pending = True
            self._nursery.start_soon(self._flush)

    async def _flush(self) -> None:
        """Write the hits' counters (queued behind this lookup's caller, not in its way)."""
        await trio.lowlevel.checkpoint()  # let the hit's answer go out first
        self._flush_pending = False
        cache = self.cache
        if cache is None:
            return
        try:
            await trio.to_thread.run_sync(cache.flush, limiter=self._limiter)
        except Exception:
            self.stats["errors"] += 1
            log.exception("semantic cache flush failed")

    def remember(self, req: Any, answer: str, got: Any) -> None:
        """Store ``answer`` for ``req`` after the client has it (and, for a ``verify`` lookup,
        tell the entry whether the fresh answer matched the cached one)."""
        if self.cache is None or self._nursery is None or got is None:
            return
        self._nursery.start_soon(self._insert, req, answer, got)

    async def _insert(self, req: Any, answer: str, got: Any) -> None:
        def work() -> None:
            if got.kind == "verify":
                self.cache.verify(got, answer)
            self.cache.insert(req, answer, lookup=got)

        try:
            await trio.to_thread.run_sync(work, limiter=self._limiter)
            self.stats["inserts"] += 1
        except Exception:
            self.stats["errors"] += 1
            log.exception("semantic cache insert failed")

    async def embed(self, texts: list[str]) -> tuple[str, list[list[float]], int]:
        """(model name, vectors, tokens read) with the float graph of the cache's embedding model."""
        from meshd.errors import ErrorCode, RemoteError

        if self.cache is None and self.state in ("idle", "loading"):
            self.load()
            with trio.move_on_after(120):
                while self.state == "loading":
                    await trio.sleep(0.05)
        if self.cache is None:
            raise RemoteError(f"this node has no embedding model: {self.reason}", ErrorCode.UNSUPPORTED)
        def work() -> tuple[str, list[list[float]], int]:
            embedder = self.float_embedder()
            tokens = sum(len(ids) for ids in embedder.token_ids(texts))
            return str(getattr(embedder, "name", "embedding")), embedder.embed(texts).tolist(), tokens

        return await trio.to_thread.run_sync(work, limiter=self._limiter)

    def float_embedder(self) -> Any:
        """The float graph of the cache's embedding model (the cache's own embedder when that is
        float; else loaded once, in the calling thread). The API's ``/v1/embeddings`` answers
        with it (its vectors keep the 1e-4 bound to the reference, the int8 ones do not), and
        fp32 retrieval collections embed their questions with it (meshd.node.rag)."""
        emb = self.cache.embedder
        if getattr(emb, "precision", "fp32") == "fp32":
            return emb
        with self._float_lock:
            if self._float is None:
                from meshd.embed import load_embedder

                self._float = load_embedder()
        return self._float

    async def clear(self) -> int:
        """Drop every entry; returns how many there were."""
        if self.cache is None:
            return 0
        n = len(self.cache)
        await trio.to_thread.run_sync(self._clear, limiter=self._limiter)
        return n

    def _clear(self) -> None:
        cache = self.cache
        self.cache = None
        cache.close()
        for p in Path(self.path).parent.glob(Path(self.path).name + "*"):
            p.unlink(missing_ok=True)
        self.cache = self._open()

    def statistics(self) -> dict[str, Any]:
        out: dict[str, Any] = {"state": self.state, **self.stats}
        if self.reason:
            out["reason"] = self.reason
        if self.cache is not None:
            try:
                out.update(self.cache.statistics())
            except Exception:
                pass
        return out
