"""Edge tokenization's fetch and cache: the tokenizers of models this node does not serve.

Whatever node a request enters tokenizes it (docs/edge-tokenization.md). A model served here
brings its own tokenizer; for the others, ``TokenizerService``:

- learns each model's tokenizer identity from the adverts (``ModelAdvert.tokenizer``,
  ``meshd.core.tokident``);
- fetches a tokenizer it lacks from a peer that advertises it: TOK_REQ on the peer's request
  stream, answered by TOK_PART chunks under the request-frame cap;
- checks the bytes against the identity (a bundle whose hash is not the identity is refused,
  counted in ``hash_rejected`` and never cached), keeps it under
  ``data_dir/tokenizers/<identity>.mtok`` (checked again whenever it is read back) and in
  memory, and loads it with the engine's ``Tokenizer`` (chat template included);
- prefetches, in the background, every identity the adverts name that it lacks, so a request
  seldom waits: ``get`` waits at most the time it is given, and the fetch goes on for the
  requests after it.

A fetch runs in the service's own nursery and is shared by every request waiting on it; one
that failed is not tried again for ``RETRY_AFTER_S``. Serving bundles to peers is the request
server's job (``meshd.node.serve``, from ``Runner.tokenizer_bundle``).
"""

from __future__ import annotations

import logging
import math
import uuid
from collections import Counter
from contextlib import aclosing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import trio

from meshd.config import Config
from meshd.core.messages import MessageType
from meshd.core.peertable import PeerTable
from meshd.core.tokident import (
    Assembler,
    BundleMismatch,
    decode_bundle,
    is_identity,
)
from meshd.core.wire import Message
from meshd.errors import MeshdError, PeerGoneError, RemoteError
from meshd.node.links import Links
from meshd.node.runner import Runner

log = logging.getLogger(__name__)

CACHE_DIR = "tokenizers"  # under data_dir
SUFFIX = ".mtok"
FETCH_TIMEOUT_S = 30.0  # one peer's whole answer
MAX_PEERS_TRIED = 3  # per fetch
RETRY_AFTER_S = 10.0  # a failed identity is not fetched again sooner
PREFETCH_POLL_S = 1.0


class Adverts(Protocol):
    """Whose adverts name which tokenizers (``meshd.node.membership.Membership``)."""

    table: PeerTable


class TokenizerNode(Protocol):
    """What the service needs of the node (``meshd.node.node.Node`` conforms)."""

    config: Config
    runner: Runner

    @property
    def membership(self) -> Adverts: ...

    @property
    def links(self) -> Links | None: ...  # once the node runs: channel(peer_id)


class FetchFailed(MeshdError):
    """No peer gave us the tokenizer (the message says why, peer by peer)."""


@dataclass
class _Fetch:
    done: trio.Event = field(default_factory=trio.Event)
    error: str = ""


def load_tokenizer(bundle: bytes, identity: str) -> Any:
    """The engine ``Tokenizer`` of a bundle whose identity must be ``identity``; raises
    ``ProtocolError`` (``BundleMismatch`` for the wrong hash) or ``ModelError``. Blocking (it
    parses megabytes of JSON): call it from a worker thread."""
    import hashlib

    from meshd.engine.manifest import TokenizerInfo
    from meshd.engine.tokenizer import Tokenizer

    data, meta = decode_bundle(bundle, identity)
    info = TokenizerInfo(file="tokenizer.json", sha256=hashlib.sha256(data).hexdigest(),
                         bos_token_id=meta.bos_token_id, eos_token_ids=meta.eos_token_ids,
                         bos_token=meta.bos_token, eos_token=meta.eos_token,
                         chat_template=meta.chat_template)
    return Tokenizer(None, info, data=data)


def _last_part(msg: Message) -> bool:
    return bool(msg["t"] == MessageType.TOK_PART
                and msg["offset"] + len(msg["data"]) >= msg["total"])


