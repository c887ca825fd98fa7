"""Entry step "execute": carry out the decision and stream the answer to the client.

The request's life after the decision is ``meshd.core.request_life.RequestLife`` (the
simulator's machine too); ``meshd.node.forward.Driver`` is its trio loop. This step gives the
driver its I/O: an attempt on one node (here, or a peer over its request stream: ``_attempt``),
an attempt along a pipeline's stages (``meshd.node.pipeline.run_plan``), and a new decision when
the machine asks for one (``_redecide``: ``decide()`` on a fresh snapshot without the nodes
that failed), and the semantic cache's pending lookup (``meshd.node.entry.cache.pending_lookup``),
which the machine races with the model: a hit is served from the cache
(``meshd.node.entry.cache.serve_cached``). A request the route step found no node for
(``ctx.no_route``) fails with that error, unless the lookup answers it. The client's requests in
flight are counted (quotas read them) while it runs, and the answer is the same set of fields
whoever served it (``answer_fields``).
"""

from __future__ import annotations

import logging
from contextlib import aclosing
from dataclasses import replace
from typing import Any

import trio

from meshd.core.decide import Decision, decide
from meshd.core.messages import MessageType
from meshd.core.packing import takes_packed
from meshd.core.planner import Plan
from meshd.core.request_life import Decided, NoRoute, Redecide, RequestLife, Send, SendPlan
from meshd.errors import BusyError, ErrorCode, PeerGoneError, RemoteError, RoutingError
from meshd.node.coalesce import pump_coalesced
from meshd.node.entry.cache import pending_lookup, serve_cached
from meshd.node.entry.context import EntryContext, EntryNode
from meshd.node.entry.route import record_decision
from meshd.node.forward import Channel, Driver, Lookup, Outcome, StageFailure, Target, route_from
from meshd.node.gen_config import gen_config_from
from meshd.node.pipeline import PipelineRequest, record_plan, run_plan

log = logging.getLogger(__name__)

REPLAN_WAIT_MIN_S = 3.0
REPLAN_POLL_S = 0.2


async def execute(ctx: EntryContext, node: EntryNode) -> None:
    """Run ``ctx.decision`` (or ``ctx.no_route``) to its end, the pending cache lookup racing
    it."""
    lookup = pending_lookup(ctx)
    if ctx.decision is None and lookup is None:
        assert ctx.no_route is not None
        raise ctx.no_route
    client = ctx.req.client
    in_flight = node.entry_state.client_in_flight
    in_flight[client] = in_flight.get(client, 0) + 1
    try:
        driver = await _run(ctx, node, lookup)
    finally:
        in_flight[client] -= 1
        if not in_flight[client]:
            del in_flight[client]
    if driver.cached is not None:
        await serve_cached(ctx, node, driver.cached.model)
        return
    outcome = ctx.outcome = driver.out
    if outcome.error is not None:
        if ctx.decision is None and ctx.no_route is not None:
            raise ctx.no_route  # the lookup missed: the route step's error, as it was
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


def targets_of(d: Decision, local_peer: str) -> dict[str, Target]:
    """The peers of a one-node decision as the driver's targets, with the router's predictions
    and the wait bounds of the early attempts."""
    targets: dict[str, Target] = {}
    if d.route is None:
        return targets
    for c in d.route.candidates:
        if c.excluded_by is not None:
            continue
        t = Target(peer_id=c.peer_id, name=c.name, is_local=c.peer_id == local_peer)
        if c.predicted_ttft_ms is not None:
            t.predicted_ms = c.predicted_ttft_ms
            t.known_ms = c.predicted_ttft_ms - c.queue_wait_ms
            t.max_wait_ms = d.wait_bounds.get(c.peer_id)
        targets[c.peer_id] = t
    return targets


class _Gone:
    """The peers this node knows are gone: no longer in its peer table (itself excepted)."""

    def __init__(self, node: EntryNode) -> None:
        self._node = node

    def __contains__(self, peer: object) -> bool:
        return peer != self._node.peer_id and self._node.membership.table.get(str(peer)) is None


