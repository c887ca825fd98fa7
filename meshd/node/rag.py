"""Retrieval at the edge as a daemon service: this node's collections, and the mesh's.

``RagService`` opens the node's store (``meshd.rag.store.RagStore`` at ``[rag] path``, default
``data_dir/rag.db``, written by ``meshd rag add``) and keeps:

- the names of the collections held here, read again every ``REFRESH_S``; the advert carries
  them (``Advert.collections``), so every node knows who holds what;
- ``retrieve(collection, question, k)``: the ``k`` nearest chunks, searched here when this node
  holds the collection, else asked of the nearest live peer whose advert names it (RAG_REQ ->
  RAG_PART on that peer's request stream, under ``[rag] remote_timeout_s`` and the request's
  own deadline; up to ``MAX_PEERS_TRIED`` holders, nearest first). No holder at all is
  ``no_collection``;
- ``serve(collection, question, k)``: a peer's RAG_REQ, answered from this node's store.

The embedding model of each collection's precision (``fp32`` or ``int8``, fixed when it was
indexed) is the semantic cache's when that one is loaded with the same precision, else loaded
here in a worker thread on first use (or at start when the store holds collections, so the
first request does not wait for it). Searches run in worker threads, one at a time.
"""

from __future__ import annotations

import logging
import math
import uuid
from contextlib import aclosing
from typing import Any, Protocol

import trio

from meshd.config import Config
from meshd.core.augment import MAX_K, MAX_QUERY_CHARS, Passage, passages_from_wire
from meshd.core.messages import MessageType
from meshd.core.peertable import PeerTable
from meshd.core.wire import Message
from meshd.errors import ErrorCode, MeshdError, PeerGoneError, ProtocolError, RemoteError
from meshd.node.edge_cache import EdgeCache
from meshd.node.links import Links

log = logging.getLogger(__name__)

REFRESH_S = 1.0  # how often the collections held here are read again (for the advert)
MAX_PEERS_TRIED = 3


class Adverts(Protocol):
    table: PeerTable


class RagNode(Protocol):
    """What the service needs of the node (``meshd.node.node.Node`` conforms)."""

    config: Config

    @property
    def membership(self) -> Adverts: ...

    @property
    def links(self) -> Links | None: ...


