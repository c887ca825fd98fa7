"""The entry node's pipeline attempt: run a request through a chain of stage nodes, once.

The entry chain's route step asks ``meshd.core.decide.decide`` (the simulator's very function)
whether the request runs as a pipeline: when no node serves the whole model, or when the chain
is predicted to finish sooner. The request's life (``meshd.core.request_life``, driven by
``meshd.node.forward.Driver``) then sends it along the plan: ``run_plan`` is one attempt, the
I/O (docs/pipeline.md):

1. open a stage session on every hop at once (``STAGE_OPEN``), each told the next hop's peer
   and session id; the last stage gets the prompt (ids, or text it encodes) and the sampling
   settings;
2. send the prompt's token ids (plus the tokens streamed before, after a failure) to the first
   stage (``STAGE_STEP``); activations go from stage to stage directly; the last stage samples
   and sends the token to this node (``STAGE_OUT``), which reports it and sends it to the first
   stage as the next step;
3. a failure (a stage's stream ends: a SIGKILLed peer shows as EOF within milliseconds; an
   ``ERROR`` such as ``busy`` or ``peer_gone``; no answer before the step deadline) raises
   ``StageFailure`` naming the peers to blame; the request's life then decides again without
   them (a new chain, or one node) and the next attempt replays the prompt plus every token so
   far as one prefill, so the caches are rebuilt and greedy output goes on identically;
4. frees every session it opened (``STAGE_FREE``) however the attempt ends.

With the prompt's ids known here, every ``STAGE_OPEN`` carries the prompt's block names
(``px``: ``meshd.core.prefix_names.block_hashes`` over all but its last token, named with the
model identity the stage's node advertises), so each stage restores its own layers' longest
cached prefix; the first step starts at the least of the stages' ``reused`` figures (docs/pipeline.md).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Protocol

import trio

from meshd.config import Config
from meshd.core.messages import MessageType
from meshd.core.packing import pack_ids, takes_packed, vocab_bound
from meshd.core.planner import Plan
from meshd.core.prefix_names import block_hashes
from meshd.core.request import DEFAULT_MAX_TOKENS, MAX_MAX_TOKENS
from meshd.core.snapshot import Policy, RouteRequest
from meshd.errors import ErrorCode, PeerGoneError
from meshd.node.activations import encode_ids
from meshd.node.forward import Channel, Journal, StageFailure
from meshd.node.gen_config import gen_fields
from meshd.node.stagelinks import StageLinks
from meshd.node.view import MeshView
from meshd.store.protocol import Recorder

log = logging.getLogger(__name__)

OPEN_TIMEOUT_S = 15.0
FREE_TIMEOUT_S = 2.0


def plan_record(p: Plan) -> dict[str, Any]:
    """The plan as the journal stores it (``meshd explain`` reads ``hops`` and ``reason``)."""
    return {
        "hops": [
            {"peer_id": h.peer_id, "name": h.name, "layer_start": h.layer_start,
             "layer_end": h.layer_end, "predicted_ms": round(h.predicted_ms, 3)}
            for h in p.hops
        ],
        "reason": p.reason,
        "predicted_ttft_ms": round(p.predicted_ttft_ms, 3),
        "predicted_per_token_ms": round(p.predicted_per_token_ms, 3),
        "predicted_total_ms": round(p.predicted_total_ms, 3),
    }


class PipelineNode(Protocol):
    """What the pipeline driver needs of the entry node (``meshd.node.entry.context.EntryNode``)."""

    config: Config
    node_name: str
    peer_id: str

    @property
    def store(self) -> Recorder | None: ...  # None: nothing recorded

    @property
    def membership(self) -> MeshView: ...

    @property
    def stage_links(self) -> StageLinks: ...


@dataclass
class PipelineRequest:
    """What every pipeline attempt of one request shares: the request as REQ/STAGE_OPEN fields
    (``msg``), its prompt's ids (learned from the last stage when this node had no tokenizer),
    and its token budget."""

    node: PipelineNode
    rid: str
    model: str
    msg: dict[str, Any]
    prompt_ids: list[int]
    journal: Journal
    vocab_size: int = 0  # of the tokenizer or model that made prompt_ids (packing)
    max_tokens: int = 0

    def __post_init__(self) -> None:
        if not self.max_tokens:
            self.max_tokens = min(int(gen_fields(self.msg).get("max_tokens", DEFAULT_MAX_TOKENS)),
                                  MAX_MAX_TOKENS)


def record_plan(node: PipelineNode, rid: str, p: Plan, req: RouteRequest, policy: Policy) -> None:
    if node.store is None:
        return
    node.store.record_decision(
        rid, strategy=f"{policy.strategy}+pipeline", candidates=[],
        constraints={"model": req.model, "residency": req.residency, "client": req.client,
                     "prompt_tokens": req.prompt_tokens,
                     "exclude": sorted(req.exclude)},
        chosen=None, order=[], plan=plan_record(p),
    )


@dataclass
class _Pass:
    """One attempt along one plan: the request, the attempt's number, and every token of the
    answer so far (those streamed before this attempt, then its own)."""

    req: PipelineRequest
    attempt: int
    tokens: list[int]

    @property
    def remaining(self) -> int:
        return self.req.max_tokens - len(self.tokens)


async def run_plan(req: PipelineRequest, p: Plan, attempt: int, resume: list[int],
                   chan: Channel) -> None:
    """One attempt (numbered ``attempt``, from 1) of ``req`` along ``p``, after the tokens
    ``resume``: reports ``("route", ...)`` once the chain is ready, then ``("tokens", ...)`` and
    ``("done", ...)`` on ``chan``; raises ``StageFailure`` naming the peers to blame."""
    run = _Pass(req, attempt, list(resume))
    node = req.node
    links = node.stage_links
    hops = p.hops
    sids = [f"{req.rid}.{attempt}@{h.layer_start}" for h in hops]
    peer_of = dict(zip(sids, (h.peer_id for h in hops), strict=True))
    watch = links.watch(set(sids), {h.peer_id for h in hops})
    opened: list[int] = []
    try:
        t_open = time.perf_counter()
        await _open_all(run, hops, sids, opened)
        reused = await _wait_ready(run, watch, sids, peer_of)
        if attempt > 1:  # after a failure: when the new chain was ready, and what it replays
            req.journal("routed", {
                "target": " -> ".join(h.name for h in hops), "pipeline": True,
                "attempt": attempt, "resume_tokens": len(resume),
                "open_ms": round((time.perf_counter() - t_open) * 1000, 3)})
        await chan.send(("route", {"served_by": hops[-1].name,
                                   "route": [node.node_name, *(h.name for h in hops)]}))
        history = req.prompt_ids + run.tokens
        skip = min(reused, len(history) - 1)  # every stage holds the prompt's first `skip`
        await _send_step(run, hops[0].peer_id, sids[0], 0, list(range(skip, len(history))),
                         history[skip:])
        length = len(history)
        step = 0
        cfg = node.config
        step_timeout = max(5.0, 2 * cfg.gossip.stall_timeout_s)
        while True:
            timeout = cfg.routing.first_token_timeout_s if step == 0 else step_timeout
            m = await _next(watch, timeout, peer_of, hops, node)
            if m["t"] != MessageType.STAGE_OUT or m["rid"] != sids[-1] or m["step"] != step:
                continue
            ids = [int(i) for i in m["ids"]]
            run.tokens.extend(ids)
            payload: dict[str, Any] = {"ids": ids, "text": m.get("text") or ""}
            if m.get("lp") is not None:
                payload["lp"] = m["lp"]
            await chan.send(("tokens", payload))
            if m.get("finish") or run.remaining <= 0:
                await chan.send(("done", {"stats": {}}))
                return
            step += 1
            await _send_step(run, hops[0].peer_id, sids[0], step, [length], ids[-1:])
            length += 1
    finally:
        links.unwatch(watch)
        with trio.CancelScope(shield=True), trio.move_on_after(FREE_TIMEOUT_S):
            async with trio.open_nursery() as nursery:
                for i in opened:
                    nursery.start_soon(_free, links, hops[i].peer_id, sids[i])


async def _open_all(run: _Pass, hops: Any, sids: list[str], opened: list[int]) -> None:
    req = run.req
    links = req.node.stage_links
    history = req.prompt_ids + run.tokens if req.prompt_ids else []
    total = len(history) + run.remaining if history else 0
    deadline_ms = int(req.node.config.routing.request_timeout_s * 1000)
    failures: list[StageFailure] = []
    named: dict[str, bytes] = {}  # model identity -> the prompt's block names

    def prefix_names(peer_id: str) -> bytes:
        mid = _model_id(req, peer_id)
        if mid and history and mid not in named:
            named[mid] = b"".join(block_hashes(history[:-1], mid))
        return named.get(mid, b"") if mid else b""

    async def open_one(i: int) -> None:
        h = hops[i]
        fields: dict[str, Any] = {
            "rid": sids[i], "model": req.model, "layer_start": h.layer_start,
            "layer_end": h.layer_end, "deadline_ms": deadline_ms,
            "next": [hops[i + 1].peer_id, sids[i + 1]] if i + 1 < len(hops) else [],
            "wire_dtype": req.msg.get("wire_dtype") or "f16",
        }
        if total:
            fields["max_tokens"] = total
        if px := prefix_names(h.peer_id):
            fields["px"] = px
        if i == len(hops) - 1:
            fields["gen"] = {**gen_fields(req.msg), "max_tokens": run.remaining}
            if run.tokens:  # a replan: penalties, grammar and seed go on after these
                fields["gen"]["after"] = list(run.tokens)
            if history and _takes_packed(req, h.peer_id):
                dtype, data = pack_ids(history, vocab_bound(history, req.vocab_size))
                fields.update(prompt_packed=data, prompt_dtype=dtype)
                if req.msg.get("tok"):
                    fields["tok"] = req.msg["tok"]
            elif history:
                fields["prompt_ids"] = history
            else:
                fields["prompt"] = req.msg["prompt"]
                fields["chat"] = bool(req.msg.get("chat", False))
        try:
            port = await links.port(h.peer_id)
            await port.send(MessageType.STAGE_OPEN, fields)
        except (PeerGoneError, trio.TooSlowError) as e:
            failures.append(StageFailure(f"cannot reach stage {h.name}: {e}", {h.peer_id}))
            return
        opened.append(i)

    async with trio.open_nursery() as nursery:
        for i in range(len(hops)):
            nursery.start_soon(open_one, i)
    if failures:
        raise failures[0]


def _model_id(req: PipelineRequest, peer_id: str) -> str:
    """The identity of the model as the node ``peer_id`` advertises it ("": unknown), which
    its stages name prefix blocks with."""
    node = req.node
    if peer_id == node.peer_id:
        advert: Any = node.membership.local_advert()
    else:
        e = node.membership.table.get(peer_id)
        advert = e.advert if e is not None else None
    return next((m.model_id for m in advert.models if m.name == req.model), "") if advert else ""


def _takes_packed(req: PipelineRequest, peer_id: str) -> bool:
    """Whether the stage on ``peer_id`` reads packed prompts (this node does)."""
    if peer_id == req.node.peer_id:
        return True
    e = req.node.membership.table.get(peer_id)
    return takes_packed(e.advert if e is not None else None, req.model)


async def _wait_ready(run: _Pass, watch: Any, sids: list[str], peer_of: dict[str, str]) -> int:
    """Wait for every stage's ``STAGE_READY``; returns the least prompt tokens they restored
    from their prefix caches (0 when any restored none)."""
    ready: set[str] = set()
    reused = 1 << 62
    with trio.move_on_after(OPEN_TIMEOUT_S) as scope:
        while len(ready) < len(sids):
            kind, m = await watch.recv.receive()
            _raise_if_failed(kind, m, peer_of)
            if m["t"] == MessageType.STAGE_READY and m["rid"] in peer_of:
                ready.add(m["rid"])
                reused = min(reused, max(int(m.get("reused") or 0), 0))
                if m["rid"] == sids[-1] and not run.req.prompt_ids and m.get("prompt_ids"):
                    run.req.prompt_ids = [int(i) for i in m["prompt_ids"]]
    if scope.cancelled_caught:
        slow = {peer_of[s] for s in sids if s not in ready}
        raise StageFailure(f"no answer to STAGE_OPEN within {OPEN_TIMEOUT_S:.0f} s", slow,
                           ErrorCode.DEADLINE)
    if not run.req.prompt_ids:
        raise StageFailure("the last stage did not return the prompt's token ids",
                           {peer_of[sids[-1]]}, ErrorCode.MALFORMED)
    return reused


def _raise_if_failed(kind: str, m: dict[str, Any], peer_of: dict[str, str]) -> None:
    if kind == "gone":
        raise StageFailure(f"stage peer {m['peer'][-8:]} gone: {m['reason']}", {m["peer"]})
    if m["t"] == MessageType.ERROR:
        culprit = m.get("peer") or peer_of.get(m.get("rid") or "") or m.get("from", "")
        raise StageFailure(f"{m['code']}: {m['message']}", {culprit} if culprit else set(),
                           m["code"])


async def _next(watch: Any, timeout: float, peer_of: dict[str, str], hops: Any,
                node: PipelineNode) -> dict[str, Any]:
    with trio.move_on_after(timeout):
        kind, m = await watch.recv.receive()
        _raise_if_failed(kind, m, peer_of)
        return dict(m)
    # nothing in time: blame the stages this node no longer hears from
    dead = {h.peer_id for h in hops if h.peer_id != node.peer_id and node.membership.table.get(h.peer_id) is None}
    raise StageFailure(f"no token from the pipeline within {timeout:.1f} s", dead, ErrorCode.DEADLINE)


async def _send_step(run: _Pass, peer: str, sid: str, step: int, pos: list[int],
                     ids: list[int]) -> None:
    dtype, shape, data = encode_ids(ids)
    try:
        port = await run.req.node.stage_links.port(peer)
        await port.send(MessageType.STAGE_STEP, {"rid": sid, "step": step, "pos": pos,
                                                 "dtype": dtype, "shape": shape, "data": data})
    except (PeerGoneError, trio.TooSlowError) as e:
        raise StageFailure(f"cannot reach the first stage: {e}", {peer}) from None


async def _free(links: Any, peer: str, sid: str) -> None:
    """Free one session over the stream it was opened on. None open: the peer is gone, and
    its sessions went with it (or go when their stream's end reaches it)."""
    port = links.open_port(peer)
    if port is None:
        return
    try:
        await port.send(MessageType.STAGE_FREE, {"rid": sid})
    except Exception:
        pass
