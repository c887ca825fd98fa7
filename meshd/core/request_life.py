"""A request's life after the route decision: one sans-I/O state machine.

``decide()`` says where a request goes first; ``RequestLife`` says what happens next, whatever
happens: a first token, a busy answer (with the server's wait, or without), a dead peer, a
failed pipeline stage, a hedge deadline, a first token that never comes, an answer from the
cache. Events go in with the time; actions come out: send an attempt to a peer (or a plan to its
stages), cancel one, arm a timer, decide again, serve the cached answer, finish, or fail with a
code. It reads no clock and does no I/O. The daemon's execute step (``meshd.node.forward``, a
thin trio loop) and the simulator (``meshd.sim.entry``, its event loop) drive this very class,
so what the simulator measures is what the daemon does.

The rules, one for both:

- **Attempts.** A request fails after ``max_attempts`` counted failures (``MAX_ATTEMPTS``, 3:
  the first try and two more). A failure counts when it leaves the request with nothing
  running: a busy answer without a usable wait, a dead or silent peer, a failed pipeline stage,
  no first token within ``first_token_timeout_s``. A copy that fails while its hedge sibling
  runs on is dropped without counting; a wait refusal (below) costs a round trip, not an
  attempt. A failure past ``timeout_s`` after the request arrived ends it too.
- **After a failure.** First the copy that lost a hedge race, if any (it did nothing wrong),
  then the next peer of the decision's order that was not tried and is not known dead, then
  (the order spent) the soonest peer that only refused for its wait bound, unbounded; when
  nothing is left, or the failed attempt was a pipeline, decide again (``Redecide``) with
  every peer tried so far (and every stage blamed) excluded: the new decision may be one node
  or a pipeline, whatever the first one was; none fails the request with ``no_route``. A resumed attempt carries the tokens streamed so
  far (the driver's business), so greedy output is identical whoever serves it.
- **Wait refusals** (``meshd.core.admission``): an attempt sent with a wait bound that the
  server cannot meet is answered busy with its wait; the request goes on to the next peer of
  the order, and once the planned bounded attempts are spent, to whichever is predicted sooner
  (``admission.after_refusals``): the next peer, checked against the best refuser's wait, or
  back to that refuser without a bound.
- **Hedging**: at most one hedge per request, armed by the first decision at ``hedge_ms`` after
  the first send: if no first token has come by then, a copy goes to the next untried peer of
  the order, without a wait bound (as every later attempt of a hedged request). The first copy
  with a token (or the answer) wins; the others are cancelled.
- **Pipelines** are never hedged; a failed stage counts one failure, blames its culprits, and
  the request decides again (above).
- **The cache**: an answer from the semantic cache cancels every attempt and is served.

Peers are whatever the driver names them by (a peer id in the daemon, a node index in the
simulator): anything hashable. Attempts are numbered from 0; ``copy`` says which copy of a
hedged request carries an attempt (0 the original, 1 the hedge): an attempt after a failure
stays on the copy that failed.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from meshd.core.admission import after_refusals
from meshd.core.decide import Decision
from meshd.core.snapshot import Policy
from meshd.errors import ErrorCode

MAX_ATTEMPTS = 3  # counted failures before a request fails (see the module's docstring)

P = TypeVar("P", bound=Hashable)

NO_GONE: frozenset[Any] = frozenset()


@dataclass(frozen=True, slots=True)
class Route(Generic[P]):
    """A one-node decision as the machine needs it: the peers in order, the wait bound of each
    early attempt (``Decision.wait_bounds``), each peer's predicted TTFT with its known part
    (RTT and prefill, for ``after_refusals``; only needed where there are bounds), and the hedge
    deadline."""

    order: tuple[P, ...]
    bounds: Mapping[P, float] = field(default_factory=dict)
    pred: Mapping[P, tuple[float | None, float | None]] = field(default_factory=dict)
    hedge_ms: float | None = None


def route_of(d: Decision, key: Callable[[str], P]) -> Route[P]:
    """``d.route`` as a ``Route``, peers named by ``key(peer_id)``."""
    r = d.route
    assert r is not None
    pred: dict[P, tuple[float | None, float | None]] = {}
    if d.wait_bounds:
        for c in r.candidates:
            if c.predicted_ttft_ms is not None and c.excluded_by is None:
                pred[key(c.peer_id)] = (c.predicted_ttft_ms, c.predicted_ttft_ms - c.queue_wait_ms)
    return Route(tuple(key(p) for p in r.order), {key(p): ms for p, ms in d.wait_bounds.items()},
                 pred, d.hedge_ms)


# ------------------------------------------------------------------------------------ events in


@dataclass(frozen=True, slots=True)
class Decided:
    """A decision (the first, or one ``Redecide`` asked for): ``route`` for one node with
    fallbacks, else ``plan`` (opaque here: the driver runs it)."""

    route: Route[Any] | None = None
    plan: Any = None


@dataclass(frozen=True, slots=True)
class NoRoute:
    """``decide()`` found no node (``reason``: its message)."""

    reason: str


@dataclass(frozen=True, slots=True)
class FirstToken:
    """Attempt ``attempt``'s first token reached the entry node."""

    attempt: int


