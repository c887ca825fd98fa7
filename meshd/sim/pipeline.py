"""Requests for a model served in layer ranges: planned by ``meshd.core.decide.decide``, run as a chain.

The planner returns either one node serving the whole model (then the request is served like any
routed one) or a chain of stages. The request visits the stages in order: at each it waits for a
slot (the stage's KV session), prefills its share of the layers, and sends the activations to the
next stage directly. The last stage's prefill yields the first token, which goes back to the entry
node. The entry node drives the decode loop (it holds the tokens a failover replays), so each
further token goes round the ring entry -> first stage -> ... -> last stage -> entry: per token,
every stage's share of the decode plus every link's one-way delay, as the planner predicts. A
stage holds its slot until the request ends. A stage with a full queue answers busy; a dead stage
is noticed after ``failure_detect_s``; both release every slot held, and the request's machine
(``meshd.core.request_life``, as in the daemon) blames that stage and decides again without it.
"""

from __future__ import annotations

from meshd.core import predict
from meshd.core.planner import Plan
from meshd.sim.events import BUSY, DEAD, DONE, STAGE, Sim
from meshd.sim.request import SimRequest
from meshd.sim.world import SimNode


def send_plan(sim: Sim, r: SimRequest, plan: Plan, now: float) -> None:
    """Send ``r`` along ``plan`` (from ``meshd.core.decide.decide``, as the daemon does)."""
    w = sim.world
    n_layers = w.models[r.model]
    if len(plan.hops) == 1:  # a node serving the whole model won: an ordinary request
        r.stages = None
        sim.send(r, w.by_peer[plan.hops[0].peer_id], now)
        return
    r.stages = [(w.by_peer[h.peer_id], (h.layer_end - h.layer_start) / n_layers) for h in plan.hops]
    r.stage_i = 0
    r.held = []
    e = w.nodes[r.entry]
    for j, _ in r.stages:
        if j != r.entry:
            sim.views.note_sent(e, j, now)
    first = r.stages[0][0]
    r.server = first
    delay = w.latency.sample_ms(r.entry, first, sim.net_rng) / 2000.0 if first != r.entry else 0.0
    sim.push(now + delay, STAGE, r, r.gen)


def _oneway_s(sim: Sim, a: int, b: int) -> float:
    if a == b:
        return 0.0
    return sim.world.latency.sample_ms(a, b, sim.net_rng) / 2000.0


def at_stage(sim: Sim, r: SimRequest, gen: int, now: float) -> None:
    """The request (its activations) reached stage ``r.stage_i``."""
    if gen != r.gen or r.stages is None:
        return
    j = r.stages[r.stage_i][0]
    t = sim.world.nodes[j]
    r.server = j
    if not t.alive:
        release(sim, r, now)
        sim.push(now + sim.sc.run.failure_detect_s, DEAD, r, r.gen)
    elif t.running < t.slots:
        slot_granted(sim, t, r, now)
    elif len(t.queue) < t.max_queue:
        t.queue.append(r)
        sim.load_changed(t, now)
    else:
        release(sim, r, now)
        sim.push(now + _oneway_s(sim, j, r.entry), BUSY, r, r.gen)


def slot_granted(sim: Sim, t: SimNode, r: SimRequest, now: float) -> None:
    """Stage ``r.stage_i`` took the request: prefill its layers, pass on (or emit a token)."""
    assert r.stages is not None
    t.running += 1
    t.active.add(r)
    r.held.append((t.idx, now))
    sim.load_changed(t, now)
    frac = r.stages[r.stage_i][1]
    prefill = predict.prefill_s(r.effective_prompt * frac, t.prefill_tps)
    r.stage_i += 1
    if r.stage_i < len(r.stages):
        nxt = r.stages[r.stage_i][0]
        sim.push(now + prefill + _oneway_s(sim, t.idx, nxt), STAGE, r, r.gen)
        return
    nodes = sim.world.nodes
    per_token = 0.0
    prev = r.entry
    for j, f in r.stages:
        per_token += f / nodes[j].decode_tps + _oneway_s(sim, prev, j)
        prev = j
    per_token += _oneway_s(sim, prev, r.entry)
    r.first_s = now + prefill
    r.end_s = r.first_s + (r.remaining_output - 1) * per_token
    r.rtt_s = 2.0 * _oneway_s(sim, t.idx, r.entry)
    r.start_s = now
    sim.push(r.end_s, DONE, r, r.gen)


def release(sim: Sim, r: SimRequest, now: float, skip: int = -1) -> None:
    """Free every slot the request holds (except on ``skip``, a node that just died)."""
    held, r.held = r.held, []
    nodes = sim.world.nodes
    for j, since in held:
        t = nodes[j]
        if j == skip:
            t.busy_s += now - since
            continue
        if r in t.active:
            t.active.discard(r)
            t.running -= 1
            t.busy_s += now - since
            sim.serve_queued(t, now)
            sim.load_changed(t, now)


def finish(sim: Sim, r: SimRequest, now: float) -> None:
    half = r.rtt_s / 2.0
    if r.ttft_s < 0.0:
        r.ttft_s = r.first_s + half - r.arrival
    if r.measured:
        sim.m.pipelined += 1
        sim.m.pipeline_ttft_ms.append(r.ttft_s * 1000.0)
    release(sim, r, now)
    sim.complete(r, now + half)


def abort(sim: Sim, r: SimRequest, now: float, dead: int) -> None:
    """Stage ``dead`` died while the request held a slot there."""
    assert r.stages is not None
    if r.stage_i >= len(r.stages) and now >= r.first_s:
        if r.ttft_s < 0.0:
            r.ttft_s = r.first_s + r.rtt_s / 2.0 - r.arrival
        per_token = (r.end_s - r.first_s) / max(r.remaining_output - 1, 1)
        streamed = 1 + int((now - r.first_s) / per_token) if per_token > 0 else r.output
        r.done_tokens = min(r.done_tokens + streamed, r.output - 1)
    r.server = dead
    release(sim, r, now, skip=dead)
