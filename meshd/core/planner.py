"""Pipeline planning: the cheapest chain of stage nodes covering every layer of a model.

``plan(req, snap, policy, rtt_between=None)`` is a shortest path over (stage node, layer) states
(docs/routing.md, "Planner"). A node serving the whole model is a one-hop plan, so the same call
answers "run it whole on one node, or as a pipeline?": whichever is predicted to finish first.

The cost of a chain is the predicted end-to-end time ``TTFT + (max_tokens - 1) * per_token``.
A single node serving the whole model runs its own decode loop and streams tokens back:
``TTFT = rtt(entry, node) + wait + prefill`` and ``per_token = decode``. A pipeline is driven by
the entry node (it holds every token so far, which failover replays), so each token travels the
ring entry -> first stage -> ... -> last stage -> entry:

* entering a stage on node ``j`` from node ``h`` (the entry node for the first stage) costs
  ``max_tokens * rtt(h, j) / 2`` (the link is crossed for the prompt and for every further token)
  plus ``j``'s expected queue wait (once);
* running layers ``[a, b)`` on ``j`` costs ``(b - a) * (prompt_tokens * prefill_ms_per_layer_token
  + (max_tokens - 1) * decode_ms_per_layer)``;
* the last stage returns each token to the entry node: ``max_tokens * rtt(last, entry) / 2``.

Ranges may overlap and the chain may leave a range before its end. Because the cost of switching
at layer ``l`` inside an interval where the same nodes cover every layer is linear in ``l``, an
optimal chain only switches at a range boundary, so the search runs over the segments between
consecutive boundaries: O(segments x units^2) for units = (node, range) pairs. When every
stage-to-stage link is priced as the path through the entry (no ``rtt_between``, no
coordinates: the daemon's snapshots), a lower bound on each extension leaves out the ones that
cannot win (``_Walk``), about O(segments x units log units), with the very same result.

RTTs (``snapshot_rtt``): a link from or to the entry node uses the entry's own ``rtt_ms`` to the
node (measured or estimated by the daemon); a stage-to-stage link uses ``rtt_between(a, b)`` when
the caller gives one (the simulator passes its latency model, a daemon may pass a measured
matrix), else the Vivaldi estimate between the two nodes' gossiped coordinates
(``NodeView.coord``), else ``rtt(entry, a) + rtt(entry, b)`` (the path through the entry, an
upper bound by the triangle inequality, so unknown links are not made to look cheap).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from meshd.core import predict
from meshd.core.routing import exclusion_reason
from meshd.core.snapshot import MeshSnapshot, NodeView, Policy, RouteRequest, Serving
from meshd.core.vivaldi import estimate_rtt_ms
from meshd.errors import RoutingError

RttBetween = Callable[[str, str], float]


@dataclass(frozen=True, slots=True)
class Hop:
    """One stage of a plan: ``peer_id`` runs layers ``[layer_start, layer_end)``.

    ``predicted_ms`` is this stage's share of the time to first token: the link into it, its
    queue wait and the prefill of its layers.
    """

    peer_id: str
    name: str
    layer_start: int
    layer_end: int
    predicted_ms: float


@dataclass(frozen=True, slots=True)
class Plan:
    """A chain of stages covering layers ``[0, num_layers)`` of ``model``, and why."""

    model: str
    hops: tuple[Hop, ...]
    predicted_ttft_ms: float
    predicted_per_token_ms: float
    reason: str
    alternatives: tuple[Plan, ...] = ()
    predicted_total_ms: float = 0.0  # TTFT + (max_tokens - 1) * per-token: what was minimised

    @property
    def peers(self) -> tuple[str, ...]:
        return tuple(h.peer_id for h in self.hops)

    @property
    def is_pipeline(self) -> bool:
        return len(self.hops) > 1


@dataclass(frozen=True, slots=True)
class _Unit:
    """One (node, range) pair that may run a stage."""

    node: NodeView
    start: int
    end: int
    prefill_ms_per_layer: float  # for the whole prompt
    decode_ms_per_layer: float  # for one token
    wait_ms: float

    @property
    def key(self) -> tuple[str, int, int]:
        return (self.node.peer_id, self.start, self.end)


def snapshot_rtt(snap: MeshSnapshot, between: RttBetween | None = None) -> RttBetween:
    """RTT estimates for the links of a chain (see the module docstring).

    Links from or to the entry node use the entry's own ``rtt_ms`` to the node; stage-to-stage
    links use ``between`` when given, else coordinates, else the path through the entry.
    """
    views = {n.peer_id: n for n in snap.nodes}
    entry = snap.local_peer_id

    def rtt(a: str, b: str) -> float:
        if a == b:
            return 0.0
        va, vb = views.get(a), views.get(b)
        if a == entry:
            return vb.rtt_ms if vb is not None else 0.0
        if b == entry:
            return va.rtt_ms if va is not None else 0.0
        if between is not None:
            return between(a, b)
        if va is None or vb is None:
            return (va.rtt_ms if va else 0.0) + (vb.rtt_ms if vb else 0.0)
        if va.coord is not None and vb.coord is not None and len(va.coord.vec) == len(vb.coord.vec):
            return estimate_rtt_ms(va.coord, vb.coord)
        return va.rtt_ms + vb.rtt_ms

    return rtt


def _layer_speeds(n: NodeView, s: Serving, prompt_tokens: int) -> tuple[float, float]:
    layers = max(s.num_layers, 1)
    pl = s.prefill_ms_per_layer_token
    if pl <= 0.0:
        pl = predict.prefill_ms(1, n.prefill_tps) / layers
    dl = s.decode_ms_per_layer
    if dl <= 0.0:
        dl = predict.decode_ms_per_token(n.decode_tps) / layers
    return pl * max(prompt_tokens, 0), dl


def _num_layers(req: RouteRequest, snap: MeshSnapshot) -> int:
    """The model's depth: the most common ``num_layers`` among its serving entries."""
    counts: dict[int, int] = {}
    for n in snap.nodes:
        for s in n.serving:
            if s.model == req.model:
                counts[s.num_layers] = counts.get(s.num_layers, 0) + 1
    if not counts:
        raise RoutingError(
            f"request {req.request_id}: no node serves any layer of model {req.model!r}"
        )
    return max(counts.items(), key=lambda kv: (kv[1], kv[0]))[0]


