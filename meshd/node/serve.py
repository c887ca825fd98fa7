"""The request protocol's server side: serve REQs that arrive on a peer's long-lived stream.

Each REQ runs in its own task with its own cancel scope (a CANCEL frame or the stream's end
cancels it); tokens go back coalesced: one ``FrameBatcher`` per stream writes the tokens of
every request on it at most once per ``FLUSH_INTERVAL_S`` (a request's first tokens and its end
at once), so concurrent requests share writes. Every request ends with exactly one DONE or
ERROR frame, because a SIGKILLed peer looks like a clean EOF and the other side must be able
to tell.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from meshd.core.augment import Passage, passages_to_wire
from meshd.core.messages import MessageType
from meshd.core.packing import unpack_ids
from meshd.core.tokident import chunks, names
from meshd.core.wire import Message
from meshd.errors import ErrorCode, MeshdError, PeerGoneError, ProtocolError, RemoteError
from meshd.net.framed import FramedStream
from meshd.node.coalesce import FrameBatcher
from meshd.node.gen_config import gen_config_from
from meshd.node.runner import Runner

log = logging.getLogger(__name__)

FLUSH_INTERVAL_S = 0.01
Retrieve = Callable[[str, str, int], Awaitable[tuple[list[Passage], float, float]]]
"""``await retrieve(collection, question, k)``: (chunks, embedding ms, search ms)."""


class RequestServer:
    def __init__(
        self,
        runner: Runner,
        node_name: str,
        *,
        max_hops: int,
        adverts: Callable[[], list[bytes]] | None = None,
        accept_adverts: Callable[[list[Any]], int] | None = None,
        retrieve: Retrieve | None = None,
        fresh_advert: Callable[[], bytes] | None = None,
        summaries: Callable[[], list[bytes]] | None = None,
    ) -> None:
        self.retrieve = retrieve  # a peer's RAG_REQ: this node's RagService.serve
        self.runner = runner
        self._adverts = adverts
        self._accept_adverts = accept_adverts
        self._fresh_advert = fresh_advert  # a probe's answer (cells)
        self._summaries = summaries  # the cell summaries held (cells), handed over in a SYNC
        self.node_name = node_name
        self.max_hops = max_hops
        self.stats = {"streams": 0, "requests": 0, "errors": 0, "malformed": 0, "cancelled": 0,
                      "token_writes": 0, "token_frames": 0, "tokens_sent": 0,
                      # how REQs carried their prompt: packed ids, a list of ids, or text
                      "prompts_packed": 0, "prompts_ids": 0, "prompts_text": 0,
                      "tokenizers_served": 0, "tokenizer_bytes_sent": 0, "retrievals_served": 0,
                      "probes_answered": 0}

    async def serve_stream(self, framed: FramedStream, peer_id: str) -> None:
        """Read frames until the stream ends; never raises (a peer cannot crash the node)."""
        self.stats["streams"] += 1
        scopes: dict[str, trio.CancelScope] = {}
        batcher = FrameBatcher(framed, FLUSH_INTERVAL_S, stats=self.stats)
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(batcher.run)
                try:
                    while True:
                        msg = await framed.recv()
                        if msg is None:
                            break
                        t = msg["t"]
                        if t == MessageType.PING:
                            await framed.send(
                                MessageType.PONG, {"n": msg["n"], "queue": self.runner.queue_depth()}
                            )
                        elif t in (MessageType.REQ, MessageType.TOK_REQ, MessageType.RAG_REQ):
                            # a request with its own id and cancel scope on this stream
                            rid = msg["rid"]
                            if rid in scopes:
                                await _error(framed, rid, ErrorCode.MALFORMED, "duplicate request id")
                                continue
                            scope = trio.CancelScope()
                            scopes[rid] = scope
                            if t == MessageType.REQ:
                                nursery.start_soon(self._serve_one, batcher, msg, scope, scopes, peer_id)
                            elif t == MessageType.TOK_REQ:
                                nursery.start_soon(self._serve_tokenizer, framed, msg, scope, scopes)
                            else:
                                nursery.start_soon(self._serve_retrieval, framed, msg, scope, scopes)
                        elif t == MessageType.SYNC_REQ:
                            await framed.send(MessageType.SYNC, self._sync_answer(msg))
                        elif t == MessageType.CANCEL:
                            s = scopes.get(msg["rid"])
                            if s is not None:
                                self.stats["cancelled"] += 1
                                s.cancel()
                        # other frames (late PONGs) are ignored
                except ProtocolError as e:
                    self.stats["malformed"] += 1
                    log.info("malformed request frame peer=%s error=%s", peer_id, e)
                    await _error(framed, None, e.code, str(e))
                except PeerGoneError:
                    pass
                nursery.cancel_scope.cancel()  # the stream is over: stop its requests
        except Exception:
            self.stats["errors"] += 1
            log.exception("request stream failed peer=%s", peer_id)
        finally:
            await framed.reset()

    def _sync_answer(self, msg: Message) -> dict[str, Any]:
        """SYNC: the adverts (and summaries) held; a probe (``fresh``) gets our own advert, new."""
        if msg.get("fresh") and self._fresh_advert is not None:
            self.stats["probes_answered"] += 1
            return {"n": msg["n"], "adverts": [self._fresh_advert()]}
        if self._accept_adverts is not None and msg.get("adverts"):
            self._accept_adverts(msg["adverts"])  # the asker's own advert
        held = [] if msg.get("summaries_only") or self._adverts is None else self._adverts()
        out: dict[str, Any] = {"n": msg["n"], "adverts": held}
        if self._summaries is not None:
            held = self._summaries()
            if held:
                out["summaries"] = held
        return out

    async def _serve_one(
        self,
        out: FrameBatcher,
        msg: Message,
        scope: trio.CancelScope,
        scopes: dict[str, trio.CancelScope],
        peer_id: str,
    ) -> None:
        rid = msg["rid"]
        self.stats["requests"] += 1
        try:
            with scope:
                scope.deadline = trio.current_time() + max(msg["deadline_ms"], 0) / 1000.0
                await self._run(out, msg)
            if scope.cancelled_caught:
                code = ErrorCode.DEADLINE if trio.current_time() >= scope.deadline else ErrorCode.CANCELLED
                _fail(out, rid, code, f"request {code}")
        except RemoteError as e:
            _fail(out, rid, e.code, str(e), getattr(e, "wait_ms", None))
        except MeshdError as e:
            _fail(out, rid, ErrorCode.INTERNAL, str(e))
        except Exception:
            self.stats["errors"] += 1
            log.exception("serving request failed rid=%s peer=%s", rid, peer_id)
            _fail(out, rid, ErrorCode.INTERNAL, "internal error on the serving node")
        finally:
            scopes.pop(rid, None)

    async def _serve_tokenizer(self, framed: FramedStream, msg: Message, scope: trio.CancelScope,
                               scopes: dict[str, trio.CancelScope]) -> None:
        """Answer TOK_REQ: the bundle of a tokenizer of a model served here, in TOK_PART chunks
        (meshd.core.tokident), or ERROR ``no_model``."""
        rid, identity = msg["rid"], msg["tok"]
        try:
            with scope:
                bundle = await trio.to_thread.run_sync(self.runner.tokenizer_bundle, identity)
                if bundle is None:
                    await _error(framed, rid, ErrorCode.NO_MODEL,
                                 f"{self.node_name} holds no tokenizer {identity[:12]}")
                    return
                for offset, data in chunks(bundle):
                    await framed.send(MessageType.TOK_PART, {"rid": rid, "offset": offset,
                                                             "total": len(bundle), "data": data})
                    self.stats["tokenizer_bytes_sent"] += len(data)
                self.stats["tokenizers_served"] += 1
        except PeerGoneError:
            pass
        except Exception:
            self.stats["errors"] += 1
            log.exception("serving a tokenizer failed rid=%s", rid)
            await _error(framed, rid, ErrorCode.INTERNAL, "internal error on the serving node")
        finally:
            scopes.pop(rid, None)

    async def _serve_retrieval(self, framed: FramedStream, msg: Message, scope: trio.CancelScope,
                               scopes: dict[str, trio.CancelScope]) -> None:
        """Answer RAG_REQ: the chunks of a collection held here nearest the question, in one
        RAG_PART (capped: meshd.core.augment), or ERROR (``no_collection``, ``deadline``)."""
        rid = msg["rid"]
        try:
            with scope:
                scope.deadline = trio.current_time() + max(msg["deadline_ms"], 0) / 1000.0
                if self.retrieve is None:
                    await _error(framed, rid, ErrorCode.NO_COLLECTION,
                                 f"{self.node_name} holds no retrieval collections")
                    return
                passages, embed_ms, search_ms = await self.retrieve(
                    msg["collection"], msg["query"], msg["k"])
                await framed.send(MessageType.RAG_PART, {
                    "rid": rid, "chunks": passages_to_wire(passages),
                    "embed_ms": round(embed_ms, 3), "search_ms": round(search_ms, 3)})
                self.stats["retrievals_served"] += 1
            if scope.cancelled_caught and trio.current_time() >= scope.deadline:
                await _error(framed, rid, ErrorCode.DEADLINE, "retrieval deadline passed")
        except RemoteError as e:
            await _error(framed, rid, e.code, str(e))
        except PeerGoneError:
            pass
        except MeshdError as e:  # the store or the embedding model on this node
            await _error(framed, rid, ErrorCode.INTERNAL, str(e))
        except Exception:
            self.stats["errors"] += 1
            log.exception("serving a retrieval failed rid=%s", rid)
            await _error(framed, rid, ErrorCode.INTERNAL, "internal error on the serving node")
        finally:
            scopes.pop(rid, None)

    def prompt_ids(self, msg: Message) -> list[int]:
        """The prompt of a REQ as token ids: packed (checked against the model's vocabulary and
        the tokenizer the entry node used), a list of ids (older entry nodes), or text to
        tokenize here."""
        model = msg["model"]
        tok = msg.get("tok")
        mine = self.runner.tokenizer_identity(model)
        if tok is not None and mine and not names(tok, mine):
            raise RemoteError(f"the prompt was tokenized with tokenizer {tok[:12]}; {model} on "
                              f"{self.node_name} uses {mine[:12]}", ErrorCode.NO_MODEL)
        if msg.get("prompt_packed") is not None:
            self.stats["prompts_packed"] += 1
            return unpack_ids(msg["prompt_packed"], msg.get("prompt_dtype"),
                              self.runner.vocab_size(model))
        if msg["prompt_ids"]:
            self.stats["prompts_ids"] += 1
            return list(msg["prompt_ids"])
        if msg.get("prompt"):
            self.stats["prompts_text"] += 1
            return self.runner.encode(model, msg["prompt"], chat=bool(msg.get("chat", False)))
        raise ProtocolError("REQ has neither prompt_packed, prompt_ids nor prompt")

    async def _run(self, out: FrameBatcher, msg: Message) -> None:
        rid = msg["rid"]
        if msg["hops"] >= self.max_hops:
            raise RemoteError(f"hop limit {self.max_hops} reached", ErrorCode.HOPS)
        model = msg["model"]
        if (msg.get("prompt_packed") is None and not msg["prompt_ids"] and msg.get("prompt")
                and not self.runner.tokenizes_here(model)):  # an upstream server tokenizes it
            self.stats["prompts_text"] += 1
            ids = await self.runner.aencode(model, msg["prompt"], chat=bool(msg.get("chat", False)))
        else:
            ids = self.prompt_ids(msg)
        if not ids:
            raise ProtocolError("the REQ's prompt has no tokens")
        resume = list(msg.get("resume_ids") or [])
        gen = gen_config_from(msg, already=len(resume), after=resume)
        t0 = time.perf_counter()
        first = 0.0
        count = 0
        if gen is not None:
            # Tokens go straight into the stream's batcher: no channel hop or await per token.
            bound = msg.get("max_wait_ms")
            source = self.runner.generate(model, ids + resume, gen,
                                          max_wait_ms=float(bound) if bound is not None else None)
            try:
                async for tok in source:
                    if not count:
                        first = time.perf_counter()
                    count += 1
                    out.token(rid, tok.id, tok.text, idx=tok.choice, lp=tok.lp)
            finally:
                # Close the generator in this task (the runner then releases its model slot),
                # even when cancelled.
                aclose = getattr(source, "aclose", None)
                if aclose is not None:
                    with trio.CancelScope(shield=True):
                        await aclose()
        end = time.perf_counter()
        stats: dict[str, Any] = {
            "served_by": self.node_name,
            "tokens": count,
            "prompt_tokens": len(ids),
            "compute_ttft_ms": round(((first if count else end) - t0) * 1000, 3),
            "compute_ms": round((end - t0) * 1000, 3),
        }
        out.finish(rid, MessageType.DONE, {"rid": rid, "stats": stats})


def _fail(out: FrameBatcher, rid: str, code: str, message: str, wait_ms: float | None = None) -> None:
    fields: dict[str, Any] = {"rid": rid, "code": code, "message": message[:1000]}
    if wait_ms is not None:
        fields["wait_ms"] = int(min(wait_ms, 2**31))
    out.finish(rid, MessageType.ERROR, fields)


async def _error(framed: FramedStream, rid: str | None, code: str, message: str) -> None:
    fields: dict[str, Any] = {"code": code, "message": message[:1000]}
    if rid is not None:
        fields["rid"] = rid
    with trio.move_on_after(2):
        try:
            await framed.send(MessageType.ERROR, fields)
        except Exception:
            pass
