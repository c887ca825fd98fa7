"""``SemanticCache``: a node's cache of answers, in SQLite, found by meaning.

Synchronous and thread-safe (one lock around the connection and the indexes); the daemon calls
it from a worker thread. The embedding of a prompt is computed outside the lock.

Rows live in one SQLite table (WAL, ``synchronous=NORMAL``) with their prompt, answer, vector
(float32 bytes), partition (meshd.cache.keys), timestamps and the observations the adaptive
policy learns from. At open the vectors are read back into one in-memory index per partition
(meshd.cache.index), or a partition's HNSW graph saved by ``close`` is loaded when its stamp
(count, largest and summed ids of its rows) still matches, so the cache survives a restart; a file that SQLite cannot read is moved
aside (``<name>.corrupt-<unix time>``) and a new, empty cache is started, with a warning.
A hit does not write: its entry's ``last_used`` and ``hits`` are kept in memory and written by
``flush`` (the daemon calls it after the answer went out), before any eviction, and at
``close``; a crash loses only those counters.
Decisions (who may read what, hit or not, what to evict) are the pure functions of
meshd.cache.keys, policy and eviction; this module does the I/O.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import random
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from sqlite_utils import Database

from meshd.cache.align import WordStates, added_alignment
from meshd.cache.eviction import (
    CacheLimits,
    Candidate,
    choose_victims,
    entry_bytes,
    expires_at,
    overflow,
)
from meshd.cache.index import EXACT_MAX, PartitionIndex
from meshd.cache.keys import CacheRequest, admit, prompt_key
from meshd.cache.policy import Decision, FixedThreshold, Observation, Policy, answers_match

log = logging.getLogger(__name__)
SCHEMA_VERSION = 1
SEARCH_K = 4  # nearest neighbours looked at per partition: the guards may refuse the first


class EmbedderLike(Protocol):
    """What the cache needs of an embedder (meshd.embed.Embedder conforms)."""

    @property
    def identity(self) -> str: ...

    @property
    def dim(self) -> int: ...

    def embed(self, texts: Sequence[str]) -> np.ndarray: ...


@dataclass(frozen=True, slots=True)
class Lookup:
    """The result of ``SemanticCache.lookup``.

    ``kind``: ``hit`` (``answer`` is the cached answer: serve it), ``verify`` (compute the
    answer, then call ``SemanticCache.verify(lookup, answer)`` so the entry learns, and
    ``insert`` it), ``miss`` (compute and ``insert``), ``skip`` (the cache takes no part:
    ``reason`` says why; do not insert either).
    """

    kind: str
    reason: str
    answer: str | None = None
    entry_id: int | None = None
    similarity: float | None = None
    threshold: float | None = None
    vector: np.ndarray | None = field(default=None, repr=False)
    embed_ms: float = 0.0
    search_ms: float = 0.0


class SemanticCache:
    """Open (creating if needed) the cache at ``path`` (``":memory:"`` for a throwaway one).

    ``policy``: ``FixedThreshold()`` (0.85, guards on) by default: on the labelled pairs it
    measured better than ``AdaptiveThreshold`` (docs/cache.md); ``clock`` and ``rng`` are
    injectable for tests. ``word_states``: a text's word spans and contextual word vectors
    (``meshd.embed.token_states.TokenStates.words``), for the verifier of guards v4's
    "qualifier added" (meshd.cache.align), asked only about a candidate the policy would
    serve; without it that check is off. ``pair_verifier``: ``(cached, query) -> P(same
    answer)``, the learned pair verifier (``meshd.embed.pair_verifier.PairVerifier.probability``),
    asked, like the other, only about a candidate the policy would serve, and only by a policy
    with ``pair_min_p`` > 0 (the daemon passes one or the other, docs/cache.md).
    """

    def __init__(self, path: str | os.PathLike[str], embedder: EmbedderLike, *,
                 policy: Policy | None = None, limits: CacheLimits | None = None,
                 clock: Callable[[], float] = time.time,
                 rng: Callable[[], float] = random.random, exact_max: int = EXACT_MAX,
                 index_dtype: str = "f16",
                 word_states: Callable[[str], WordStates] | None = None,
                 pair_verifier: Callable[[str, str], float] | None = None) -> None:
        self.path = str(path)
        self.embedder = embedder
        self.word_states = word_states
        self.pair_verifier = pair_verifier
        self.policy: Policy = policy if policy is not None else FixedThreshold()
        self.limits = limits or CacheLimits()
        self.dim = int(embedder.dim)
        self._clock, self._rng = clock, rng
        self._exact_max, self._index_dtype = exact_max, index_dtype
        self._lock = threading.RLock()
        self._indexes: dict[str, PartitionIndex] = {}
        self._entries = 0
        self._bytes = 0
        self._touched: dict[int, tuple[float, int]] = {}  # entry id -> (last used, new hits)
        self.stats = {"lookups": 0, "hits": 0, "verifies": 0, "misses": 0, "skips": 0,
                      "inserts": 0, "evictions": 0, "expired": 0, "rebuilds": 0}
        t0 = time.perf_counter()
        self._open()
        log.info("semantic cache opened path=%s entries=%d partitions=%d open_ms=%.0f",
                 self.path, self._entries, len(self._indexes), (time.perf_counter() - t0) * 1e3)

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
        if "meta" not in self.db.table_names():
            self.db.table("meta").create({"key": str, "value": str}, pk="key")
        if "entries" not in self.db.table_names():
            self.db.table("entries").create({
                "id": int, "partition": str, "prompt_key": str, "prompt": str, "answer": str,
                "vector": bytes,
                "created_at": float, "last_used": float, "expires_at": float, "hits": int,
                "nbytes": int, "observations": str,
            }, pk="id")
            self.db.table("entries").create_index(["partition", "prompt_key"])
            self.db.table("entries").create_index(["last_used"])
            self.db.table("entries").create_index(["expires_at"])
        meta = {r["key"]: r["value"] for r in self.db["meta"].rows}
        if meta.get("schema") not in (None, str(SCHEMA_VERSION)):
            raise sqlite3.DatabaseError(f"schema version {meta.get('schema')}")
        if meta.get("embedder") not in (None, self.embedder.identity):
            log.warning("semantic cache cleared path=%s reason=%s old=%s new=%s", self.path,
                        "embedding model changed", meta.get("embedder"), self.embedder.identity)
            self.db.execute("DELETE FROM entries")
        self.db.table("meta").upsert_all([{"key": "schema", "value": str(SCHEMA_VERSION)},
                                    {"key": "embedder", "value": self.embedder.identity}],
                                   pk="key")
        self.db.conn.commit()

    def _load(self) -> None:
        self._indexes.clear()
        self._entries = self._bytes = 0
        now = self._clock()
        with self.db.conn:
            n = self.db.execute("DELETE FROM entries WHERE expires_at <= ?", [now]).rowcount
        self.stats["expired"] += max(n, 0)
        saved = {r[0][len("index:"):]: r[1] for r in self.db.execute(
            "SELECT key, value FROM meta WHERE key LIKE 'index:%'")}
        with self.db.conn:  # a graph on disk is good only until the next write: forget them
            self.db.execute("DELETE FROM meta WHERE key LIKE 'index:%'")
        parts = self.db.execute("SELECT partition, count(*), max(id), sum(id), sum(nbytes) "
                                "FROM entries GROUP BY partition ORDER BY partition").fetchall()
        for part, count, max_id, sum_id, nbytes in parts:
            self._entries += count
            self._bytes += nbytes
            if saved.get(part) == f"{count}:{max_id}:{sum_id}" and self._restore(part):
                continue
            rows = self.db.execute("SELECT id, vector FROM entries WHERE partition = ? "
                                   "ORDER BY id", [part]).fetchall()
            matrix = np.frombuffer(b"".join(r[1] for r in rows), np.float32).reshape(
                len(rows), self.dim)
            self._index(part).add(np.array([r[0] for r in rows], np.int64), matrix, threads=0)

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
            "SELECT partition, count(*), max(id), sum(id) FROM entries GROUP BY partition")}
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
        except Exception:  # the connection may be half open
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

    # -- the API ---------------------------------------------------------------------------

    def lookup(self, req: CacheRequest, *, vector: np.ndarray | None = None) -> Lookup:
        """Find a cached answer for ``req`` (see ``Lookup`` for what to do next)."""
        adm = admit(req)
        if not adm.cacheable:
            self.stats["skips"] += 1
            return Lookup("skip", adm.reason)
        t0 = time.perf_counter()
        try:
            with self._lock:
                same = self._exact_locked(adm.read, prompt_key(req.prompt))
        except sqlite3.DatabaseError as err:
            with self._lock:
                self._rebuild(err)
            same = None
        if same is not None:  # the very same prompt: no embedding needed
            self.stats["lookups"] += 1
            self.stats["hits"] += 1
            return Lookup("hit", "same prompt", same[1], same[0], 1.0, None, None, 0.0,
                          (time.perf_counter() - t0) * 1e3)
        if vector is None:
            vector = np.asarray(self.embedder.embed([req.prompt])[0], np.float32)
        t1 = time.perf_counter()
        try:
            with self._lock:
                result = self._lookup_locked(req, adm.read, vector)
        except sqlite3.DatabaseError as err:
            with self._lock:
                self._rebuild(err)
            result = (Decision("miss", 0.0, 0.0, "cache rebuilt"), None, None)
        decision, eid, answer = result
        t2 = time.perf_counter()
        kind = decision.kind if eid is not None else "miss"
        self.stats["lookups"] += 1
        self.stats[{"hit": "hits", "verify": "verifies", "miss": "misses"}[kind]] += 1
        return Lookup(kind, decision.reason, answer if kind != "miss" else None, eid,
                      decision.similarity if eid is not None else None,
                      decision.threshold if eid is not None else None, vector,
                      (t1 - t0) * 1e3, (t2 - t1) * 1e3)

    def lookup_exact(self, req: CacheRequest, *, blocking: bool = True) -> Lookup | None:
        """The hit for the very same prompt (no embedding, one indexed SQLite read, no write),
        or None: not cached word for word, not cacheable, or (``blocking=False``) another
        thread holds the cache right now. Cheap enough for an event loop with
        ``blocking=False``; on None, ``lookup`` gives the full answer."""
        adm = admit(req)
        if not adm.cacheable or not self._lock.acquire(blocking=blocking):
            return None
        t0 = time.perf_counter()
        try:
            same = self._exact_locked(adm.read, prompt_key(req.prompt))
        except sqlite3.DatabaseError:
            return None  # lookup() meets it again and rebuilds
        finally:
            self._lock.release()
        if same is None:
            return None
        self.stats["lookups"] += 1
        self.stats["hits"] += 1
        return Lookup("hit", "same prompt", same[1], same[0], 1.0, None, None, 0.0,
                      (time.perf_counter() - t0) * 1e3)

    def _exact_locked(self, parts: tuple[str, ...], key: str) -> tuple[int, str] | None:
        now = self._clock()
        for part in parts:
            row = self.db.execute("SELECT id, answer FROM entries WHERE partition = ? AND "
                                  "prompt_key = ? AND expires_at > ? ORDER BY id DESC LIMIT 1",
                                  [part, key, now]).fetchone()
            if row is not None:
                self._touch(int(row[0]), now)
                return int(row[0]), str(row[1])
        return None

    def _lookup_locked(self, req: CacheRequest, parts: tuple[str, ...], vector: np.ndarray
                       ) -> tuple[Decision, int | None, str | None]:
        found: list[tuple[int, float]] = []
        for part in parts:
            idx = self._indexes.get(part)
            if idx is not None:
                found += idx.search(vector, SEARCH_K)
        found.sort(key=lambda kv: (-kv[1], kv[0]))
        now = self._clock()
        best: tuple[Decision, int | None, str | None] = (
            Decision("miss", found[0][1] if found else 0.0, 0.0, "no cached prompt near"),
            None, None)
        for eid, sim in found:
            row = self.db.execute("SELECT prompt, answer, expires_at, observations, partition "
                                  "FROM entries WHERE id = ?", [eid]).fetchone()
            if row is None:
                continue
            prompt, answer, expiry, obs_json, part = row
            if expiry <= now:
                self._delete([eid], [part])
                self.stats["expired"] += 1
                continue
            obs = _observations(obs_json)
            align = None
            if self.word_states is not None:
                align = functools.partial(added_alignment, self.word_states, req.prompt, prompt)
            pair = None
            if self.pair_verifier is not None:
                pair = functools.partial(self.pair_verifier, prompt, req.prompt)
            decision = self.policy.decide(sim, req.prompt, prompt, obs, u=self._rng(),
                                          align=align, pair=pair)
            if decision.kind == "miss" and decision.reason not in ("below the floor",
                                                                    "below the fixed threshold"):
                best = (decision, None, None)
                continue  # a guard refused this one: the next neighbour may still do
            if decision.kind == "hit":
                self._touch(eid, now)
            return decision, eid, answer
        return best

    def _touch(self, eid: int, now: float) -> None:
        _, hits = self._touched.get(eid, (now, 0))
        self._touched[eid] = (now, hits + 1)

    @property
    def pending_touches(self) -> int:
        """Hits not yet written to SQLite (``flush`` writes them)."""
        return len(self._touched)

    def flush(self) -> None:
        """Write the hits' ``last_used`` and ``hits`` held in memory (see the module doc)."""
        try:
            with self._lock:
                self._flush_locked()
        except sqlite3.DatabaseError as err:
            with self._lock:
                self._rebuild(err)

    def _flush_locked(self) -> None:
        if not self._touched:
            return
        rows = [(used, hits, eid) for eid, (used, hits) in self._touched.items()]
        self._touched.clear()
        with self.db.conn:
            self.db.conn.executemany("UPDATE entries SET last_used = max(last_used, ?), "
                                     "hits = hits + ? WHERE id = ?", rows)

    def insert(self, req: CacheRequest, answer: str, *, lookup: Lookup | None = None) -> int | None:
        """Store ``answer`` for ``req`` (reusing ``lookup``'s vector); returns the entry id, or
        None when the request is not cacheable or the answer alone exceeds the byte bound."""
        adm = admit(req)
        if not adm.cacheable or adm.write is None:
            return None
        vector = lookup.vector if lookup is not None and lookup.vector is not None else None
        if vector is None:
            vector = np.asarray(self.embedder.embed([req.prompt])[0], np.float32)
        vec = np.ascontiguousarray(vector, np.float32).reshape(self.dim)
        nbytes = entry_bytes(req.prompt, answer, self.dim)
        if nbytes > self.limits.max_bytes:
            return None
        now = self._clock()
        try:
            with self._lock:
                return self._insert_locked(adm.write, req.prompt, answer, vec, nbytes, now)
        except sqlite3.DatabaseError as err:
            with self._lock:
                self._rebuild(err)
            return None

    def _insert_locked(self, part: str, prompt: str, answer: str, vec: np.ndarray, nbytes: int,
                       now: float) -> int:
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
                "INSERT INTO entries (partition, prompt_key, prompt, answer, vector, created_at, "
                "last_used, expires_at, hits, nbytes, observations) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, 0, ?, '[]')",
                [part, prompt_key(prompt), prompt, answer, vec.tobytes(), now, now,
                 expires_at(now, self.limits), nbytes])
        eid = int(cur.lastrowid or 0)
        self._index(part).add(np.array([eid], np.int64), vec[None])
        self._entries += 1
        self._bytes += nbytes
        self.stats["inserts"] += 1
        return eid

    def _delete(self, ids: list[int], parts: list[str]) -> None:
        if not ids:
            return
        marks = ",".join("?" * len(ids))
        with self.db.conn:
            freed = self.db.execute(f"SELECT coalesce(sum(nbytes), 0), count(*) FROM entries "
                                    f"WHERE id IN ({marks})", ids).fetchone()
            self.db.execute(f"DELETE FROM entries WHERE id IN ({marks})", ids)
        for eid, part in zip(ids, parts, strict=True):
            idx = self._indexes.get(part)
            if idx is not None:
                idx.remove(eid)
                if len(idx) == 0:
                    del self._indexes[part]
        self._bytes -= int(freed[0])
        self._entries -= int(freed[1])

    def verify(self, lookup: Lookup, fresh_answer: str) -> bool | None:
        """After a ``verify`` lookup: compare the freshly computed answer with the cached one
        (equal text, whitespace aside, is a correct hit) and teach the entry. Returns the label,
        or None when there was nothing to verify."""
        if lookup.kind not in ("verify", "hit") or lookup.entry_id is None or lookup.answer is None:
            return None
        correct = answers_match(lookup.answer, fresh_answer)
        self.observe(lookup.entry_id, float(lookup.similarity or 0.0), correct)
        return correct

    def observe(self, entry_id: int, similarity: float, correct: bool) -> None:
        """Record that serving ``entry_id`` at ``similarity`` would have been right or wrong."""
        try:
            with self._lock:
                row = self.db.execute("SELECT observations FROM entries WHERE id = ?",
                                      [entry_id]).fetchone()
                if row is None:
                    return
                obs = self.policy.observe(_observations(row[0]), similarity, correct)
                with self.db.conn:
                    self.db.execute("UPDATE entries SET observations = ? WHERE id = ?",
                                    [json.dumps([[round(s, 5), ok] for s, ok in obs]), entry_id])
        except sqlite3.DatabaseError as err:
            with self._lock:
                self._rebuild(err)

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
                    "policy": type(self.policy).__name__, **self.stats}

    def close(self) -> None:
        """Save the HNSW graphs (see ``_save_graphs``) and close the database."""
        with self._lock:
            try:
                self._flush_locked()
                self._save_graphs()
            except (OSError, sqlite3.Error, RuntimeError) as err:
                log.warning("semantic cache graphs not saved path=%s reason=%s", self.path, err)
            self.db.conn.close()


def _observations(text: str | None) -> tuple[Observation, ...]:
    try:
        return tuple((float(s), bool(ok)) for s, ok in json.loads(text or "[]"))
    except (ValueError, TypeError):
        return ()
