"""Entry step "augment": retrieval-augmented generation at the edge (docs/rag.md).

A request naming a collection (``rag``) gets the ``[rag] top_k`` chunks nearest its question
(the prompt, or the last user message) put into its prompt, numbered and with their sources,
before it is routed:

- retrieval runs here when this node holds the collection, else on the nearest node whose
  advert names it (``meshd.node.rag.RagService``; RAG_REQ/RAG_PART), and a collection nobody
  holds is refused with ``no_collection``;
- the augmented prompt is tokenized with the tokenizer ``prepare`` used, and must fit the
  model's context with the request's ``max_tokens``: the lowest-scoring chunks are trimmed until
  it does (``meshd.core.augment.fit_passages``, pure), and a note in the answer says so;
- the answer carries ``sources`` (``[{source, score}]``, the chunks used, best first) and
  ``rag`` (collection, where it was retrieved, chunks retrieved and used, timings).

Runs after ``edge_answer`` (a request with ``rag`` never takes a cached answer: its context
may have changed) and before ``route``, which then routes the augmented prompt as usual.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from meshd.core.augment import Fit, Passage, build_prompt, fit_passages
from meshd.core.request import EntryRequest
from meshd.errors import ErrorCode, RemoteError
from meshd.node.entry.context import EntryContext, EntryNode
from meshd.node.entry.prepare import context_length, template_tools


async def augment(ctx: EntryContext, node: EntryNode) -> None:
    name = ctx.req.rag
    if not name:
        return
    rag = node.rag
    if rag is None:
        raise RemoteError("this node cannot retrieve (no retrieval service)", ErrorCode.UNSUPPORTED)
    question = question_of(ctx.req)
    got = await rag.retrieve(name, question, node.config.rag.top_k)
    passages: list[Passage] = got["passages"]
    encode = _encoder(ctx, node)

    def count(kept: Sequence[Passage]) -> int:
        req = with_passages(ctx.req, kept)
        if encode is None:
            return max(1, len(req.prompt or "") // 4)  # prepare's estimate for the text path
        return len(encode(req))

    fit: Fit = fit_passages(passages, count, ctx.max_tokens, context_length(node, ctx.model))
    kept = [passages[i] for i in fit.kept]
    ctx.req = with_passages(ctx.req, kept)
    if encode is not None:
        ctx.prompt_ids = encode(ctx.req)
        ctx.prompt_tokens = len(ctx.prompt_ids)
    else:  # the text travels; the serving node tokenizes (and checks the context) exactly
        ctx.prompt_ids, ctx.tokenizer = [], ""
        ctx.prompt_tokens = fit.prompt_tokens
    if fit.note:
        ctx.notes.append(fit.note)
    info = {"collection": name, "retrieved_by": got["node"] or node.node_name,
            "chunks_retrieved": len(passages), "chunks_used": len(kept),
            "trimmed": len(fit.dropped), "embed_ms": round(got["embed_ms"], 3),
            "search_ms": round(got["search_ms"], 3)}
    if got["tried"]:
        info["failed_nodes"] = got["tried"]
    ctx.extra.setdefault("answer", {}).update({
        "sources": [{"source": p.source, "score": round(p.score, 4)} for p in kept],
        "rag": info,
    })
    ctx.journal("augmented", {**info, "prompt_tokens": ctx.prompt_tokens,
                              "sources": [p.source for p in kept]})


def question_of(req: EntryRequest) -> str:
    """What retrieval searches for: the prompt, or the last user message of a chat."""
    if req.messages is not None:
        users = [str(m["content"]) for m in req.messages if m.get("role") == "user"]
        return users[-1] if users else str(req.messages[-1]["content"])
    return req.prompt or ""


def with_passages(req: EntryRequest, passages: Sequence[Passage]) -> EntryRequest:
    """``req`` with the passages put into its prompt (the last user message of a chat)."""
    if req.messages is None:
        return dataclasses.replace(req, prompt=build_prompt(req.prompt or "", passages))
    msgs = [dict(m) for m in req.messages]
    users = [i for i, m in enumerate(msgs) if m.get("role") == "user"]
    i = users[-1] if users else len(msgs) - 1
    msgs[i]["content"] = build_prompt(msgs[i]["content"], passages)
    return dataclasses.replace(req, messages=tuple(msgs))


def _encoder(ctx: EntryContext, node: EntryNode) -> Callable[[EntryRequest], list[int]] | None:
    """How ``prepare`` tokenized this request (the local model's tokenizer, or the one fetched
    for the model), or None when the text travels and the serving node tokenizes."""
    if not ctx.prompt_ids:
        return None
    model = ctx.model
    if node.runner.get(model) is not None:
        runner = node.runner
        if not runner.tokenizes_here(model):  # an upstream server tokenizes: the text travels
            return None

        def local(req: EntryRequest) -> list[int]:
            if req.messages is not None:
                return list(runner.encode_messages(model, list(req.messages),
                                                   tools=template_tools(req)))
            return list(runner.encode(model, req.prompt or "", chat=req.chat))

        return local
    tok = node.tokenizers.loaded.get(ctx.tokenizer)
    if tok is None:
        return None

    def edge(req: EntryRequest) -> list[int]:
        if req.messages is not None:
            return list(tok.encode_chat(list(req.messages),
                                        tools=template_tools(req)))
        return list(tok.encode_prompt(req.prompt or "", chat=req.chat))

    return edge
