"""The execute step for one node: serve or forward a request, fail over, hedge.

``serve_request`` turns one routed request into a stream of events for the client. The route
comes from the pure ``meshd.core.decide.decide`` over a snapshot (the entry chain's route step);
this module does the I/O the decision asks for:

- the chosen node runs it (this node, or a peer over its long-lived request stream);
- if no first token arrives by the hedge deadline, a second copy goes to the next-best node and
  the first to answer wins (the other is cancelled);
- if the serving node dies, stalls or answers busy, the request moves to the next candidate;
  after k tokens it resumes there from the prompt plus those k tokens, so the client sees one
  uninterrupted stream (identical under greedy decoding);
- a first attempt may carry a wait bound (``meshd.core.admission``): a node that cannot start
  the request within it answers busy at once with its estimated wait, and the request moves on;
  the last attempt goes to whichever is predicted sooner, the next candidate or the refuser that
  reported the shortest wait;
- every decision, retry, hedge and the outcome go to the journal.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any

import trio

from meshd.core.admission import after_refusals
from meshd.core.routing import RouteDecision
from meshd.core.snapshot import Policy
from meshd.errors import BusyError, ErrorCode, PeerGoneError, RemoteError

log = logging.getLogger(__name__)

MAX_ATTEMPTS = 4


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
    started: float = field(default_factory=time.perf_counter)
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


Sink = Callable[[str, dict[str, Any]], Awaitable[None]]


async def serve_request(
    decision: RouteDecision,
    targets: dict[str, Target],
    start_attempt: Callable[[Target, list[int], trio.MemorySendChannel[Any]], Awaitable[None]],
    sink: Sink,
    *,
    entry_name: str,
    hedge_after_s: float | None,
    first_token_timeout_s: float,
    journal: Callable[[str, dict[str, Any]], None],
    policy: Policy | None = None,
) -> Outcome:
    """Run the request along ``decision.order`` with failover and hedging (``policy``: the
    wait-bound settings of checked attempts after refusals; None: the defaults).

    ``start_attempt(target, resume_ids, channel)`` runs one attempt and reports on ``channel``
    tuples ``(kind, payload)`` with kind "tokens" ({"ids", "text"}), "done" ({"stats"}), or
    "error" ({"exc"}). ``sink(kind, payload)`` forwards events to the client: "route" and
    "tokens".
    """
    out = Outcome()
    policy = policy or Policy()
    queue = [targets[p] for p in decision.order if p in targets]
    refused: list[tuple[float, Target]] = []  # (predicted TTFT back there, who) after wait refusals
    attempts = 0
    while True:
        if not queue and refused:  # nobody else: back to the soonest node that was only busy
            queue.append(replace(min(refused, key=lambda r: r[0])[1], max_wait_ms=None))
            refused.clear()
        if not queue or attempts >= MAX_ATTEMPTS:
            out.error = out.error or "no candidate could serve the request"
            out.error_code = out.error_code or ErrorCode.NO_ROUTE
            break
        primary = queue.pop(0)
        if primary.max_wait_ms is None and refused:
            primary = _after_refusals(primary, queue, refused, policy, journal)
        attempts += 1
        n_refused = len(refused)
        result = await _race(primary, queue, out, start_attempt, sink, entry_name,
                             hedge_after_s if not out.tokens else None,
                             first_token_timeout_s, journal, refused)
        if result == "done":
            out.error = out.error_code = None
            break
        if len(refused) > n_refused:
            attempts -= 1  # a wait refusal costs a round trip, not one of the attempts
        # failed: move on (the failed target is not retried, except as _after_refusals says)
    out.ended = time.perf_counter()
    return out


def _after_refusals(
    nxt: Target, queue: list[Target], refused: list[tuple[float, Target]], policy: Policy,
    journal: Callable[[str, dict[str, Any]], None],
) -> Target:
    """The planned bounded attempts are over: go on to ``nxt``, bounded by the best refuser's
    wait while checks are left, or back to the refuser whose reported wait makes it sooner,
    without a bound (``meshd.core.admission.after_refusals``, the simulator's rule too). A
    refuser gone back to leaves ``refused``."""
    k, bound = after_refusals(nxt.predicted_ms, nxt.known_ms, [ms for ms, _ in refused], policy)
    if k is None:
        return replace(nxt, max_wait_ms=bound)
    best_ms, best = refused.pop(k)
    queue.insert(0, nxt)
    journal("back_to_refuser", {"target": best.name, "predicted_ms": round(best_ms, 1),
                                "instead_of": nxt.name})
    return replace(best, max_wait_ms=None)


async def _race(
    primary: Target,
    queue: list[Target],
    out: Outcome,
    start_attempt: Callable[[Target, list[int], trio.MemorySendChannel[Any]], Awaitable[None]],
    sink: Sink,
    entry_name: str,
    hedge_after_s: float | None,
    first_token_timeout_s: float,
    journal: Callable[[str, dict[str, Any]], None],
    refused: list[tuple[float, Target]],
) -> str:
    """One attempt (plus at most one hedge). Returns "done" or "failed"; a target that refused
    for its wait bound, with an estimate, goes to ``refused``."""
    send, recv = trio.open_memory_channel[Any](4096)
    resume = list(out.tokens)
    scopes: dict[int, trio.CancelScope] = {}
    names: dict[int, Target] = {}
    alive: set[int] = set()
    winner: list[int] = []
    losers: list[Target] = []  # cancelled because another copy answered first: still usable
    status = "failed"

    async def launch(idx: int, target: Target, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        with trio.CancelScope() as scope:
            scopes[idx] = scope
            names[idx] = target
            alive.add(idx)
            task_status.started()
            chan = _Tagged(send, idx)
            try:
                await start_attempt(target, resume, chan)  # type: ignore[arg-type]
            except Exception as e:  # reported, never raised into the race
                await chan.send(("error", {"exc": e}))
        alive.discard(idx)
        if scope.cancelled_caught:
            return

    async with trio.open_nursery() as nursery:
        await nursery.start(launch, 0, primary)
        journal("forwarded" if not primary.is_local else "routed",
                {"target": primary.name, "resume_tokens": len(resume)})
        route_sent = False
        deadline_first = trio.current_time() + first_token_timeout_s
        hedge_at = trio.current_time() + hedge_after_s if hedge_after_s else None
        next_idx = 1
        while True:
            timeout = deadline_first if not winner else None
            if hedge_at is not None and not winner:
                timeout = min(timeout, hedge_at) if timeout is not None else hedge_at
            if timeout is not None:
                with trio.move_on_at(timeout) as ms:
                    item = await recv.receive()
                if ms.cancelled_caught:
                    now = trio.current_time()
                    if hedge_at is not None and now >= hedge_at and queue:
                        hedge = queue.pop(0)
                        out.hedges.append({"target": hedge.name, "after_ms": round(hedge_after_s * 1000, 1)})  # type: ignore[operator]
                        journal("hedge", {"target": hedge.name, "primary": primary.name})
                        await nursery.start(launch, next_idx, hedge)
                        next_idx += 1
                        hedge_at = None
                        continue
                    hedge_at = None if hedge_at is not None and now >= hedge_at else hedge_at
                    if now >= deadline_first:
                        for idx in list(alive):
                            out.retries.append({"target": names[idx].name, "reason": "no first token in time"})
                        journal("retry", {"reason": "first-token timeout", "targets": [names[i].name for i in alive]})
                        nursery.cancel_scope.cancel()
                        break
                    continue
            else:
                item = await recv.receive()
            idx, (kind, payload) = item
            if winner and idx != winner[0]:
                continue
            if kind == "tokens":
                if not winner:
                    winner.append(idx)
                    for j, s in scopes.items():
                        if j != idx:
                            s.cancel()
                            if j in alive:
                                losers.append(names[j])
                    if not route_sent:
                        await _announce(out, names[idx], entry_name, sink)
                        route_sent = True
                if out.first_at is None:
                    out.first_at = time.perf_counter()
                    out.ttft_ms = (out.first_at - out.started) * 1000
                    journal("first_token", {"target": names[idx].name, "ttft_ms": round(out.ttft_ms, 3)})
                out.tokens.extend(payload["ids"])
                out.text.append(payload["text"])
                await sink("tokens", payload)
            elif kind == "done":
                if not winner:
                    winner.append(idx)
                    await _announce(out, names[idx], entry_name, sink)
                status = "done"
                nursery.cancel_scope.cancel()
                break
            elif kind == "error":
                exc = payload["exc"]
                reason = str(exc)
                target = names[idx]
                is_busy = isinstance(exc, BusyError) or getattr(exc, "code", "") == ErrorCode.BUSY
                out.retries.append({"target": target.name, "reason": reason, "busy": is_busy,
                                    "after_tokens": len(out.tokens)})
                wait_ms = getattr(exc, "wait_ms", None)
                if is_busy and target.max_wait_ms is not None and wait_ms is not None:
                    refused.append((wait_ms + (target.known_ms or 0.0), target))
                journal("retry", {"target": target.name, "reason": reason,
                                  "after_tokens": len(out.tokens)})
                code = getattr(exc, "code", ErrorCode.PEER_GONE)
                if not isinstance(exc, PeerGoneError | BusyError | RemoteError):
                    code = ErrorCode.INTERNAL
                out.error, out.error_code = reason, code
                if winner and idx == winner[0]:
                    nursery.cancel_scope.cancel()
                    break
                alive.discard(idx)
                if not alive:
                    nursery.cancel_scope.cancel()
                    break
    if status != "done":
        # a hedge copy that lost the race did nothing wrong: it is the next one to fail over to
        queue[:0] = [t for t in losers if t not in queue]
    return status


async def _announce(out: Outcome, t: Target, entry_name: str, sink: Sink) -> None:
    """Tell the client who serves, and through which nodes: after a failover the route is the
    path of the node now serving (the nodes that failed are in ``out.retries``)."""
    out.route = [t.name] if t.is_local else [entry_name, t.name]
    out.served_by = t.name
    await sink("route", {"served_by": t.name, "route": list(out.route)})


class _Tagged:
    def __init__(self, send: trio.MemorySendChannel[Any], idx: int) -> None:
        self._send = send
        self._idx = idx

    async def send(self, item: Any) -> None:
        await self._send.send((self._idx, item))
