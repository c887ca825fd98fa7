"""The execute step's I/O: a thin trio loop around the request's life (``meshd.core.request_life``).

The route comes from the pure ``meshd.core.decide.decide`` (the entry chain's route step); what
happens next is decided by ``RequestLife``, the machine the simulator drives too: which peer to
try after a failure, when a wait refusal sends the request on or back, when to hedge, when to
decide again, when to give up. ``drive`` feeds it what happens and does what it says:

- an attempt runs here or on a peer over its long-lived request stream (``start``), or along a
  pipeline's stages (``meshd.node.pipeline.run_plan``); after k tokens a new attempt resumes
  from the prompt plus those k tokens, so the client sees one uninterrupted stream (identical
  under greedy decoding);
- its tokens go to the client (``sink``) as they come; the first attempt with a token wins a
  hedge race and the other copy is cancelled;
- a semantic cache lookup, when one runs (``lookup``), is awaited beside the attempts and its
  answer fed in as ``CacheHit`` or ``CacheMiss``; while it is pending, what goes to the client
  is held back here and let out on ``Release``; on ``ServeCached`` the loop ends and the caller
  serves the cached answer (``Driver.cached``);
- every attempt, retry, hedge, new decision and the outcome go to the journal.

``serve_request`` runs a one-node decision with given targets (the unit tests' entry).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Container
from dataclasses import dataclass, field, replace
from typing import Any

import trio

from meshd.core.request_life import (
    Action,
    ArmTimer,
    BackToRefuser,
    Busy,
    CacheHit,
    CacheLookup,
    CacheMiss,
    Cancel,
    Decided,
    Fail,
    Failed,
    Finish,
    Finished,
    FirstToken,
    FirstTokenLate,
    HedgeDue,
    NoRoute,
    Redecide,
    Release,
    RequestLife,
    Route,
    Send,
    SendPlan,
    ServeCached,
    StageFailed,
)
from meshd.core.routing import RouteDecision
from meshd.core.snapshot import Policy
from meshd.errors import BusyError, ErrorCode, PeerGoneError, RemoteError, RoutingError

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Target:
    peer_id: str
    name: str
    is_local: bool
    max_wait_ms: float | None = None  # wait-bounded admission (meshd.core.admission)
    predicted_ms: float | None = None  # the router's predicted TTFT there
    known_ms: float | None = None  # the part of it that is not queue wait (RTT + prefill)


@dataclass(slots=True)
class Outcome:
    tokens: list[int] = field(default_factory=list)
    text: list[str] = field(default_factory=list)
    served_by: str = ""
    route: list[str] = field(default_factory=list)
    ttft_ms: float | None = None
    retries: list[dict[str, Any]] = field(default_factory=list)
    hedges: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None
    error_code: str | None = None
    started: float = field(default_factory=time.perf_counter)  # reset at the first attempt's send
    first_at: float | None = None
    ended: float | None = None

    def stats(self) -> dict[str, Any]:
        end = self.ended or time.perf_counter()
        decode_s = end - self.first_at if self.first_at is not None else 0.0
        n = len(self.tokens)
        return {
            "served_by": self.served_by,
            "route": self.route,
            "ttft_ms": round(self.ttft_ms, 3) if self.ttft_ms is not None else None,
            "tokens": n,
            "tokens_per_s": round((n - 1) / decode_s, 2) if n > 1 and decode_s > 0 else None,
            "total_ms": round((end - self.started) * 1000, 3),
            "retries": len(self.retries),
            "hedges": len(self.hedges),
            "hedge_won": any(h["target"] == self.served_by for h in self.hedges),
        }


class StageFailure(RemoteError):
    """A stage of a pipeline attempt failed (died, stalled, refused): ``culprits`` are the peers
    to plan around; ``code`` is what the client is told if nothing else serves."""

    def __init__(self, message: str, culprits: set[str], code: str = ErrorCode.PEER_GONE) -> None:
        super().__init__(message, code)
        self.culprits = culprits


Sink = Callable[[str, dict[str, Any]], Awaitable[None]]
Journal = Callable[[str, dict[str, Any]], None]
Channel = Any  # a send channel of (kind, payload): "route", "tokens", "done" (attempts report)
Start = Callable[[Send | SendPlan, Target | None, list[int], Channel], Awaitable[None]]
"""``start(action, target, resume_ids, channel)`` runs one attempt: ``target`` for a ``Send``
(None for a ``SendPlan``); reports ``("tokens", {"ids", "text"})`` and ``("done", {...})`` (a
plan attempt also ``("route", {"served_by", "route"})`` once its chain is ready) on
``channel``; raises on failure (``BusyError`` with its wait, ``StageFailure``, or any other)."""
Lookup = Callable[[], Awaitable[bool]]
"""``await lookup()``: whether the request's pending semantic cache lookup found its answer."""
Redecider = Callable[[Redecide, Any, StageFailure | None, int],
                     Awaitable[tuple[Any, dict[str, Target]]]]
