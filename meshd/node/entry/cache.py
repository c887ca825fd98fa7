"""Entry steps "edge answer" and "remember": the answer cache (docs/cache.md).

Before routing, the request is looked up in this node's cache (``meshd.node.edge_cache``),
for the same model, settings, context (system prompt, earlier turns, tools, schema) and client
(or a tenant's clients that all opted in to sharing): first the very same request (the exact
path, on the event loop, no model of any kind), then a question that means the same within the
request's error bound (the semantic path, in a worker thread). When this node serves the
model, the step waits for that lookup: the model would wait for it too, and routing beside it
would take the cores the embedding runs on. For a peer's model, routing goes on meanwhile; the
lookup's result is an event of the request's machine, ``meshd.core.request_life``, which races
it with the model: the execute step feeds it in, ``pending_lookup``, and serves a hit,
``serve_cached``.
A hit is answered from the cache, marked ``cached`` with how (``exact`` or ``semantic``), without
touching a model. Who may read what and when a candidate is served are the cache's pure rules
(``meshd.cache.keys``, ``meshd.cache.policy``, ``meshd.cache.bound``). Greedy requests take
part by default; sampled ones only when they opt in; ``cache: false`` keeps a request out.

After a request was answered by a model, "remember" keeps the answer for next time: an exact
hit at once, written after the client has it.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

from meshd.engine.sampling import GenerationConfig
from meshd.node.entry.context import EntryContext, EntryNode

_ENGINE = GenerationConfig()  # what the engine uses for the settings a request leaves unset


def cache_request(ctx: EntryContext, node: EntryNode, tenant: str) -> Any:
    """The request as the cache sees it: the question (the last message, or the prompt), the
    context it must share with a cached one (earlier messages, tools, schema), the bound."""
    from meshd.cache import CacheRequest, conversation

    req, s = ctx.req, ctx.req.sampling
    if req.messages is not None:
        prompt, context, follow_up = conversation(req.messages, req.shape)
    else:
        prompt, context, follow_up = req.prompt or "", req.shape, False
    max_error = req.cache_max_error
    return CacheRequest(
        model=model_identity(node, ctx.model), tenant=tenant, client=req.client, prompt=prompt,
        temperature=s.temperature if s.temperature is not None else _ENGINE.temperature,
        top_k=s.top_k if s.top_k is not None else _ENGINE.top_k,
        top_p=s.top_p if s.top_p is not None else _ENGINE.top_p,
        repetition_penalty=(s.repetition_penalty if s.repetition_penalty is not None
                            else _ENGINE.repetition_penalty),
        max_tokens=ctx.max_tokens, seed=s.seed, stop=s.stop,
        chat=req.chat or req.messages is not None,
        cache_sampled=bool(req.cache),  # an explicit cache: true opts a sampled request in
        context=context, follow_up=follow_up,
        max_error=max_error if max_error is not None else node.config.cache.max_error,
        presence_penalty=s.presence_penalty or 0.0, frequency_penalty=s.frequency_penalty or 0.0,
        logit_bias=s.logit_bias, n=s.n, logprobs=s.logprobs,
    )


def _manifest(node: EntryNode, model: str) -> Any:
    """The engine manifest of ``model`` where this node serves it from local files, else None
    (a peer's model, an upstream server, a fake in tests)."""
    served = node.runner.get(model)
    return getattr(getattr(getattr(served, "model", None), "model", None), "manifest", None)


def model_identity(node: EntryNode, model: str) -> str:
    """The cache's key for ``model``: ``name@content hash`` where this node holds the model's
    files, else ``name@identity`` (``identity_of``; an upstream server's model here, or what the
    mesh advertises), else the name."""
    digest = getattr(_manifest(node, model), "content_hash", None)
    if digest:
        return f"{model}@{str(digest)[:16]}"
    mid = identity_of(node, model)
    return f"{model}@{mid}" if mid else model


def identity_of(node: EntryNode, model: str, served_by: str | None = None) -> str:
    """What ``model`` really is (meshd.core.modelid): this node's, when it serves it, else the
    identity most of its live servers advertise (ties: the smallest); with ``served_by``, the one
    that node advertises ("" when unknown)."""
    if node.runner.get(model) is not None and served_by in (None, node.node_name):
        return node.runner.model_identity(model)
    counts: dict[str, int] = {}
    for e in node.membership.table.live():
        if served_by is not None and e.advert.name != served_by:
            continue
        for m in e.advert.models:
            if m.name == model and m.model_id:
                counts[m.model_id] = counts.get(m.model_id, 0) + 1
    return min(counts, key=lambda k: (-counts[k], k)) if counts else ""


async def edge_answer(ctx: EntryContext, node: EntryNode) -> None:
    """The very same request is answered here, at once. Anything else that the semantic path
    may take starts its lookup (the question's embedding, in a worker thread). For a model
    this node serves, the lookup is awaited here and a hit served; for a peer's model the
    chain moves on: routing and the peer's model start meanwhile, and the request's machine
    settles which answers (``pending_lookup``, fed to it by the execute step). Nothing when
    the node runs no cache."""
    cache = node.edge_cache
    if cache is None:
        return
    if ctx.req.cache is False or ctx.req.rag:
        return  # a retrieval request's answer depends on context the cache key does not hold
    await cache.opened.wait()  # a request may come in while the node is still starting
    if cache.store is None:
        return
    from meshd.cache.keys import admit

    creq = cache_request(ctx, node, node.config.cache.tenant)
    adm = admit(creq)
    if not adm.cacheable:
        ctx.journal("cache_skip", {"reason": adm.reason})
        return
    ctx.extra["cache"] = (creq, None)  # a model's answer is kept for next time
    got = await cache.exact(creq)
    if got is not None:
        ctx.extra["cache"] = (creq, got)
        await _serve_hit(ctx, node, got)
    elif adm.semantic and cache.semantic_ready():
        ctx.extra["cache_pending"] = (creq, cache.start_lookup(creq))
        if not node.runner.ready(ctx.model):
            return  # a peer's model races the lookup (the execute step)
        # This node runs the model: it would wait for the lookup anyway (a decision naming
        # this node does, ``CacheLookup``), and routing meanwhile would only take the cores
        # and the interpreter from the lookup's embedding. A hit is served now, routing none.
        answered = pending_lookup(ctx)
        if answered is not None and await answered():
            await _serve_hit(ctx, node, ctx.extra["cache"][1])
    else:
        cache.missed()


def pending_lookup(ctx: EntryContext) -> Callable[[], Awaitable[bool]] | None:
    """The semantic lookup ``edge_answer`` started, as the request's machine awaits it (the
    execute step's driver, ``meshd.node.forward``): ``await`` it for whether it found the
    answer; what it found and its timings are kept for ``serve_cached`` and ``remember``. None
    when no lookup runs."""
    pending = ctx.extra.pop("cache_pending", None)
    if pending is None:
        return None
    creq, lookup = pending

    async def answered() -> bool:
        got = await _result(ctx, lookup)
        if got is not None:
            ctx.extra["cache"] = (creq, got)
        return got is not None and bool(got.hit)

    return answered


async def serve_cached(ctx: EntryContext, node: EntryNode, model: str | None) -> None:
    """The machine's ``ServeCached``: the lookup's hit is streamed to the client. ``model``:
    what became of the model's attempts ("cancelled", "dropped"), journaled as
    ``cache_overtook``; None when none had been sent."""
    if model is not None:
        ctx.journal("cache_overtook", {"model": model})
    ctx.outcome = None
    _, got = ctx.extra["cache"]
    await _serve_hit(ctx, node, got)


def _how(got: Any) -> dict[str, Any]:
    """How a request was served by the cache, as the answer, the journal and the HTTP headers
    say it."""
    out: dict[str, Any] = {"kind": got.kind, "similarity": _round(got.similarity),
                           "entry": got.entry_id}
    if got.kind == "semantic":
        out.update(score=_round(got.score), threshold=_round(got.threshold))
    return out


async def _serve_hit(ctx: EntryContext, node: EntryNode, got: Any) -> None:
    answer = str(got.answer)
    ttft_ms = (time.perf_counter() - ctx.started) * 1000.0
    how = _how(got)
    ctx.journal("cache_hit", {**how, **ctx.extra.get("cache_timing", {})})
    await ctx.emit("route", {"served_by": node.node_name, "route": [node.node_name],
                             "cached": True, "cache": how})
    ids: list[int] = []
    if got.answer_ids is not None:  # tokenized when it was stored
        ids = list(got.answer_ids)
    elif node.runner.ready(ctx.model):
        ids = await node.runner.aencode(ctx.model, answer)
        ids = _without_bos(ids, _bos(node, ctx.model))
    await ctx.emit("tokens", {"ids": ids, "text": answer})
    ctx.answer = {
        "served_by": node.node_name, "route": [node.node_name], "ttft_ms": round(ttft_ms, 3),
        "tokens": len(ids), "tokens_per_s": None, "total_ms": round(ttft_ms, 3), "retries": 0,
        "hedges": 0, "request_id": ctx.req.request_id, "text": answer, "token_ids": ids,
        "model": ctx.model, "strategy": "cache", "prompt_tokens": ctx.prompt_tokens,
        "completion_tokens": len(ids), "finish_reason": "stop", "max_tokens": ctx.max_tokens,
        "cached": True, "cache": how,
    }


async def remember(ctx: EntryContext, node: EntryNode) -> None:
    """After the answer: a model's is kept for next time (an exact hit from now on); a cache
    hit is noted, so that feedback on it can name its entry."""
    cache = node.edge_cache
    if cache is None or ctx.answer is None or "cache" not in ctx.extra:
        return
    creq, got = ctx.extra["cache"]
    rid = ctx.req.request_id
    if ctx.answer.get("cached"):
        cache.served(rid, got)
        return
    want = identity_of(node, ctx.model)
    served = identity_of(node, ctx.model, str(ctx.answer.get("served_by") or ""))
    if want and served and served != want:  # another model under the same name answered
        cache.stats["other_model"] += 1
        ctx.journal("cache_skip", {"reason": f"answered by {served}, not {want}"})
        return
    miss: dict[str, Any] = {"kind": "miss"}
    if got is not None:
        miss.update(reason=got.reason, similarity=_round(got.similarity),
                    score=_round(got.score), threshold=_round(got.threshold))
    ctx.answer["cache"] = miss
    cache.remember(creq, str(ctx.answer.get("text", "")), got, rid, _tokenizer(node, ctx.model))


async def _result(ctx: EntryContext, lookup: Any) -> Any:
    """The pending semantic lookup's answer, its timings kept for the journal (``_timing``)."""
    got = await lookup.result()
    ctx.extra["cache_timing"] = _timing(ctx, lookup, got)
    return got


def _timing(ctx: EntryContext, lookup: Any, got: Any) -> dict[str, Any]:
    """Where a semantic lookup's time went, in ms: from the request's start to the lookup's
    start (``start_ms``), waiting for a worker thread (``queued_ms``), the prompt's embedding
    (``embed_ms``), the search with its checks (``search_ms``: the index with the entry's row,
    ``index_ms``, and the verifier, ``verify_ms``) and back to the request (``handoff_ms``);
    ``embed_cpu_ms`` and ``verify_cpu_ms``: the looking-up thread's CPU time in each."""
    now = time.perf_counter()
    began, answered = lookup.began, lookup.answered
    if got is None or began is None or answered is None:
        return {}
    return {"start_ms": _round((lookup.created - ctx.started) * 1e3),
            "queued_ms": _round((began - lookup.created) * 1e3), "embed_ms": _round(got.embed_ms),
            "search_ms": _round(got.search_ms), "index_ms": _round(got.index_ms),
            "verify_ms": _round(got.verify_ms), "embed_cpu_ms": _round(got.embed_cpu_ms),
            "verify_cpu_ms": _round(got.verify_cpu_ms),
            "handoff_ms": _round((now - answered) * 1e3)}


def _tokenizer(node: EntryNode, model: str) -> Callable[[str], list[int]] | None:
    """How a hit on ``model`` tokenizes its answer, for the cache to do it once when it stores
    the answer: with this node's copy of the model's tokenizer (None for a peer's or an
    upstream server's model: a hit tokenizes through the runner, or not at all)."""
    if not (node.runner.ready(model) and node.runner.tokenizes_here(model)):
        return None
    bos, runner = _bos(node, model), node.runner
    return lambda text: _without_bos(runner.encode(model, text), bos)


def _without_bos(ids: list[int], bos: int | None) -> list[int]:
    """A cached answer's ids: as the tokenizer encodes its text, less a leading BOS."""
    return ids[1:] if ids and ids[0] == bos else ids


def _bos(node: EntryNode, model: str) -> int | None:
    tok = getattr(_manifest(node, model), "tokenizer", None)
    bos = getattr(tok, "bos_token_id", None)
    return int(bos) if bos is not None else None


def _round(x: Any) -> float | None:
    return round(float(x), 4) if x is not None else None
