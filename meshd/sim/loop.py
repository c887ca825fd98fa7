"""The discrete-event loop: arrivals, routing by the real router, serving, gossip, failures.

Events are plain tuples ``(time, seq, kind, a, b)`` on one ``heapq``; ``seq`` breaks ties in
insertion order, so a run is a pure function of the scenario, the strategy and the seed.
Every routing decision is ``meshd.core.decide.decide``, the daemon's own (one node with its
fallbacks, or a pipeline plan), called on the ``MeshSnapshot`` the entry node would have built
(``meshd.sim.views``); the simulation only carries the result out.

Serving model: a node has ``concurrency`` slots, each running one request at the node's
per-stream prefill and decode speeds (continuous batching at a fixed per-stream speed), and a
FIFO queue of at most ``max_queue``; a request finding the queue full is answered busy. What the
entry node does then (the next peer, a wait refusal's rules, a hedge, a new decision) is the
daemon's own ``meshd.core.request_life.RequestLife``, driven by ``meshd.sim.entry``. Time to first
token, seen at the entry node, is the request's trip there, its queueing, its prefill and the
first token's trip back.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
import random
from collections.abc import Callable
from typing import Any

from meshd.core import predict
from meshd.core.advert import significant_load_change
from meshd.core.decide import decide
from meshd.core.energy import request_energy_j
from meshd.core.request_life import (
    Decided,
    Finish,
    Finished,
    GiveUp,
    NoRoute,
    RequestLife,
    route_of,
)
from meshd.core.routing import LOCKSTEP
from meshd.core.snapshot import RouteRequest
from meshd.core.vivaldi import update
from meshd.errors import RoutingError
from meshd.sim import admission, entry, hedging, pipeline
from meshd.sim.chat import ChatStream
from meshd.sim.events import (
    ADVERT,
    ARRIVAL,
    AT_SERVER,
    BUSY,
    DEAD,
    DONE,
    EARLY,
    FIRST,
    HEDGE,
    PURGE,
    REFUSED,
    SCENARIO_EVENT,
    STAGE,
    SUMMARY,
)
from meshd.sim.metrics import Metrics, summarise
from meshd.sim.prefixes import names_of
from meshd.sim.request import SimRequest
from meshd.sim.scenario import Scenario
from meshd.sim.tiers import TierSim
from meshd.sim.views import Views, stats
from meshd.sim.workload import ArrivalStream, mean_length
from meshd.sim.world import VIVALDI, SimNode, World, note_dead

Progress = Callable[[float], None]


class Simulation:
    """One run of one strategy over one scenario."""

    def __init__(self, scenario: Scenario, strategy: str, *, seed: int | None = None,
                 tier_mode: str = "tiered") -> None:
        sc = scenario
        self.sc = sc
        self.seed = sc.run.seed if seed is None else seed
        self.strategy = strategy
        self.world = World(sc, self.seed)
        # round_robin_lockstep is the herding baseline: every counter starts at 0.
        self.lockstep = strategy == LOCKSTEP
        if self.lockstep:
            for node in self.world.nodes:
                node.rr = 0
        self.nominal = _nominal(sc)
        self.views = Views(self.world, sc, self.seed, self.nominal)
        # The scenario's policy with the strategy under test. The explanation list is trimmed
        # to the decision's own order: it changes what `meshd explain` would list, not the choice.
        # The fallback list is cut to what the simulation can use (every attempt plus a hedge).
        self.policy = dataclasses.replace(
            sc.policy, strategy=strategy, explain_limit=0,
            max_fallbacks=min(sc.policy.max_fallbacks, sc.run.max_attempts + 1),
        )  # fmt: skip
        # model = "auto" arrivals (docs/tiers.md): meshd.core.tiers.choose_tier, or a baseline
        self.tiers = TierSim(sc, tier_mode, self.policy)
        self.route_rng = random.Random(self.seed * 7 + 1)
        self.net_rng = random.Random(self.seed * 13 + 2)
        self.event_rng = random.Random(self.seed * 19 + 4)
        self.streams: list[ArrivalStream | ChatStream] = [
            ChatStream(a, i, self.seed, sc.run.duration_s) if a.chat is not None
            else ArrivalStream(a, i, self.seed) for i, a in enumerate(sc.arrivals)]
        self.m = Metrics()
        self.heap: list[tuple[float, int, int, Any, Any]] = []
        self._seq = 0
        self.now = 0.0
        self.outstanding = 0
        self.rid = 0
        self.active_streams = 0
        self.stop_s = sc.run.duration_s + sc.run.drain_s
        self.last_event_s = 0.0
        self.events = 0
        self.early = sc.gossip.early_adverts
        self.tick = min(0.01, sc.gossip.advert_interval_s / 50.0)
        self.tick_now = -1
        self.wheel: list[list[SimNode]] = [
            [] for _ in range(math.ceil(sc.gossip.advert_interval_s / self.tick) + 2)
        ]
        self.hedge = self.policy.hedge_factor > 0.0
        self.gap = sc.gossip.min_advert_gap_s

    # -- scheduling --------------------------------------------------------------------------

    def push(self, t: float, kind: int, a: Any = None, b: Any = None) -> None:
        self._seq += 1
        heapq.heappush(self.heap, (t, self._seq, kind, a, b))

    def _start(self) -> None:
        sc = self.sc
        interval = sc.gossip.advert_interval_s
        phase_rng = random.Random(self.seed * 23 + 6)
        for node in self.world.nodes:
            phase = phase_rng.random() * interval
            self.views.publish_advert(node, phase - interval)
            self._schedule_advert(node, phase)
        self.push(0.0, ADVERT, 0)
        for s in self.streams:
            t = s.next_time()
            if t <= sc.run.duration_s:
                self.active_streams += 1
                self.push(t, ARRIVAL, s)
        if sc.gossip.probes and len(self.world.cells) > 1:
            self.push(0.0, SUMMARY)
        for i, ev in enumerate(sc.events):
            self.push(ev.at_s, SCENARIO_EVENT, i)

    def run(self, progress: Progress | None = None) -> dict[str, Any]:
        if progress is not None:
            progress(0.0)
        self._start()
        heap = self.heap
        pop = heapq.heappop
        stop = self.stop_s
        n = 0
        tick = 4096
        while heap:
            t, _, kind, a, b = pop(heap)
            if t > stop:
                break
            self.now = t
            n += 1
            if kind == AT_SERVER:
                self._at_server(a, b, t)
            elif kind == DONE:
                self._done(a, b, t)
            elif kind == ARRIVAL:
                self._arrival(a, t)
            elif kind == ADVERT:
                self._advert_tick(a, t)
            elif kind == EARLY:
                a.adv_pending = False
                if (
                    a.alive
                    and t - a.adv_last >= self.gap
                    and significant_load_change(a.adv_load, (len(a.queue), a.running))
                ):
                    self.views.publish_advert(a, t)
            elif kind == BUSY:
                if b == a.gen:
                    entry.busy(self, a, t)
            elif kind == DEAD:
                if b == a.gen:
                    note_dead(self.world.nodes[a.entry], a.server)
                    self.world.nodes[a.entry].measured.pop(a.server, None)
                    entry.dead(self, a, t)
            elif kind == STAGE:
                pipeline.at_stage(self, a, b, t)
            elif kind == REFUSED:
                if b[0] == a.gen:
                    entry.busy(self, a, t, b[1])
            elif kind == HEDGE:
                entry.hedge_due(self, a, b, t)
            elif kind == FIRST:
                entry.first_token(self, a, b, t)
            elif kind == SUMMARY:
                self.views.publish_summaries(t)
                if t + self.sc.gossip.summary_interval_s <= stop:
                    self.push(t + self.sc.gossip.summary_interval_s, SUMMARY)
            elif kind == SCENARIO_EVENT:
                self._scenario_event(a, t)
            elif kind == PURGE:
                self.world.purge(a)
            if n >= tick:
                tick += 4096
                if progress is not None:
                    progress(min(t / self.sc.run.duration_s, 1.0))
                if self.active_streams == 0 and self.outstanding == 0:
                    break
            self.last_event_s = t
        self.events = n
        for r in self._leftovers():
            self._unfinished(r)
        if progress is not None:
            progress(1.0)
        return self.summary()

    # Periodic adverts sit on a timing wheel of ``tick``-second slots instead of the heap (one
    # heap event per tick, not per advert): at 100,000 nodes that halves the heap.

    def _schedule_advert(self, node: SimNode, at: float) -> None:
        k = max(math.ceil(at / self.tick - 1e-9), self.tick_now + 1)
        node.adv_due = k
        self.wheel[k % len(self.wheel)].append(node)

    def _advert_tick(self, k: int, now: float) -> None:
        self.tick_now = k
        slot = k % len(self.wheel)
        due, self.wheel[slot] = self.wheel[slot], []
        interval = self.sc.gossip.advert_interval_s
        publish = self.views.publish_advert
        for node in due:
            if node.adv_due != k or not node.alive:
                continue
            if now - node.adv_last >= interval - self.tick / 2:
                publish(node, now)
            self._schedule_advert(node, node.adv_last + interval)
        nxt = (k + 1) * self.tick
        if nxt <= self.stop_s:
            self.push(nxt, ADVERT, k + 1)

    def load_changed(self, t: SimNode, now: float) -> None:
        """The daemon advertises early when its load changed significantly (node/membership.py)."""
        if (
            self.early
            and not t.adv_pending
            and now - t.adv_last >= self.gap
            and significant_load_change(t.adv_load, (len(t.queue), t.running))
        ):
            t.adv_pending = True
            self.push(now + self.sc.gossip.advert_settle_s, EARLY, t)

    def _leftovers(self) -> list[SimRequest]:
        seen: dict[int, SimRequest] = {}  # by object: hedged copies share a request id
        for node in self.world.nodes:
            for r in list(node.queue) + list(node.active):
                seen[id(r)] = r
        for _, _, kind, a, b in self.heap:
            if kind in (AT_SERVER, DONE, BUSY, DEAD, STAGE) and a.gen == b:
                seen[id(a)] = a
        return sorted(seen.values(), key=_rid)

    # -- requests ----------------------------------------------------------------------------

    def _arrival(self, s: ArrivalStream | ChatStream, t: float) -> None:
        nxt = s.next_time()
        if nxt <= self.sc.run.duration_s:
            self.push(nxt, ARRIVAL, s)
        else:
            self.active_streams -= 1
        spec = s.spec
        regions = self.world.region_names
        ri = s.rng.randrange(len(regions)) if spec.region == "*" else regions.index(spec.region)
        alive = self.world.region_alive[ri]
        ids: tuple[int, ...] = ()
        answer_ids: tuple[int, ...] = ()
        if isinstance(s, ChatStream):  # a turn of a conversation, at its conversation's entry node
            turn, entry = s.take(alive)
            ids, prompt, output = turn.prompt_ids, len(turn.prompt_ids), turn.max_tokens
            answer_ids = turn.answer_ids
        else:
            entry = alive[s.rng.randrange(len(alive))] if alive else -1
            prompt, output = s.sizes()
        self.rid += 1
        measured = t >= self.sc.run.warmup_s
        model = spec.model
        if model == "auto":
            is_complex, score = self.tiers.draw(spec.complex_share, s.rng)
            if entry >= 0:
                e = self.world.nodes[entry]
                snaps = {m: self.views.snapshot(e, t, m, spec.residency) for m in self.tiers.models}
                model = self.tiers.choose(self.rid, snaps, is_complex, score, prompt, output,
                                          spec.residency, measured) or "auto"
        run = self.sc.run
        life: RequestLife[int] = RequestLife(started_s=t, max_attempts=run.max_attempts,
                                             timeout_s=run.timeout_s, policy=self.policy)
        r = SimRequest(self.rid, t, entry, model, prompt, output, spec.residency, measured, life)
        r.ids, r.answer_ids = ids, answer_ids
        if measured:
            self.m.arrived += 1
        self.outstanding += 1
        if entry < 0:
            self.settle_failed(r, "no_entry")
            return
        if model == "auto":
            self.settle_failed(r, "no_route")
            return
        self.decide_request(r, t)

    def decide_request(self, r: SimRequest, now: float,
                       exclude: frozenset[int] = frozenset()) -> None:
        """``decide()`` for ``r`` (again, after a failure: without the nodes in ``exclude``), on
        the entry node's snapshot; the decision goes to the request's machine."""
        w = self.world
        e = w.nodes[r.entry]
        snap = self.views.snapshot(e, now, r.model, r.residency)
        req = RouteRequest(
            request_id=str(r.rid), model=r.model, prompt_tokens=r.effective_prompt,
            max_tokens=r.remaining_output, residency=r.residency,
            exclude=frozenset(w.nodes[j].peer_id for j in exclude) if exclude else frozenset(),
            prompt_ids=r.ids,
        )  # fmt: skip
        try:
            d = decide(req, snap, self.policy, self.route_rng, e.rr, hedge=self.hedge)
        except RoutingError as err:
            entry.apply(self, r, NoRoute(str(err)), now)
            return
        if d.plan is not None:
            entry.apply(self, r, Decided(plan=d.plan), now)
            return
        e.rr += 1
        entry.apply(self, r, Decided(route_of(d, w.by_peer.__getitem__)), now)

    def send(self, r: SimRequest, j: int, now: float) -> None:
        """Send copy ``r`` to node ``j``."""
        r.server = j
        if j == r.entry:
            r.rtt_s = 0.0
            self._at_server(r, r.gen, now)
            return
        e = self.world.nodes[r.entry]
        r.rtt_s = self.world.latency.sample_ms(r.entry, j, self.net_rng) / 1000.0
        self.views.note_sent(e, j, now)
        self.push(now + r.rtt_s / 2.0, AT_SERVER, r, r.gen)

    def _at_server(self, r: SimRequest, gen: int, now: float) -> None:
        if gen != r.gen:
            return
        t = self.world.nodes[r.server]
        if not t.alive:
            # No answer: the entry node notices after failure_detect_s and tries elsewhere.
            self.push(now + self.sc.run.failure_detect_s, DEAD, r, r.gen)
        elif t.running < t.slots:
            self._serve(t, r, now)
        elif (wait := admission.refused_wait_ms(t, r, now)) is not None:
            self.push(now + r.rtt_s / 2.0, REFUSED, r, (r.gen, wait))
        elif len(t.queue) < t.max_queue:
            t.queue.append(r)
            self.load_changed(t, now)
        else:
            self.push(now + r.rtt_s / 2.0, BUSY, r, r.gen)

    def _serve(self, t: SimNode, r: SimRequest, now: float) -> None:
        reused = 0
        if t.px is not None and r.ids:  # its KV prefix cache (meshd.sim.prefixes)
            if r.names is None:
                r.names = names_of(r.model, r.ids)
            reused = t.px.reuse(r.names, r.effective_prompt, now)
        prefill = predict.prefill_s(r.effective_prompt - reused, t.prefill_tps)
        if t.px is not None and r.names:
            t.px.keep(r.names, now + prefill)
        # per-stream speed with the streams running there now (the node's batch curve)
        decode = predict.decode_s(r.remaining_output - 1, predict.batched_decode_tps(
            t.hw.batch_tps, t.running + 1, t.decode_tps))
        r.start_s = now
        r.first_s = now + prefill
        r.end_s = now + prefill + decode
        t.running += 1
        t.active.add(r)
        self.push(r.end_s, DONE, r, r.gen)
        self.load_changed(t, now)
        if r.copies is not None and r.life.racing:
            hedging.watch(self, r)

    def serve_queued(self, t: SimNode, now: float) -> None:
        if not t.alive:
            return
        q = t.queue
        timeout = self.sc.run.timeout_s
        while q and t.running < t.slots:
            r = q.pop(0)
            if now - r.arrival > timeout:
                entry.expired(self, r, now)
                continue
            if r.stages is not None:
                pipeline.slot_granted(self, t, r, now)
            else:
                self._serve(t, r, now)

    def _done(self, r: SimRequest, gen: int, now: float) -> None:
        if gen != r.gen:
            return
        if r.stages is not None:
            pipeline.finish(self, r, now)
            return
        w = self.world
        t = w.nodes[r.server]
        t.running -= 1
        t.active.discard(r)
        t.busy_s += now - r.start_s
        if t.px is not None and t.px.keep_answers:  # the engine keeps finished answers' KV
            t.px.finished(r.model, r.ids, r.answer_ids)
            if t.px.answers:
                step_s = 1.0 / predict.batched_decode_tps(t.hw.batch_tps, max(t.running, 1),
                                                          t.decode_tps)
                t.px.keep_answers_now(now, t.running, step_s, t.prefill_tps, bool(t.queue))
        half = r.rtt_s / 2.0
        if r.ttft_s < 0.0:
            r.ttft_s = r.first_s + half - r.arrival
        if r.server != r.entry:
            e = w.nodes[r.entry]
            if e.alive:
                rtt_ms = r.rtt_s * 1000.0
                e.measured[r.server] = (rtt_ms, now)
                e.coord = update(e.coord, t.coord, rtt_ms, VIVALDI, self.net_rng)
            if e.cell != t.cell and r.measured:
                self.m.cross_cell += 1
        elif r.measured:
            self.m.local += 1
        if r.measured:
            self.m.served_by_hardware[t.hw.name] += 1
        self.complete(r, now + half)
        self.serve_queued(t, now)
        self.load_changed(t, now)

    def complete(self, r: SimRequest, at: float) -> None:
        """Copy ``r`` delivered the answer (its last token reaches the entry node at ``at``)."""
        r.gen += 1  # a pending hedge check of this request is void now
        acts = r.life.handle(Finished(r.attempt), self.now)
        entry.perform(self, r, [a for a in acts if type(a) is not Finish], self.now)
        if acts and type(acts[-1]) is Finish:
            self.outstanding -= 1
            if r.measured:
                self.m.complete(r.ttft_s, at - r.arrival, r.prompt, r.output)

    def settle_failed(self, r: SimRequest, reason: str) -> None:
        """The request of copy ``r`` failed for good (``reason``, as ``failed_by_reason`` says)."""
        r.gen += 1
        if r.held:
            pipeline.release(self, r, self.now)
        self.outstanding -= 1
        if r.measured:
            self.m.fail(reason)

    def _unfinished(self, r: SimRequest) -> None:
        """The run is over with copy ``r`` still in the system: its request failed, once."""
        if r.life.over:
            return
        r.life.handle(GiveUp("unfinished"), self.now)  # the run is over: nothing to cancel
        self.settle_failed(r, "unfinished")

    # -- failures and joins ------------------------------------------------------------------

    def _scenario_event(self, i: int, now: float) -> None:
        ev = self.sc.events[i]
        w = self.world
        if ev.action == "join":
            ri = w.region_names.index(ev.region or "")
            for _ in range(ev.count):
                node = w.join(ri, self.sc.hardware[ev.hardware or ""], ev.serve, now)
                if self.lockstep:
                    node.rr = 0
                self.views.set_rate(node)
                self.views.publish_advert(node, now)
                self._schedule_advert(node, now + self.sc.gossip.advert_interval_s)
            return
        pool = [
            n.idx for n in w.nodes
            if n.alive
            and (ev.region is None or n.region_name == ev.region)
            and (ev.hardware is None or n.hw.name == ev.hardware)
        ]  # fmt: skip
        k = ev.count or int(round(ev.fraction * len(pool)))
        victims = sorted(self.event_rng.sample(pool, min(k, len(pool))))
        for j in victims:
            self.kill(j, now)

    def kill(self, j: int, now: float) -> None:
        """Node ``j`` dies: its work is lost; each entry node notices after failure_detect_s."""
        w = self.world
        t = w.nodes[j]
        w.kill(j, now)
        detect = now + self.sc.run.failure_detect_s
        for r in sorted(t.active, key=_rid):
            if r not in t.active:
                continue  # a pipelined request failed while we released another one's slots
            if r.stages is not None:
                pipeline.abort(self, r, now, j)
            else:
                t.busy_s += now - r.start_s
                if now >= r.first_s:
                    if r.ttft_s < 0.0:
                        r.ttft_s = r.first_s + r.rtt_s / 2.0 - r.arrival
                    streamed = 1 + int((now - r.first_s) * t.decode_tps)
                    r.done_tokens = min(r.done_tokens + streamed, r.output - 1)
            r.gen += 1
            self.push(detect, DEAD, r, r.gen)
        queued = list(t.queue)
        t.queue.clear()
        for r in queued:
            if r.stages is not None:
                r.server = j
                pipeline.release(self, r, now)
            r.gen += 1
            self.push(detect, DEAD, r, r.gen)
        t.active.clear()
        t.running = 0
        g = self.sc.gossip
        ttl = g.advert_ttl_s or 3.0 * g.advert_interval_s
        self.push(now + ttl + g.advert_delay_ms[1] / 1000.0 + 0.001, PURGE, j)

    # -- results -----------------------------------------------------------------------------

    def summary(self) -> dict[str, Any]:
        w = self.world
        end = max(self.last_event_s, self.sc.run.duration_s)
        util: list[float] = []
        cost = 0.0
        energy = 0.0
        for n in w.nodes:
            until = n.died_s if n.died_s >= 0 else end
            alive_slot_s = n.slots * max(until - n.born_s, 1e-9)
            util.append(min(n.busy_s / alive_slot_s, 1.0))
            cost += n.busy_s * n.cost_per_hour / n.slots / 3600.0
            energy += request_energy_j(n.power_w, n.busy_s * 1000.0, n.slots) or 0.0
        window = self.sc.run.duration_s - self.sc.run.warmup_s
        extra = {"events": self.events, "nodes": len(w.nodes), "cells": len(w.cells),
                 "tiers": self.tiers.summary()}
        extra.update(stats(self.views))
        held = [n.px for n in w.nodes if n.px is not None]
        if held:  # prefix caches (meshd.sim.prefixes): requests that reused one, tokens skipped
            extra["prefix_hits"] = sum(p.hits for p in held)
            extra["prefix_reused_tokens"] = sum(p.reused_tokens for p in held)
            extra["prefix_answers_kept"] = sum(p.answers_kept for p in held)
        return summarise(self.m, window_s=window, total_cost=cost, utilisation=util, extra=extra,
                         total_energy_j=energy if any(n.power_w for n in w.nodes) else None)


def _rid(r: SimRequest) -> int:
    return r.rid


def _nominal(sc: Scenario) -> tuple[int, int]:
    """Rate-weighted mean prompt and output lengths: the 'typical request' of summaries."""
    total = sum(a.rate_per_s for a in sc.arrivals) or 1.0
    p = sum(a.rate_per_s * mean_length(a.prompt_tokens, 4000) for a in sc.arrivals) / total
    o = sum(a.rate_per_s * mean_length(a.output_tokens, 4000) for a in sc.arrivals) / total
    return max(1, round(p)), max(1, round(o))