"""``await redecide(action, plan, stage_failure, tokens_so_far)``: a new ``Decision`` on a
fresh snapshot without ``action.exclude``, and the targets of its candidates; ``plan`` and
``stage_failure``: the plan whose stage failed and how, when a pipeline attempt's failure led
here (else None); raises ``RoutingError``."""


async def serve_request(
    decision: RouteDecision,
    targets: dict[str, Target],
    start_attempt: Callable[[Target, list[int], trio.MemorySendChannel[Any]], Awaitable[None]],
    sink: Sink,
    *,
    entry_name: str,
    hedge_after_s: float | None,
    first_token_timeout_s: float,
    journal: Journal,
    policy: Policy | None = None,
) -> Outcome:
    """Run a one-node decision along ``decision.order`` (the peers of ``targets``), with wait
    refusals, failover and a hedge after ``hedge_after_s``; no new decision (nothing to decide
    with). ``start_attempt(target, resume_ids, channel)``: one attempt (``Start``)."""

    async def start(action: Send | SendPlan, target: Target | None, resume: list[int],
                    chan: Channel) -> None:
        assert target is not None
        await start_attempt(target, resume, chan)

    first = Decided(route_from(decision.order, targets,
                               hedge_after_s * 1000.0 if hedge_after_s else None))
    d = Driver(targets, start, sink, entry_name=entry_name, journal=journal,
               life=RequestLife(started_s=trio.current_time(), policy=policy,
                                first_token_timeout_s=first_token_timeout_s))
    return await d.drive(first)


def route_from(order: Any, targets: dict[str, Target], hedge_ms: float | None) -> Route[str]:
    """The machine's ``Route`` from the decision's order and its targets' bounds and predictions."""
    peers = tuple(p for p in order if p in targets)
    bounds = {p: t.max_wait_ms for p in peers if (t := targets[p]).max_wait_ms is not None}
    pred = {p: (t.predicted_ms, t.known_ms) for p in peers if (t := targets[p]).predicted_ms is not None}
    return Route(peers, bounds, pred, hedge_ms)


