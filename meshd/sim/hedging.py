"""Hedged requests in the simulated world (the decisions are ``meshd.core.request_life``'s).

When the request's machine sends a hedge, a second copy of the request (``meshd.sim.entry``)
travels to the next peer of the order; both copies share the request's life. A first token
decides the race: the simulation schedules the instant a copy's first token reaches the entry
node (``watch``) only while two copies run, and the machine picks the winner. A cancelled copy
is dropped wherever it is (``cancel``: in transit, queued, or serving, its slot freed). The
request is counted once, with the winner's timings.
"""

from __future__ import annotations

from meshd.sim.events import FIRST, Sim
from meshd.sim.request import SimRequest


def has_first_token(sim: Sim, r: SimRequest, now: float) -> bool:
    """Whether copy ``r``'s first token has reached its entry node by ``now``."""
    if r.server < 0:
        return False
    t = sim.world.nodes[r.server]
    return r in t.active and r.first_s + r.rtt_s / 2.0 <= now


def watch(sim: Sim, r: SimRequest) -> None:
    """``r`` started serving while a sibling lives: its first token decides the race."""
    sim.push(r.first_s + r.rtt_s / 2.0, FIRST, r, r.gen)


def cancel(sim: Sim, c: SimRequest, now: float) -> None:
    """Drop copy ``c`` wherever it is (in transit, queued or serving)."""
    c.gen += 1
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
