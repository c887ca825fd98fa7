"""Entry step "execute": carry out the decision and stream the answer to the client.

One node (``Decision.route``): ``meshd.node.forward.serve_request`` runs it here or on a peer,
with the decision's wait bounds, hedging and failover. A pipeline (``Decision.plan``):
``meshd.node.pipeline.run_pipeline`` drives the chain of stages and replans around failures.
Either way the client's requests in flight are counted (quotas read them) while it runs, and the
answer is the same set of fields (``answer_fields``).
"""

from __future__ import annotations

import logging
from contextlib import aclosing
from typing import Any

from meshd.core.messages import MessageType
from meshd.core.packing import takes_packed
from meshd.errors import BusyError, ErrorCode, PeerGoneError, RemoteError
from meshd.node.coalesce import pump_coalesced
from meshd.node.entry.context import EntryContext, EntryNode
from meshd.node.forward import Outcome, Target, serve_request
from meshd.node.gen_config import gen_config_from
from meshd.node.pipeline import record_plan, run_pipeline

log = logging.getLogger(__name__)


async def execute(ctx: EntryContext, node: EntryNode, in_flight: dict[str, int]) -> None:
    d = ctx.decision
    assert d is not None
    client = ctx.req.client
    in_flight[client] = in_flight.get(client, 0) + 1
    try:
        if d.plan is not None:
            outcome = await _pipeline(ctx, node)
        else:
            outcome = await _one_node(ctx, node)
    finally:
        in_flight[client] -= 1
        if not in_flight[client]:
            del in_flight[client]
    ctx.outcome = outcome
    if outcome.error is not None:
        raise RemoteError(f"request failed: {outcome.error}", outcome.error_code or ErrorCode.INTERNAL)
    ctx.answer = answer_fields(ctx, outcome)


class Choices:
    """The answer's choices as their "tokens" events come (``idx``: the choice, ``lp``: log
    probabilities), passed on to the client's ``emit``: each choice's text, token count and log
    probabilities, for the answer (``answer_fields``)."""

    def __init__(self, emit: Any) -> None:
        self.emit = emit
        self.text: dict[int, list[str]] = {}
        self.tokens: dict[int, int] = {}
        self.lp: dict[int, list[Any]] = {}

    async def __call__(self, kind: str, payload: dict[str, Any]) -> None:
        if kind == "tokens":
            i = int(payload.get("idx") or 0)
            self.text.setdefault(i, []).append(payload.get("text") or "")
            self.tokens[i] = self.tokens.get(i, 0) + len(payload.get("ids") or ())
            if payload.get("lp") is not None:
                self.lp.setdefault(i, []).extend(payload["lp"])
        await self.emit(kind, payload)

    def fields(self, n: int, max_tokens: int, logprobs: bool) -> list[dict[str, Any]]:
        out = []
        for i in range(n):
            count = self.tokens.get(i, 0)
            c: dict[str, Any] = {"index": i, "text": "".join(self.text.get(i, [])),
                                 "tokens": count,
                                 "finish_reason": "length" if count >= max_tokens else "stop"}
            if logprobs:
                c["logprobs"] = self.lp.get(i, [])
            out.append(c)
        return out


def answer_fields(ctx: EntryContext, outcome: Outcome) -> dict[str, Any]:
    """The DONE stats every client gets (control socket and HTTP alike). A request with n > 1
    or logprobs also gets ``choices``: per choice its ``index``, ``text``, ``tokens``,
    ``finish_reason`` and (logprobs) ``logprobs``, a list of [token, log probability,
    [[token, log probability], ...]]."""
    stats = outcome.stats()
    n = len(outcome.tokens)
    s = ctx.req.sampling
    choices: Choices | None = ctx.extra.get("choices")
    extra: dict[str, Any] = {}
    if choices is not None and (s.n > 1 or s.logprobs is not None):
        extra["choices"] = choices.fields(s.n, ctx.max_tokens, s.logprobs is not None)
    return {

        **stats,
        "request_id": ctx.req.request_id,
        "text": "".join(outcome.text),
        "token_ids": outcome.tokens,
        "model": ctx.model,
        "strategy": ctx.strategy,
        # exact: counted here, or by the serving node when only the text travelled
        "prompt_tokens": ctx.extra.get("served_prompt_tokens") or ctx.prompt_tokens,
        "completion_tokens": n,
        "finish_reason": "length" if n >= ctx.max_tokens else "stop",
        "max_tokens": ctx.max_tokens,
        "cached": False,
        **({"notes": list(ctx.notes)} if ctx.notes else {}),
        **({"pipeline": ctx.extra["pipeline"], "replans": ctx.extra["replans"]}
           if "pipeline" in ctx.extra else {}),
        **ctx.extra.get("answer", {}),  # what earlier steps add (augment: sources, rag)
        **extra,
    }