@dataclass(frozen=True, slots=True)
class Finished:
    """Attempt ``attempt`` delivered the whole answer."""

    attempt: int


@dataclass(frozen=True, slots=True)
class Busy:
    """The attempt's peer answered busy: with ``wait_ms``, the wait it would have needed (a
    refusal, if the attempt carried a bound), else nothing usable."""

    attempt: int
    wait_ms: float | None = None
    reason: str = "busy"
    gone: Container[Any] = NO_GONE  # peers the entry node knows dead now (skipped)


@dataclass(frozen=True, slots=True)
class Failed:
    """The attempt failed: its peer died, stalled, or answered an error (``code``)."""

    attempt: int
    code: str = ErrorCode.PEER_GONE
    reason: str = "peer gone"
    gone: Container[Any] = NO_GONE


@dataclass(frozen=True, slots=True)
class StageFailed:
    """A stage of the pipeline attempt failed; ``culprits`` are the peers to plan around."""

    attempt: int
    culprits: frozenset[Any] = frozenset()
    code: str = ErrorCode.PEER_GONE
    reason: str = "a stage failed"
    gone: Container[Any] = NO_GONE


@dataclass(frozen=True, slots=True)
class Expired:
    """The attempt's server dropped it: not started within the request's deadline."""

    attempt: int
    code: str = "timeout"


@dataclass(frozen=True, slots=True)
class HedgeDue:
    """The hedge timer (``ArmTimer("hedge")``) went off."""

    gone: Container[Any] = NO_GONE


@dataclass(frozen=True, slots=True)
class FirstTokenLate:
    """The first-token timer (``ArmTimer("first_token")``) went off."""

    gone: Container[Any] = NO_GONE


@dataclass(frozen=True, slots=True)
class CacheHit:
    """The semantic cache answered the request."""


@dataclass(frozen=True, slots=True)
class GiveUp:
    """The request is abandoned (the driver's run ended, the client went away)."""

    code: str
    reason: str = ""


# ---------------------------------------------------------------------------------- actions out


@dataclass(frozen=True, slots=True)
class Send:
    """Start attempt ``attempt`` on ``peer`` (with the tokens streamed so far), bounded by
    ``max_wait_ms`` (None: no bound); ``hedge``: a second copy, the first still running."""

    attempt: int
    peer: Any
    max_wait_ms: float | None
    copy: int
    hedge: bool = False


@dataclass(frozen=True, slots=True)
class SendPlan:
    """Start attempt ``attempt`` along ``plan``'s stages (with the tokens streamed so far)."""

    attempt: int
    plan: Any
    copy: int


@dataclass(frozen=True, slots=True)
class Cancel:
    """Stop attempt ``attempt`` (``why``: "lost", another copy answered first; "done"; "late",
    no first token in time; "cached")."""

    attempt: int
    peer: Any
    why: str


