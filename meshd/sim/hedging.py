"""Hedged requests, as the daemon sends them (issue 4).

If a request's first token has not reached its entry node by the decision's ``hedge_ms`` (``meshd.core.decide``) after
it was sent, a second copy goes to the next peer of the decision's order. The copy whose first
token reaches the entry node first wins; the other is cancelled at that instant (dropped from its
queue, or its slot freed). A copy that is answered busy or finds its peer dead while the other
copy lives is simply dropped; the last live copy retries as a lone request would. The request is
counted once, with the winner's timings.
"""

from __future__ import annotations

from meshd.sim.events import FIRST, HEDGE, Sim
from meshd.sim.request import SimRequest


class Family:
    """The copies of one hedged request; ``parent`` is the original."""

    __slots__ = ("parent", "copies", "live", "winner", "done")

    def __init__(self, parent: SimRequest) -> None:
        self.parent = parent
        self.copies: list[SimRequest] = [parent]
        self.live = 1
        self.winner: SimRequest | None = None
        self.done = False


def arm(sim: Sim, r: SimRequest, hedge_ms: float, now: float) -> None:
    """After the first decision: schedule the hedge check ``hedge_ms`` (``Decision.hedge_ms``)
    after sending."""
    if r.stages is not None or r.attempts or r.family is not None:
        return
    sim.push(now + hedge_ms / 1000.0, HEDGE, r, r.gen)


def _has_first_token(sim: Sim, r: SimRequest, now: float) -> bool:
    if r.server < 0:
        return False
    t = sim.world.nodes[r.server]
    return r in t.active and r.first_s + r.rtt_s / 2.0 <= now


def fire(sim: Sim, r: SimRequest, gen: int, now: float) -> None:
    """The hedge deadline passed: send a copy to the next untried peer, if the token is late."""
    if gen != r.gen or r.family is not None or _has_first_token(sim, r, now):
        return
    dead = sim.world.nodes[r.entry].known_dead
    nxt = next(
        (i for i in range(r.pos + 1, len(r.order))
         if r.order[i] not in r.tried and r.order[i] not in dead),
        -1,
    )  # fmt: skip
    if nxt < 0:
        return
    fam = Family(r)
    h = SimRequest(r.rid, r.arrival, r.entry, r.model, r.prompt, r.output, r.residency, r.measured)
    h.order = r.order
    h.pos = nxt
    h.tried = r.tried  # shared: a retry of either copy avoids both peers
    h.done_tokens = r.done_tokens
    h.family = fam
    r.family = fam
    fam.copies.append(h)
    fam.live = 2
    if r.measured:
        sim.m.hedges += 1
    t = sim.world.nodes[r.server] if r.server >= 0 else None
    if t is not None and r in t.active:
        watch(sim, r)
    sim.send(h, now)


def watch(sim: Sim, r: SimRequest) -> None:
    """``r`` started serving while a sibling lives: its first token decides the race."""
    sim.push(r.first_s + r.rtt_s / 2.0, FIRST, r, r.gen)


def first_token(sim: Sim, r: SimRequest, gen: int, now: float) -> None:
    fam = r.family
    if gen != r.gen or fam is None or fam.winner is not None:
        return
    fam.winner = r
    if r is not fam.parent and r.measured:
        sim.m.hedge_wins += 1
    for c in fam.copies:
        if c is not r and c.gen >= 0:
            cancel(sim, c, now)


def cancel(sim: Sim, c: SimRequest, now: float) -> None:
    """Drop copy ``c`` wherever it is (in transit, queued or serving)."""
    fam = c.family
    c.gen += 1
    if fam is not None:
        fam.live -= 1
    c.gen = -abs(c.gen) - 1  # negative: this copy is gone
    if c.server < 0:
        return
    t = sim.world.nodes[c.server]
    if c in t.active:
        t.active.discard(c)
        t.running -= 1
        t.busy_s += now - c.start_s
        sim.serve_queued(t, now)
        sim.load_changed(t, now)
    elif c in t.queue:
        t.queue.remove(c)
        sim.load_changed(t, now)


def drop_if_sibling_lives(c: SimRequest) -> bool:
    """A copy that would fail or retry: if its sibling lives, it just goes away."""
    fam = c.family
    if fam is None or fam.live <= 1 or c.gen < 0:
        return False
    fam.live -= 1
    c.gen = -abs(c.gen) - 1
    return True


def settle(r: SimRequest) -> SimRequest | None:
    """The request to account when copy ``r`` completes or fails for good (None: already done)."""
    fam = r.family
    if fam is None:
        return r
    if fam.done:
        return None
    fam.done = True
    parent: SimRequest = fam.parent
    return parent