async def _run(ctx: EntryContext, node: EntryNode, lookup: Lookup | None) -> Driver:
    d = ctx.decision
    assert ctx.policy is not None and ctx.route_req is not None
    fields = ctx.wire_fields()
    packed = ctx.packed_prompt()
    preq = PipelineRequest(node, ctx.req.request_id, ctx.model, fields, list(ctx.prompt_ids),
                           ctx.journal, ctx.vocab_size)
    choices = ctx.extra["choices"] = Choices(ctx.emit)
    if d is not None and d.plan is not None:
        node.stats["requests_pipelined"] = node.stats.get("requests_pipelined", 0) + 1
        record_plan(node, ctx.req.request_id, d.plan, ctx.route_req, ctx.policy)
        ctx.journal("routed", {"target": " -> ".join(h.name for h in d.plan.hops),
                               "pipeline": True, "resume_tokens": 0})

    async def start(action: Send | SendPlan, target: Target | None, resume: list[int],
                    chan: Channel) -> None:
        if isinstance(action, SendPlan):
            await run_plan(preq, action.plan, action.attempt + 1, resume, chan)
        else:
            assert target is not None
            if resume and fields.get("n", 1) > 1:  # the tokens so far are of several choices
                raise RemoteError("a request with n > 1 cannot resume on another node after "
                                  "its first tokens", ErrorCode.PEER_GONE)
            await _attempt(node, target, resume, chan if ctx.prompt_ids else _Counted(chan, ctx),
                           fields, ctx.prompt_ids, packed)

    async def redecide(a: Redecide, plan: Plan | None, failed: StageFailure | None,
                       tokens: int) -> tuple[Decision, dict[str, Target]]:
        return await _redecide(ctx, node, preq, a, plan, failed, tokens)

    targets = targets_of(d, node.peer_id) if d is not None else {}
    life: RequestLife[str] = RequestLife(
        started_s=trio.current_time(), policy=ctx.policy,
        first_token_timeout_s=node.config.routing.first_token_timeout_s)
    driver = Driver(targets, start, choices, entry_name=node.node_name, journal=ctx.journal,
                    life=life, redecide=redecide, gone=_Gone(node))
    first: Decided | NoRoute
    if d is None:
        assert ctx.no_route is not None
        first = NoRoute(str(ctx.no_route), str(ctx.no_route.code))
    elif d.plan is not None:
        first = Decided(plan=d.plan)
    else:
        assert d.route is not None
        first = Decided(route_from(d.route.order, targets, d.hedge_ms))
    outcome = await driver.drive(first, lookup=lookup, here=node.peer_id)
    if driver.last_plan is not None and driver.cached is None:
        ctx.extra["pipeline"] = [f"{h.name}[{h.layer_start},{h.layer_end})"
                                 for h in driver.last_plan.hops]
        ctx.extra["replans"] = len(outcome.retries)
    return driver


async def _redecide(ctx: EntryContext, node: EntryNode,
                    preq: PipelineRequest, a: Redecide, plan: Plan | None,
                    failed: StageFailure | None, tokens: int) -> tuple[Decision, dict[str, Target]]:
    """``decide()`` again on a fresh snapshot, without the nodes ``a.exclude`` names, for the
    rest of the request (its prompt and the ``tokens`` streamed, the tokens left). After a
    failed stage, when nothing covers the model right now (a healthy stage's connection may
    have dropped with the failed one), it waits up to two advert intervals for the peer table
    to hear it again. Journaled as a ``replan``; raises ``RoutingError``."""
    req, policy = ctx.route_req, ctx.policy
    assert req is not None and policy is not None
    history = len(preq.prompt_ids) + tokens if preq.prompt_ids else 0
    again = replace(req, exclude=req.exclude | a.exclude,
                    prompt_tokens=history or req.prompt_tokens,
                    max_tokens=max(ctx.max_tokens - tokens, 1))
    wait_s = max(REPLAN_WAIT_MIN_S, 2 * node.config.gossip.advert_interval_s) if failed else 0.0
    deadline = trio.current_time() + wait_s
    while True:
        try:
            d = decide(again, node.membership.snapshot(), policy, node.rng,
                       node.entry_state.next_rr(),
                       pipeline_mode=ctx.req.pipeline, hedge=node.config.routing.hedge)
            break
        except RoutingError:
            if trio.current_time() >= deadline:
                raise
        await trio.sleep(REPLAN_POLL_S)
    targets = targets_of(d, node.peer_id)
    if d.plan is not None:
        chain = [h.name for h in d.plan.hops]
        new = "new chain " + " -> ".join(f"{h.name}[{h.layer_start},{h.layer_end})" for h in d.plan.hops)
        record_plan(node, req.request_id, d.plan, again, policy)
    else:
        assert d.route is not None
        chain = [targets[d.route.order[0]].name] if d.route.order[0] in targets else []
        new = "new route " + ", ".join(t.name for t in targets.values())
        if node.store is not None:
            record_decision(node.store, d.route, again, energy_weight=policy.energy_weight)
    lost: list[Any] = []
    if failed is not None and plan is not None:
        lost = [h for h in plan.hops if h.peer_id in failed.culprits]
    what = (", ".join(f"{h.name} [{h.layer_start}, {h.layer_end})" for h in lost) or "a stage"
            ) if failed is not None else "the nodes tried"
    ctx.journal("replan", {
        "reason": f"{what} failed after {tokens} tokens ({a.after}); {new}",
        "lost": [h.name for h in lost],
        "layers": [[h.layer_start, h.layer_end] for h in lost],
        "after_tokens": tokens,
        "chain": chain,
    })
    return d, targets


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
