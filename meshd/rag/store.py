"""``RagStore``: a node's retrieval collections in one SQLite file, with a vector index each.

Synchronous and thread-safe (one lock around the connection and the indexes); the daemon calls
it from worker threads, ``meshd rag`` from the command line, both on the same file (WAL: the
daemon reads while the CLI writes). Tables:

    collections  name, embedder identity and dimension, embedding precision, chunking
                 settings, version
    files        (collection, source): sha256, bytes, chunk count, when indexed
    chunks       id, collection, source, position, line range, heading, text, vector (f32 bytes)
    meta         schema version

Each collection's vectors are searched with ``meshd.cache.index.PartitionIndex`` (the semantic
cache's: exact below 4,096 vectors, an HNSW graph from ``usearch`` above). A collection's
``version`` goes up with every change; a reader whose index is older rebuilds it, or loads the
graph saved beside the database (``<db>.idx/<collection>.<version>.usearch``) by the writer.
Re-adding a file whose bytes are unchanged (sha256) does nothing; a changed file's chunks are
replaced in one transaction. Chunking is the pure ``meshd.rag.chunking``.

A collection has one embedding **precision** (``fp32``: the float graph of the embedding model,
or ``int8``: its quantized graph, about half the CPU per question), fixed when it is created:
its chunks are embedded with it and so is every question asked of it, so the vectors of one
index always come from one graph. Adding with another precision is refused.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
from sqlite_utils import Database

from meshd.cache.index import EXACT_MAX, PartitionIndex
from meshd.cache.store import EmbedderLike
from meshd.errors import LocalError
from meshd.rag.chunking import MAX_CHARS, OVERLAP_CHARS, chunk_text, kind_of

log = logging.getLogger(__name__)
SCHEMA_VERSION = 1
DB_NAME = "rag.db"  # in the node's data_dir
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
MAX_FILE_BYTES = 8 << 20  # a larger file is skipped, and said so
EMBED_BATCH = 64
PRECISIONS = ("fp32", "int8")  # meshd.embed.embedder.PRECISIONS (the core of this store needs no onnxruntime)
SKIP_DIRS = {".git", ".hg", ".svn", "__pycache__", "node_modules", ".venv", "venv", ".mypy_cache",
             ".pytest_cache", ".ruff_cache", ".tox", "dist", "build"}


class RagError(LocalError):
    """A collection or file cannot be used (the message says which and why)."""


class NoCollection(RagError):
    """The collection does not exist in this store."""


@dataclass(frozen=True, slots=True)
class Hit:
    source: str
    score: float
    text: str
    start_line: int
    end_line: int
    heading: str
    chunk_id: int

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "score": round(self.score, 4), "text": self.text,
                "lines": [self.start_line, self.end_line], "heading": self.heading,
                "chunk": self.chunk_id}


@dataclass(frozen=True, slots=True)
class Retrieval:
    collection: str
    hits: tuple[Hit, ...]
    embed_ms: float
    search_ms: float


@dataclass
class AddReport:
    files_added: int = 0
    files_replaced: int = 0
    files_unchanged: int = 0
    files_skipped: list[str] | None = None  # "path: why"
    chunks: int = 0
    chunks_removed: int = 0
    seconds: float = 0.0
    embed_seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"files_added": self.files_added, "files_replaced": self.files_replaced,
                "files_unchanged": self.files_unchanged, "files_skipped": self.files_skipped or [],
                "chunks": self.chunks, "chunks_removed": self.chunks_removed,
                "seconds": round(self.seconds, 3), "embed_seconds": round(self.embed_seconds, 3),
                "chunks_per_s": round(self.chunks / self.seconds, 1) if self.seconds else None}


def check_name(name: str) -> str:
    if not NAME.match(name):
        raise RagError(f"collection name {name!r}: use 1 to 64 letters, digits, '.', '_' or '-', "
                       "starting with a letter or digit")
    return name


def file_sources(paths: Iterable[str | os.PathLike[str]]) -> tuple[list[Path], list[str]]:
    """The files under ``paths`` (directories walked, hidden and build folders left out), and
    "path: why" for the paths that cannot be read."""
    files: list[Path] = []
    problems: list[str] = []
    for raw in paths:
        p = Path(raw).expanduser()
        if p.is_dir():
            for root, dirs, names in os.walk(p):
                dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not d.startswith("."))
                files.extend(Path(root) / n for n in sorted(names) if not n.startswith("."))
        elif p.is_file():
            files.append(p)
        else:
            problems.append(f"{p}: no such file or directory")
    return [f.resolve() for f in files], problems


def _read_text(path: Path) -> tuple[bytes, str | None, str]:
    """(bytes, text or None, why not text)."""
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            return b"", None, f"{size} bytes is over the {MAX_FILE_BYTES >> 20} MiB limit"
        data = path.read_bytes()
    except OSError as e:
        return b"", None, e.strerror or type(e).__name__
    if b"\0" in data[:8192]:
        return data, None, "binary file"
    try:
        return data, data.decode("utf-8"), ""
    except UnicodeDecodeError:
        return data, None, "not UTF-8 text"


def check_precision(precision: str) -> str:
    if precision not in PRECISIONS:
        raise RagError(f"embedding precision {precision!r}: use {' or '.join(PRECISIONS)}")
    return precision


def _precision_of(emb: EmbedderLike) -> str:
    return str(getattr(emb, "precision", "fp32"))


class RagStore:
    """Open (creating if needed) the store at ``path``.

    ``embedder``: an embedder (then every collection used must have its precision), or a
    callable ``load(precision) -> embedder`` called once per precision on first use (listing
    and removing need no model). ``precision``: the precision of collections created without
    one (``[rag] embed_precision``)."""

    def __init__(self, path: str | os.PathLike[str],
                 embedder: EmbedderLike | Callable[[str], EmbedderLike] | None = None, *,
                 exact_max: int = EXACT_MAX, precision: str = "fp32") -> None:
        self.path = Path(path)
        self._loader: Callable[[str], EmbedderLike] | None = None
        self._embedders: dict[str, EmbedderLike] = {}
        if embedder is not None and hasattr(embedder, "embed"):
            fixed = cast(EmbedderLike, embedder)
            self._embedders[_precision_of(fixed)] = fixed
        elif embedder is not None:
            self._loader = embedder
        self.precision = check_precision(precision)
        self._exact_max = exact_max
        self._lock = threading.RLock()
        self._indexes: dict[str, tuple[int, PartitionIndex]] = {}  # name -> (version, index)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            conn = sqlite3.connect(str(self.path), check_same_thread=False, timeout=30)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            self.db = Database(conn)
            self._schema()
        except sqlite3.DatabaseError as e:
            raise RagError(f"{self.path}: cannot open the retrieval store: {e}") from None

    # -- schema ---------------------------------------------------------------------------

    def _schema(self) -> None:
        db = self.db
        with self._lock, db.conn:
            if "meta" not in db.table_names():
                db.table("meta").create({"key": str, "value": str}, pk="key")
                db.table("meta").insert({"key": "schema", "value": str(SCHEMA_VERSION)})
            got = db.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
            if got is None or int(got[0]) != SCHEMA_VERSION:
                raise RagError(f"{self.path}: schema {got and got[0]}, this meshd reads "
                               f"{SCHEMA_VERSION}")
            if "collections" not in db.table_names():
                db.table("collections").create({"name": str, "embedder": str, "dim": int,
                                          "precision": str,
                                          "max_chars": int, "overlap_chars": int, "version": int,
                                          "created": float, "updated": float}, pk="name")
            elif "precision" not in db.table("collections").columns_dict:
                # a store written before collections had a precision: the embedder identity
                # says which graph made its vectors ("+int8" for the quantized one)
                db.execute("ALTER TABLE collections ADD COLUMN precision TEXT")
                db.execute("UPDATE collections SET precision = CASE WHEN embedder LIKE '%+int8' "
                           "THEN 'int8' ELSE 'fp32' END")
            if "files" not in db.table_names():
                db.table("files").create({"collection": str, "source": str, "sha256": str,
                                    "bytes": int, "chunks": int, "indexed": float},
                                   pk=("collection", "source"))
            if "chunks" not in db.table_names():
                db.table("chunks").create({"id": int, "collection": str, "source": str, "ord": int,
                                     "start_line": int, "end_line": int, "heading": str,
                                     "text": str, "vector": bytes}, pk="id")
                db.table("chunks").create_index(["collection", "source"])

    @property
    def embedder(self) -> EmbedderLike:
        """The embedder of the store's default precision."""
        return self.embedder_for(self.precision)

    def embedder_for(self, precision: str) -> EmbedderLike:
        """The embedder of ``precision`` (loaded on first use when the store has a loader)."""
        check_precision(precision)
        with self._lock:
            got = self._embedders.get(precision)
            if got is not None:
                return got
            if self._loader is None:
                if self._embedders:
                    have = ", ".join(sorted(self._embedders))
                    raise RagError(f"this retrieval store was given the {have} embedder only, "
                                   f"not the {precision} one")
                raise RagError("no embedding model given to the retrieval store")
            loaded = self._loader(precision)
            if _precision_of(loaded) != precision:
                raise RagError(f"asked for the {precision} embedder, got the "
                               f"{_precision_of(loaded)} one")
            self._embedders[precision] = loaded
            return loaded

    # -- reading ---------------------------------------------------------------------------

    def names(self) -> list[str]:
        with self._lock:
            return [r[0] for r in self.db.execute("SELECT name FROM collections ORDER BY name")]

    def collections(self) -> list[dict[str, Any]]:
        """Every collection with its files, chunks, text bytes and when it last changed."""
        q = """SELECT c.name, c.embedder, c.version, c.updated, c.max_chars, c.overlap_chars,
                      c.precision,
                      (SELECT count(*) FROM files f WHERE f.collection = c.name),
                      (SELECT coalesce(sum(f.chunks), 0) FROM files f WHERE f.collection = c.name),
                      (SELECT coalesce(sum(f.bytes), 0) FROM files f WHERE f.collection = c.name)
               FROM collections c ORDER BY c.name"""
        with self._lock:
            rows = self.db.execute(q).fetchall()
        return [{"name": r[0], "embedder": r[1], "version": r[2], "updated": r[3],
                 "max_chars": r[4], "overlap_chars": r[5], "precision": r[6] or "fp32",
                 "files": r[7], "chunks": r[8], "bytes": r[9]} for r in rows]

    def precisions(self) -> list[str]:
        """The embedding precisions of the collections held (the embedders a reader needs)."""
        with self._lock:
            return sorted({r[0] or "fp32" for r in
                           self.db.execute("SELECT DISTINCT precision FROM collections")})

    def files(self, collection: str) -> list[dict[str, Any]]:
        with self._lock:
            self._collection(collection)
            rows = self.db.execute("SELECT source, sha256, bytes, chunks, indexed FROM files "
                                   "WHERE collection = ? ORDER BY source", [collection]).fetchall()
        return [{"source": r[0], "sha256": r[1], "bytes": r[2], "chunks": r[3], "indexed": r[4]}
                for r in rows]

    def chunks_of(self, collection: str, source: str) -> list[str]:
        with self._lock:
            return [r[0] for r in self.db.execute(
                "SELECT text FROM chunks WHERE collection = ? AND source = ? ORDER BY ord",
                [collection, source])]

    def _collection(self, name: str) -> dict[str, Any]:
        row = self.db.execute("SELECT embedder, dim, version, max_chars, overlap_chars, precision "
                              "FROM collections WHERE name = ?", [name]).fetchone()
        if row is None:
            raise NoCollection(f"no collection {name!r} in {self.path}"
                               + (f" (collections: {', '.join(self.names())})" if self.names()
                                  else " (it holds none; add one with `meshd rag add`)"))
        return {"embedder": row[0], "dim": row[1], "version": row[2], "max_chars": row[3],
                "overlap_chars": row[4], "precision": row[5] or "fp32"}

    def query(self, collection: str, question: str, k: int = 4) -> Retrieval:
        """The ``k`` chunks most similar to ``question``, best first, with the time taken by
        the question's embedding (with the collection's precision) and by the search (ms)."""
        if k < 1:
            raise RagError("k must be >= 1")
        with self._lock:
            col = self._collection(collection)
        emb = self.embedder_for(col["precision"])
        if col["embedder"] != emb.identity:
            raise RagError(f"collection {collection!r} was indexed with {col['embedder']}, not "
                           f"{emb.identity}: add its files again into a new collection")
        t0 = time.perf_counter()
        vec = emb.embed([question])[0]
        t1 = time.perf_counter()
        with self._lock:
            index = self._index(collection, col)
            found = index.search(vec, k)
            t2 = time.perf_counter()
            hits = self._hits(found)
        return Retrieval(collection, tuple(hits), (t1 - t0) * 1e3, (t2 - t1) * 1e3)

    def _hits(self, found: Sequence[tuple[int, float]]) -> list[Hit]:
        if not found:
            return []
        ids = [i for i, _ in found]
        rows = {r[0]: r for r in self.db.execute(
            f"SELECT id, source, text, start_line, end_line, heading FROM chunks WHERE id IN "
            f"({','.join('?' * len(ids))})", ids)}
        return [Hit(source=rows[i][1], score=float(s), text=rows[i][2], start_line=rows[i][3],
                    end_line=rows[i][4], heading=rows[i][5] or "", chunk_id=i)
                for i, s in found if i in rows]

    # -- the vector index -------------------------------------------------------------------

    def _graph_path(self, collection: str, version: int) -> Path:
        return Path(f"{self.path}.idx") / f"{collection}.{version}.usearch"

    def _index(self, collection: str, col: dict[str, Any]) -> PartitionIndex:
        """The collection's index at its current version (rebuilt or loaded when older)."""
        held = self._indexes.get(collection)
        if held is not None and held[0] == col["version"]:
            return held[1]
        index = PartitionIndex(int(col["dim"]), exact_max=self._exact_max)
        graph = self._graph_path(collection, col["version"])
        count = self.db.execute("SELECT count(*) FROM chunks WHERE collection = ?",
                                [collection]).fetchone()[0]
        if count > self._exact_max and graph.exists():  # else this store searches exactly
            try:
                index.load(str(graph))
                self._indexes[collection] = (col["version"], index)
                return index
            except Exception as e:  # a torn or foreign file: rebuild from the rows
                log.warning("rag index unreadable path=%s error=%s", graph, e)
                index = PartitionIndex(int(col["dim"]), exact_max=self._exact_max)
        rows = self.db.execute("SELECT id, vector FROM chunks WHERE collection = ?",
                               [collection]).fetchall()
        if rows:
            keys = np.fromiter((r[0] for r in rows), np.int64, len(rows))
            vecs = np.frombuffer(b"".join(r[1] for r in rows), np.float32).reshape(len(rows), -1)
            index.add(keys, vecs, threads=0)
        self._indexes[collection] = (col["version"], index)
        self._save_graph(collection, col["version"], index)
        return index

    def _save_graph(self, collection: str, version: int, index: PartitionIndex) -> None:
        if index.kind != "hnsw":
            return
        path = self._graph_path(collection, version)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".tmp{os.getpid()}")
            index.save(str(tmp))
            tmp.replace(path)
            for old in path.parent.glob(f"{collection}.*.usearch"):
                if old != path:
                    old.unlink(missing_ok=True)
        except OSError as e:
            log.warning("rag index not saved path=%s error=%s", path, e.strerror)

    # -- writing ---------------------------------------------------------------------------

    def add(self, collection: str, paths: Iterable[str | os.PathLike[str]], *,
            max_chars: int = MAX_CHARS, overlap_chars: int = OVERLAP_CHARS,
            precision: str | None = None,
            progress: Callable[[str], None] | None = None) -> AddReport:
        """Index the text files under ``paths`` into ``collection`` (created if new, with
        ``precision`` or the store's default): new files are added, changed ones replaced,
        unchanged ones (same sha256) skipped. ``precision`` other than an existing collection's
        is refused (``RagError``) before anything is read."""
        check_name(collection)
        t0 = time.perf_counter()
        rep = AddReport(files_skipped=[])
        precision = self._precision_for(collection, precision)
        files, problems = file_sources(paths)
        rep.files_skipped = list(problems)
        if not files and problems:
            raise RagError("; ".join(problems))
        emb = self.embedder_for(precision)
        with self._lock, self.db.conn:
            col = self._ensure(collection, emb, max_chars, overlap_chars)
        with self._lock:  # hold the index (the saved graph, if any) so changes update it in place
            self._index(collection, col)
        known = {f["source"]: f["sha256"] for f in self.files(collection)}
        for path in files:
            data, text, why = _read_text(path)
            if text is None:
                rep.files_skipped.append(f"{path}: {why}")
                continue
            digest = hashlib.sha256(data).hexdigest()
            source = str(path)
            if known.get(source) == digest:
                rep.files_unchanged += 1
                continue
            chunks = chunk_text(text, kind_of(path.name), max_chars=col["max_chars"],
                                overlap_chars=col["overlap_chars"])
            te = time.perf_counter()
            vecs = (emb.embed([c.text for c in chunks]) if chunks
                    else np.empty((0, emb.dim), np.float32))
            rep.embed_seconds += time.perf_counter() - te
            removed = self._replace(collection, source, digest, len(data), chunks,
                                    np.asarray(vecs, np.float32))
            rep.chunks += len(chunks)
            rep.chunks_removed += removed
            if source in known:
                rep.files_replaced += 1
            else:
                rep.files_added += 1
            if progress is not None:
                progress(f"{source}: {len(chunks)} chunks")
        with self._lock:  # readers (the daemon) load the graph instead of building it again
            col = self._collection(collection)
            held = self._indexes.get(collection)
            if held is not None and held[0] == col["version"]:
                self._save_graph(collection, col["version"], held[1])
            else:
                self._index(collection, col)
        rep.seconds = time.perf_counter() - t0
        return rep

    def put_chunks(self, collection: str, source: str, chunks: Sequence[Any], vectors: np.ndarray,
                   *, digest: str = "", size: int = 0, precision: str | None = None) -> int:
        """Store already-embedded chunks as the whole content of ``source`` (benchmarks, and
        importers that embed elsewhere); returns how many old chunks it replaced."""
        check_name(collection)
        emb = self.embedder_for(self._precision_for(collection, precision))
        with self._lock, self.db.conn:
            self._ensure(collection, emb, MAX_CHARS, OVERLAP_CHARS)
        return self._replace(collection, source, digest, size, chunks,
                             np.asarray(vectors, np.float32))

    def _precision_for(self, collection: str, asked: str | None) -> str:
        """The precision to embed ``collection``'s new chunks with: its own when it exists
        (``asked`` must then agree), else ``asked`` or the store's default."""
        if asked is not None:
            check_precision(asked)
        with self._lock:
            try:
                have = self._collection(collection)["precision"]
            except NoCollection:
                return asked or self.precision
        if asked is not None and asked != have:
            raise RagError(f"collection {collection!r} is indexed with {have} embeddings, not "
                           f"{asked}: one collection never mixes the two (add with "
                           f"--precision {have}, or remove it first: meshd rag rm {collection})")
        return str(have)

    def _ensure(self, name: str, emb: EmbedderLike, max_chars: int,
                overlap_chars: int) -> dict[str, Any]:
        try:
            col = self._collection(name)
        except NoCollection:
            now = time.time()
            self.db.table("collections").insert({"name": name, "embedder": emb.identity,
                                           "dim": int(emb.dim), "precision": _precision_of(emb),
                                           "max_chars": max_chars,
                                           "overlap_chars": overlap_chars, "version": 0,
                                           "created": now, "updated": now})
            return self._collection(name)
        if col["embedder"] != emb.identity:
            raise RagError(f"collection {name!r} was indexed with {col['embedder']}, not "
                           f"{emb.identity}; remove it or use another name")
        return col

    def _replace(self, collection: str, source: str, digest: str, size: int,
                 chunks: Sequence[Any], vecs: np.ndarray) -> int:
        """Swap the chunks of one file in one transaction; keep a loaded index in step."""
        with self._lock:
            col = self._collection(collection)
            held = self._indexes.get(collection)
            index = held[1] if held is not None and held[0] == col["version"] else None
            with self.db.conn:
                old = [r[0] for r in self.db.execute(
                    "SELECT id FROM chunks WHERE collection = ? AND source = ?",
                    [collection, source])]
                self.db.execute("DELETE FROM chunks WHERE collection = ? AND source = ?",
                                [collection, source])
                start = (self.db.execute("SELECT coalesce(max(id), 0) FROM chunks")
                         .fetchone()[0]) + 1
                ids = list(range(start, start + len(chunks)))
                self.db.table("chunks").insert_all(
                    ({"id": i, "collection": collection, "source": source, "ord": n,
                      "start_line": c.start_line, "end_line": c.end_line, "heading": c.heading,
                      "text": c.text, "vector": vecs[n].tobytes()}
                     for n, (i, c) in enumerate(zip(ids, chunks, strict=True))), batch_size=500)
                self.db.table("files").upsert({"collection": collection, "source": source,
                                         "sha256": digest, "bytes": size, "chunks": len(chunks),
                                         "indexed": time.time()}, pk=("collection", "source"))
                self._bump(collection)
            if index is not None:
                index.remove(old)
                index.add(np.asarray(ids, np.int64), vecs, threads=0)
                self._indexes[collection] = (col["version"] + 1, index)
            return len(old)

    def _bump(self, collection: str) -> None:
        self.db.execute("UPDATE collections SET version = version + 1, updated = ? WHERE name = ?",
                        [time.time(), collection])

    def remove(self, collection: str, sources: Sequence[str] = ()) -> tuple[int, int]:
        """Drop a whole collection, or only the files ``sources`` of it (absolute paths, or
        paths that resolve to them). Returns (files, chunks) removed."""
        with self._lock:
            self._collection(collection)
            with self.db.conn:
                if not sources:
                    files = self.db.execute("SELECT count(*) FROM files WHERE collection = ?",
                                            [collection]).fetchone()[0]
                    cur = self.db.execute("DELETE FROM chunks WHERE collection = ?", [collection])
                    self.db.execute("DELETE FROM files WHERE collection = ?", [collection])
                    self.db.execute("DELETE FROM collections WHERE name = ?", [collection])
                    self._indexes.pop(collection, None)
                    for old in Path(f"{self.path}.idx").glob(f"{collection}.*.usearch"):
                        old.unlink(missing_ok=True)
                    return int(files), int(cur.rowcount)
                files = chunks = 0
                for s in sources:
                    name = str(Path(s).expanduser().resolve()) if not s.startswith("/") else s
                    cur = self.db.execute("DELETE FROM chunks WHERE collection = ? AND source = ?",
                                          [collection, name])
                    gone = self.db.execute("DELETE FROM files WHERE collection = ? AND source = ?",
                                           [collection, name]).rowcount
                    if not gone:
                        raise RagError(f"collection {collection!r} holds no file {name}")
                    files += gone
                    chunks += cur.rowcount
                self._bump(collection)
            return files, chunks

    def close(self) -> None:
        with self._lock:
            self.db.conn.close()
