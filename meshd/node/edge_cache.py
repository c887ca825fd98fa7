"""The entry node's answer cache as a daemon service: ``meshd.cache.SemanticCache``, opened at
start for exact repeats, with the embedding model and the pair verifier attached later for
paraphrases (docs/cache.md).

The cache file is opened before the service starts (SQLite only: no model), so an exact repeat
is answered from the first repeat on, on the event loop (``exact``: one indexed read, or none
for an answer still being written), and never waits for the embedding model. The model, the
verifier and its calibration (about 90 MB and a few seconds of CPU) are loaded on the first
request that could take the semantic path, in a worker thread, so a node that never sees one
stays light; until they are loaded (and for good, if the ``meshd[edge]`` extra is missing or a
file cannot be opened) the semantic path says so and only exact repeats are answered. With
``[cache] max_error = 0`` they are never loaded. The semantic lookup (``start_lookup``),
``insert`` and ``flush`` run in worker threads, one at a time (the embedding takes most of a
core); storing an answer happens after the client has it, in this service's own nursery, but
the answer is an exact hit from that moment (``SemanticCache.stage``). The embedding graph is
``[cache] embed_precision`` (int8 by default); ``/v1/embeddings``, retrieval and the tier
classifier use the float graph.

Feedback: the service remembers, for the last ``SERVED_MAX`` requests it answered from the
cache or stored an answer of, which entry that was; ``feedback(rid, "wrong")`` removes the entry
and, for a semantic hit, counts against the threshold that served it.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from meshd.config import CacheConfig, Config
from meshd.errors import ErrorCode, RemoteError

log = logging.getLogger(__name__)
SERVED_MAX = 10_000  # requests whose cache entry feedback can still name
FLUSH_DELAY_S = 0.05  # from a hit to writing the hits' counters


@dataclass(frozen=True, slots=True)
class Served:
    """What a request's feedback applies to: the entry that answered it, or that stored its
    answer."""

    kind: str  # exact, semantic, or stored (a model's answer, kept)
    entry_id: int | None
    partition: str | None
    key: str | None
    score: float | None  # the verifier's, for a semantic hit


def semantic_parts(c: CacheConfig, embed_dir: Path | None = None) -> tuple[Any, Any, Any]:
    """What the semantic path needs, as the daemon loads it: the embedding model (``[cache]
    embed_precision``), the pair verifier shipped with meshd and its calibration
    (``SemanticCache.attach``'s arguments)."""
    from meshd.embed import load_embedder
    from meshd.embed.pair_verifier import PairVerifier, read_calibration

    embedder = load_embedder(embed_dir, precision=c.embed_precision)
    verifier = PairVerifier(embed_dir=embedder.path)
    return embedder, verifier.probability, read_calibration()


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
        self.store: Any = None  # meshd.cache.SemanticCache once opened (exact repeats)
        # the semantic path: off, idle (loads on the first request that could use it), loading,
        # ready
        self.state = "off" if not c.enabled else "idle"
        self.reason = "disabled in [cache]" if not c.enabled else "loads on the first cacheable request"
        self._limiter = trio.CapacityLimiter(1)
        self._nursery: trio.Nursery | None = None
        self._flush_pending = False
        self._served: OrderedDict[str, Served] = OrderedDict()
        # set once the cache file is open (or could not be): the control socket takes requests
        # before the node's services have all started, and they wait for it here
        self.opened = trio.Event()
        if not c.enabled:
            self.opened.set()
        self._float: Any = None  # the float embedder, when the cache's is int8 (float_embedder)
        self._float_lock = threading.Lock()  # worker threads of the API and of retrieval ask
        self.stats = {"errors": 0, "loading_skips": 0, "other_model": 0}  # other_model: an answer
        # not kept because another model under the same name gave it

    @property
    def cache(self) -> Any:
        """The cache with its embedding model (the semantic path), else None."""
        store = self.store
        return store if store is not None and store.semantic else None

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Open the cache file (before the node is ready: the exact path answers from the first
        request on), then the service's nursery (loading, lookups, inserts, flushes) until the
        daemon stops; then, once they have all ended, the cache is closed: the hits' counters
        written and each HNSW graph saved beside the file (``SemanticCache.close``)."""
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                if self.config.cache.enabled:
                    await self._open_store()
                task_status.started()
                await trio.sleep_forever()
        finally:
            self._nursery = None
            store, self.store = self.store, None
            if store is not None:
                with trio.CancelScope(shield=True):
                    await trio.to_thread.run_sync(_close, store)

    async def _open_store(self) -> None:
        try:
            self.store = await trio.to_thread.run_sync(self._open, limiter=self._limiter)
        except Exception as e:  # the file's folder is unusable
            self.state, self.reason = "off", str(e).splitlines()[0][:300]
            log.warning("semantic cache off reason=%s", self.reason)
        finally:
            self.opened.set()

    def _open(self) -> Any:
        from meshd.cache import CacheLimits, SemanticCache

        c = self.config.cache
        self.path.parent.mkdir(parents=True, exist_ok=True)
        limits = CacheLimits(max_entries=c.max_entries, max_bytes=int(c.max_size_mb * 2**20),
                             ttl_s=c.ttl_s)
        return SemanticCache(self.path, limits=limits)

    def load(self) -> None:
        """Start loading the embedding model and the verifier (once)."""
        if self.state == "idle" and self._nursery is not None and self.store is not None:
            self.state, self.reason = "loading", "the embedding model is loading"
            self._nursery.start_soon(self._load)

    async def _load(self) -> None:
        try:
            await trio.to_thread.run_sync(self._attach, limiter=self._limiter)
            self.state, self.reason = "ready", ""
            log.info("semantic cache ready path=%s entries=%d", self.path, len(self.store))
        except Exception as e:  # the extra is missing, the model or a file is unusable
            self.state, self.reason = "off", str(e).splitlines()[0][:300]
            log.warning("semantic path off reason=%s", self.reason)

    def _attach(self) -> None:
        self.store.attach(*semantic_parts(self.config.cache))

    @property
    def ready(self) -> bool:
        return self.cache is not None

    # -- lookups ---------------------------------------------------------------------------

    async def exact(self, req: Any) -> Any:
        """The exact hit for ``req``, or None: on the event loop (no thread hop: each can wait
        tens of ms for a core on a loaded box) unless a worker thread holds the cache, then in
        a thread of its own (never behind the embedding's limiter)."""
        from meshd.cache.store import Busy

        store = self.store
        if store is None:
            return None
        try:
            try:
                got = store.lookup_exact(req, blocking=False)
            except Busy:
                got = await trio.to_thread.run_sync(store.lookup_exact, req)
        except Exception:
            self.stats["errors"] += 1
            log.exception("semantic cache lookup failed")
            return None
        return got

    def missed(self) -> None:
        """A request the exact path missed and the semantic path does not take: counted."""
        if self.store is not None:
            self.store.missed()

    def semantic_ready(self) -> bool:
        """Whether a semantic lookup can run now; the first ask starts loading the model."""
        if self.cache is not None:
            return True
        self.load()
        if self.store is not None and self.state == "loading":
            self.stats["loading_skips"] += 1
        return False

    def start_lookup(self, req: Any) -> PendingLookup:
        """Start the semantic lookup of ``req`` (a worker thread embeds the question) and return
        at once; ``await pending.result()`` gives the ``Lookup`` (None on an error). The entry
        chain routes meanwhile. When no other cache work holds the worker, its thread starts
        here and now, not when the caller next yields to trio (the route step runs first:
        about a millisecond on the 2-core box); else the lookup waits for it in this service's
        nursery. Either way the nursery does not end before the thread has answered."""
        pending = PendingLookup()
        if self._nursery is None:
            pending.set(None)
            return pending
        try:
            self._limiter.acquire_on_behalf_of_nowait(pending)
        except trio.WouldBlock:
            self._nursery.start_soon(self._run_pending, req, pending)
            return pending
        token = trio.lowlevel.current_trio_token()
        trio.lowlevel.start_thread_soon(
            functools.partial(self._lookup_work, req, pending),
            lambda outcome: token.run_sync_soon(self._answered, pending, outcome))
        self._nursery.start_soon(self._until_answered, pending)
        return pending

    def _lookup_work(self, req: Any, pending: PendingLookup) -> Any:
        """In the worker thread: the semantic path (the exact path missed on the event loop)."""
        pending.began = time.perf_counter()
        got = self.store.lookup_semantic(req)
        pending.answered = time.perf_counter()
        return got

    def _answered(self, pending: PendingLookup, outcome: Any) -> None:
        """Back on the event loop: the thread's ``Lookup`` (or its exception) to the waiter."""
        self._limiter.release_on_behalf_of(pending)
        try:
            got = outcome.unwrap()
        except Exception:
            self.stats["errors"] += 1
            log.exception("semantic cache lookup failed")
            got = None
        pending.set(got)

    @staticmethod
    async def _until_answered(pending: PendingLookup) -> None:
        with trio.CancelScope(shield=True):  # as trio.to_thread: a thread is not cancelled
            await pending.result()

    async def _run_pending(self, req: Any, pending: PendingLookup) -> None:
        try:
            pending.set(await self._semantic(req, pending))
        finally:
            pending.set(None)  # no-op once set; a cancelled lookup still wakes its waiter

    async def _semantic(self, req: Any, pending: PendingLookup) -> Any:
        try:
            got = await trio.to_thread.run_sync(self._lookup_work, req, pending,
                                                limiter=self._limiter)
        except Exception:
            self.stats["errors"] += 1
            log.exception("semantic cache lookup failed")
            return None
        return got

    def _hit(self) -> None:
        if not self._flush_pending and self._nursery is not None:
            self._flush_pending = True
            self._nursery.start_soon(self._flush)

    async def _flush(self) -> None:
        """Write the hits' counters, ``FLUSH_DELAY_S`` after a hit (``served``): once its answer
        has left (the request's last steps and its DONE frame do not share the interpreter
        with a SQLite write), and for all the hits of that while in one write."""
        await trio.sleep(FLUSH_DELAY_S)
        self._flush_pending = False
        store = self.store
        if store is None:
            return
        try:
            await trio.to_thread.run_sync(store.flush, limiter=self._limiter)
        except Exception:
            self.stats["errors"] += 1
            log.exception("semantic cache flush failed")

    # -- storing, feedback -----------------------------------------------------------------

    def served(self, rid: str, got: Any) -> None:
        """``rid`` was answered from the cache by ``got`` (a hit): what its feedback names; the
        hit's counters are written shortly after, once its answer went out (``_flush``)."""
        self._hit()
        self._remember_rid(rid, Served(got.kind, got.entry_id, got.partition, got.key,
                                       got.score))

    def remember(self, req: Any, answer: str, got: Any, rid: str,
                 tokenize: Callable[[str], list[int]] | None = None) -> None:
        """Keep ``answer`` for ``req``: an exact hit at once (in memory), written and (for the
        semantic path) embedded after the client has it. ``got``: the request's semantic
        lookup, whose vector is reused (None when it had none). ``tokenize``: the answer's
        token ids as a hit serves them, computed with the write and kept (None: a hit
        tokenizes the answer itself)."""
        store = self.store
        if store is None or self._nursery is None:
            return
        where = store.stage(req, answer)
        if where is None:
            return
        self._remember_rid(rid, Served("stored", None, where[0], where[1], None))
        vector = getattr(got, "vector", None)
        self._nursery.start_soon(self._insert, req, answer, vector, tokenize)

    async def _insert(self, req: Any, answer: str, vector: Any,
                      tokenize: Callable[[str], list[int]] | None) -> None:
        store = self.store

        def work() -> None:
            ids = None
            if tokenize is not None:
                try:
                    ids = tokenize(answer)
                except Exception:  # the model went away meanwhile: a hit tokenizes it then
                    log.debug("semantic cache: answer not tokenized for storing", exc_info=True)
            store.insert(req, answer, vector=vector, answer_ids=ids)

        try:
            await trio.to_thread.run_sync(work, limiter=self._limiter)
        except Exception:
            self.stats["errors"] += 1
            log.exception("semantic cache insert failed")

    def _remember_rid(self, rid: str, served: Served) -> None:
        self._served[rid] = served
        self._served.move_to_end(rid)
        while len(self._served) > SERVED_MAX:
            self._served.popitem(last=False)

    async def feedback(self, rid: str, verdict: str) -> dict[str, Any]:
        """A client says the answer of ``rid`` was ``right`` or ``wrong``. Wrong: its entry is
        removed, and a semantic hit's score counts as one more near miss served (the
        threshold rises past it)."""
        if verdict not in ("right", "wrong"):
            raise RemoteError(f"verdict must be right or wrong, not {verdict!r}",
                              ErrorCode.MALFORMED)
        store = self.store
        s = self._served.get(rid)
        if store is None or s is None:
            raise RemoteError(f"this node has no cached answer of request {rid!r} (it names "
                              f"the last {SERVED_MAX:,} answers it served from the cache or "
                              "kept, since it started)", ErrorCode.MALFORMED)
        out: dict[str, Any] = {"request_id": rid, "verdict": verdict, "served": s.kind,
                               "removed": 0}
        if verdict == "right":
            store.confirm()
            return out
        del self._served[rid]
        score = s.score if s.kind == "semantic" else None
        out["removed"] = await trio.to_thread.run_sync(
            lambda: store.forget(entry_id=s.entry_id, partition=s.partition, key=s.key,
                                 wrong_score=score), limiter=self._limiter)
        out["counted_against_threshold"] = score is not None
        return out

    # -- embeddings for the API and retrieval ----------------------------------------------

    async def embed(self, texts: list[str]) -> tuple[str, list[list[float]], int]:
        """(model name, vectors, tokens read) with the float graph of the cache's embedding model."""
        if self.cache is None and self.state in ("idle", "loading"):
            with trio.move_on_after(120):
                while self.store is None and self.state != "off":
                    await trio.sleep(0.05)
                self.load()
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
        with it, and fp32 retrieval collections embed their questions with it (meshd.node.rag)."""
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
        store = self.store
        if store is None:
            return 0
        n = len(store)
        await trio.to_thread.run_sync(self._clear, limiter=self._limiter)
        return n

    def _clear(self) -> None:
        store = self.store
        self.store = None
        parts = (store.embedder, store.verifier, store.calibration)
        store.close()
        for p in Path(self.path).parent.glob(Path(self.path).name + "*"):
            p.unlink(missing_ok=True)
        fresh = self._open()
        if parts[0] is not None:
            fresh.attach(*parts)
        self._served.clear()
        self.store = fresh

    def statistics(self) -> dict[str, Any]:
        out: dict[str, Any] = {"state": self.state, **self.stats}
        if self.reason:
            out["reason"] = self.reason
        if self.store is not None:
            try:
                out.update(self.store.statistics())
            except Exception:
                pass
        return out
