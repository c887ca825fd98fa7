"""Entry step "prepare": which model, the prompt's token ids, and how many tokens to generate.

- The model: the one the request names, else the node's own default, else the model most nodes
  of the mesh serve. A model nobody serves is refused here (``no_model``).
- Token ids, whatever node the request entered (docs/edge-tokenization.md): with the model's
  own tokenizer when this node serves it, else with the tokenizer the mesh advertises for the
  model (``meshd.node.tokenizers``: fetched once from a peer, checked against its identity,
  cached), chat messages through the model's chat template. Only the ids travel, packed. When
  that tokenizer cannot be had within ``[routing] tokenizer_wait_s`` (or ``edge_tokenize`` is
  off) the text goes instead, the serving node tokenizes it, and the journal says why.
- The budget (``meshd.core.budget.token_budget``): max_tokens clamped to meshd's limit, and a
  prompt that cannot fit the model's context refused before anything is forwarded (exact
  whenever the ids are known here).
"""

from __future__ import annotations

from typing import Any

import trio

from meshd.core.budget import token_budget
from meshd.core.request import EntryRequest
from meshd.errors import ErrorCode, RemoteError, UnknownModelError
from meshd.node.entry.context import EntryContext, EntryNode

LONG_PROMPT_CHARS = 16_384  # a longer prompt is tokenized in a worker thread