def _units(
    req: RouteRequest, snap: MeshSnapshot, policy: Policy, num_layers: int
) -> tuple[list[_Unit], list[tuple[NodeView, Serving, str]]]:
    units: list[_Unit] = []
    excluded: list[tuple[NodeView, Serving, str]] = []
    for n in sorted(snap.nodes, key=lambda v: v.peer_id):
        ranges = [s for s in n.serving if s.model == req.model and s.num_layers == num_layers]
        if not ranges:
            continue
        why = exclusion_reason(req, n, policy)
        for s in sorted(ranges, key=lambda r: (r.layer_start, r.layer_end)):
            start, end = max(s.layer_start, 0), min(s.layer_end, num_layers)
            if start >= end:
                continue
            if why is not None:
                excluded.append((n, s, why))
                continue
            pl, dl = _layer_speeds(n, s, req.prompt_tokens)
            share = (end - start) / num_layers
            svc = share * predict.service_time_ms(
                req.prompt_tokens, req.max_tokens, n.prefill_tps, n.decode_tps
            )
            rate = n.service_rate_rps
            if rate <= 0.0:
                rate = predict.rate_from_service_ms(n.max_concurrency, svc)
            load = predict.load(n.queue_depth, n.in_flight, n.sent_since_advert)
            wait = predict.queue_wait_ms(load, n.max_concurrency, rate)
            units.append(_Unit(n, start, end, pl, dl, wait))
    return units, excluded


@dataclass(frozen=True, slots=True)
class _State:
    total: float
    ttft: float
    per_token: float
    hops: tuple[Hop, ...]


_Key = tuple[tuple[str, int, int], bool]  # (unit, whether the chain has switched yet)
_Frontier = dict[_Key, tuple[float, tuple[str, ...], _State]]


def _offer(frontier: _Frontier, key: _Key, st: _State) -> None:
    """Keep ``st`` for ``key`` if it is cheaper (ties: the lower sequence of peer ids)."""
    o = (st.total, tuple(h.peer_id for h in st.hops), st)
    old = frontier.get(key)
    if old is None or o[:2] < old[:2]:
        frontier[key] = o


