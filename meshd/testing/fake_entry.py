"""A fake node and entry chain for the HTTP API's tests: no libp2p, no engine.

``FakeChain.submit`` behaves like the real chain at its edge: it raises the same errors with the
same codes (unknown model, context too long, quota, busy, no route), emits a route and then
tokens paced by ``step_s``, returns the final stats, and calls its observers once per request.
Cancelling the caller stops it within one step, which ``active`` and ``cancelled`` show.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

import trio

from meshd.api.protocols import Emit, Observer, ServedNode
from meshd.core.request import EntryRequest
from meshd.errors import (
    BusyError,
    ContextLengthError,
    ErrorCode,
    MeshdError,
    QuotaError,
    RoutingError,
    UnknownModelError,
)


@dataclass
class FakeModel:
    name: str
    context_length: int = 256
    nodes: int = 1
    served_by: str = "fake1"
    route: tuple[str, ...] = ("fake1",)
    # what meshd.node.model_facts would know of it (format, architecture, parameters, ...)
    facts: dict[str, Any] = field(default_factory=dict)
    reply: tuple[str, ...] = ()  # the text pieces it answers, one per token (else " w0 w1 ...")


@dataclass
class FakeChain:
    models_served: dict[str, FakeModel] = field(default_factory=lambda: {"tiny": FakeModel("tiny")})
    step_s: float = 0.0
    quotas: dict[str, int] = field(default_factory=dict)
    busy: bool = False
    no_route: bool = False
    fail_after_tokens: int | None = None  # raise peer_gone after this many tokens
    reroute_after_tokens: int | None = None  # a failover to "fake2" after this many tokens
    observers: list[Observer] = field(default_factory=list)
    active: int = 0
    cancelled: int = 0
    steps: int = 0
    in_flight: dict[str, int] = field(default_factory=dict)
    requests: list[EntryRequest] = field(default_factory=list)
    feedback: list[tuple[str, str]] = field(default_factory=list)
    # prompt -> how the cache answers it ({"kind": "exact"} or {"kind": "semantic", ...})
    cache_hits: dict[str, dict[str, Any]] = field(default_factory=dict)
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def new_request_id(self) -> str:
        return f"req{next(self._ids):04d}"

    async def embed(self, texts: list[str]) -> tuple[str, list[list[float]], int]:
        """Deterministic unit vectors of 4 numbers, one per text."""
        out = []
        for t in texts:
            v = [float(len(t)), float(sum(map(ord, t)) % 97), 1.0, 0.5]
            n = sum(x * x for x in v) ** 0.5
            out.append([x / n for x in v])
        return "fake-embed", out, sum(len(t.split()) for t in texts)

    async def chat_template(self, model: str) -> str | None:
        m = self.models_served.get(model)
        return str(m.facts.get("chat_template") or "") or None if m is not None else None

    def models(self) -> list[dict[str, Any]]:
        return [{**m.facts, "id": m.name, "nodes": m.nodes, "context_length": m.context_length}
                for m in self.models_served.values()]

    async def cache_feedback(self, rid: str, verdict: str) -> dict[str, Any]:
        """Feedback on a request this chain answered (``feedback`` lists it); others are
        unknown, as to a cache that never kept them."""
        from meshd.errors import RemoteError

        if verdict not in ("right", "wrong"):
            raise RemoteError(f"verdict must be right or wrong, not {verdict!r}",
                              ErrorCode.MALFORMED)
        if rid not in {r.request_id for r in self.requests}:
            raise RemoteError(f"this node has no cached answer of request {rid!r}",
                              ErrorCode.MALFORMED)
        self.feedback.append((rid, verdict))
        return {"request_id": rid, "verdict": verdict, "served": "stored",
                "removed": int(verdict == "wrong")}

    async def submit(self, req: EntryRequest, emit: Emit) -> dict[str, Any]:
        self.requests.append(req)
        stats: dict[str, Any] = {"request_id": req.request_id, "origin": req.origin,
                                 "strategy": req.strategy or "meshd", "model": req.model}
        try:
            out = await self._submit(req, emit, stats)
        except MeshdError as e:
            self._observe({**stats, "outcome": str(getattr(e, "code", ErrorCode.INTERNAL))})
            raise
        except trio.Cancelled:
            self.cancelled += 1
            self._observe({**stats, "outcome": str(ErrorCode.CANCELLED)})
            raise
        self._observe({**out, "outcome": "ok", "origin": req.origin})
        return out

    def _observe(self, stats: dict[str, Any]) -> None:
        for ob in self.observers:
            ob(stats)

    async def _submit(self, req: EntryRequest, emit: Emit, stats: dict[str, Any]) -> dict[str, Any]:
        model = self.models_served.get(req.model or "")
        if model is None:
            raise UnknownModelError(f"no node of the mesh serves model {req.model!r}")
        text = (req.prompt or "") if req.messages is None else " ".join(m["content"] for m in req.messages)
        prompt_tokens = len(text.split())
        if prompt_tokens + req.wanted_tokens > model.context_length:
            raise ContextLengthError(
                f"the prompt is {prompt_tokens} tokens and {req.wanted_tokens} more were asked "
                f"for; model {model.name} has a context of {model.context_length}",
                prompt_tokens=prompt_tokens, max_tokens=req.wanted_tokens,
                context=model.context_length)
        quota = self.quotas.get(req.client)
        if quota is not None and self.in_flight.get(req.client, 0) >= quota:
            raise QuotaError(f"client {req.client!r} has {self.in_flight.get(req.client, 0)} requests "
                             f"in flight, its quota is {quota}")
        if self.no_route:
            raise RoutingError("no node may serve the request")
        if self.busy:
            raise BusyError("every node is busy", wait_ms=2500.0)
        how = self.cache_hits.get(text)
        if how is not None:  # answered from the entry node's cache, as the real chain does
            await emit("route", {"served_by": "fake1", "route": ["fake1"], "cached": True,
                                 "cache": how})
            await emit("tokens", {"ids": [7], "text": " cached"})
            return {**stats, "text": " cached", "token_ids": [7], "served_by": "fake1",
                    "route": ["fake1"], "ttft_ms": 0.1, "tokens": 1, "total_ms": 0.1,
                    "prompt_tokens": prompt_tokens, "completion_tokens": 1,
                    "finish_reason": "stop", "cached": True, "cache": how, "retries": 0,
                    "hedges": 0}
        self.in_flight[req.client] = self.in_flight.get(req.client, 0) + 1
        self.active += 1
        try:
            await emit("route", {"served_by": model.served_by, "route": list(model.route)})
            ids: list[int] = []
            pieces: list[str] = []
            for i in itertools.count():
                if i >= req.wanted_tokens or (model.reply and i >= len(model.reply)):
                    break
                if self.fail_after_tokens is not None and i >= self.fail_after_tokens:
                    from meshd.errors import PeerGoneError

                    raise PeerGoneError("the serving node went away")
                if i == self.reroute_after_tokens:
                    await emit("route", {"served_by": "fake2", "route": ["fake2"]})
                await trio.sleep(self.step_s)
                self.steps += 1
                piece = model.reply[i] if model.reply else f" w{i}"
                if any(s in "".join(pieces) + piece for s in req.sampling.stop):
                    break
                ids.append(100 + i)
                pieces.append(piece)
                await emit("tokens", {"ids": [100 + i], "text": piece})
        finally:
            self.active -= 1
            self.in_flight[req.client] -= 1
        n = len(ids)
        return {**stats, "text": "".join(pieces), "token_ids": ids, "served_by": model.served_by,
                "route": list(model.route), "ttft_ms": 1.0, "tokens": n, "total_ms": 1.0 + n,
                "prompt_tokens": prompt_tokens, "completion_tokens": n,
                "finish_reason": "length" if n >= req.wanted_tokens else "stop", "cached": False,
                "retries": 0, "hedges": 0}


@dataclass
class FakeNode:
    entry: FakeChain = field(default_factory=FakeChain)
    is_ready: tuple[bool, str] = (True, "")
    api_url: str | None = None

    def ready_state(self) -> tuple[bool, str]:
        return self.is_ready

    def status(self) -> dict[str, Any]:
        return {
            "name": "fake1", "peers": 2, "queue_depth": 0, "in_flight": self.entry.active,
            "uptime_s": 12.5, "api_url": self.api_url,
            "models": [{"model": m, "queue_depth": 0, "in_flight": self.entry.active, "served": 3,
                        "failed": 1, "busy_refusals": 2, "wait_refusals": 1, "prefill_tps": 500.0,
                        "decode_tps": 50.0} for m in self.entry.models_served],
            "services": {
                "node": {"adverts_published": 7, "adverts_accepted": 11, "adverts_rejected": 2,
                         "requests_forwarded": 4, "requests_local": 5},
                "advert_rejections": {"replay": 1, "bad_signature": 1},
                "gossip": {"published": 7, "rejected": 2, "handler_errors": 0},
                "attestation": {"attested_total": 3, "attested_peers": 2,
                                "rejected_by_reason": {"wrong_ca": 1, "expired": 0}},
                "links": {"pings": 9, "stalls": 1},
                "upstreams": {"tiny-up": {"requests": 4, "in_flight": 1, "errors": 1,
                                          "errors_by_kind": {"peer_gone": 1}}},
                "cache": {"state": "ready", "entries": 9, "exact_hits": 3, "semantic_hits": 2,
                          "refused": 1, "misses": 4, "feedback_wrong": 1, "feedback_right": 0},
            },
        }

    def peers_listing(self) -> list[dict[str, Any]]:
        return [{"name": "fake2", "advert_age_s": 0.5, "stalled": False},
                {"name": "fake3", "advert_age_s": 1.5, "stalled": True}]


def _conforms(node: FakeNode) -> ServedNode:
    return node  # mypy checks that the fake satisfies the Protocol serve_api takes
