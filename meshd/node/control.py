"""The node's answers on the control socket: submit, status, peers, explain, revocations."""

from __future__ import annotations

import logging
import time
from contextlib import aclosing
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import trio

from meshd.core.messages import MessageType
from meshd.core.routing import quota_constraint, route
from meshd.core.snapshot import MeshSnapshot, RouteRequest
from meshd.core.vivaldi import estimate_rtt_ms
from meshd.core.wire import Message
from meshd.errors import BusyError, MeshdError, PeerGoneError, RemoteError, RoutingError
from meshd.net.framed import FramedStream
from meshd.node.entry import Target, serve_request
from meshd.node.generation import gen_config_from, gen_fields
from meshd.node.view import coord_of, peer_rtt

if TYPE_CHECKING:
    from meshd.node.node import Node

log = logging.getLogger(__name__)


class ControlMixin:
    async def handle_control(self: Node, msg: Message, out: FramedStream) -> None:  # type: ignore[misc]
        t = msg["t"]
        if t == MessageType.SUBMIT:
            await self._submit(msg, out)
        elif t == MessageType.STATUS_REQ:
            await out.send(MessageType.STATUS, {"data": self.status()})
        elif t == MessageType.PEERS_REQ:
            await out.send(MessageType.PEERS, {"peers": self.peers_listing()})
        elif t == MessageType.EXPLAIN_REQ:
            record = await self.store.explain(msg["rid"]) if self.store is not None else None
            await out.send(MessageType.EXPLAIN, {"record": flatten_explain(record)})
        elif t == MessageType.PUSH_REVOCATION:
            gone = await self.apply_revocation_bytes(msg["crl"], gossip=True)
            rl = self.attestor.revocation_list
            await out.send(
                MessageType.OK,
                {"data": {"version": rl.version if rl else 0, "disconnected": gone}},
            )
        else:
            raise RemoteError(f"message {t} is not a request", "unsupported")

    # ------------------------------------------------------------------ status

    def status(self: Node) -> dict[str, Any]:  # type: ignore[misc]
        return {
            "name": self.node_name,
            "peer_id": self.peer_id,
            "region": self.region,
            "labels": self.labels,
            "addrs": self.addrs,
            "uptime_s": round(time.time() - self.started_at, 1),
            "peers": len(self.table),
            "queue_depth": self.runner.queue_depth(),
            "in_flight": self.runner.in_flight(),
            "models": [s.statistics() for s in self.runner.models.values()],
            "hardware": self.hardware.to_dict() if self.hardware is not None else {},
            "strategy": self.policy.strategy,
            "coord": {"vec": list(self.coord.vec), "height": self.coord.height, "error": self.coord.error},
            "services": {
                "node": dict(self.stats),
                "advert_rejections": dict(self.rejections),
                "gossip": dict(self.gossip.stats) if self.gossip else {},
                "advert_delay_ms": delay_summary(self.advert_delays_ms, self.stats["adverts_timed"]),
                "attestation": self.attestor.statistics(),
                "links": self.links.statistics() if self.links else {},
                "request_server": dict(self.server.stats),
                "stage_server": self.stage_server.statistics(),
                "placement": self.placer.statistics(),
            },
        }

    def peers_listing(self: Node) -> list[dict[str, Any]]:  # type: ignore[misc]
        now = trio.current_time()
        rows = []
        for pid, e in sorted(self.table.entries.items()):
            a = e.advert
            rtt, source = peer_rtt(e, self.coord, now)
            remote = coord_of(a)
            est = estimate_rtt_ms(self.coord, remote) if remote is not None and len(remote.vec) == len(self.coord.vec) else None
            rows.append(
                {
                    "name": a.name,
                    "peer_id": pid,
                    "region": a.region,
                    "labels": a.labels,
                    "hardware": a.hardware,
                    "models": [
                        {"name": m.name, "layers": [m.layer_start, m.layer_end], "num_layers": m.num_layers}
                        for m in a.models
                    ],
                    "queue_depth": a.queue_depth,
                    "in_flight": a.in_flight,
                    "prefill_tps": a.prefill_tps,
                    "decode_tps": a.decode_tps,
                    "advert_age_s": round(now - e.heard_at, 3),
                    "seq": a.seq,
                    "rtt_ms": round(rtt, 3),
                    "rtt_source": source,
                    "rtt_measured_ms": round(e.rtt_ms, 3) if e.rtt_ms is not None else None,
                    "rtt_estimated_ms": round(est, 3) if est is not None else None,
                    "stalled": e.stalled,
                }
            )
        return rows

    # ------------------------------------------------------------------ submit

    def _pick_model(self: Node, requested: str | None) -> str:  # type: ignore[misc]
        if requested:
            return requested
        local = self.runner.default_model()
        if local is not None:
            return local
        counts: dict[str, int] = {}
        for e in self.table.live():
            for m in e.advert.models:
                counts[m.name] = counts.get(m.name, 0) + 1
        if not counts:
            raise RoutingError("no model is served anywhere in the mesh yet")
        return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[0][0]

    async def _submit(self: Node, msg: Message, out: FramedStream) -> None:  # type: ignore[misc]
        self.stats["requests_submitted"] += 1
        rid = msg["rid"] or self.new_request_id()
        model = self._pick_model(msg.get("model"))
        chat = bool(msg.get("chat", False))
        prompt = msg["prompt"]
        prompt_ids: list[int] = []
        if self.runner.get(model) is not None:
            prompt_ids = self.runner.encode(model, prompt, chat=chat)
        gen_config_from(msg)  # validates the generation fields before anything runs
        strategy = msg.get("strategy") or self.policy.strategy
        policy = replace(self.policy, strategy=strategy) if strategy != self.policy.strategy else self.policy
        client = msg.get("client") or "local"
        req = RouteRequest(
            request_id=rid,
            model=model,
            prompt_tokens=len(prompt_ids) or max(1, len(prompt) // 4),
            max_tokens=int(msg.get("max_tokens") or 64),
            residency=msg.get("residency"),
            client=client,
        )
        snap = self.snapshot()
        if policy.client_quota:  # the quota constraint reads the requests in flight per client
            snap = _with_clients(snap, self.client_in_flight)
        journal = self._journal(rid)
        journal("received", {"model": model, "prompt_tokens": req.prompt_tokens, "client": client})
        from meshd.node.pipeline import choose_pipeline, submit_pipeline

        try:
            quota_constraint(req, snap, policy)
            pipe = choose_pipeline(req, snap, policy, msg.get("pipeline"))  # plan() decides
        except RoutingError as e:
            self.stats["requests_failed"] += 1
            await self._record_failure(rid, strategy, snap, str(e))
            raise RemoteError(str(e), "no_route") from None
        if pipe is not None:
            await submit_pipeline(self, pipe, req, msg, prompt_ids, out, journal, strategy, policy)
            return
        try:
            decision = route(req, snap, policy, self.rng, self.rr_index)
        except RoutingError as e:
            self.stats["requests_failed"] += 1
            await self._record_failure(rid, strategy, snap, str(e))
            raise RemoteError(str(e), "no_route") from None
        self.rr_index += 1
        await self._record_decision(rid, decision, req)
        targets = _targets(snap, decision, policy)
        fields = {"rid": rid, "model": model, "prompt": prompt, "chat": chat, **gen_fields(msg)}

        async def sink(kind: str, payload: dict[str, Any]) -> None:
            if kind == "route":
                await out.send(MessageType.ROUTE, {"rid": rid, **payload})
            else:
                await out.send(MessageType.TOKENS, {"rid": rid, "ids": payload["ids"], "text": payload["text"]})

        async def start_attempt(target: Target, resume: list[int], chan: Any) -> None:
            await self._attempt(target, resume, chan, fields, prompt_ids)

        from meshd.core.routing import hedge_deadline_ms

        hedge_ms = hedge_deadline_ms(decision, policy) if self.config.routing.hedge else None
        self.client_in_flight[client] = self.client_in_flight.get(client, 0) + 1
        try:
            outcome = await serve_request(
                decision,
                targets,
                start_attempt,
                sink,
                entry_name=self.node_name,
                hedge_after_s=hedge_ms / 1000.0 if hedge_ms else None,
                first_token_timeout_s=self.config.routing.first_token_timeout_s,
                journal=journal,
            )
        finally:
            self.client_in_flight[client] -= 1
        stats = outcome.stats()
        await self._record_outcome(rid, outcome)
        if outcome.error is not None:
            self.stats["requests_failed"] += 1
            raise RemoteError(f"request failed: {outcome.error}", outcome.error_code or "internal")
        text = "".join(outcome.text)
        await out.send(MessageType.DONE, {"rid": rid, "stats": {**stats, "request_id": rid, "text": text,
                                                                 "token_ids": outcome.tokens, "model": model,
                                                                 "strategy": strategy}})

    async def _attempt(  # type: ignore[misc]
        self: Node, target: Target, resume: list[int], chan: Any, fields: dict[str, Any],
        prompt_ids: list[int],
    ) -> None:
        model = fields["model"]
        if target.is_local:
            self.stats["requests_local"] += 1
            ids = prompt_ids or self.runner.encode(model, fields["prompt"], chat=fields["chat"])
            gen = gen_config_from(fields, already=len(resume))
            from meshd.node.coalesce import pump_coalesced

            async def sink(batch: list[Any]) -> None:
                await chan.send(("tokens", {"ids": [t.id for t in batch], "text": "".join(t.text for t in batch)}))

            if gen is not None:
                source = self.runner.generate(model, ids + resume, gen, max_wait_ms=target.max_wait_ms)
                await pump_coalesced(source, 0.01, sink)
            await chan.send(("done", {"stats": {}}))
            return
        self.stats["requests_forwarded"] += 1
        assert self.links is not None
        ch = await self.links.channel(target.peer_id)
        self.table.note_sent(target.peer_id)
        req = {
            **fields,
            "prompt_ids": prompt_ids,
            "resume_ids": resume,
            "deadline_ms": int(self.config.routing.request_timeout_s * 1000),
            "hops": 1,
            "origin": self.peer_id,
        }
        if target.max_wait_ms is not None:
            req["max_wait_ms"] = int(target.max_wait_ms)
        async with aclosing(ch.request(req)) as frames:
            async for frame in frames:
                t = frame["t"]
                if t == MessageType.TOKENS:
                    await chan.send(("tokens", {"ids": frame["ids"], "text": frame.get("text", "")}))
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

    # ------------------------------------------------------------------ journal

    def _journal(self: Node, rid: str) -> Any:  # type: ignore[misc]
        def journal(kind: str, payload: dict[str, Any]) -> None:
            log.debug("request event rid=%s kind=%s %s", rid, kind, payload)
            if self.store is not None:
                try:
                    self.store.record_event(rid, kind, node=self.node_name, payload=payload)
                except Exception:  # the journal must never cost the client its request
                    self.stats["journal_errors"] = self.stats.get("journal_errors", 0) + 1
                    log.exception("journal write failed rid=%s kind=%s", rid, kind)

        return journal

    async def _record_decision(self: Node, rid: str, decision: Any, req: RouteRequest) -> None:  # type: ignore[misc]
        if self.store is None:
            return
        rec = decision_record(decision, req)
        names = {c["peer_id"]: c["name"] for c in rec["candidates"]}
        self.store.record_decision(
            rid,
            strategy=rec["strategy"],
            candidates=rec["candidates"],
            constraints={"applied": rec["constraints"], "model": req.model,
                         "residency": req.residency, "client": req.client,
                         "prompt_tokens": req.prompt_tokens},
            chosen=names.get(decision.chosen, decision.chosen),
            order=[names.get(p, p) for p in rec["order"]],
        )

    async def _record_failure(self: Node, rid: str, strategy: str, snap: Any, error: str) -> None:  # type: ignore[misc]
        if self.store is None:
            return
        self.store.record_event(rid, "failed", node=self.node_name, payload={"error": error})
        self.store.record_outcome(rid, ttft_ms=None, tokens=0, tokens_per_s=None, served_by=None,
                                  route=[], error=error)

    async def _record_outcome(self: Node, rid: str, outcome: Any) -> None:  # type: ignore[misc]
        if self.store is None:
            return
        s = outcome.stats()
        self.store.record_event(rid, "failed" if outcome.error else "done", node=self.node_name,
                                payload={"error": outcome.error, "tokens": s["tokens"],
                                         "retries": outcome.retries, "hedges": outcome.hedges})
        self.store.record_outcome(rid, ttft_ms=s["ttft_ms"], tokens=s["tokens"],
                                  tokens_per_s=s["tokens_per_s"], served_by=s["served_by"] or None,
                                  route=s["route"], error=outcome.error, retries=s["retries"],
                                  hedges=s["hedges"])


def delay_summary(samples: Any, total: int) -> dict[str, Any]:
    """Publish-to-receipt delay of recent adverts heard by gossip: p50/p99 over the recent
    samples, the samples, and ``n`` = how many were ever taken (the recent ones are a ring)."""
    xs = sorted(samples)
    if not xs:
        return {"n": total, "p50": None, "p99": None, "recent": []}
    def pct(q: float) -> float:
        return round(xs[min(len(xs) - 1, int(q * len(xs)))], 3)
    return {"n": total, "p50": pct(0.5), "p99": pct(0.99), "recent": [round(x, 3) for x in samples]}


def _with_clients(snap: MeshSnapshot, in_flight: dict[str, int]) -> MeshSnapshot:
    """``snap`` with the requests in flight per client (its memo of indexes kept)."""
    out = replace(snap, client_in_flight=dict(in_flight))
    out.cache.update(snap.cache)
    return out


def _targets(snap: Any, decision: Any, policy: Any) -> dict[str, Target]:
    """The eligible candidates of the decision (every peer of its order is one) as targets,
    with the router's predictions and the wait bounds of meshd's admission
    (meshd.core.admission)."""
    from meshd.core.admission import wait_bounds

    bounds = wait_bounds(decision, policy)
    targets: dict[str, Target] = {}
    for c in decision.candidates:
        if c.excluded_by is not None:
            continue
        t = Target(peer_id=c.peer_id, name=c.name, is_local=c.peer_id == snap.local_peer_id)
        if c.predicted_ttft_ms is not None:
            t.predicted_ms = c.predicted_ttft_ms
            t.known_ms = c.predicted_ttft_ms - c.queue_wait_ms
            t.max_wait_ms = bounds.get(c.peer_id)
        targets[c.peer_id] = t
    return targets


def decision_record(decision: Any, req: RouteRequest) -> dict[str, Any]:
    return {
        "strategy": decision.strategy,
        "model": req.model,
        "prompt_tokens": req.prompt_tokens,
        "residency": req.residency,
        "constraints": list(decision.constraints),
        "candidates": [
            {
                "name": c.name,
                "peer_id": c.peer_id,
                "predicted_ttft_ms": c.predicted_ttft_ms,
                "rtt_ms": c.rtt_ms,
                "rtt_source": c.rtt_source,
                "queue_wait_ms": c.queue_wait_ms,
                "prefill_ms": c.prefill_ms,
                "score": c.score,
                "excluded_by": c.excluded_by,
            }
            for c in decision.candidates
        ],
        "order": list(decision.order),
        "chosen": decision.chosen,
    }


def flatten_explain(record: dict[str, Any] | None) -> dict[str, Any] | None:
    """The store's record with the decision's headline fields lifted to the top level."""
    if record is None:
        return None
    d = record.get("decision") or {}
    return {
        **record,
        "strategy": d.get("strategy"),
        "candidates": d.get("candidates") or [],
        "chosen": d.get("chosen"),
        "constraints": d.get("constraints"),
        "plan": d.get("plan"),
    }


__all__ = ["ControlMixin", "decision_record", "flatten_explain", "MeshdError", "trio"]