def _search(
    units: Sequence[_Unit],
    bounds: Sequence[int],
    entry: str,
    rtt: RttBetween,
    tokens: int,
    half_rtt: dict[str, float] | None = None,
) -> _State | None:
    """The cheapest chain of two or more stages over the segments ``[bounds[t], bounds[t+1])``.

    States are (unit, whether the chain has switched yet); one-stage chains are priced exactly
    by ``_single`` instead. None when no chain of two or more stages exists.

    ``half_rtt`` (see ``_separable``): when given, ``rtt(a, b)`` is known to be
    ``half_rtt[a] * 2 + half_rtt[b] * 2`` up to rounding for every two stage nodes, and each
    state is extended only from the previous states that can give its cheapest offer
    (``_Walk``): the same offers in the same order minus ones that cannot win, so the same
    result, in about O(units log units) per segment instead of O(units^2).
    """
    best: dict[_Key, _State] = {}
    for t in range(len(bounds) - 1):
        a, b = bounds[t], bounds[t + 1]
        k = b - a
        nxt: _Frontier = {}
        offer = functools.partial(_offer, nxt)
        walk = _Walk(best, tokens, half_rtt) if half_rtt is not None and best else None
        for u in units:
            if not (u.start <= a and u.end >= b):
                continue
            pre = k * u.prefill_ms_per_layer
            dec = k * u.decode_ms_per_layer
            seg = pre + (tokens - 1) * dec
            prevs = best.items() if walk is None else walk.select(u, seg, rtt)
            if t == 0:
                link = rtt(entry, u.node.peer_id) / 2.0
                hop = Hop(u.node.peer_id, u.node.name, a, b, link + u.wait_ms + pre)
                offer(
                    (u.key, False),
                    _State(
                        tokens * link + u.wait_ms + seg, link + u.wait_ms + pre, link + dec, (hop,)
                    ),
                )
            for (key, multi), prev in prevs:
                last = prev.hops[-1]
                if key == u.key:  # the same range goes on: extend its stage
                    hop = Hop(last.peer_id, last.name, last.layer_start, b, last.predicted_ms + pre)
                    offer(
                        (key, multi),
                        _State(
                            prev.total + seg,
                            prev.ttft + pre,
                            prev.per_token + dec,
                            (*prev.hops[:-1], hop),
                        ),
                    )
                elif last.peer_id == u.node.peer_id:  # another range of the same node: no link
                    hop = Hop(u.node.peer_id, u.node.name, a, b, pre)
                    offer(
                        (u.key, True),
                        _State(
                            prev.total + seg,
                            prev.ttft + pre,
                            prev.per_token + dec,
                            (*prev.hops, hop),
                        ),
                    )
                else:
                    link = rtt(last.peer_id, u.node.peer_id) / 2.0
                    hop = Hop(u.node.peer_id, u.node.name, a, b, link + u.wait_ms + pre)
                    st = _State(
                        prev.total + tokens * link + u.wait_ms + seg,
                        prev.ttft + link + u.wait_ms + pre,
                        prev.per_token + link + dec,
                        (*prev.hops, hop),
                    )
                    offer((u.key, True), st)
        if not nxt:
            return None
        best = {key: o[2] for key, o in nxt.items()}
    finals: list[tuple[float, tuple[str, ...], _State]] = []
    for (_, multi), st in best.items():
        if not multi:
            continue
        back = rtt(st.hops[-1].peer_id, entry) / 2.0
        done = _State(st.total + tokens * back, st.ttft + back, st.per_token + back, st.hops)
        finals.append((done.total, tuple(h.peer_id for h in done.hops), done))
    return min(finals, key=lambda o: (o[0], o[1]))[2] if finals else None


# A bound below every computed offer: an offer is a sum of at most eight non-negative terms,
# each rounded once (relative error 2**-53 each), so it is at least (1 - 2**-50) times the exact
# sum, and the estimate of that sum below is at most (1 + 2**-50) times it; _TINY covers the
# absolute error of subnormal terms. Past _HUGE (overflow near) nothing is pruned.
_LOWER = 1.0 - 1e-12
_TINY = 1e-300
_HUGE = 1e300


