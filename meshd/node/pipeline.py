"""The entry node's pipeline driver: run a request through a chain of stage nodes.

The entry chain's route step asks ``meshd.core.decide.decide`` (the simulator's very function)
whether the request runs as a pipeline: when no node serves the whole model, or when the chain
is predicted to finish sooner. ``run_pipeline`` then does the I/O (docs/pipeline.md):

1. open a stage session on every hop at once (``STAGE_OPEN``), each told the next hop's peer
   and session id; the last stage gets the prompt (ids, or text it encodes) and the sampling
   settings;
2. send the prompt's token ids to the first stage (``STAGE_STEP``); activations go from stage
   to stage directly; the last stage samples and sends the token to this node (``STAGE_OUT``),
   which streams it to the client and sends it to the first stage as the next step;
3. on a failure (a stage's stream ends: a SIGKILLed peer shows as EOF within milliseconds; an
   ``ERROR`` such as ``busy`` or ``peer_gone``; no answer before the step deadline) it plans
   again without the failed peer, opens fresh sessions, and replays the prompt plus every token
   so far as one prefill, so the caches are rebuilt and greedy output goes on identically.
   The journal records each ``replan``;
4. frees every session it opened (``STAGE_FREE``) however the request ends.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import trio

from meshd.config import Config
from meshd.core.messages import MessageType
from meshd.core.packing import pack_ids, takes_packed, vocab_bound
from meshd.core.planner import Plan, plan
from meshd.core.request import DEFAULT_MAX_TOKENS, MAX_MAX_TOKENS
from meshd.core.snapshot import Policy, RouteRequest
from meshd.errors import ErrorCode, PeerGoneError, RemoteError, RoutingError
from meshd.node.activations import encode_ids
from meshd.node.forward import Outcome
from meshd.node.gen_config import gen_fields
from meshd.node.stagelinks import StageLinks
from meshd.node.view import MeshView
from meshd.store.protocol import Recorder

log = logging.getLogger(__name__)

MAX_ATTEMPTS = 4
OPEN_TIMEOUT_S = 15.0
FREE_TIMEOUT_S = 2.0
REPLAN_WAIT_MIN_S = 3.0
REPLAN_POLL_S = 0.2


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


class StageFailure(RemoteError):
    """A stage of a pipeline failed (died, stalled, refused): ``culprits`` are the peers to plan
    around; ``code`` is what the client is told if no replan succeeds."""

    def __init__(self, message: str, culprits: set[str], code: str = ErrorCode.PEER_GONE) -> None:
        super().__init__(message, code)
        self.culprits = culprits


@dataclass
class _Run:
    node: PipelineNode
    rid: str
    model: str
    msg: dict[str, Any]
    prompt_ids: list[int]
    max_tokens: int
    sink: Any
    journal: Any
    vocab_size: int = 0  # of the tokenizer or model that made prompt_ids (packing)
    out: Outcome = field(default_factory=Outcome)
    attempt: int = 0

    @property
    def remaining(self) -> int:
        return self.max_tokens - len(self.out.tokens)


async def run_pipeline(
    node: PipelineNode, first: Plan, req: RouteRequest, msg: dict[str, Any], prompt_ids: list[int],
    sink: Any, journal: Any, policy: Policy, *, vocab_size: int = 0,
) -> tuple[Outcome, Plan]:
    """Serve one request along ``first``, replanning around failed stages; never raises for a
    stage's failure (the outcome carries the error). Returns the outcome and the last plan."""
    max_tokens = min(int(gen_fields(msg).get("max_tokens", DEFAULT_MAX_TOKENS)), MAX_MAX_TOKENS)
    run = _Run(node, req.request_id, req.model, msg, list(prompt_ids), max_tokens, sink, journal,
               vocab_size)
    failed_at: dict[str, float] = {}  # peer -> when it last failed this request
    current = first
    while True:
        run.attempt += 1
        try:
            await _attempt(run, current)
            run.out.error = run.out.error_code = None
            break
        except StageFailure as f:
            names = {h.peer_id: h.name for h in current.hops}
            lost = [h for h in current.hops if h.peer_id in f.culprits]
            run.out.retries.append({"target": ",".join(names.get(p, p) for p in f.culprits),
                                    "reason": str(f), "after_tokens": len(run.out.tokens)})
            run.out.error, run.out.error_code = str(f), f.code
            log.info("pipeline stage failed rid=%s attempt=%d error=%s", run.rid, run.attempt, f)
            if run.attempt >= MAX_ATTEMPTS:
                run.out.error = f"pipeline failed {run.attempt} times; last: {f}"
                break
            for peer in f.culprits:
                failed_at[peer] = trio.current_time()
            history = len(run.prompt_ids) + len(run.out.tokens) if run.prompt_ids else 0
            try:
                nxt, again = await _replan(node, req, policy, failed_at,
                                           prompt_tokens=history or req.prompt_tokens,
                                           max_tokens=max(run.remaining, 1))
            except RoutingError as e:
                run.out.error = f"{f}; no replacement: {e}"
                run.out.error_code = ErrorCode.NO_ROUTE
                journal("failed", {"error": run.out.error})
                break
            journal("replan", {
                "reason": f"{', '.join(f'{h.name} [{h.layer_start}, {h.layer_end})' for h in lost) or 'a stage'} "
                          f"failed after {len(run.out.tokens)} tokens ({f}); new chain "
                          + " -> ".join(f"{h.name}[{h.layer_start},{h.layer_end})" for h in nxt.hops),
                "lost": [h.name for h in lost],
                "layers": [[h.layer_start, h.layer_end] for h in lost],
                "after_tokens": len(run.out.tokens),
                "chain": [h.name for h in nxt.hops],
            })
            record_plan(node, run.rid, nxt, again, policy)
            current = nxt
    run.out.ended = time.perf_counter()
    return run.out, current