class TokenizerService:
    def __init__(self, node: TokenizerNode) -> None:
        self.node = node
        self.cache_dir: Path = node.config.path(node.config.node.data_dir) / CACHE_DIR
        self.loaded: dict[str, Any] = {}  # identity -> engine Tokenizer (fetched or on disk)
        self._fetches: dict[str, _Fetch] = {}
        self._failed: dict[str, tuple[float, str]] = {}  # identity -> (when, why)
        self._nursery: trio.Nursery | None = None
        self.stats: dict[str, int] = {
            "fetches": 0, "fetched": 0, "fetch_failures": 0, "hash_rejected": 0,
            "bytes_fetched": 0, "cache_loads": 0, "cache_rejected": 0, "cache_write_errors": 0,
        }

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            if not self.node.config.routing.edge_tokenize:
                await trio.sleep_forever()
            while True:
                self.prefetch()
                await trio.sleep(PREFETCH_POLL_S)

    # ---------------------------------------------------------------- what the entry asks

    def advertised(self, model: str) -> str:
        """The tokenizer identity the mesh advertises for ``model`` ("" if none): the one most
        of its live servers name (ties: the smallest, so every entry node picks the same)."""
        counts = Counter(m.tokenizer for e in self.node.membership.table.live() for m in e.advert.models
                         if m.name == model and is_identity(m.tokenizer))
        if not counts:
            return ""
        return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[0][0]

    async def get(self, identity: str, wait_s: float) -> tuple[Any | None, str]:
        """``(tokenizer, "")``, or ``(None, why not)`` when it cannot be had within ``wait_s``
        (the fetch goes on in the background; the caller forwards the text meanwhile)."""
        tok = self.loaded.get(identity) or self._local(identity)
        if tok is not None:
            return tok, ""
        if self._nursery is None:
            return None, "the tokenizer service is not running"
        f = self._fetches.get(identity)
        if f is None:
            failed = self._failed.get(identity)
            if failed is not None and trio.current_time() - failed[0] < RETRY_AFTER_S:
                ago = trio.current_time() - failed[0]
                return None, f"its fetch failed {ago:.1f} s ago: {failed[1]}"
            f = self._start(identity)
        with trio.move_on_after(wait_s):
            await f.done.wait()
        tok = self.loaded.get(identity)
        if tok is not None:
            return tok, ""
        return None, f.error or f"not fetched within tokenizer_wait_s = {wait_s:g} s"

    def prefetch(self) -> None:
        """Start fetching every tokenizer the adverts name that this node lacks."""
        wanted = sorted({m.tokenizer for e in self.node.membership.table.live() for m in e.advert.models
                         if is_identity(m.tokenizer)})
        now = trio.current_time()
        for identity in wanted:
            if identity in self.loaded or identity in self._fetches:
                continue
            failed = self._failed.get(identity)
            if failed is not None and now - failed[0] < RETRY_AFTER_S:
                continue
            if self._local(identity) is not None:
                continue
            self._start(identity)

    def statistics(self) -> dict[str, Any]:
        return {**self.stats, "held": sorted(i[:12] for i in self.loaded),
                "fetching": sorted(i[:12] for i in self._fetches),
                "failed": {i[:12]: why for i, (_, why) in sorted(self._failed.items())}}

    # ---------------------------------------------------------------- fetching

    def _local(self, identity: str) -> Any | None:
        """The tokenizer of a model served here, if one has this identity."""
        runner = self.node.runner
        for name, s in list(runner.models.items()):
            if runner.tokenizer_identity(name) == identity:  # an engine or an upstream model's
                return (getattr(getattr(s.model, "model", None), "tokenizer", None)
                        or getattr(s.model, "tokenizer", None))
        return None

    def _start(self, identity: str) -> _Fetch:
        assert self._nursery is not None
        f = self._fetches[identity] = _Fetch()
        self._nursery.start_soon(self._fetch, identity, f)
        return f

    async def _fetch(self, identity: str, f: _Fetch) -> None:
        self.stats["fetches"] += 1
        try:
            tok = await self._from_disk(identity)
            if tok is None:
                tok = await self._from_peers(identity)
            self.loaded[identity] = tok
            self._failed.pop(identity, None)
            log.info("tokenizer ready identity=%s", identity[:12])
        except Exception as e:
            if not isinstance(e, MeshdError):
                log.exception("tokenizer fetch failed identity=%s", identity[:12])
            f.error = str(e) or type(e).__name__
            self.stats["fetch_failures"] += 1
            self._failed[identity] = (trio.current_time(), f.error)
            log.warning("tokenizer fetch failed identity=%s error=%s", identity[:12], f.error)
        finally:
            self._fetches.pop(identity, None)
            f.done.set()

    async def _from_disk(self, identity: str) -> Any | None:
        path = self.cache_dir / f"{identity}{SUFFIX}"
        try:
            data = await trio.to_thread.run_sync(path.read_bytes)
        except FileNotFoundError:
            return None
        except OSError as e:
            log.warning("cached tokenizer unreadable path=%s error=%s", path, e.strerror)
            return None
        try:
            tok = await trio.to_thread.run_sync(load_tokenizer, data, identity)
        except MeshdError as e:
            self.stats["cache_rejected"] += 1
            log.warning("cached tokenizer rejected path=%s error=%s", path, e)
            try:
                path.unlink()
            except OSError:
                pass
            return None
        self.stats["cache_loads"] += 1
        return tok

    def _holders(self, identity: str) -> list[tuple[str, str]]:
        """``(peer id, name)`` of the live peers advertising ``identity``, nearest first."""
        rows = []
        for e in self.node.membership.table.live():
            if any(m.tokenizer == identity for m in e.advert.models):
                rtt = e.rtt_ms if e.rtt_ms is not None else math.inf
                rows.append((rtt, e.advert.name, e.advert.peer_id))
        return [(pid, name) for _, name, pid in sorted(rows)]

    async def _from_peers(self, identity: str) -> Any:
        holders = self._holders(identity)
        if not holders:
            raise FetchFailed("no live peer advertises it")
        errors = []
        for pid, name in holders[:MAX_PEERS_TRIED]:
            try:
                with trio.fail_after(FETCH_TIMEOUT_S):
                    data = await self._download(pid, identity)
                tok = await trio.to_thread.run_sync(load_tokenizer, data, identity)
            except BundleMismatch as e:
                self.stats["hash_rejected"] += 1
                log.warning("tokenizer refused peer=%s error=%s", name, e)
                errors.append(f"{name}: {e}")
                continue
            except (MeshdError, trio.TooSlowError) as e:
                errors.append(f"{name}: {e or type(e).__name__}")
                continue
            self.stats["fetched"] += 1
            self.stats["bytes_fetched"] += len(data)
            log.info("tokenizer fetched identity=%s peer=%s bytes=%d", identity[:12], name, len(data))
            await self._store(identity, data)
            return tok
        raise FetchFailed("; ".join(errors))

    async def _download(self, peer_id: str, identity: str) -> bytes:
        links = self.node.links
        if links is None:
            raise PeerGoneError("the node's links are not up yet")
        ch = await links.channel(peer_id)
        asm = Assembler()
        fields = {"rid": f"tok-{uuid.uuid4().hex[:12]}", "tok": identity}
        async with aclosing(ch.request(fields, mtype=MessageType.TOK_REQ, ends=_last_part)) as frames:
            async for m in frames:
                if m["t"] == MessageType.TOK_PART:
                    whole = asm.feed(m["offset"], m["total"], m["data"])
                    if whole is not None:
                        return whole
                elif m["t"] == MessageType.ERROR:
                    raise RemoteError(f"{m['code']}: {m['message']}", m["code"])
        raise PeerGoneError("the answer ended before the whole tokenizer came")

    async def _store(self, identity: str, data: bytes) -> None:
        path = self.cache_dir / f"{identity}{SUFFIX}"

        def write() -> None:
            self.cache_dir.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_bytes(data)
            tmp.replace(path)

        try:
            await trio.to_thread.run_sync(write)
        except OSError as e:
            self.stats["cache_write_errors"] += 1
            log.warning("tokenizer cache write failed path=%s error=%s", path, e.strerror)


__all__ = ["FetchFailed", "TokenizerService", "load_tokenizer"]