async def prepare(ctx: EntryContext, node: EntryNode) -> None:
    req = ctx.req
    if req.sampling.grammar is not None:  # the control socket's; the API checked its own
        _check_grammar(req.sampling.grammar)
    ctx.model = ctx.model or pick_model(node, req.model)  # "tier" may have chosen it
    context = context_length(node, ctx.model)
    tokenized, why = "here", ""
    if node.runner.ready(ctx.model):  # served here (an upstream model: its server answers)
        if req.messages is not None:
            ctx.prompt_ids = await node.runner.aencode_messages(ctx.model, list(req.messages),
                                                                tools=template_tools(req))
        else:
            ctx.prompt_ids = await node.runner.aencode(ctx.model, req.prompt or "", chat=req.chat)
        ctx.tokenizer = node.runner.tokenizer_identity(ctx.model)
        ctx.vocab_size = node.runner.vocab_size(ctx.model) or 0
    else:
        why = await _edge_tokenize(ctx, node)
        tokenized = "edge"
    if ctx.prompt_ids:
        ctx.prompt_tokens = len(ctx.prompt_ids)
        ctx.max_tokens, note = token_budget(ctx.prompt_tokens, req.max_tokens, context)
    else:
        tokenized = "text"
        if req.messages is not None:
            raise RemoteError(
                f"this node does not hold the tokenizer of model {ctx.model!r} ({why}), so it "
                f"cannot render chat messages for it; send the request to a node that serves it",
                ErrorCode.UNSUPPORTED)
        ctx.prompt_tokens = max(1, len(req.prompt or "") // 4)  # an estimate, for the router
        # the serving node checks the context with the exact count
        ctx.max_tokens, note = token_budget(0, req.max_tokens, None)
    if note is not None:
        ctx.notes.append(note)
        ctx.journal("clamped", {"note": note})
    ctx.journal("received", {"model": ctx.model, "prompt_tokens": ctx.prompt_tokens,
                             "client": req.client, "max_tokens": ctx.max_tokens,
                             "origin": req.origin, "tokenized": tokenized})


def _check_grammar(grammar: str) -> None:
    from meshd.engine.constrain import GrammarError, check

    try:
        check(grammar)
    except GrammarError as e:
        raise RemoteError(f"grammar: {e}", ErrorCode.MALFORMED) from None


async def _edge_tokenize(ctx: EntryContext, node: EntryNode) -> str:
    """Tokenize a request for a model served elsewhere with the tokenizer the mesh advertises
    for it (sets ``ctx.prompt_ids``); when it cannot be had in time, leave them empty and return
    why (journaled: ``tokenizer_unavailable``)."""
    req = ctx.req
    routing = node.config.routing
    identity = node.tokenizers.advertised(ctx.model)
    if not routing.edge_tokenize:
        why = "edge tokenization is off ([routing] edge_tokenize = false)"
    elif not identity:
        why = f"no peer advertises a tokenizer for {ctx.model} (older nodes)"
    else:
        tok, why = await node.tokenizers.get(identity, routing.tokenizer_wait_s)
        if tok is not None:
            def encode() -> list[int]:
                if req.messages is not None:
                    return list(tok.encode_chat(list(req.messages), tools=template_tools(req)))
                return list(tok.encode_prompt(req.prompt or "", chat=req.chat))

            text = (req.prompt or "") if req.messages is None else "".join(
                str(m.get("content", "")) for m in req.messages)
            if len(text) > LONG_PROMPT_CHARS:
                ctx.prompt_ids = await trio.to_thread.run_sync(encode)
            else:
                ctx.prompt_ids = encode()
            ctx.tokenizer = identity
            ctx.vocab_size = int(tok.vocab_size)
            return ""
    ctx.journal("tokenizer_unavailable", {"model": ctx.model, "tokenizer": identity[:12],
                                          "reason": why, "forwarded": "text"})
    return why


async def chat_template(node: EntryNode, model: str) -> str | None:
    """The chat template ``prepare`` renders ``model``'s chat messages with: the local model's
    tokenizer's, else the one the mesh advertises for it (fetched as ``_edge_tokenize`` does);
    None when there is none, or for an upstream model (its server renders, without tools)."""
    if node.runner.ready(model):
        served = node.runner.get(model)
        tok = getattr(getattr(getattr(served, "model", None), "model", None), "tokenizer", None)
        info = getattr(tok, "info", None)
        return getattr(info, "chat_template", None) or None
    identity = node.tokenizers.advertised(model)
    if not identity or not node.config.routing.edge_tokenize:
        return None
    tok, _ = await node.tokenizers.get(identity, node.config.routing.tokenizer_wait_s)
    return (tok.info.chat_template or None) if tok is not None else None


def template_tools(req: EntryRequest) -> list[Any] | None:
    """The tools the chat template renders (None: none, or rendered in the messages already)."""
    return list(req.tools) if req.tools else None


def pick_model(node: EntryNode, requested: str | None) -> str:
    """The model to serve: the one asked for (if anybody serves it), else this node's default,
    else the one most nodes serve."""
    if requested:
        if node.runner.get(requested) is not None or _heard_of(node, requested):
            return requested
        heard = models_heard(node)
        raise UnknownModelError(f"no node of the mesh serves model {requested!r}"
                                f" (served: {', '.join(sorted(heard)) or 'none yet'})")
    local = node.runner.default_model()
    if local is not None:
        return local
    heard = models_heard(node)
    if not heard:
        raise RemoteError("no model is served anywhere in the mesh yet", ErrorCode.NO_ROUTE)
    return sorted(heard.items(), key=lambda kv: (-kv[1]["nodes"], kv[0]))[0][0]


def _heard_of(node: EntryNode, model: str) -> bool:
    return any(m.name == model for e in node.membership.table.live() for m in e.advert.models)


def models_heard(node: EntryNode) -> dict[str, dict[str, Any]]:
    """Every model the mesh serves, from this node and the adverts it holds:
    ``{name: {"nodes": how many serve some of its layers, "context_length": int | None}}``."""
    out: dict[str, dict[str, Any]] = {}
    for name in node.runner.models:
        out[name] = {"nodes": 1, "context_length": node.runner.context_length(name)}
    for e in node.membership.table.live():
        for m in e.advert.models:
            row = out.setdefault(m.name, {"nodes": 0, "context_length": None})
            row["nodes"] += 1
            if row["context_length"] is None and m.context_length:
                row["context_length"] = m.context_length
    return out


def context_length(node: EntryNode, model: str) -> int | None:
    """The model's context in tokens: the local model's, else the one its servers advertise."""
    if node.runner.get(model) is not None:
        return node.runner.context_length(model)
    for e in node.membership.table.live():
        for m in e.advert.models:
            if m.name == model and m.context_length:
                return m.context_length
    return None