def excluded_peers(failed_at: dict[str, float], heard_at: dict[str, float]) -> frozenset[str]:
    """The peers a replan leaves out: those that failed this request and have not been heard
    from since (a peer whose connection dropped but that adverts again is usable; a dead one
    never adverts again). Pure; times on one monotonic clock."""
    return frozenset(p for p, t in failed_at.items() if heard_at.get(p, -1.0) <= t)


async def _replan(node: PipelineNode, req: RouteRequest, policy: Policy, failed_at: dict[str, float], *,
                  prompt_tokens: int, max_tokens: int) -> tuple[Plan, RouteRequest]:
    """Plan the rest of the request without the failed peers. When nothing covers the model
    right now (a healthy stage's connection dropped with the failed one), wait up to two advert
    intervals for the peer table to hear it again before giving up."""
    deadline = trio.current_time() + max(REPLAN_WAIT_MIN_S,
                                         2 * node.config.gossip.advert_interval_s)
    while True:
        heard = {pid: e.heard_at for pid, e in node.membership.table.entries.items()}
        again = replace(req, exclude=req.exclude | excluded_peers(failed_at, heard),
                        prompt_tokens=prompt_tokens, max_tokens=max_tokens)
        try:
            return plan(again, node.membership.snapshot(), policy), again
        except RoutingError:
            if trio.current_time() >= deadline:
                raise
        await trio.sleep(REPLAN_POLL_S)


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


async def _attempt(run: _Run, p: Plan) -> None:
    """One pass of the request along ``p``; returns when the last token came, else raises
    ``StageFailure``."""
    node = run.node
    links = node.stage_links
    hops = p.hops
    sids = [f"{run.rid}.{run.attempt}@{h.layer_start}" for h in hops]
    peer_of = dict(zip(sids, (h.peer_id for h in hops), strict=True))
    watch = links.watch(set(sids), {h.peer_id for h in hops})
    opened: list[int] = []
    try:
        t_open = time.perf_counter()
        await _open_all(run, hops, sids, opened)
        await _wait_ready(run, watch, sids, peer_of)
        if run.attempt > 1:  # after a replan: when the new chain was ready, and what it replays
            run.journal("routed", {
                "target": " -> ".join(h.name for h in hops), "pipeline": True,
                "attempt": run.attempt, "resume_tokens": len(run.out.tokens),
                "open_ms": round((time.perf_counter() - t_open) * 1000, 3)})
        for name in [node.node_name, *(h.name for h in hops)]:
            if name not in run.out.route:
                run.out.route.append(name)
        run.out.served_by = hops[-1].name
        await run.sink("route", {"served_by": run.out.served_by, "route": list(run.out.route)})
        history = run.prompt_ids + run.out.tokens
        await _send_step(run, hops[0].peer_id, sids[0], 0, list(range(len(history))), history)
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
            if run.out.first_at is None:
                run.out.first_at = time.perf_counter()
                run.out.ttft_ms = (run.out.first_at - run.out.started) * 1000
                run.journal("first_token", {"target": hops[-1].name,
                                            "ttft_ms": round(run.out.ttft_ms, 3)})
            run.out.tokens.extend(ids)
            run.out.text.append(m.get("text") or "")
            payload: dict[str, Any] = {"ids": ids, "text": m.get("text") or ""}
            if m.get("lp") is not None:
                payload["lp"] = m["lp"]
            await run.sink("tokens", payload)
            if m.get("finish") or run.remaining <= 0:
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


