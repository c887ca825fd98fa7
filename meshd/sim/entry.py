"""The entry node's side of a simulated request: the daemon's ``RequestLife``, driven by events.

After ``meshd.core.decide.decide`` (``Simulation.decide_request``), everything an entry node
does with a request is ``meshd.core.request_life.RequestLife``: the very machine the daemon's
execute step drives. The simulation turns what happens in its world into the machine's events
(a busy answer, a refusal with the server's wait, a peer found dead, a failed stage, the hedge
deadline, a first token that decides a hedge race, the answer) and carries out the actions
that come back: send an attempt (``Simulation.send``) or a plan (``meshd.sim.pipeline``), send a
hedge copy, cancel a copy, decide again, count the request as answered or failed.

The simulation tells the machine of a first token only where one decides something: a hedge
race (``meshd.sim.hedging.watch`` schedules it) or a hedge deadline (the token had come). It
has no answer cache: it never feeds ``CacheLookup``, so the machine never holds anything back
for one and never answers ``Release`` or ``ServeCached`` here.
"""

from __future__ import annotations

from meshd.core.request_life import (
    Action,
    ArmTimer,
    Busy,
    Cancel,
    Drop,
    Expired,
    Fail,
    Failed,
    FirstToken,
    HedgeDue,
    Redecide,
    Send,
    SendPlan,
    StageFailed,
)
from meshd.sim import hedging, pipeline
from meshd.sim.events import HEDGE, Sim
from meshd.sim.request import SimRequest


def apply(sim: Sim, r: SimRequest, ev: object, now: float) -> None:
    """Feed ``ev`` (about copy ``r``) to the request's machine and carry out its actions."""
    life = r.life
    retries, refusals, hedges, won = life.retries, life.refusals, life.hedges, life.hedge_won
    acts = life.handle(ev, now)
    if r.measured:
        m = sim.m
        m.retries += life.retries - retries
        m.wait_refusals += life.refusals - refusals
        m.hedges += life.hedges - hedges
        m.hedge_wins += life.hedge_won - won
    perform(sim, r, acts, now)


def perform(sim: Sim, r: SimRequest, acts: list[Action], now: float) -> None:
    """Carry out ``acts`` for copy ``r`` (a new attempt after a failure rides on it)."""
    for a in acts:
        t = type(a)
        if t is Send:
            assert isinstance(a, Send)
            if a.hedge:
                _hedge(sim, r, a, now)
            else:
                r.attempt = a.attempt
                r.stages = None
                sim.send(r, a.peer, now)
        elif t is SendPlan:
            assert isinstance(a, SendPlan)
            r.attempt = a.attempt
            pipeline.send_plan(sim, r, a.plan, now)
        elif t is ArmTimer:
            assert isinstance(a, ArmTimer)
            if a.kind == "hedge":
                sim.push(a.at, HEDGE, r, r.gen)
        elif t is Cancel:
            assert isinstance(a, Cancel)
            c = carrier(r, a.attempt)
            if c is not None:
                hedging.cancel(sim, c, now)
        elif t is Drop:
            r.gen = -abs(r.gen) - 1  # this copy is gone; its sibling runs on
        elif t is Redecide:
            assert isinstance(a, Redecide)
            sim.decide_request(r, now, a.exclude)
        elif t is Fail:
            assert isinstance(a, Fail)
            sim.settle_failed(r, a.code)
        # BackToRefuser is a note for the daemon's journal; Finish is counted by ``complete``


def carrier(r: SimRequest, attempt: int) -> SimRequest | None:
    """The copy of ``r``'s request that carries ``attempt``."""
    if r.copies is None:
        return r if r.attempt == attempt else None
    for c in r.copies:
        if c.attempt == attempt:
            return c
    return None


def _hedge(sim: Sim, r: SimRequest, a: Send, now: float) -> None:
    h = SimRequest(r.rid, r.arrival, r.entry, r.model, r.prompt, r.output, r.residency,
                   r.measured, r.life)
    h.done_tokens = r.done_tokens
    h.ids, h.names, h.answer_ids = r.ids, r.names, r.answer_ids
    h.attempt = a.attempt
    r.copies = h.copies = [r, h]
    t = sim.world.nodes[r.server] if r.server >= 0 else None
    if t is not None and r in t.active:
        hedging.watch(sim, r)
    sim.send(h, a.peer, now)


# -- what the world reports -----------------------------------------------------------------


def busy(sim: Sim, r: SimRequest, now: float, wait_ms: float | None = None) -> None:
    """The entry node heard ``busy`` for copy ``r`` (with the server's wait: a refusal)."""
    gone = sim.world.nodes[r.entry].known_dead
    if r.stages is not None:
        apply(sim, r, StageFailed(r.attempt, frozenset((r.server,)), "busy", "busy", gone), now)
    else:
        apply(sim, r, Busy(r.attempt, wait_ms, "busy", gone), now)


def dead(sim: Sim, r: SimRequest, now: float) -> None:
    """The entry node found copy ``r``'s server (or stage) dead."""
    gone = sim.world.nodes[r.entry].known_dead
    if r.stages is not None:
        apply(sim, r, StageFailed(r.attempt, frozenset((r.server,)), "dead", "dead", gone), now)
    else:
        apply(sim, r, Failed(r.attempt, "dead", "dead", gone), now)


def expired(sim: Sim, r: SimRequest, now: float) -> None:
    """Copy ``r`` was not started within the request's timeout: its server dropped it."""
    apply(sim, r, Expired(r.attempt, "timeout"), now)


def hedge_due(sim: Sim, r: SimRequest, gen: int, now: float) -> None:
    """The hedge deadline of the request's first decision passed."""
    if gen != r.gen:
        return
    if hedging.has_first_token(sim, r, now):
        apply(sim, r, FirstToken(r.attempt), now)
    apply(sim, r, HedgeDue(sim.world.nodes[r.entry].known_dead), now)


def first_token(sim: Sim, r: SimRequest, gen: int, now: float) -> None:
    """Copy ``r``'s first token reached the entry node while a hedge race was on."""
    if gen != r.gen:
        return
    apply(sim, r, FirstToken(r.attempt), now)
