"""``RequestLife``: the state machine of one request after its decision (the rules are in
``meshd.core.request_life``'s docstring)."""

from __future__ import annotations

from collections.abc import Container, Mapping
from dataclasses import dataclass
from typing import Any, Generic

from meshd.core.admission import after_refusals
from meshd.core.request_life.events import (
    Action,
    ArmTimer,
    BackToRefuser,
    Busy,
    CacheHit,
    CacheLookup,
    CacheMiss,
    Cancel,
    Decided,
    Drop,
    Expired,
    Fail,
    Failed,
    Finish,
    Finished,
    FirstToken,
    FirstTokenLate,
    GiveUp,
    HedgeDue,
    NoRoute,
    P,
    Redecide,
    Release,
    Send,
    SendPlan,
    ServeCached,
    StageFailed,
)
from meshd.core.snapshot import Policy
from meshd.errors import ErrorCode

MAX_ATTEMPTS = 3  # counted failures before a request fails (see meshd.core.request_life)


@dataclass(slots=True)
class _Attempt:
    peer: Any  # None for a plan
    plan: Any
    copy: int
    bound: float | None


class RequestLife(Generic[P]):
    """One request after its first decision (see the module's docstring for the rules).

    ``started_s``: when the request arrived, on the driver's clock (``timeout_s`` counts from
    it; None: no deadline here). ``first_token_timeout_s``: how long a one-node attempt may go
    without a first token (None: never checked; pipelines have their own step deadlines).
    ``policy``: the wait-bound settings ``after_refusals`` reads.
    """

    __slots__ = (
        "max_attempts", "started_s", "timeout_s", "first_token_timeout_s", "policy", "state",
        "attempts", "retries", "refusals", "hedges", "hedge_won", "decisions", "live", "winner",
        "tried", "losers", "order", "pos", "bounds", "pred", "refused", "hedge_at", "hedged",
        "first_token", "first_token_at", "code", "reason", "cache", "here", "_next_id", "_carry",
        "_raced", "_parked", "_held",
    )  # fmt: skip

    def __init__(self, *, started_s: float, max_attempts: int = MAX_ATTEMPTS,
                 timeout_s: float | None = None, first_token_timeout_s: float | None = None,
                 policy: Policy | None = None) -> None:
        self.max_attempts = max_attempts
        self.started_s = started_s
        self.timeout_s = timeout_s
        self.first_token_timeout_s = first_token_timeout_s
        self.policy = policy or Policy()
        # deciding, running, redeciding, waiting (for the cache: the end is settled), done,
        # failed, cached
        self.state = "deciding"
        self.attempts = 0  # counted failures
        self.retries = 0  # the same, as statistics (the failure that ends the request too)
        self.refusals = 0  # wait refusals
        self.hedges = 0
        self.hedge_won = 0  # races won by the hedge copy
        self.decisions = 0
        self.live: dict[int, _Attempt] = {}
        self.winner: int | None = None
        self.tried: set[P] = set()  # peers sent to, and stages blamed
        self.losers: list[P] = []  # peers whose copy lost a hedge race: next in line
        self.order: list[P] = []
        self.pos = 0
        self.bounds: dict[P, float] | None = None
        self.pred: Mapping[P, tuple[float | None, float | None]] = {}
        self.refused: list[tuple[float, P]] = []  # (predicted TTFT back there, peer)
        self.hedge_at: float | None = None
        self.hedged = False
        self.first_token = False
        self.first_token_at: float | None = None
        self.code = ErrorCode.NO_ROUTE.value
        self.reason = "no node could serve the request"
        self.cache: str | None = None  # the semantic lookup: None (none), pending, answered
        self.here: Any = None  # the driver's own node (CacheLookup)
        self._parked: Decided | None = None  # a first decision waiting for the lookup
        self._held: tuple[str, Action] | None = None  # the end waiting for it (state, action)
        self._next_id = 0
        self._carry = 0  # the copy the next attempt after a failure rides on
        self._raced = False  # the hedge race is decided

    # ------------------------------------------------------------------------------ reading

    @property
    def over(self) -> bool:
        return self.state in ("done", "failed", "cached")

    @property
    def held(self) -> bool:
        """A cache lookup is pending: what the attempts emit is held back from the client."""
        return self.cache == "pending"

    @property
    def racing(self) -> bool:
        """Two copies run and neither has a token yet."""
        return self.winner is None and len(self.live) > 1

    def peer_of(self, attempt: int) -> Any:
        a = self.live.get(attempt)
        return a.peer if a is not None else None

    def bound_of(self, attempt: int) -> float | None:
        """The wait bound attempt ``attempt`` was sent with (None: none, or not running)."""
        a = self.live.get(attempt)
        return a.bound if a is not None else None

    # ------------------------------------------------------------------------------ events

    def handle(self, ev: object, now: float) -> list[Action]:
        """Take one event at time ``now``; the actions to carry out, in order."""
        if self.over:
            return []
        if isinstance(ev, FirstToken):
            return self._first_token(ev.attempt)
        if isinstance(ev, Finished):
            return self._finished(ev.attempt)
        if isinstance(ev, Busy):
            return self._busy(ev, now)
        if isinstance(ev, Failed):
            return self._failed(ev.attempt, ev.code, ev.reason, ev.gone, now)
        if isinstance(ev, StageFailed):
            if ev.attempt in self.live:
                self.tried.update(ev.culprits)
            return self._failed(ev.attempt, ev.code, ev.reason, ev.gone, now)
        if isinstance(ev, Decided):
            return self._decided(ev, now)
        if isinstance(ev, NoRoute):
            if self.state not in ("deciding", "redeciding"):
                return []
            return self._no_route(ev.reason, ev.code)
        if isinstance(ev, HedgeDue):
            return self._hedge_due(ev.gone, now)
        if isinstance(ev, FirstTokenLate):
            return self._first_token_late(ev.gone, now)
        if isinstance(ev, Expired):
            return self._expired(ev.attempt, ev.code)
        if isinstance(ev, CacheLookup):
            if self.state == "deciding" and self.cache is None:
                self.cache, self.here = "pending", ev.here
            return []
        if isinstance(ev, CacheHit):
            return self._cache_hit()
        if isinstance(ev, CacheMiss):
            return self._cache_miss(now)
        if isinstance(ev, GiveUp):
            self.code, self.reason = ev.code, ev.reason or ev.code
            return self._end("failed", "gave up", Fail(self.code, self.reason), wait=False)
        raise TypeError(f"not an event of a request's life: {ev!r}")

    def _decided(self, ev: Decided, now: float) -> list[Action]:
        if self.state not in ("deciding", "redeciding"):
            return []
        first = self.decisions == 0
        if first and self.cache == "pending" and (ev.route is None or ev.route.order[:1] == (self.here,)):
            self._parked = ev  # this node's model would share its cores with the embedding
            return []
        self.decisions += 1
        self.state = "running"
        self.refused = []
        if ev.route is None:
            self.order, self.pos, self.bounds, self.pred = [], 0, None, {}
            return self._send_plan(ev.plan)
        r = ev.route
        if not r.order:
            return self._no_route("the decision named no node")
        self.order = list(r.order)
        self.pos = 0
        self.bounds = dict(r.bounds) if r.bounds else None
        self.pred = r.pred
        out = self._send(self.order[0], now)
        if first and r.hedge_ms is not None:
            self.hedge_at = now + r.hedge_ms / 1000.0
            out.append(ArmTimer("hedge", self.hedge_at))
        return out

    def _no_route(self, reason: str, code: str = ErrorCode.NO_ROUTE.value) -> list[Action]:
        if self.decisions:
            reason = f"{self.reason}; no node left to try: {reason}"
        self.code, self.reason = str(code), reason
        return self._end("failed", "no route", Fail(self.code, reason))

    def _first_token(self, attempt: int) -> list[Action]:
        if attempt not in self.live:
            return []
        self.first_token = True
        self.hedge_at = None
        self.first_token_at = None
        if self.winner is not None:
            return []
        out: list[Action] = []
        if self.hedged and not self._raced:
            self._raced = True
            if self.live[attempt].copy != 0:
                self.hedge_won += 1
        self.winner = attempt
        for k in sorted(self.live):
            if k != attempt:
                a = self.live.pop(k)
                if a.peer is not None and a.peer not in self.losers:
                    self.losers.append(a.peer)
                out.append(Cancel(k, a.peer, "lost"))
        return out

    def _finished(self, attempt: int) -> list[Action]:
        if attempt not in self.live:
            return []
        self.winner = attempt
        return self._end("done", "done", Finish(attempt))

    def _busy(self, ev: Busy, now: float) -> list[Action]:
        a = self.live.get(ev.attempt)
        if a is None:
            return []
        if ev.wait_ms is None or a.bound is None or self.hedged or self.bounds is None:
            return self._failed(ev.attempt, ErrorCode.BUSY.value, ev.reason, ev.gone, now)
        # a wait refusal: costs a round trip, not an attempt
        del self.live[ev.attempt]
        self._carry = a.copy
        self.refusals += 1
        known = self.pred.get(a.peer, (0.0, 0.0))[1] or 0.0
        self.refused.append((ev.wait_ms + known, a.peer))
        order, bounds, gone = self.order, self.bounds, ev.gone
        self.pos += 1
        while self.pos < len(order) and (order[self.pos] in gone or order[self.pos] in self.tried):
            self.pos += 1
        nxt = order[self.pos] if self.pos < len(order) else None
        out: list[Action] = []
        if nxt is None or nxt not in bounds:
            # the planned bounds are spent: the next peer, checked against the best refuser's
            # wait, or back to the refuser predicted sooner, unbounded
            nxt_ms, nxt_known = self.pred.get(nxt, (None, 0.0)) if nxt is not None else (None, 0.0)
            k, bound = after_refusals(nxt_ms, nxt_known, [ms for ms, _ in self.refused], self.policy)
            if k is not None:
                best_ms, best = self.refused.pop(k)
                bounds.pop(best, None)
                self.tried.discard(best)
                order.insert(self.pos, best)
                out.append(BackToRefuser(best, best_ms, nxt))
            elif bound is not None:
                assert nxt is not None
                bounds[nxt] = bound
        out.extend(self._send(order[self.pos], now))
        return out

    def _failed(self, attempt: int, code: str, reason: str, gone: Container[Any],
                now: float) -> list[Action]:
        a = self.live.pop(attempt, None)
        if a is None:
            return []
        if self.winner == attempt:
            self.winner = None
        self.code, self.reason = str(code), reason
        if self.live:  # a sibling runs on
            return [Drop(attempt)]
        self._carry = a.copy
        return self._next(a.plan is not None, gone, now)

    def _expired(self, attempt: int, code: str) -> list[Action]:
        if self.live.pop(attempt, None) is None:
            return []
        if self.live:
            return [Drop(attempt)]
        self.code, self.reason = code, "not started within the request's deadline"
        return self._end("failed", "expired", Fail(self.code, self.reason))

    def _first_token_late(self, gone: Container[Any], now: float) -> list[Action]:
        at = self.first_token_at
        if at is None or now < at or self.winner is not None or not self.live:
            return []
        self.first_token_at = None
        out: list[Action] = []
        plan = False
        for k in sorted(self.live):
            a = self.live.pop(k)
            plan = plan or a.plan is not None
            self._carry = min(self._carry, a.copy) if out else a.copy
            out.append(Cancel(k, a.peer, "late"))
        self.code, self.reason = ErrorCode.DEADLINE.value, "no first token in time"
        out.extend(self._next(plan, gone, now))
        return out

    def _next(self, after_plan: bool, gone: Container[Any], now: float) -> list[Action]:
        """A counted failure left nothing running: the next attempt, a new decision, or the end."""
        self.attempts += 1
        self.retries += 1
        if self.attempts >= self.max_attempts or (
                self.timeout_s is not None and now - self.started_s > self.timeout_s):
            return self._end("failed", "attempts", Fail(self.code, self.reason))
        while self.losers:
            peer = self.losers.pop(0)
            if peer not in gone:
                return self._send(peer, now)
        if not after_plan:
            order = self.order
            self.pos += 1
            while self.pos < len(order) and (order[self.pos] in gone or order[self.pos] in self.tried):
                self.pos += 1
            if self.pos < len(order):
                return self._send(order[self.pos], now)
            if self.refused:  # back to the soonest node that only refused, unbounded
                k = min(range(len(self.refused)), key=lambda i: self.refused[i][0])
                best_ms, best = self.refused.pop(k)
                if self.bounds is not None:
                    self.bounds.pop(best, None)
                order.insert(self.pos, best)
                return [BackToRefuser(best, best_ms, None), *self._send(best, now)]
        self.state = "redeciding"
        return [Redecide(frozenset(self.tried), self.reason)]

    def _cache_hit(self) -> list[Action]:
        if self.cache != "pending":
            return []  # no lookup, or the answer is the client's already
        self.cache = "answered"
        self._parked = None
        held, self._held = self._held, None
        if held is not None and isinstance(held[1], Finish):
            model: str | None = "dropped"
        else:
            model = "cancelled" if self._next_id else None
        return self._end("cached", "cached", ServeCached(model), wait=False)

    def _cache_miss(self, now: float) -> list[Action]:
        if self.cache != "pending":
            return []
        self.cache = "answered"
        out: list[Action] = [Release()]
        held, self._held = self._held, None
        parked, self._parked = self._parked, None
        if held is not None:
            self.state = held[0]
            out.append(held[1])
        elif parked is not None:
            out.extend(self._decided(parked, now))
        return out

    def _hedge_due(self, gone: Container[Any], now: float) -> list[Action]:
        at = self.hedge_at
        if at is None or now < at:
            return []
        self.hedge_at = None
        if self.first_token or self.hedged or len(self.live) != 1 or self.state != "running":
            return []
        order = self.order
        nxt = next((i for i in range(self.pos + 1, len(order))
                    if order[i] not in self.tried and order[i] not in gone), -1)
        if nxt < 0:
            return []
        self.hedged = True
        self.hedges += 1
        self.pos = nxt
        return self._send(order[nxt], now, copy=1, hedge=True)

    # ------------------------------------------------------------------------------ helpers

    def _send(self, peer: P, now: float, *, copy: int | None = None, hedge: bool = False
              ) -> list[Action]:
        c = self._carry if copy is None else copy
        bound = None if (self.hedged or self.bounds is None) else self.bounds.get(peer)
        k = self._next_id
        self._next_id += 1
        self.live[k] = _Attempt(peer, None, c, bound)
        self.tried.add(peer)
        out: list[Action] = [Send(k, peer, bound, c, hedge)]
        if not hedge and self.first_token_timeout_s is not None:
            self.first_token_at = now + self.first_token_timeout_s
            out.append(ArmTimer("first_token", self.first_token_at))
        return out

    def _send_plan(self, plan: Any) -> list[Action]:
        k = self._next_id
        self._next_id += 1
        self.live[k] = _Attempt(None, plan, self._carry, None)
        self.first_token_at = None
        return [SendPlan(k, plan, self._carry)]

    def _end(self, state: str, why: str, last: Action, *, wait: bool = True) -> list[Action]:
        """End in ``state`` with ``last``, every other attempt cancelled; with ``wait``, while a
        cache lookup is pending, ``last`` waits for it (``_cache_hit``, ``_cache_miss``)."""
        keep = last.attempt if isinstance(last, Finish) else -1
        out: list[Action] = [Cancel(k, a.peer, why) for k, a in sorted(self.live.items()) if k != keep]
        self.live.clear()
        self.hedge_at = self.first_token_at = None
        if wait and self.cache == "pending":
            self.state, self._held = "waiting", (state, last)
            return out
        self.state = state
        out.append(last)
        return out
