"""The entry chain: everything this node does with a request a client gave it, in order.

    accept       the control socket's SUBMIT (meshd.node.control) or the HTTP API turn the
                 client's message into an ``EntryRequest`` (meshd.core.request.parse_submit:
                 every field checked once) and name the client (socket owner, or API key)
    admit        counted; a request id already in flight here is refused at once
                                                                        (meshd.node.entry.admit)
    tier         model = "auto": the classifier's score and the pure tier decision choose
                 the model                                              (meshd.node.entry.tier)
    reach        cells on: probe a few nodes of other cells for their load   (meshd.node.entry.reach)
    prepare      model, token ids, token budget and context check    (meshd.node.entry.prepare)
    edge_answer  a prompt that means what an answered one meant: answered from this node's
                 semantic cache, no model run; the very same prompt at once, a paraphrase by
                 a lookup that runs on while route and execute start    (meshd.node.entry.cache)
    augment      a request naming a retrieval collection (rag) gets the nearest chunks put
                 into its prompt, trimmed to the context               (meshd.node.entry.augment)
    route        the pure decision: one node with fallbacks, or a pipeline (none found: kept
                 for execute, the cache may still answer)               (meshd.node.entry.route)
    execute      the request's machine (meshd.core.request_life) driven by a trio loop: serve
                 here, forward with hedging/failover, or drive the pipeline, racing the
                 cache's pending lookup (held back until it misses; a hit cancels the model
                 and is served)                                       (meshd.node.entry.execute)
    remember     a model's answer goes into the semantic cache, after the client has it
                                                                        (meshd.node.entry.cache)
    record       however the request ended: out of the set in flight, counted, journal,
                 observers                                             (meshd.node.entry.record)

``STEPS`` is the list the chain runs, in this order, with nothing around it: each step is a plain
``async def step(ctx, node) -> None`` of its module, named as above, that reads and fills the
``EntryContext``, reads and moves what the ``EntryNode`` holds (its services, and the entry
path's ``EntryState``), raises a ``MeshdError`` to refuse, or sets ``ctx.answer`` to answer
(execute does; an edge answer such as a cache hit does it early). Each step says when it runs:
``UNTIL_ANSWER`` (until the request is answered), ``AFTER_ANSWER`` (only once it is) or
``ALWAYS`` (last, however the request ended: refused, failed, timed out or cancelled; shielded
from cancellation). Adding a step is one module and one line here. Steps that decide call pure
functions of ``meshd.core``.

The whole chain runs under the request timeout: no client ever waits longer than
``[routing] request_timeout_s`` for its answer or its error.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from meshd.core.request import EntryRequest
from meshd.errors import ErrorCode, MeshdError, RemoteError
from meshd.node.entry.admit import admit
from meshd.node.entry.augment import augment
from meshd.node.entry.cache import edge_answer, remember
from meshd.node.entry.context import Emit, EntryContext, EntryNode, Observer
from meshd.node.entry.execute import execute
from meshd.node.entry.prepare import chat_template, models_heard, prepare
from meshd.node.entry.reach import reach
from meshd.node.entry.record import record
from meshd.node.entry.route import route
from meshd.node.entry.tier import tier
from meshd.node.model_facts import model_facts

log = logging.getLogger(__name__)

Step = Callable[[EntryContext, EntryNode], Awaitable[None]]

UNTIL_ANSWER, AFTER_ANSWER, ALWAYS = "until_answer", "after_answer", "always"

# (step, when): in order (see the module's docstring for ``when``)
STEPS: tuple[tuple[Step, str], ...] = (
    (admit, UNTIL_ANSWER),
    (tier, UNTIL_ANSWER),
    (reach, UNTIL_ANSWER),
    (prepare, UNTIL_ANSWER),
    (edge_answer, UNTIL_ANSWER),
    (augment, UNTIL_ANSWER),
    (route, UNTIL_ANSWER),
    (execute, UNTIL_ANSWER),
    (remember, AFTER_ANSWER),
    (record, ALWAYS),
)


class EntryChain:
    """The entry node's service: ``submit`` runs one request through ``STEPS``."""

    def __init__(self, node: EntryNode) -> None:
        self.node = node

    @property
    def observers(self) -> list[Observer]:
        """Told of every recorded request's end (the record step)."""
        return self.node.entry_state.observers

    def new_request_id(self) -> str:
        return uuid.uuid4().hex[:16]

    def models(self) -> list[dict[str, Any]]:
        """Every model the mesh serves, from the gossiped view and this node, with what is known
        of it (``meshd.node.model_facts``: format, architecture, parameters, ...)."""
        facts = model_facts(self.node)
        return [{**facts.get(name, {}), "id": name, **row}
                for name, row in sorted(models_heard(self.node).items())]

    async def chat_template(self, model: str) -> str | None:
        """The chat template this node renders ``model``'s chats with (None: none known)."""
        if model not in models_heard(self.node) and self.node.runner.get(model) is None:
            return None
        return await chat_template(self.node, model)

    async def embed(self, texts: list[str]) -> tuple[str, list[list[float]], int]:
        """Sentence embeddings with this node's model (the semantic cache's), for the API."""
        cache = self.node.edge_cache
        if cache is None:
            raise RemoteError("this node runs no semantic cache, so no embedding model",
                              ErrorCode.UNSUPPORTED)
        return await cache.embed(texts)

    async def cache_feedback(self, rid: str, verdict: str) -> dict[str, Any]:
        """The answer of ``rid`` was right or wrong (``EdgeCache.feedback``)."""
        cache = self.node.edge_cache
        if cache is None:
            raise RemoteError("this node runs no answer cache", ErrorCode.UNSUPPORTED)
        return await cache.feedback(rid, verdict)

    def statistics(self) -> dict[str, Any]:
        state = self.node.entry_state
        return {**state.stats, "in_flight": len(state.in_flight),
                "client_in_flight": dict(state.client_in_flight)}

    async def submit(self, req: EntryRequest, emit: Emit) -> dict[str, Any]:
        """Run ``req`` through the chain; ``emit`` gets "route" and "tokens" events as they come.
        Returns the answer's stats (``meshd.node.entry.execute.answer_fields``); raises a
        ``RemoteError`` with the code to answer the client with. Cancelling the caller cancels
        the request everywhere it runs."""
        node = self.node
        rid = req.request_id
        ctx = EntryContext(req, emit, self._journal(rid))
        cancelled = True
        timeout_s = node.config.routing.request_timeout_s
        try:
            with trio.move_on_after(timeout_s) as scope:
                for step, when in STEPS:
                    if when == ALWAYS or (ctx.answer is not None) != (when == AFTER_ANSWER):
                        continue
                    log.debug("entry step rid=%s step=%s", rid, step.__name__)
                    await step(ctx, node)
            cancelled = False
            if scope.cancelled_caught:
                node.entry_state.stats["timeouts"] += 1
                ctx.error = RemoteError(f"no answer within the request timeout of {timeout_s:g} s",
                                        ErrorCode.DEADLINE)
        except MeshdError as e:
            cancelled = False
            ctx.error = e if isinstance(e, RemoteError) else RemoteError(
                str(e), getattr(e, "code", None) or ErrorCode.INTERNAL)
        except Exception:
            cancelled = False
            log.exception("entry chain failed rid=%s", rid)
            ctx.error = RemoteError("internal error; see the daemon log", ErrorCode.INTERNAL)
        finally:
            ctx.cancelled = cancelled
            with trio.CancelScope(shield=True):
                for step, when in STEPS:
                    if when == ALWAYS:
                        log.debug("entry step rid=%s step=%s", rid, step.__name__)
                        await step(ctx, node)
        if ctx.error is not None:
            raise ctx.error
        assert ctx.answer is not None
        return ctx.answer

    def _journal(self, rid: str) -> Callable[[str, dict[str, Any]], None]:
        node = self.node

        def journal(kind: str, payload: dict[str, Any]) -> None:
            log.debug("request event rid=%s kind=%s %s", rid, kind, payload)
            if node.store is not None:
                try:
                    node.store.record_event(rid, kind, node=node.node_name, payload=payload)
                except Exception:  # the journal must never cost the client its request
                    node.stats["journal_errors"] = node.stats.get("journal_errors", 0) + 1
                    log.exception("journal write failed rid=%s kind=%s", rid, kind)

        return journal