async def _one_node(ctx: EntryContext, node: EntryNode) -> Outcome:
    d = ctx.decision
    assert d is not None and d.route is not None
    snap_local = node.peer_id
    targets: dict[str, Target] = {}
    for c in d.route.candidates:
        if c.excluded_by is not None:
            continue
        t = Target(peer_id=c.peer_id, name=c.name, is_local=c.peer_id == snap_local)
        if c.predicted_ttft_ms is not None:
            t.predicted_ms = c.predicted_ttft_ms
            t.known_ms = c.predicted_ttft_ms - c.queue_wait_ms
            t.max_wait_ms = d.wait_bounds.get(c.peer_id)
        targets[c.peer_id] = t
    fields = ctx.wire_fields()
    packed = ctx.packed_prompt()
    choices = ctx.extra["choices"] = Choices(ctx.emit)

    async def start_attempt(target: Target, resume: list[int], chan: Any) -> None:
        if resume and fields.get("n", 1) > 1:  # the tokens so far are of several choices
            raise RemoteError("a request with n > 1 cannot resume on another node after its "
                              "first tokens", ErrorCode.PEER_GONE)
        await _attempt(node, target, resume, chan if ctx.prompt_ids else _Counted(chan, ctx),
                       fields, ctx.prompt_ids, packed)

    return await serve_request(
        d.route, targets, start_attempt, choices,
        entry_name=node.node_name,
        hedge_after_s=d.hedge_ms / 1000.0 if d.hedge_ms else None,
        first_token_timeout_s=node.config.routing.first_token_timeout_s,
        journal=ctx.journal,
        policy=ctx.policy,
    )


class _Counted:
    """An attempt's channel that keeps the prompt's token count the serving node reports in
    its DONE (the entry node only estimated it: the text travelled, not the ids)."""

    def __init__(self, chan: Any, ctx: EntryContext) -> None:
        self._chan = chan
        self._ctx = ctx

    async def send(self, item: Any) -> None:
        kind, payload = item
        if kind == "done" and (payload.get("stats") or {}).get("prompt_tokens"):
            self._ctx.extra["served_prompt_tokens"] = int(payload["stats"]["prompt_tokens"])
        await self._chan.send(item)


async def _pipeline(ctx: EntryContext, node: EntryNode) -> Outcome:
    d = ctx.decision
    assert d is not None and d.plan is not None and ctx.policy is not None and ctx.route_req is not None
    node.stats["requests_pipelined"] = node.stats.get("requests_pipelined", 0) + 1
    record_plan(node, ctx.req.request_id, d.plan, ctx.route_req, ctx.policy)
    ctx.journal("routed", {"target": " -> ".join(h.name for h in d.plan.hops), "pipeline": True,
                           "resume_tokens": 0})
    choices = ctx.extra["choices"] = Choices(ctx.emit)
    outcome, last = await run_pipeline(node, d.plan, ctx.route_req, ctx.wire_fields(),
                                       ctx.prompt_ids, choices, ctx.journal, ctx.policy,
                                       vocab_size=ctx.vocab_size)
    ctx.extra["pipeline"] = [f"{h.name}[{h.layer_start},{h.layer_end})" for h in last.hops]
    ctx.extra["replans"] = len(outcome.retries)
    return outcome