async def _open_all(run: _Run, hops: Any, sids: list[str], opened: list[int]) -> None:
    links = run.node.stage_links
    history = run.prompt_ids + run.out.tokens if run.prompt_ids else []
    total = len(history) + run.remaining if history else 0
    deadline_ms = int(run.node.config.routing.request_timeout_s * 1000)
    failures: list[StageFailure] = []

    async def open_one(i: int) -> None:
        h = hops[i]
        fields: dict[str, Any] = {
            "rid": sids[i], "model": run.model, "layer_start": h.layer_start,
            "layer_end": h.layer_end, "deadline_ms": deadline_ms,
            "next": [hops[i + 1].peer_id, sids[i + 1]] if i + 1 < len(hops) else [],
            "wire_dtype": run.msg.get("wire_dtype") or "f16",
        }
        if total:
            fields["max_tokens"] = total
        if i == len(hops) - 1:
            fields["gen"] = {**gen_fields(run.msg), "max_tokens": run.remaining}
            if run.out.tokens:  # a replan: penalties, grammar and seed go on after these
                fields["gen"]["after"] = list(run.out.tokens)
            if history and _takes_packed(run, h.peer_id):
                dtype, data = pack_ids(history, vocab_bound(history, run.vocab_size))
                fields.update(prompt_packed=data, prompt_dtype=dtype)
                if run.msg.get("tok"):
                    fields["tok"] = run.msg["tok"]
            elif history:
                fields["prompt_ids"] = history
            else:
                fields["prompt"] = run.msg["prompt"]
                fields["chat"] = bool(run.msg.get("chat", False))
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


def _takes_packed(run: _Run, peer_id: str) -> bool:
    """Whether the stage on ``peer_id`` reads packed prompts (this node does)."""
    if peer_id == run.node.peer_id:
        return True
    e = run.node.membership.table.get(peer_id)
    return takes_packed(e.advert if e is not None else None, run.model)


async def _wait_ready(run: _Run, watch: Any, sids: list[str], peer_of: dict[str, str]) -> None:
    ready: set[str] = set()
    with trio.move_on_after(OPEN_TIMEOUT_S) as scope:
        while len(ready) < len(sids):
            kind, m = await watch.recv.receive()
            _raise_if_failed(kind, m, peer_of)
            if m["t"] == MessageType.STAGE_READY and m["rid"] in peer_of:
                ready.add(m["rid"])
                if m["rid"] == sids[-1] and not run.prompt_ids and m.get("prompt_ids"):
                    run.prompt_ids = [int(i) for i in m["prompt_ids"]]
    if scope.cancelled_caught:
        slow = {peer_of[s] for s in sids if s not in ready}
        raise StageFailure(f"no answer to STAGE_OPEN within {OPEN_TIMEOUT_S:.0f} s", slow,
                           ErrorCode.DEADLINE)
    if not run.prompt_ids:
        raise StageFailure("the last stage did not return the prompt's token ids",
                           {peer_of[sids[-1]]}, ErrorCode.MALFORMED)


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


async def _send_step(run: _Run, peer: str, sid: str, step: int, pos: list[int],
                     ids: list[int]) -> None:
    dtype, shape, data = encode_ids(ids)
    try:
        port = await run.node.stage_links.port(peer)
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