class _Walk:
    """The previous states worth extending into one unit, for ``_search`` (see ``half_rtt``).

    An offer from a previous state ``p`` (last peer ``x``) into unit ``u`` (peer ``y != x``,
    wait ``w``, segment cost ``seg``) costs ``p.total + tokens * rtt(x, y) / 2 + w + seg``,
    which is at least ``key(p) + tokens * h(y) + w + seg`` (times ``_LOWER``) with
    ``key(p) = p.total + tokens * h(x)`` and ``h`` the half RTTs. Walking the previous states
    by ascending ``key`` finds the cheapest offer ``m``, and stops where the bound passes
    ``m``: the rest cost more than ``m``, so ``_offer`` would keep none of them in the end.
    Offers from the unit's own node, and the first offer into its key (which ``_offer`` keeps
    even if it is NaN), are always made. NaN totals are never the cheapest and never walked.
    """

    __slots__ = ("items", "keys", "order", "own", "tokens", "half")

    def __init__(self, best: dict[_Key, _State], tokens: int, half: dict[str, float]) -> None:
        self.items = list(best.items())
        self.tokens = tokens
        self.half = half
        self.own: dict[str, list[int]] = {}
        keys: list[float] = []
        for i, (_, st) in enumerate(self.items):
            peer = st.hops[-1].peer_id
            self.own.setdefault(peer, []).append(i)
            keys.append(st.total + tokens * half[peer])
        self.keys = keys
        self.order = sorted(
            (i for i in range(len(keys)) if keys[i] == keys[i]), key=keys.__getitem__
        )

    def select(self, u: _Unit, seg: float, rtt: RttBetween) -> list[tuple[_Key, _State]]:
        items, peer = self.items, u.node.peer_id
        rest = self.tokens * self.half[peer] + u.wait_ms + seg
        if rest != rest:  # NaN: nothing to bound with
            return items
        own = self.own.get(peer, ())
        chosen = set(own)
        m = math.inf
        for i in own:
            (key, multi), prev = items[i]
            if key != u.key or multi:  # into (u.key, True): no link, no wait
                c = prev.total + seg
                if c < m:
                    m = c
        first = 1 if items[0][0] == (u.key, False) else 0
        if first < len(items):
            chosen.add(first)
        keys = self.keys
        for i in self.order:
            bound = (keys[i] + rest) * _LOWER - _TINY
            if m < bound < _HUGE:
                break
            prev = items[i][1]
            last = prev.hops[-1].peer_id
            if last == peer:
                continue
            chosen.add(i)
            c = prev.total + self.tokens * (rtt(last, peer) / 2.0) + u.wait_ms + seg
            if c < m:
                m = c
        return [items[i] for i in sorted(chosen)]


def _separable(
    snap: MeshSnapshot, units: Sequence[_Unit], between: RttBetween | None
) -> dict[str, float] | None:
    """Half of each stage node's RTT term in ``snapshot_rtt`` when every link between two of
    them is the path through the entry (no ``between``, no coordinates): ``rtt(a, b)`` is
    then ``h(a) * 2 + h(b) * 2`` with ``h(entry) = 0`` and ``h(x) = rtt_ms(x) / 2``. None
    when that does not hold, or when an RTT is negative or NaN (the bound needs them >= 0),
    or when two units share a key."""
    if between is not None:
        return None
    views = {n.peer_id: n for n in snap.nodes}
    half: dict[str, float] = {}
    seen: set[tuple[str, int, int]] = set()
    for u in units:
        if u.key in seen:
            return None
        seen.add(u.key)
        pid = u.node.peer_id
        v = views[pid]
        if v.coord is not None or not v.rtt_ms >= 0.0:
            return None
        half[pid] = 0.0 if pid == snap.local_peer_id else v.rtt_ms / 2.0
    return half


def _single(u: _Unit, num_layers: int, entry: str, rtt: RttBetween, tokens: int) -> _State:
    """A whole-model node: its own decode loop, tokens streamed back (one round trip in all)."""
    r = rtt(entry, u.node.peer_id)
    pre = num_layers * u.prefill_ms_per_layer
    dec = num_layers * u.decode_ms_per_layer
    ttft = r + u.wait_ms + pre
    hop = Hop(u.node.peer_id, u.node.name, 0, num_layers, ttft)
    return _State(ttft + (tokens - 1) * dec, ttft, dec, (hop,))


def _uncovered(units: Sequence[_Unit], num_layers: int) -> list[int]:
    covered = [False] * num_layers
    for u in units:
        for layer in range(u.start, u.end):
            covered[layer] = True
    return [i for i, c in enumerate(covered) if not c]