def token_payloads(batch: list[Any]) -> list[dict[str, Any]]:
    """A batch of the local runner's tokens as "tokens" events: one per choice (``idx``, absent
    for choice 0), with their log probabilities (``lp``) when the tokens carry them."""
    out: dict[int, dict[str, Any]] = {}
    for t in batch:
        p = out.get(t.choice)
        if p is None:
            p = out[t.choice] = {"ids": [], "text": ""}
            if t.choice:
                p["idx"] = t.choice
        p["ids"].append(t.id)
        p["text"] += t.text
        if t.lp is not None:
            p.setdefault("lp", []).append(t.lp)
    return list(out.values())


def req_fields(fields: dict[str, Any], prompt_ids: list[int], packed: dict[str, Any],
               resume: list[int], *, deadline_ms: int, origin: str,
               max_wait_ms: float | None = None) -> dict[str, Any]:
    """The REQ an entry node sends a peer: the request's ``fields`` (``EntryContext.wire_fields``)
    and its prompt ids, packed when ``packed`` (``EntryContext.packed_prompt``) is given."""
    req = {
        **fields,
        "prompt_ids": prompt_ids,
        **packed,
        "resume_ids": resume,
        "deadline_ms": deadline_ms,
        "hops": 1,
        "origin": origin,
    }
    if max_wait_ms is not None:
        req["max_wait_ms"] = int(max_wait_ms)
    return req


async def _attempt(
    node: EntryNode, target: Target, resume: list[int], chan: Any, fields: dict[str, Any],
    prompt_ids: list[int], packed: dict[str, Any],
) -> None:
    """One attempt on one target: the local runner, or a peer over its request stream. Reports
    ("tokens", {"ids", "text"}) and ("done", {"stats"}) on ``chan``; raises on failure. A peer
    that reads packed prompts (``takes_packed``) gets the ids as ``packed``; an older one a
    list of ids; either gets the text only when the ids are not known here."""
    model = fields["model"]
    if target.is_local:
        node.stats["requests_local"] += 1
        ids = prompt_ids or await node.runner.aencode(model, fields.get("prompt", ""),
                                                      chat=fields.get("chat", False))
        gen = gen_config_from(fields, already=len(resume), after=resume)

        async def sink(batch: list[Any]) -> None:
            for payload in token_payloads(batch):
                await chan.send(("tokens", payload))

        if gen is not None:
            source = node.runner.generate(model, ids + resume, gen, max_wait_ms=target.max_wait_ms)
            await pump_coalesced(source, 0.01, sink)
        await chan.send(("done", {"stats": {}}))
        return
    node.stats["requests_forwarded"] += 1
    assert node.links is not None
    ch = await node.links.channel(target.peer_id)
    node.membership.table.note_sent(target.peer_id)
    peer = node.membership.table.get(target.peer_id)
    req = req_fields(fields, prompt_ids, packed if takes_packed(peer.advert if peer else None, model)
                     else {}, resume, deadline_ms=int(node.config.routing.request_timeout_s * 1000),
                     origin=node.peer_id, max_wait_ms=target.max_wait_ms)
    async with aclosing(ch.request(req)) as frames:
        async for frame in frames:
            t = frame["t"]
            if t == MessageType.TOKENS:
                payload = {"ids": frame["ids"], "text": frame.get("text", "")}
                if frame.get("idx"):
                    payload["idx"] = frame["idx"]
                if frame.get("lp") is not None:
                    payload["lp"] = frame["lp"]
                await chan.send(("tokens", payload))
            elif t == MessageType.DONE:
                await chan.send(("done", {"stats": frame.get("stats") or {}}))
                return
            elif t == MessageType.ERROR:
                code = frame["code"]
                if code == "busy":
                    raise BusyError(f"{target.name} is busy: {frame['message']}",
                                    wait_ms=frame.get("wait_ms"))
                raise RemoteError(f"{target.name}: {frame['message']}", code)
    raise PeerGoneError(f"{target.name} ended the request without an answer")