@dataclass(frozen=True, slots=True)
class Drop:
    """Attempt ``attempt`` failed while a sibling runs on: nothing follows from it."""

    attempt: int


@dataclass(frozen=True, slots=True)
class ArmTimer:
    """Feed ``HedgeDue`` (kind "hedge") or ``FirstTokenLate`` ("first_token") at ``at``."""

    kind: str
    at: float


@dataclass(frozen=True, slots=True)
class Redecide:
    """Call ``decide()`` again, on a fresh snapshot, with ``exclude`` left out; feed back
    ``Decided`` or ``NoRoute``. ``after``: the failure that led here."""

    exclude: frozenset[Any]
    after: str


@dataclass(frozen=True, slots=True)
class BackToRefuser:
    """(A note for the journal) the request goes back to ``peer``, which refused it earlier and
    is predicted sooner (``predicted_ms``) than ``instead_of``."""

    peer: Any
    predicted_ms: float
    instead_of: Any


@dataclass(frozen=True, slots=True)
class Finish:
    """The request is answered by attempt ``attempt``."""

    attempt: int


@dataclass(frozen=True, slots=True)
class ServeCached:
    """Answer the request from the cache."""


@dataclass(frozen=True, slots=True)
class Fail:
    """The request failed for good: tell the client ``code`` and ``reason``."""

    code: str
    reason: str


Action = Send | SendPlan | Cancel | Drop | ArmTimer | Redecide | BackToRefuser | Finish | ServeCached | Fail


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
        "first_token", "first_token_at", "code", "reason", "_next_id", "_carry", "_raced",
    )  # fmt: skip

    def __init__(self, *, started_s: float, max_attempts: int = MAX_ATTEMPTS,
                 timeout_s: float | None = None, first_token_timeout_s: float | None = None,
                 policy: Policy | None = None) -> None:
        self.max_attempts = max_attempts
        self.started_s = started_s
        self.timeout_s = timeout_s
        self.first_token_timeout_s = first_token_timeout_s
        self.policy = policy or Policy()
        self.state = "deciding"  # deciding, running, redeciding, done, failed, cached
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
        self._next_id = 0
        self._carry = 0  # the copy the next attempt after a failure rides on
        self._raced = False  # the hedge race is decided

    # ------------------------------------------------------------------------------ reading

    @property
    def over(self) -> bool:
        return self.state in ("done", "failed", "cached")

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

    def copy_of(self, attempt: int) -> int:
        a = self.live.get(attempt)
        return a.copy if a is not None else 0

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
            return self._no_route(ev.reason)
        if isinstance(ev, HedgeDue):
            return self._hedge_due(ev.gone, now)
        if isinstance(ev, FirstTokenLate):
            return self._first_token_late(ev.gone, now)
        if isinstance(ev, Expired):
            return self._expired(ev.attempt, ev.code)
        if isinstance(ev, CacheHit):
            return self._end("cached", "cached", ServeCached())
        if isinstance(ev, GiveUp):
            self.code, self.reason = ev.code, ev.reason or ev.code
            return self._end("failed", "gave up", Fail(self.code, self.reason))
        raise TypeError(f"not an event of a request's life: {ev!r}")

    def _decided(self, ev: Decided, now: float) -> list[Action]:
        if self.state not in ("deciding", "redeciding"):
            return []
        first = self.decisions == 0
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

    def _no_route(self, reason: str) -> list[Action]:
        if self.decisions:
            reason = f"{self.reason}; no node left to try: {reason}"
        self.code, self.reason = ErrorCode.NO_ROUTE.value, reason
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

    def _end(self, state: str, why: str, last: Action) -> list[Action]:
        keep = last.attempt if isinstance(last, Finish) else -1
        out: list[Action] = [Cancel(k, a.peer, why) for k, a in sorted(self.live.items()) if k != keep]
        self.live.clear()
        self.state = state
        self.hedge_at = self.first_token_at = None
        out.append(last)
        return out
