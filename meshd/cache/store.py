"""``SemanticCache``: a node's cache of answers, in SQLite: exact repeats by key, paraphrases by
meaning within an error bound.

Synchronous and thread-safe (one lock around the connection and the indexes); the daemon calls
it from worker threads, and the exact path from its event loop. Embedding and the verifier run
outside the lock.

Two paths, in this order (docs/cache.md):

- *exact*: the request's partition (model, settings, reader, context: meshd.cache.keys) and
  the key of its question, one indexed read. It needs no embedding model: the cache opens
  without one, and ``stage`` makes an answer visible to it before the row is even written.
- *semantic*: once ``attach`` gave it an embedding model and a verifier, the question is
  embedded, the nearest cached question of the readable partitions is found, and the pure
  decision (meshd.cache.policy) serves it only above the threshold the error bound gives for
  the request's ``max_error`` (meshd.cache.bound). Wrong-answer feedback (``forget``) removes
  an entry and, for a semantic hit, adds its score to the calibration, so the threshold rises.

Rows live in one SQLite table (WAL, ``synchronous=NORMAL``) with their question, answer, vector
(float32 bytes; NULL until embedded, and for follow-ups, which are never searched by meaning),
partition, key and timestamps. On ``attach`` the vectors are read into one in-memory index per
partition (meshd.cache.index), or a partition's HNSW graph saved by ``close`` is loaded when
its stamp (count, largest and summed ids of its rows) still matches; rows stored before the
model was there are embedded then. A file that SQLite cannot read is moved aside
(``<name>.corrupt-<unix time>``) and a new, empty cache is started, with a warning. A hit does
not write: its entry's ``last_used`` and ``hits`` are kept in memory and written by ``flush``,
before any eviction, and at ``close``.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
from sqlite_utils import Database

from meshd.cache.bound import Calibration, threshold
from meshd.cache.eviction import (
    CacheLimits,
    Candidate,
    choose_victims,
    entry_bytes,
    expires_at,
    overflow,
)
from meshd.cache.index import EXACT_MAX, PartitionIndex
from meshd.cache.keys import Admission, CacheRequest, admit, prompt_key
from meshd.cache.lookup import Busy, EmbedderLike, Lookup, Verifier
from meshd.cache.policy import decide

__all__ = ["Busy", "EmbedderLike", "Lookup", "SemanticCache", "Verifier"]
log = logging.getLogger(__name__)
T = TypeVar("T")
SCHEMA_VERSION = 2  # 2: exact_only; the feedback table (answer_ids, added later, is optional)
SEARCH_K = 4  # neighbours fetched per partition: the nearest live one is the candidate
EMBED_BATCH = 64
GUESS_DIM = 384  # a row's vector bytes are counted as this model's (all-MiniLM-L6-v2) until
# the model is loaded: a row stored before then is counted the same, vector or not


class SemanticCache:
    """Open (creating if needed) the cache at ``path`` (``":memory:"`` for a throwaway one).

    ``embedder``, ``verifier`` and ``calibration`` enable the semantic path (also later, with
    ``attach``); without them the cache answers exact repeats only. ``clock`` is injectable
    for tests."""

    def __init__(self, path: str | os.PathLike[str], embedder: EmbedderLike | None = None, *,
                 verifier: Verifier | None = None, calibration: Calibration | None = None,
                 limits: CacheLimits | None = None, clock: Callable[[], float] = time.time,
                 exact_max: int = EXACT_MAX, index_dtype: str = "f16") -> None:
        self.path = str(path)
        self.embedder: EmbedderLike | None = None
        self.verifier: Verifier | None = None
        self.calibration: Calibration | None = None
        self.limits = limits or CacheLimits()
        self.dim = 0
        self._clock = clock
        self._exact_max, self._index_dtype = exact_max, index_dtype
        self._lock = threading.RLock()
        self._indexes: dict[str, PartitionIndex] = {}
        self._entries = 0
        self._bytes = 0
        self._touched: dict[int, tuple[float, int]] = {}  # entry id -> (last used, new hits)
        self._staged: dict[tuple[str, str], str] = {}  # (partition, key) -> answer being stored
        self._wrong: list[float] = []  # scores of semantic hits reported wrong
        self._limits: dict[float, float | None] = {}  # max_error -> threshold (memo)
        self.stats = {"lookups": 0, "exact_hits": 0, "semantic_hits": 0, "refused": 0,
                      "misses": 0, "skips": 0, "inserts": 0, "embedded": 0, "evictions": 0,
                      "expired": 0, "rebuilds": 0, "feedback_wrong": 0, "feedback_right": 0}
        t0 = time.perf_counter()
        self._open()
        log.info("semantic cache opened path=%s entries=%d open_ms=%.0f", self.path,
                 self._entries, (time.perf_counter() - t0) * 1e3)
        if embedder is not None:
            self.attach(embedder, verifier, calibration)

    # -- open, schema, corruption ----------------------------------------------------------

    def _open(self) -> None:
        try:
            self._connect()
            self._load()
        except sqlite3.DatabaseError as err:
            self._rebuild(err)

    def _connect(self) -> None:
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(self.path, check_same_thread=False, timeout=10.0)
        self.db = Database(conn, execute_plugins=False)
        self.db.execute("PRAGMA quick_check").fetchall()  # raises on a file that is not SQLite
        if self.path != ":memory:":
            self.db.enable_wal()
        self.db.execute("PRAGMA synchronous=NORMAL")
        tables = self.db.table_names()
        if "meta" not in tables:
            self.db.table("meta").create({"key": str, "value": str}, pk="key")
        if "entries" not in tables:
            self.db.table("entries").create({
                "id": int, "partition": str, "prompt_key": str, "prompt": str, "answer": str,
                "answer_ids": bytes, "vector": bytes,
                "created_at": float, "last_used": float, "expires_at": float, "hits": int,
                "nbytes": int, "observations": str, "exact_only": int,
            }, pk="id")
            self.db.table("entries").create_index(["partition", "prompt_key"])
            self.db.table("entries").create_index(["last_used"])
            self.db.table("entries").create_index(["expires_at"])
        if "feedback" not in tables:
            self.db.table("feedback").create({"id": int, "at": float, "score": float}, pk="id")
        meta = {r["key"]: r["value"] for r in self.db["meta"].rows}
        schema = meta.get("schema")
        if schema not in (None, "1", str(SCHEMA_VERSION)):
            raise sqlite3.DatabaseError(f"schema version {schema}")
        columns = self.db.table("entries").columns_dict
        if "exact_only" not in columns:  # a version 1 file
            self.db.execute("ALTER TABLE entries ADD COLUMN exact_only INTEGER DEFAULT 0")
        if "answer_ids" not in columns:  # older files: their answers are tokenized when served
            self.db.execute("ALTER TABLE entries ADD COLUMN answer_ids BLOB")
        self.db.table("meta").upsert({"key": "schema", "value": str(SCHEMA_VERSION)}, pk="key")
        self.db.conn.commit()

    def _load(self) -> None:
        """Counts, expiry and feedback; the vectors are read when the model is attached."""
        self._indexes.clear()
        now = self._clock()
        with self.db.conn:
            n = self.db.execute("DELETE FROM entries WHERE expires_at <= ?", [now]).rowcount
        self.stats["expired"] += max(n, 0)
        self._entries, self._bytes = self.db.execute(
            "SELECT count(*), coalesce(sum(nbytes), 0) FROM entries").fetchone()
        self._wrong = [float(r[0]) for r in self.db.execute("SELECT score FROM feedback")]
        self._limits.clear()
        if self.embedder is not None:
            self._load_vectors()

    def _load_vectors(self) -> None:
        """Check the model, embed the rows stored without a vector, fill the indexes."""
        assert self.embedder is not None
        meta = {r["key"]: r["value"] for r in self.db["meta"].rows}
        if meta.get("embedder") not in (None, self.embedder.identity):
            log.warning("semantic cache vectors dropped path=%s reason=%s old=%s new=%s",
                        self.path, "embedding model changed", meta.get("embedder"),
                        self.embedder.identity)
            with self.db.conn:
                self.db.execute("UPDATE entries SET vector = NULL")
        with self.db.conn:
            self.db.table("meta").upsert({"key": "embedder", "value": self.embedder.identity},
                                         pk="key")
        self._backfill()
        saved = {r[0][len("index:"):]: r[1] for r in self.db.execute(
            "SELECT key, value FROM meta WHERE key LIKE 'index:%'")}
        with self.db.conn:  # a graph on disk is good only until the next write: forget them
            self.db.execute("DELETE FROM meta WHERE key LIKE 'index:%'")
        parts = self.db.execute(
            "SELECT partition, count(*), max(id), sum(id) FROM entries WHERE vector IS NOT NULL "
            "GROUP BY partition ORDER BY partition").fetchall()
        for part, count, max_id, sum_id in parts:
            if saved.get(part) == f"{count}:{max_id}:{sum_id}" and self._restore(part):
                continue
            rows = self.db.execute("SELECT id, vector FROM entries WHERE partition = ? AND "
                                   "vector IS NOT NULL ORDER BY id", [part]).fetchall()
            matrix = np.frombuffer(b"".join(r[1] for r in rows), np.float32).reshape(
                len(rows), self.dim)
            self._index(part).add(np.array([r[0] for r in rows], np.int64), matrix, threads=0)

    def _backfill(self) -> None:
        """Embed the questions of rows stored without a vector (not follow-ups)."""
        assert self.embedder is not None
        rows = self.db.execute("SELECT id, prompt FROM entries WHERE vector IS NULL AND "
                               "NOT coalesce(exact_only, 0) ORDER BY id").fetchall()
        for i in range(0, len(rows), EMBED_BATCH):
            chunk = rows[i:i + EMBED_BATCH]
            vecs = np.asarray(self.embedder.embed([r[1] for r in chunk]), np.float32)
            self.stats["embedded"] += len(chunk)
            with self.db.conn:
                self.db.conn.executemany(
                    "UPDATE entries SET vector = ? WHERE id = ?",
                    [(v.tobytes(), r[0]) for r, v in zip(chunk, vecs, strict=True)])

    def _graph_path(self, part: str) -> str | None:
        return None if self.path == ":memory:" else f"{self.path}.hnsw-{part}"

    def _restore(self, part: str) -> bool:
        path = self._graph_path(part)
        if path is None or not os.path.exists(path):
            return False
        try:
            self._index(part).load(path)
        except Exception as err:  # a damaged graph file: rebuild from the rows instead
            log.warning("semantic cache index rebuilt path=%s reason=%s", path, err)
            del self._indexes[part]
            return False
        return True

    def _save_graphs(self) -> None:
        """Write each HNSW graph next to the database, stamped with its rows, so that the
        next open loads it instead of rebuilding it (a crash leaves no stamp: rebuild)."""
        stamps = {r[0]: f"{r[1]}:{r[2]}:{r[3]}" for r in self.db.execute(
            "SELECT partition, count(*), max(id), sum(id) FROM entries WHERE vector IS NOT NULL "
            "GROUP BY partition")}
        rows = []
        for part, idx in self._indexes.items():
            path = self._graph_path(part)
            if path is not None and part in stamps and idx.save(path):
                rows.append({"key": "index:" + part, "value": stamps[part]})
        if rows:
            self.db.table("meta").upsert_all(rows, pk="key")
            self.db.conn.commit()

    def _rebuild(self, err: BaseException) -> None:
        """Move an unusable file aside and start empty; never raise for a corrupt cache."""
        self.stats["rebuilds"] += 1
        self._touched.clear()
        try:
            self.db.conn.close()
        except Exception:  # the connection may be half open, or never opened
            pass
        if self.path != ":memory:":
            aside = f"{self.path}.corrupt-{int(self._clock())}"
            for suffix in ("", "-wal", "-shm"):
                if os.path.exists(self.path + suffix):
                    os.replace(self.path + suffix, aside + suffix)
            log.warning("semantic cache rebuilt path=%s reason=%s moved_to=%s", self.path,
                        str(err).splitlines()[0] if str(err) else type(err).__name__, aside)
        self._connect()
        self._load()

    def _index(self, part: str) -> PartitionIndex:
        idx = self._indexes.get(part)
        if idx is None:
            idx = self._indexes[part] = PartitionIndex(
                self.dim, exact_max=self._exact_max, dtype=self._index_dtype)
        return idx

    # -- the semantic path's parts ---------------------------------------------------------

    def attach(self, embedder: EmbedderLike, verifier: Verifier | None,
               calibration: Calibration | None) -> None:
        """Give the cache its embedding model, the pair verifier and the verifier's
        calibration: the semantic path starts (rows stored without a vector are embedded
        now). Without a verifier or a calibration the semantic path refuses every candidate."""
        with self._lock:
            self.embedder, self.verifier, self.calibration = embedder, verifier, calibration
            self.dim = int(embedder.dim)
            self._limits.clear()
            try:
                self._load_vectors()
            except sqlite3.DatabaseError as err:
                self._rebuild(err)

    @property
    def semantic(self) -> bool:
        """Whether the semantic path runs (a model attached)."""
        return self.embedder is not None

    def threshold(self, max_error: float) -> float | None:
        """The verifier score a semantic hit must beat at ``max_error`` (None: nothing may be
        served), from the calibration and the wrong-answer feedback so far."""
        if self.calibration is None or self.verifier is None:
            return None
        if max_error not in self._limits:
            cal = self.calibration.with_wrong(self._wrong)
            self._limits[max_error] = threshold(cal, max_error)
        return self._limits[max_error]

    # -- lookups ---------------------------------------------------------------------------

    def lookup_exact(self, req: CacheRequest, *, blocking: bool = True) -> Lookup | None:
        """The cached answer of the very same request (no embedding; one indexed SQLite read,
        or none for an answer still being stored), else None: not cached or not cacheable.
        With ``blocking=False`` it raises ``Busy`` rather than wait for another thread."""
        adm = admit(req)
        if not adm.cacheable:
            return None
        t0 = time.perf_counter()
        key = prompt_key(req.prompt)
        for part in adm.read:
            answer = self._staged.get((part, key))
            if answer is not None:
                self._count("exact_hits")
                return Lookup("exact", "same request", answer, None, part, key, 1.0,
                              search_ms=(time.perf_counter() - t0) * 1e3)
        if not self._lock.acquire(blocking=blocking):
            raise Busy
        try:
            same = self._exact_locked(adm.read, key)
        except sqlite3.DatabaseError:
            return None  # the semantic path (or lookup()) meets it again and rebuilds
        finally:
            self._lock.release()
        if same is None:
            return None
        self._count("exact_hits")
        return Lookup("exact", "same request", same[1], same[0], same[2], key, 1.0,
                      search_ms=(time.perf_counter() - t0) * 1e3, answer_ids=same[3])

    def _exact_locked(self, parts: tuple[str, ...], key: str
                      ) -> tuple[int, str, str, tuple[int, ...] | None] | None:
        now = self._clock()
        for part in parts:
            row = self.db.execute("SELECT id, answer, answer_ids FROM entries WHERE partition "
                                  "= ? AND prompt_key = ? AND expires_at > ? ORDER BY id DESC "
                                  "LIMIT 1", [part, key, now]).fetchone()
            if row is not None:
                self._touch(int(row[0]), now)
                return int(row[0]), str(row[1]), part, _ids(row[2])
        return None

    def lookup(self, req: CacheRequest, *, vector: np.ndarray | None = None) -> Lookup:
        """The exact path, then the semantic one (see ``Lookup`` for what to do next)."""
        adm = admit(req)
        if not adm.cacheable:
            self._count("skips")
            return Lookup("skip", adm.reason)
        same = self.lookup_exact(req)
        if same is not None:
            return same
        return self._semantic(req, adm, vector)

    def lookup_semantic(self, req: CacheRequest, *, vector: np.ndarray | None = None
                        ) -> Lookup:
        """The semantic path alone, for a caller that has just missed ``lookup_exact`` with
        the same request (the daemon: the exact path on its event loop, this in a worker
        thread), so that the exact read is not made twice."""
        adm = admit(req)
        if not adm.cacheable:
            self._count("skips")
            return Lookup("skip", adm.reason)
        return self._semantic(req, adm, vector)

    def _semantic(self, req: CacheRequest, adm: Admission, vector: np.ndarray | None
                  ) -> Lookup:
        if not adm.semantic or self.embedder is None:
            self._count("misses")
            why = "exact repeats only" if not adm.semantic else "no embedding model yet"
            return Lookup("miss", why)
        limit = self.threshold(req.max_error)
        if limit is None:  # no embedding either: nothing could be served
            self._count("refused")
            return Lookup("refused", "the error bound cannot hold at this max_error")
        t0, c0 = time.perf_counter(), time.thread_time()
        if vector is None:
            vector = np.asarray(self.embedder.embed([req.prompt])[0], np.float32)
            self.stats["embedded"] += 1
        t1, c1 = time.perf_counter(), time.thread_time()
        found = self._safely(lambda: self._nearest_locked(adm.read, vector), None)
        gate = self.calibration.gate if self.calibration is not None else 1.0
        verifier = self.verifier
        assert verifier is not None  # threshold() is None without one
        t1b, c1b = time.perf_counter(), time.thread_time()
        if found is None:
            d = decide(None, gate, limit, lambda: 0.0)
        else:
            eid, sim, cached, answer, part, ids = found
            d = decide(sim, gate, limit, lambda: verifier(cached, req.prompt))
        t2, c2 = time.perf_counter(), time.thread_time()
        timing: dict[str, Any] = {
            "embed_ms": (t1 - t0) * 1e3, "search_ms": (t2 - t1) * 1e3,
            "index_ms": (t1b - t1) * 1e3, "verify_ms": (t2 - t1b) * 1e3,
            "embed_cpu_ms": (c1 - c0) * 1e3, "verify_cpu_ms": (c2 - c1b) * 1e3}
        if d.kind == "hit" and found is not None:
            with self._lock:
                self._touch(eid, self._clock())
            self._count("semantic_hits")
            return Lookup("semantic", d.reason, answer, eid, part, None, d.similarity, d.score,
                          d.threshold, vector, answer_ids=ids, **timing)
        self._count("refused" if d.kind == "refused" else "misses")
        return Lookup(d.kind, d.reason, None, None, None, None, d.similarity, d.score,
                      d.threshold, vector, **timing)

    def _nearest_locked(self, parts: tuple[str, ...], vector: np.ndarray
                        ) -> tuple[int, float, str, str, str, tuple[int, ...] | None] | None:
        """(id, similarity, question, answer, partition, answer's token ids) of the nearest
        live entry."""
        found: list[tuple[int, float]] = []
        for part in parts:
            idx = self._indexes.get(part)
            if idx is not None:
                found += idx.search(vector, SEARCH_K)
        found.sort(key=lambda kv: (-kv[1], kv[0]))
        now = self._clock()
        for eid, sim in found:
            row = self.db.execute("SELECT prompt, answer, expires_at, partition, answer_ids "
                                  "FROM entries WHERE id = ?", [eid]).fetchone()
            if row is None:
                continue
            if row[2] <= now:
                self._delete([eid], [row[3]])
                self.stats["expired"] += 1
                continue
            return eid, sim, str(row[0]), str(row[1]), str(row[3]), _ids(row[4])
        return None

    def missed(self) -> None:
        """Count a lookup that ended with the exact path's miss (the caller takes no semantic
        path for it: a follow-up, a bound of 0, the model not loaded yet)."""
        self._count("misses")

    def _count(self, what: str) -> None:
        self.stats[what] += 1
        if what != "skips":
            self.stats["lookups"] += 1

    def _touch(self, eid: int, now: float) -> None:
        _, hits = self._touched.get(eid, (now, 0))
        self._touched[eid] = (now, hits + 1)

    @property
    def pending_touches(self) -> int:
        """Hits not yet written to SQLite (``flush`` writes them)."""
        return len(self._touched)

    def flush(self) -> None:
        """Write the hits' ``last_used`` and ``hits`` held in memory (see the module doc)."""
        self._safely(self._flush_locked, None)

    def _flush_locked(self) -> None:
        if not self._touched:
            return
        rows = [(used, hits, eid) for eid, (used, hits) in self._touched.items()]
        self._touched.clear()
        with self.db.conn:
            self.db.conn.executemany("UPDATE entries SET last_used = max(last_used, ?), "
                                     "hits = hits + ? WHERE id = ?", rows)

    # -- storing ---------------------------------------------------------------------------

    def stage(self, req: CacheRequest, answer: str) -> tuple[str, str] | None:
        """Make ``answer`` an exact hit for ``req`` at once (in memory, no I/O: an event loop
        may call it), until ``insert`` has written it; returns its (partition, key)."""
        adm = admit(req)
        if not adm.cacheable or adm.write is None:
            return None
        where = (adm.write, prompt_key(req.prompt))
        self._staged[where] = answer
        return where

    def insert(self, req: CacheRequest, answer: str, *, vector: np.ndarray | None = None,
               answer_ids: list[int] | None = None) -> int | None:
        """Store ``answer`` for ``req``: the row first (the exact path has it), then, when the
        semantic path runs and ``req`` is not a follow-up, its vector (``vector`` if given,
        else embedded here). ``answer_ids``: the answer's token ids as a hit serves them
        (kept, so that a hit need not tokenize it; None: tokenized when served). Returns the
        entry id, or None when the request is not cacheable or the answer alone exceeds the
        byte bound."""
        adm = admit(req)
        part = adm.write
        if not adm.cacheable or part is None:
            return None
        key = prompt_key(req.prompt)
        exact_only = req.follow_up  # never searched by meaning: no vector
        try:
            ids = None if answer_ids is None else np.asarray(answer_ids, "<i4").tobytes()
            nbytes = entry_bytes(req.prompt, answer, self.dim or GUESS_DIM) + len(ids or b"")
            if nbytes > self.limits.max_bytes:
                return None
            now = self._clock()
            eid = self._safely(lambda: self._insert_locked(
                part, key, req.prompt, answer, ids, nbytes, now, exact_only), None)
        finally:
            if self._staged.get((part, key)) == answer:
                del self._staged[(part, key)]
        embedder = self.embedder
        if eid is None or exact_only or embedder is None:
            return eid
        if vector is None:
            vector = np.asarray(embedder.embed([req.prompt])[0], np.float32)
            self.stats["embedded"] += 1
        vec = np.ascontiguousarray(vector, np.float32).reshape(self.dim)
        self._safely(lambda: self._set_vector_locked(eid, part, vec), None)
        return eid

    def _safely(self, work: Callable[[], T], default: T) -> T:
        """``work()`` under the lock; a file SQLite can no longer read is rebuilt (empty) and
        ``default`` returned: a damaged cache costs a miss, never a failed request."""
        try:
            with self._lock:
                return work()
        except sqlite3.DatabaseError as err:
            with self._lock:
                self._rebuild(err)
            return default

    def _insert_locked(self, part: str, key: str, prompt: str, answer: str,
                       answer_ids: bytes | None, nbytes: int, now: float, exact_only: bool
                       ) -> int:
        self._flush_locked()  # eviction orders by last_used: it must see every hit
        expired = [(r[0], r[1]) for r in self.db.execute(
            "SELECT id, partition FROM entries WHERE expires_at <= ?", [now])]
        if expired:
            self._delete([e for e, _ in expired], [p for _, p in expired])
            self.stats["expired"] += len(expired)
        over_n, over_b = overflow(self._entries, self._bytes, nbytes, self.limits)
        if over_n or over_b:
            limit = max(over_n, 1) + 64
            while True:
                rows = self.db.execute("SELECT id, last_used, nbytes, partition FROM entries "
                                       "ORDER BY last_used, id LIMIT ?", [limit]).fetchall()
                victims = choose_victims([Candidate(r[0], r[1], r[2]) for r in rows],
                                         over_n, over_b)
                freed = sum(r[2] for r in rows[:len(victims)])
                if len(victims) >= over_n and freed >= over_b or len(rows) < limit:
                    break
                limit *= 2
            parts = {r[0]: r[3] for r in rows}
            self._delete(victims, [parts[v] for v in victims])
            self.stats["evictions"] += len(victims)
        with self.db.conn:
            cur = self.db.execute(
                "INSERT INTO entries (partition, prompt_key, prompt, answer, answer_ids, vector, "
                "created_at, last_used, expires_at, hits, nbytes, observations, exact_only) "
                "VALUES (?, ?, ?, ?, ?, NULL, ?, ?, ?, 0, ?, '[]', ?)",
                [part, key, prompt, answer, answer_ids, now, now, expires_at(now, self.limits),
                 nbytes, int(exact_only)])
        self._entries += 1
        self._bytes += nbytes
        self.stats["inserts"] += 1
        return int(cur.lastrowid or 0)

    def _set_vector_locked(self, eid: int, part: str, vec: np.ndarray) -> None:
        with self.db.conn:
            cur = self.db.execute("UPDATE entries SET vector = ? WHERE id = ?",
                                  [vec.tobytes(), eid])
        if cur.rowcount:  # not evicted or forgotten meanwhile
            self._index(part).add(np.array([eid], np.int64), vec[None])

    def _delete(self, ids: list[int], parts: list[str]) -> None:
        if not ids:
            return
        marks = ",".join("?" * len(ids))
        with self.db.conn:
            freed = self.db.execute(f"SELECT coalesce(sum(nbytes), 0), count(*) FROM entries "
                                    f"WHERE id IN ({marks})", ids).fetchone()
            self.db.execute(f"DELETE FROM entries WHERE id IN ({marks})", ids)
        by_part: dict[str, list[int]] = {}
        for eid, part in zip(ids, parts, strict=True):
            by_part.setdefault(part, []).append(eid)
        for part, keys in by_part.items():
            idx = self._indexes.get(part)
            if idx is not None:
                idx.remove(keys)
                if len(idx) == 0:
                    del self._indexes[part]
        self._bytes -= int(freed[0])
        self._entries -= int(freed[1])

    # -- feedback --------------------------------------------------------------------------

    def forget(self, *, entry_id: int | None = None, partition: str | None = None,
               key: str | None = None, wrong_score: float | None = None) -> int:
        """A wrong answer: remove the entry (by id, and every entry of ``key`` in
        ``partition``); with ``wrong_score`` (a semantic hit's verifier score) count one more
        near miss served at that score, kept in the file, so the threshold rises past it.
        Returns how many entries were removed."""
        self.stats["feedback_wrong"] += 1
        if partition is not None and key is not None:
            self._staged.pop((partition, key), None)

        def work() -> int:
            rows = []
            if entry_id is not None:
                rows += self.db.execute("SELECT id, partition FROM entries WHERE id = ?",
                                        [entry_id]).fetchall()
            if partition is not None and key is not None:
                rows += self.db.execute("SELECT id, partition FROM entries WHERE partition = ? "
                                        "AND prompt_key = ?", [partition, key]).fetchall()
            gone = dict(rows)
            self._delete(list(gone), list(gone.values()))
            if wrong_score is not None:
                with self.db.conn:
                    self.db.execute("INSERT INTO feedback (at, score) VALUES (?, ?)",
                                    [self._clock(), float(wrong_score)])
                self._wrong.append(float(wrong_score))
                self._limits.clear()
            return len(gone)

        return self._safely(work, 0)

    def confirm(self) -> None:
        """A right answer: counted (the bound is on near misses; a right answer leaves it)."""
        self.stats["feedback_right"] += 1

    # -- the rest --------------------------------------------------------------------------

    def __len__(self) -> int:
        return self._entries

    def statistics(self) -> dict[str, Any]:
        with self._lock:
            kinds: dict[str, int] = {}
            for idx in self._indexes.values():
                kinds[idx.kind] = kinds.get(idx.kind, 0) + 1
            return {"path": self.path, "entries": self._entries, "bytes": self._bytes,
                    "partitions": len(self._indexes), "index_kinds": kinds,
                    "index_bytes": sum(i.memory_bytes() for i in self._indexes.values()),
                    "semantic": self.semantic, "wrong_scores": len(self._wrong),
                    "threshold_at_0.01": self.threshold(0.01), **self.stats}

    def close(self) -> None:
        """Save the HNSW graphs (see ``_save_graphs``) and close the database."""
        with self._lock:
            try:
                self._flush_locked()
                self._save_graphs()
            except (OSError, sqlite3.Error, RuntimeError) as err:
                log.warning("semantic cache graphs not saved path=%s reason=%s", self.path, err)
            self.db.conn.close()


def _ids(blob: bytes | None) -> tuple[int, ...] | None:
    """An answer's token ids as stored (little-endian int32), None when none were."""
    return None if blob is None else tuple(np.frombuffer(blob, "<i4").tolist())