def _spans(layers: Sequence[int]) -> str:
    out: list[str] = []
    start = prev = layers[0]
    for x in [*layers[1:], None]:
        if x is not None and x == prev + 1:
            prev = x
            continue
        out.append(str(start) if start == prev else f"{start}-{prev}")
        if x is not None:
            start = prev = x
    return ", ".join(out)


def _describe(st: _State, snap: MeshSnapshot) -> str:
    stages = " -> ".join(
        f"{h.name or h.peer_id}[{h.layer_start},{h.layer_end})"
        + (" (local)" if h.peer_id == snap.local_peer_id else "")
        for h in st.hops
    )
    kind = "whole model on" if len(st.hops) == 1 else f"pipeline of {len(st.hops)} stages:"
    return f"{kind} {stages}, predicted TTFT {st.ttft:.0f} ms, {st.per_token:.1f} ms/token"


def _to_plan(model: str, st: _State, reason: str, alternatives: tuple[Plan, ...] = ()) -> Plan:
    return Plan(model, st.hops, st.ttft, st.per_token, reason, alternatives, st.total)


def plan(
    req: RouteRequest,
    snap: MeshSnapshot,
    policy: Policy,
    rtt_between: RttBetween | None = None,
) -> Plan:
    """The chain of stages predicted to serve ``req`` soonest (see the module docstring).

    Respects ``req.exclude`` (failover replanning) and every hard constraint of the router;
    raises ``RoutingError`` naming the uncovered layers when no chain covers the model.
    ``alternatives`` holds the best plan of the other kind (the best whole-model node when a
    pipeline wins, the best pipeline when a whole-model node wins), when there is one.
    """
    if policy.model_allow and req.model not in policy.model_allow:
        raise RoutingError(
            f"request {req.request_id}: model {req.model!r} is not in the allow-list"
        )
    num_layers = _num_layers(req, snap)
    units, excluded = _units(req, snap, policy, num_layers)
    gaps = _uncovered(units, num_layers)
    if gaps:
        raise RoutingError(_gap_message(req, num_layers, gaps, excluded))
    rtt = snapshot_rtt(snap, rtt_between)
    tokens = max(req.max_tokens, 1)
    entry = snap.local_peer_id
    bounds = sorted({0, num_layers} | {u.start for u in units} | {u.end for u in units})
    options: list[_State] = [
        _single(u, num_layers, entry, rtt, tokens)
        for u in units
        if u.start == 0 and u.end == num_layers
    ]
    pipeline = _search(units, bounds, entry, rtt, tokens, _separable(snap, units, rtt_between))
    if pipeline is not None:
        options.append(pipeline)
    if not options:  # cannot happen once every layer is covered; kept as a guard
        raise RoutingError(f"request {req.request_id}: no chain covers model {req.model!r}")
    options.sort(key=lambda st: (st.total, tuple(h.peer_id for h in st.hops)))
    best = options[0]
    other = next((o for o in options[1:] if (len(o.hops) > 1) != (len(best.hops) > 1)), None)
    reason = _describe(best, snap)
    alternatives: tuple[Plan, ...] = ()
    if other is not None:
        reason += (
            f"; best alternative: {_describe(other, snap)} "
            f"({other.total:.0f} ms in all against {best.total:.0f} ms)"
        )
        alternatives = (_to_plan(req.model, other, _describe(other, snap)),)
    if excluded:
        reason += f"; {len(excluded)} stage range(s) excluded by hard constraints"
    return _to_plan(req.model, best, reason, alternatives)


def _gap_message(
    req: RouteRequest,
    num_layers: int,
    gaps: Sequence[int],
    excluded: Sequence[tuple[NodeView, Serving, str]],
) -> str:
    why = []
    for n, s, reason in excluded:
        if any(s.layer_start <= g < s.layer_end for g in gaps):
            why.append(f"{n.name or n.peer_id}[{s.layer_start},{s.layer_end}) {reason}")
    tail = (
        f"; excluded: {'; '.join(why[:8])}" + (f" and {len(why) - 8} more" if len(why) > 8 else "")
        if why
        else ""
    )
    return (
        f"request {req.request_id}: no chain covers model {req.model!r} ({num_layers} layers): "
        f"layers {_spans(gaps)} are not served by any eligible node{tail}"
    )


__all__ = ["Hop", "Plan", "RttBetween", "plan", "snapshot_rtt"]