class Driver:
    """The trio loop of one request: attempts as tasks, their reports and two timers turned into
    the machine's events, its actions carried out (see the module's docstring)."""

    def __init__(self, targets: dict[str, Target], start: Start, sink: Sink, *, entry_name: str,
                 journal: Journal, life: RequestLife[str], redecide: Redecider | None = None,
                 gone: Container[str] = frozenset()) -> None:
        self.targets = targets
        self.start = start
        self.sink = sink
        self.entry_name = entry_name
        self.journal = journal
        self.life = life
        self.redecide = redecide
        self.gone = gone  # peers this node knows are dead (skipped)
        self.out = Outcome()
        self.last_plan: Any = None  # the last plan run (pipelines)
        self._hedge_ms: float | None = None
        self._stage_failure: StageFailure | None = None  # the last failure, if a stage's
        self._scopes: dict[int, trio.CancelScope] = {}
        self._names: dict[int, str] = {}
        self._plans: set[int] = set()
        self._timers: dict[str, float] = {}
        self._held: list[tuple[str, dict[str, Any]]] = []  # for the client, until the cache misses
        self._sent = False  # an attempt was sent (the outcome's clock starts then)
        self.cached: ServeCached | None = None  # the request was answered from the cache
        self._send, self._recv = trio.open_memory_channel[Any](4096)
        self._nursery: trio.Nursery | None = None

    async def drive(self, first: Decided | NoRoute, *, lookup: Lookup | None = None,
                    here: str | None = None) -> Outcome:
        """Run the request from its first decision (or its lack of one) to its end; ``lookup``:
        its pending semantic cache lookup, racing the attempts; ``here``: this node's peer id
        (a first decision naming it waits for the lookup)."""
        life = self.life
        out = self.out
        self._hedge_ms = first.route.hedge_ms if isinstance(first, Decided) and first.route else None
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            if lookup is not None:
                life.handle(CacheLookup(here), trio.current_time())
                nursery.start_soon(self._lookup, lookup)
            await self._do(life.handle(first, trio.current_time()))
            while not life.over:
                at = min(self._timers.values(), default=None)
                item = None
                if at is None:
                    item = await self._recv.receive()
                else:
                    with trio.move_on_at(at):
                        item = await self._recv.receive()
                if item is None:
                    await self._timer(trio.current_time())
                else:
                    await self._report(*item)
            nursery.cancel_scope.cancel()
        if life.state in ("done", "cached"):
            out.error = out.error_code = None
        elif out.error is None:
            out.error, out.error_code = life.reason, life.code
        out.ended = time.perf_counter()
        return out

    # ------------------------------------------------------------------ what happens

    async def _timer(self, now: float) -> None:
        for kind, at in sorted(self._timers.items(), key=lambda kv: kv[1]):
            if at > now:
                continue
            del self._timers[kind]
            if kind == "hedge":
                await self._do(self.life.handle(HedgeDue(self.gone), now))
            else:
                late = [self._names[k] for k in sorted(self.life.live)]
                acts = self.life.handle(FirstTokenLate(self.gone), now)
                if any(isinstance(a, Cancel) and a.why == "late" for a in acts):
                    for name in late:
                        self.out.retries.append({"target": name, "reason": "no first token in time"})
                    self.journal("retry", {"reason": "first-token timeout", "targets": late})
                await self._do(acts)

    async def _lookup(self, lookup: Lookup) -> None:
        hit = await lookup()
        await self._send.send((-1, "cache", {"hit": hit}))

    async def _emit(self, kind: str, payload: dict[str, Any]) -> None:
        """To the client, unless the machine holds it back for the cache (``Release``)."""
        if self.life.held:
            self._held.append((kind, payload))
        else:
            await self.sink(kind, payload)

    async def _report(self, k: int, kind: str, payload: dict[str, Any]) -> None:
        life, out = self.life, self.out
        if kind == "cache":
            event = CacheHit() if payload["hit"] else CacheMiss()
            await self._do(life.handle(event, trio.current_time()))
            return
        if k not in life.live:
            return  # a cancelled or finished attempt's last words
        now = trio.current_time()
        if kind == "route":  # a plan attempt's chain is ready
            for name in payload["route"]:
                if name not in out.route:
                    out.route.append(name)
            out.served_by = payload["served_by"]
            await self._emit("route", {"served_by": out.served_by, "route": list(out.route)})
        elif kind == "tokens":
            if life.winner != k:
                await self._do(life.handle(FirstToken(k), now))
                await self._announce(k)
            if out.first_at is None:
                out.first_at = time.perf_counter()
                out.ttft_ms = (out.first_at - out.started) * 1000
                self.journal("first_token", {"target": out.served_by or self._names[k],
                                             "ttft_ms": round(out.ttft_ms, 3)})
            out.tokens.extend(payload["ids"])
            out.text.append(payload["text"])
            await self._emit("tokens", payload)
        elif kind == "done":
            if life.winner != k:
                await self._announce(k)
            await self._do(life.handle(Finished(k), now))
        elif kind == "error":
            await self._do(life.handle(self._failure(k, payload["exc"]), now))

    def _failure(self, k: int, exc: BaseException) -> object:
        """The machine's event for attempt ``k``'s error, noted in the outcome and journal."""
        out, name, reason = self.out, self._names[k], str(exc)
        self._stage_failure = exc if isinstance(exc, StageFailure) else None
        code = getattr(exc, "code", ErrorCode.PEER_GONE)
        if not isinstance(exc, PeerGoneError | BusyError | RemoteError):
            code = ErrorCode.INTERNAL
        out.error, out.error_code = reason, code
        if isinstance(exc, StageFailure):
            names = {h.peer_id: h.name for h in self.last_plan.hops} if self.last_plan else {}
            out.retries.append({"target": ",".join(names.get(p, p) for p in sorted(exc.culprits)),
                                "reason": reason, "after_tokens": len(out.tokens)})
            log.info("pipeline stage failed attempt=%d error=%s", k, exc)
            return StageFailed(k, frozenset(exc.culprits), str(code), reason, self.gone)
        is_busy = isinstance(exc, BusyError) or code == ErrorCode.BUSY
        out.retries.append({"target": name, "reason": reason, "busy": is_busy,
                            "after_tokens": len(out.tokens)})
        self.journal("retry", {"target": name, "reason": reason, "after_tokens": len(out.tokens)})
        if is_busy:
            return Busy(k, getattr(exc, "wait_ms", None), reason, self.gone)
        return Failed(k, str(code), reason, self.gone)

    # ------------------------------------------------------------------ what to do

    async def _do(self, acts: list[Action]) -> None:
        for a in acts:
            if isinstance(a, Send):
                await self._launch_node(a)
            elif isinstance(a, SendPlan):
                await self._launch_plan(a)
            elif isinstance(a, Cancel):
                scope = self._scopes.pop(a.attempt, None)
                if scope is not None:
                    scope.cancel()
            elif isinstance(a, ArmTimer):
                self._timers[a.kind] = a.at
            elif isinstance(a, Redecide):
                await self._redecide(a)
            elif isinstance(a, BackToRefuser):
                if a.instead_of is not None:
                    self.journal("back_to_refuser", {
                        "target": self._name(a.peer), "predicted_ms": round(a.predicted_ms, 1),
                        "instead_of": self._name(a.instead_of)})
            elif isinstance(a, Finish):
                self._timers.clear()
            elif isinstance(a, Fail):
                self._timers.clear()
                self.out.error, self.out.error_code = a.reason, a.code
            elif isinstance(a, Release):
                held, self._held = self._held, []
                for kind, payload in held:
                    await self.sink(kind, payload)
            elif isinstance(a, ServeCached):
                self._timers.clear()
                self._held = []
                self.cached = a
            # Drop: the failure is noted already; the sibling runs on

    def _name(self, peer: str) -> str:
        t = self.targets.get(peer)
        return t.name if t is not None else peer

    async def _launch_node(self, a: Send) -> None:
        target = replace(self.targets[a.peer], max_wait_ms=a.max_wait_ms)
        resume = list(self.out.tokens)
        if a.hedge:
            primary = next((self._names[k] for k in sorted(self.life.live) if k != a.attempt), "")
            after = self._hedge_ms
            self.out.hedges.append({"target": target.name,
                                    "after_ms": round(after, 1) if after is not None else None})
            self.journal("hedge", {"target": target.name, "primary": primary})
        else:
            self.journal("forwarded" if not target.is_local else "routed",
                         {"target": target.name, "resume_tokens": len(resume)})
        self._names[a.attempt] = target.name
        self._started()
        assert self._nursery is not None
        await self._nursery.start(self._run, a, target, resume)

    async def _launch_plan(self, a: SendPlan) -> None:
        self.last_plan = a.plan
        self._plans.add(a.attempt)
        self._names[a.attempt] = " -> ".join(h.name for h in a.plan.hops)
        self._started()
        assert self._nursery is not None
        await self._nursery.start(self._run, a, None, list(self.out.tokens))

    def _started(self) -> None:
        """The first attempt goes out: the outcome's times (TTFT, total) count from here, not
        from a wait for the cache's lookup."""
        if not self._sent:
            self._sent = True
            self.out.started = time.perf_counter()

    async def _run(self, a: Send | SendPlan, target: Target | None, resume: list[int],
                   task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        with trio.CancelScope() as scope:
            self._scopes[a.attempt] = scope
            task_status.started()
            chan = _Tagged(self._send, a.attempt)
            try:
                await self.start(a, target, resume, chan)
            except Exception as e:  # reported, never raised into the loop
                await chan.send(("error", {"exc": e}))

    async def _announce(self, k: int) -> None:
        """Tell the client who serves, and through which nodes: after a failover the route is the
        path of the node now serving (the nodes that failed are in ``out.retries``). A plan
        attempt announced its chain when it was ready."""
        if k in self._plans:
            return
        peer = self.life.peer_of(k)
        t = self.targets[peer]
        out = self.out
        out.route = [t.name] if t.is_local else [self.entry_name, t.name]
        out.served_by = t.name
        await self._emit("route", {"served_by": t.name, "route": list(out.route)})

    async def _redecide(self, a: Redecide) -> None:
        now = trio.current_time()
        if self.redecide is None:
            await self._do(self.life.handle(NoRoute("no new decision here"), now))
            return
        try:
            failed = self._stage_failure
            d, targets = await self.redecide(a, self.last_plan if failed else None, failed,
                                             len(self.out.tokens))
        except RoutingError as e:
            self.journal("failed", {"error": f"{a.after}; no replacement: {e}"})
            await self._do(self.life.handle(NoRoute(str(e)), trio.current_time()))
            return
        self.targets.update(targets)
        if d.plan is not None:
            event = Decided(plan=d.plan)
        else:
            event = Decided(route_from(d.route.order, targets, d.hedge_ms))
        await self._do(self.life.handle(event, trio.current_time()))


class _Tagged:
    def __init__(self, send: trio.MemorySendChannel[Any], idx: int) -> None:
        self._send = send
        self._idx = idx

    async def send(self, item: Any) -> None:
        kind, payload = item
        await self._send.send((self._idx, kind, payload))