class RagService:
    def __init__(self, node: RagNode, edge_cache: EdgeCache | None = None) -> None:
        self.node = node
        self.config = node.config
        self.path = node.config.rag_path()
        self.edge_cache = edge_cache
        self.store: Any = None  # meshd.rag.store.RagStore once opened
        self.names: tuple[str, ...] = ()  # collections held here, as advertised
        self.state = "idle"
        self.reason = ""
        self._limiter = trio.CapacityLimiter(1)
        self._opening: trio.Event | None = None
        self.stats: dict[str, Any] = {"retrievals": 0, "local": 0, "remote": 0,
                                      "served_to_peers": 0, "errors": 0, "last_embed_ms": None,
                                      "last_search_ms": None}

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            if self.path.exists():
                try:
                    await self._open()
                    names = await trio.to_thread.run_sync(self.store.names, limiter=self._limiter)
                    if tuple(names) != self.names:
                        log.info("rag collections held=%s", ",".join(names) or "-")
                    self.names = tuple(names)
                    if self.names:  # load the embedders the collections need, before a request does
                        await trio.to_thread.run_sync(self._warm, limiter=self._limiter)
                        self.state = "ready"
                except MeshdError as e:
                    self._off(str(e))
                except Exception as e:  # the extra is missing, the model cannot load
                    self._off(str(e).splitlines()[0][:300] if str(e) else type(e).__name__)
            await trio.sleep(REFRESH_S)

    def _off(self, why: str) -> None:
        if why != self.reason:
            log.warning("rag store unusable path=%s reason=%s", self.path, why)
        self.state, self.reason = "off", why

    async def _open(self) -> None:
        if self.store is not None:
            return
        if self._opening is not None:
            await self._opening.wait()
            return
        self._opening = trio.Event()
        try:
            from meshd.rag.store import RagStore

            self.store = await trio.to_thread.run_sync(
                lambda: RagStore(self.path, self._embedder, precision=self.config.rag.embed_precision))
            self.reason = ""
        finally:
            self._opening.set()
            self._opening = None

    def _warm(self) -> None:
        for precision in self.store.precisions():
            self.store.embedder_for(precision)

    def _embedder(self, precision: str) -> Any:
        """The embedder of a collection's precision: the cache's when it has that one."""
        cache = self.edge_cache.cache if self.edge_cache is not None else None
        if cache is not None and getattr(cache.embedder, "precision", "fp32") == precision:
            return cache.embedder  # the cache's graph (int8 by default) serves int8 collections
        if cache is not None and self.edge_cache is not None and precision == "fp32":
            return self.edge_cache.float_embedder()  # the one /v1/embeddings answers with
        from meshd.embed import load_embedder

        return load_embedder(precision=precision)

    # ------------------------------------------------------------------ retrieval

    async def serve(self, collection: str, question: str, k: int) -> tuple[list[Passage], float, float]:
        """This node's ``k`` best chunks of ``collection`` (and the embedding and search ms);
        ``no_collection`` when it holds none of that name."""
        from meshd.rag.store import NoCollection

        if not self.path.exists():
            raise RemoteError(f"{self.config.node.name or 'this node'} holds no collection "
                              f"{collection!r}", ErrorCode.NO_COLLECTION)
        await self._open()
        try:
            got = await trio.to_thread.run_sync(self.store.query, collection,
                                                question[:MAX_QUERY_CHARS], min(k, MAX_K),
                                                limiter=self._limiter)
        except NoCollection as e:
            raise RemoteError(str(e), ErrorCode.NO_COLLECTION) from None
        except MeshdError:
            raise
        except Exception as e:  # the meshd[edge] extra is missing, the model cannot load
            why = str(e).splitlines()[0][:300] if str(e) else type(e).__name__
            raise RemoteError(f"retrieval is unavailable on this node: {why}",
                              ErrorCode.UNSUPPORTED) from None
        self.stats["last_embed_ms"] = round(got.embed_ms, 3)
        self.stats["last_search_ms"] = round(got.search_ms, 3)
        return ([Passage(f"{h.source}:{h.start_line}-{h.end_line}", h.score, h.text)
                 for h in got.hits], got.embed_ms, got.search_ms)

    async def holds(self, collection: str) -> bool:
        if collection in self.names:
            return True
        if not self.path.exists():
            return False
        await self._open()
        names = await trio.to_thread.run_sync(self.store.names, limiter=self._limiter)
        self.names = tuple(names)
        return collection in self.names

    def holders(self, collection: str) -> list[tuple[str, str]]:
        """``(peer id, name)`` of live peers advertising ``collection``, nearest first."""
        rows = []
        for e in self.node.membership.table.live():
            if collection in e.advert.collections:
                rtt = e.rtt_ms if e.rtt_ms is not None else math.inf
                rows.append((rtt, e.advert.name, e.advert.peer_id))
        return [(pid, name) for _, name, pid in sorted(rows)]

    async def retrieve(self, collection: str, question: str, k: int) -> dict[str, Any]:
        """``{"passages", "node", "embed_ms", "search_ms", "tried"}``: the ``k`` best chunks of
        ``collection`` from this node or the nearest node holding it."""
        self.stats["retrievals"] += 1
        try:
            if await self.holds(collection):
                passages, e_ms, s_ms = await self.serve(collection, question, k)
                self.stats["local"] += 1
                return {"passages": passages, "node": "", "embed_ms": e_ms, "search_ms": s_ms,
                        "tried": []}
            return await self._remote(collection, question, k)
        except MeshdError:
            self.stats["errors"] += 1
            raise

    async def _remote(self, collection: str, question: str, k: int) -> dict[str, Any]:
        holders = self.holders(collection)
        if not holders:
            known = sorted({c for e in self.node.membership.table.live() for c in e.advert.collections}
                           | set(self.names))
            raise RemoteError(f"no node of the mesh holds collection {collection!r} (held: "
                              f"{', '.join(known) or 'none'}); add it with `meshd rag add`",
                              ErrorCode.NO_COLLECTION)
        errors: list[str] = []
        timeout = self.config.rag.remote_timeout_s
        for pid, name in holders[:MAX_PEERS_TRIED]:
            try:
                with trio.fail_after(timeout):
                    got = await self._ask(pid, collection, question, k, timeout)
            except (MeshdError, trio.TooSlowError) as e:
                why = str(e) or f"no answer within [rag] remote_timeout_s = {timeout:g} s"
                errors.append(f"{name}: {why}")
                log.info("rag retrieval failed peer=%s collection=%s error=%s", name, collection, why)
                continue
            self.stats["remote"] += 1
            got["node"], got["tried"] = name, errors
            return got
        raise RemoteError(f"collection {collection!r}: every node holding it failed to answer: "
                          + "; ".join(errors), ErrorCode.PEER_GONE)

    async def _ask(self, peer_id: str, collection: str, question: str, k: int,
                   timeout_s: float) -> dict[str, Any]:
        links = self.node.links
        if links is None:
            raise PeerGoneError("the node's links are not up yet")
        ch = await links.channel(peer_id)
        fields = {"rid": f"rag-{uuid.uuid4().hex[:12]}", "collection": collection,
                  "query": question[:MAX_QUERY_CHARS], "k": min(k, MAX_K),
                  "deadline_ms": int(timeout_s * 1000)}
        async with aclosing(ch.request(fields, mtype=MessageType.RAG_REQ, ends=_is_part)) as frames:
            async for m in frames:
                if m["t"] == MessageType.RAG_PART:
                    try:
                        passages = passages_from_wire(m["chunks"])
                    except ProtocolError as e:
                        raise RemoteError(f"a bad answer: {e}", ErrorCode.MALFORMED) from None
                    return {"passages": passages[:k], "embed_ms": float(m.get("embed_ms") or 0),
                            "search_ms": float(m.get("search_ms") or 0)}
                if m["t"] == MessageType.ERROR:
                    raise RemoteError(f"{m['message']} ({m['code']})", m["code"])
        raise PeerGoneError("the answer ended before the chunks came")

    def statistics(self) -> dict[str, Any]:
        out: dict[str, Any] = {"state": self.state, "path": str(self.path),
                               "collections": list(self.names), **self.stats}
        if self.reason:
            out["reason"] = self.reason
        return out


def _is_part(msg: Message) -> bool:
    return bool(msg["t"] == MessageType.RAG_PART)
