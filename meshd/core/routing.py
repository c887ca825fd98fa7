"""Where one request runs: a pure decision over a ``MeshSnapshot`` (docs/routing.md).

``route(req, snap, policy, rng, rr_index)`` lists every node that serves the whole model, marks
the ones a hard constraint excludes (with the reason), predicts each remaining node's time to
first token, and picks one by the policy's strategy. It returns a ``RouteDecision``: the chosen
peer first in ``order``, then the fallbacks in the order failover and hedging should try them.
If nothing qualifies it raises ``RoutingError`` naming why each node was excluded.

The daemon and the simulator call this very function; it does no I/O, reads no clock, and draws
randomness only from the ``rng`` it is given, so a seeded run decides the same every time.

Speed: the per-node figures of a model are gathered once per snapshot (a ``ModelIndex``
memoised in ``snap.cache``). The formulas are those of ``meshd.core.predict``, written out in a
plain loop for the usual few dozen candidates and as numpy vectors past ``NUMPY_MIN_NODES``
(tests check that both agree with each other and with ``predict``).
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import math
import operator
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from meshd.core.snapshot import MeshSnapshot, NodeView, Policy, RouteRequest, Serving
from meshd.errors import ConfigError, RoutingError

STRATEGIES = ("meshd", "round_robin", "random", "least_queue", "latency_only", "lwsq")

# Hard constraints on single nodes, in the order they are checked (the first that applies is
# the one reported in ``Candidate.excluded_by``).
EXCLUDED_TRIED = "already tried"
EXCLUDED_RESIDENCY = "residency"
EXCLUDED_HOPS = "hop limit"
EXCLUDED_BUSY = "busy"
EXCLUDED_KV = "kv cache full"

# Eligible candidates from which the vectorised (numpy) path is used.
NUMPY_MIN_NODES = 64

Floats = npt.NDArray[np.float64]
Ints = npt.NDArray[np.intp]
Vec = list[float] | Floats
Positions = list[int] | Ints


@dataclass(frozen=True, slots=True)
class Candidate:
    """One node that serves the model, as the router saw it.

    ``predicted_ttft_ms`` = ``rtt_ms`` + ``queue_wait_ms`` + ``prefill_ms`` (staleness corrected,
    the same model whatever the strategy, so hedging and ``meshd explain`` can use it). ``score``
    is what the strategy ranked by, lower is better (None for round_robin and random).
    ``excluded_by`` names the hard constraint that ruled the node out, or is None.
    """

    peer_id: str
    name: str
    predicted_ttft_ms: float | None
    rtt_ms: float
    rtt_source: str
    queue_wait_ms: float
    prefill_ms: float
    score: float | None
    excluded_by: str | None


@dataclass(frozen=True, slots=True)
class RouteDecision:
    """The router's answer and its reasons.

    ``order`` holds peer ids: the chosen one first, then the fallbacks in the order failover and
    hedging should try them (at most ``policy.max_fallbacks``). ``candidates`` lists eligible
    nodes, best first (every peer in ``order``, and more up to ``policy.explain_limit``), then
    excluded ones (up to ``policy.explain_limit``); ``omitted`` counts the nodes serving the model
    that the list leaves out. ``constraints`` are the hard constraints that applied, in words.
    """

    request_id: str
    strategy: str
    candidates: tuple[Candidate, ...]
    order: tuple[str, ...]
    constraints: tuple[str, ...]
    omitted: int = 0

    @property
    def chosen(self) -> str:
        return self.order[0]

    def candidate(self, peer_id: str) -> Candidate | None:
        for c in self.candidates:
            if c.peer_id == peer_id:
                return c
        return None


def residency_allows(labels: frozenset[str], tag: str) -> bool:
    """Whether a node whose certificate carries ``labels`` may serve a request tagged ``tag``.

    Tags and labels are hierarchical with ``/``: a node labelled ``eu/de`` may serve requests
    tagged ``eu`` or ``eu/de``; a node labelled ``eu`` may not serve one tagged ``eu/de`` (it
    could be anywhere in the EU). A label may also be written ``residency:eu``. The node's
    ``region`` field is not used: it is self-declared, the labels are signed by the mesh's CA.
    """
    for label in labels:
        lab = label.removeprefix("residency:")
        if lab == tag or lab.startswith(tag + "/"):
            return True
    return False


def _serves_whole(serving: tuple[Serving, ...], model: str) -> bool:
    for s in serving:
        if s.model == model and s.layer_start == 0 and s.layer_end == s.num_layers:
            return True
    return False


def _nonneg(x: float) -> float:
    """A finite non-negative number (adverts are validated, but never trust a float): NaN and
    negatives count as 0, infinity as 1e18."""
    return x if 0.0 <= x <= 1e18 else (1e18 if x > 1e18 else 0.0)


def _inverse_ms(tps: float) -> float:
    """ms per token at ``tps`` tokens/s; an unknown or absurd speed counts as very slow."""
    return 1000.0 / tps if 1e-9 <= tps <= 1e18 else (0.0 if tps > 1e18 else 1e12)


_COLUMNS = operator.attrgetter(
    "peer_id", "rtt_ms", "queue_depth", "in_flight", "sent_since_advert", "max_queue",
    "max_concurrency", "service_rate_rps", "prefill_tps", "decode_tps", "advert_age_s",
    "cost_per_hour", "free_kv_tokens", "is_local",
)  # fmt: skip


class ModelIndex:
    """The nodes serving the whole of one model, sorted by peer id, as columns of numbers.

    Built once per snapshot and model (``model_index``) and read-only afterwards; ``arrays``
    gives the same columns as numpy arrays for the vectorised path (built on first use).
    """

    __slots__ = (
        "nodes", "ids", "pos", "rtt", "adv", "sent", "c", "rate", "inv_pf", "inv_dc", "age",
        "cph", "kv", "local", "local_at", "queued", "max_queue", "_residency", "_arrays", "_masks",
    )  # fmt: skip

    def __init__(self, nodes: tuple[NodeView, ...]) -> None:
        self.nodes = nodes
        cols = list(zip(*map(_COLUMNS, nodes), strict=True)) if nodes else [()] * 14
        ids, rtt, q0, f0, s0, mq, c, rate, pf, dc, age, cph, kv, local = cols
        q = [x if x > 0 else 0 for x in q0]
        f = [x if x > 0 else 0 for x in f0]
        s = [x if x > 0 else 0 for x in s0]
        # The common case is tested inline; only odd values pay for a call.
        nonneg, inverse = _nonneg, _inverse_ms
        self.ids: list[str] = list(ids)
        self.rtt: list[float] = [x if 0.0 <= x <= 1e18 else nonneg(x) for x in rtt]
        self.adv: list[float] = [
            float(a + b) for a, b in zip(q, f, strict=True)
        ]  # queued + running
        self.sent: list[float] = [float(x) for x in s]  # sent there by us since its advert
        self.queued: list[int] = [a + b for a, b in zip(q, s, strict=True)]
        self.max_queue: list[int] = list(mq)
        self.c: list[float] = [float(x) if x > 1 else 1.0 for x in c]  # slots
        # measured completions/s (0: derive from the speeds)
        self.rate: list[float] = [x if 0.0 <= x <= 1e18 else nonneg(x) for x in rate]
        self.inv_pf: list[float] = [1000.0 / x if 1e-9 <= x <= 1e18 else inverse(x) for x in pf]
        self.inv_dc: list[float] = [1000.0 / x if 1e-9 <= x <= 1e18 else inverse(x) for x in dc]
        self.age: list[float] = [x if 0.0 <= x <= 1e18 else nonneg(x) for x in age]  # advert age, s
        self.cph: list[float] = [x if 0.0 <= x <= 1e18 else nonneg(x) for x in cph]  # per hour
        self.kv: list[int] = list(kv)
        self.local: list[bool] = list(local)
        self.pos = {pid: i for i, pid in enumerate(self.ids)}
        self.local_at = self.local.index(True) if True in self.local else -1
        self._residency: dict[str, list[bool]] = {}
        self._arrays: dict[str, Floats] | None = None
        self._masks: dict[str, npt.NDArray[Any]] | None = None

    def residency(self, tag: str) -> list[bool]:
        """Which nodes' labels allow residency ``tag`` (memoised per tag)."""
        m = self._residency.get(tag)
        if m is None:
            m = [residency_allows(n.labels, tag) for n in self.nodes]
            self._residency[tag] = m
        return m

    def masks(self) -> dict[str, npt.NDArray[Any]]:
        """Boolean and integer columns for the vectorised eligibility test."""
        if self._masks is None:
            self._masks = {
                "not_busy": np.array(self.queued) < np.array(self.max_queue),
                "kv": np.array(self.kv, dtype=np.int64),
                "local": np.array(self.local, dtype=np.bool_),
            }
        return self._masks

    def arrays(self) -> dict[str, Floats]:
        if self._arrays is None:
            names = ("rtt", "adv", "sent", "c", "rate", "inv_pf", "inv_dc", "age", "cph")
            self._arrays = {k: np.array(getattr(self, k), dtype=np.float64) for k in names}
        return self._arrays


def model_index(snap: MeshSnapshot, model: str) -> ModelIndex:
    """The ``ModelIndex`` of ``model`` in ``snap``, memoised in ``snap.cache``."""
    key = ("routing.index", model)
    hit = snap.cache.get(key)
    if isinstance(hit, ModelIndex):
        return hit
    nodes = [n for n in snap.nodes if _serves_whole(n.serving, model)]
    if any(a.peer_id > b.peer_id for a, b in itertools.pairwise(nodes)):
        nodes.sort(key=_peer_id)
    idx = ModelIndex(tuple(nodes))
    snap.cache[key] = idx
    return idx


def _peer_id(n: NodeView) -> str:
    return n.peer_id


def _global_constraints(req: RouteRequest, snap: MeshSnapshot, policy: Policy) -> list[str]:
    """Constraints on the request as a whole; raises when one of them rules everything out."""
    applied: list[str] = []
    if policy.strategy not in STRATEGIES:
        raise ConfigError(
            f"unknown routing strategy {policy.strategy!r}; choose one of {', '.join(STRATEGIES)}"
        )
    if policy.model_allow:
        if req.model not in policy.model_allow:
            raise RoutingError(
                f"request {req.request_id}: model {req.model!r} is not in the allow-list "
                f"({', '.join(sorted(policy.model_allow))})"
            )
        applied.append(f"model {req.model} is on the allow-list")
    quota = policy.client_quota.get(req.client)
    if quota is not None:
        used = snap.client_in_flight.get(req.client, 0)
        if used >= quota:
            raise RoutingError(
                f"request {req.request_id}: client {req.client!r} has {used} requests in flight, "
                f"its quota is {quota}"
            )
        applied.append(f"client {req.client} within quota ({used + 1}/{quota})")
    if req.residency is not None:
        applied.append(f"residency {req.residency}: only nodes whose labels allow it")
    if req.exclude:
        applied.append(f"excluding {len(req.exclude)} peer(s) already tried")
    if req.hops >= policy.max_hops:
        applied.append(f"hop limit reached ({req.hops}/{policy.max_hops}): local node only")
    return applied


def exclusion_reason(req: RouteRequest, n: NodeView, policy: Policy) -> str | None:
    """Why a hard constraint on single nodes rules ``n`` out for ``req``, or None."""
    if n.peer_id in req.exclude:
        return EXCLUDED_TRIED
    if req.residency is not None and not residency_allows(n.labels, req.residency):
        return f"{EXCLUDED_RESIDENCY} (labels do not allow {req.residency})"
    if req.hops >= policy.max_hops and not n.is_local:
        return f"{EXCLUDED_HOPS} ({req.hops}/{policy.max_hops})"
    queued = max(n.queue_depth, 0) + max(n.sent_since_advert, 0)
    if queued >= n.max_queue:
        return f"{EXCLUDED_BUSY} (queue {queued}/{n.max_queue})"
    need = req.prompt_tokens + req.max_tokens
    if n.free_kv_tokens < need:
        return f"{EXCLUDED_KV} ({n.free_kv_tokens} free < {need})"
    return None


def _eligible(req: RouteRequest, idx: ModelIndex, policy: Policy) -> Positions:
    """Positions (in ``idx``, ascending) of the nodes that pass every hard constraint."""
    need = req.prompt_tokens + req.max_tokens
    if len(idx.ids) >= NUMPY_MIN_NODES:
        return _eligible_np(req, idx, policy, need)
    queued, max_queue, kv = idx.queued, idx.max_queue, idx.kv
    out = [i for i in range(len(idx.ids)) if queued[i] < max_queue[i] and kv[i] >= need]
    if req.exclude:
        pos = idx.pos
        gone = {pos[p] for p in req.exclude if p in pos}
        if gone:
            out = [i for i in out if i not in gone]
    if req.residency is not None:
        allowed = idx.residency(req.residency)
        out = [i for i in out if allowed[i]]
    if req.hops >= policy.max_hops:
        local = idx.local
        out = [i for i in out if local[i]]
    return out


def _eligible_np(req: RouteRequest, idx: ModelIndex, policy: Policy, need: int) -> Positions:
    m = idx.masks()
    ok = m["not_busy"] & (m["kv"] >= need)
    if req.exclude:
        gone = [idx.pos[p] for p in req.exclude if p in idx.pos]
        if gone:
            ok[gone] = False
    if req.residency is not None:
        ok &= np.array(idx.residency(req.residency), dtype=np.bool_)
    if req.hops >= policy.max_hops:
        ok &= m["local"]
    out: Ints = np.flatnonzero(ok)
    return out


@dataclass(slots=True)
class _Predictions:
    """Per eligible node (position ``k`` describes node ``e[k]`` of the index)."""

    e: Positions
    rate: Vec  # completions per second when saturated
    wait: Vec  # expected queue wait, ms
    prefill: Vec  # ms
    ttft: Vec  # ms
    cost: Vec  # price of this request there
    age: Vec  # advert age, s


def _predict(req: RouteRequest, idx: ModelIndex, e: Positions, policy: Policy) -> _Predictions:
    """Predicted TTFT of ``req`` at every eligible node (docs/routing.md, "Prediction").

    The loop form of predict.prefill_ms, service_time_ms, service_rate_rps, stale_load,
    queue_wait_ms, predicted_ttft_ms and request_cost.
    """
    if not isinstance(e, list):
        return _predict_np(req, idx, e, policy)
    p = float(max(req.prompt_tokens, 0))
    o = float(max(req.max_tokens - 1, 0))
    rtt, advs, sent, cs, rates, ipf, idc, ages, cph = (
        idx.rtt, idx.adv, idx.sent, idx.c, idx.rate, idx.inv_pf, idx.inv_dc, idx.age, idx.cph,
    )  # fmt: skip
    prefill = [p * ipf[i] for i in e]
    svc = [max(pre + o * idc[i], 1e-3) for pre, i in zip(prefill, e, strict=True)]
    rate = [rates[i] if rates[i] > 0.0 else cs[i] * 1000.0 / s for i, s in zip(e, svc, strict=True)]
    age = [ages[i] for i in e]
    relax_f = policy.stale_relax_factor
    per_rate = sum(advs[i] for i in e) / sum(rate)
    wait: list[float] = []
    ttft: list[float] = []
    cost: list[float] = []
    exp = math.exp
    for k, i in enumerate(e):
        a, c, r = advs[i], cs[i], rate[k]
        load = a
        if relax_f > 0.0 and age[k] > 0.0:
            typical = per_rate * r
            load = typical + (a - typical) * exp(-age[k] * r / (relax_f * (a if a > c else c)))
        ahead = load + sent[i] - c + 1.0
        w = ahead / r * 1000.0 if ahead > 0.0 else 0.0
        wait.append(w)
        ttft.append(rtt[i] + w + prefill[k])
        cost.append(cph[i] / 3600.0 * svc[k] / 1000.0 / c)
    return _Predictions(e, rate, wait, prefill, ttft, cost, age)


def _predict_np(req: RouteRequest, idx: ModelIndex, ix: Ints, policy: Policy) -> _Predictions:
    """``_predict`` as numpy vectors: the same formulas, for large candidate sets."""
    a = idx.arrays()
    everyone = len(ix) == len(idx.ids)  # the usual case: no gathering needed

    def col(name: str) -> Floats:
        v = a[name]
        return v if everyone else v[ix]

    p = float(max(req.prompt_tokens, 0))
    o = float(max(req.max_tokens - 1, 0))
    c = col("c")
    prefill = p * col("inv_pf")
    svc = np.maximum(prefill + o * col("inv_dc"), 1e-3)
    measured = col("rate")
    rate = np.where(measured > 0.0, measured, c * 1000.0 / svc)
    adv = col("adv")
    age = col("age")
    load = adv
    if policy.stale_relax_factor > 0.0:
        typical = float(adv.sum()) / float(rate.sum()) * rate
        relax = policy.stale_relax_factor * np.maximum(adv, c) / rate
        load = typical + (adv - typical) * np.exp(-age / relax)
    ahead = load + col("sent") - c + 1.0
    wait = np.where(ahead > 0.0, ahead / rate * 1000.0, 0.0)
    ttft = col("rtt") + wait + prefill
    cost = col("cph") / 3600.0 * svc / 1000.0 / c
    return _Predictions(ix, rate, wait, prefill, ttft, cost, age)


def _scores(pr: _Predictions, policy: Policy) -> tuple[Vec, Vec]:
    """meshd's score (predicted TTFT plus a small price term) and its part known for sure.

    The price term is ``cost_weight_ms * (cost / cheapest - 1)``: nothing for the cheapest node,
    ``cost_weight_ms`` for one twice its price per request. The known part leaves out the queue
    wait, which stale adverts make uncertain.
    """
    cw = policy.cost_weight_ms
    if isinstance(pr.ttft, np.ndarray):
        cost = np.asarray(pr.cost)
        ref = float(cost.min())
        known = pr.ttft - np.asarray(pr.wait)
        if cw > 0.0 and ref > 0.0:
            known = known + cw * (cost / ref - 1.0)
        return known + pr.wait, known
    ref = min(pr.cost)
    if cw > 0.0 and ref > 0.0:
        known_l = [
            t - w + cw * (c / ref - 1.0) for t, w, c in zip(pr.ttft, pr.wait, pr.cost, strict=True)
        ]
    else:
        known_l = [t - w for t, w in zip(pr.ttft, pr.wait, strict=True)]
    return [k + w for k, w in zip(known_l, pr.wait, strict=True)], known_l


def _weights(pr: _Predictions, known: Vec, policy: Policy) -> Vec:
    """Sampling weights: capacity times a Boltzmann factor (docs/routing.md, "Choosing").

    ``rate * exp(-(known - min known) / T - (wait - min wait) / (T + k * sigma))`` with
    ``T = sample_temperature_ms``, ``k = staleness_temperature`` and ``sigma`` the standard
    deviation, in ms of waiting, of the arrivals and completions a node may have seen since its
    advert: ``1000 * sqrt(age / rate)``. The wait of a node with old figures counts for little.
    """
    t0 = max(policy.sample_temperature_ms, 1e-9)
    kappa = policy.staleness_temperature * 1000.0
    if isinstance(known, np.ndarray):
        wait = np.asarray(pr.wait)
        rate = np.asarray(pr.rate)
        temp = t0 + kappa * np.sqrt(np.asarray(pr.age) / rate)
        x = (known - known.min()) / t0 + (wait - wait.min()) / temp
        out: Floats = rate * np.exp(-x)
        return out
    kmin, wmin = min(known), min(pr.wait)
    exp, sqrt = math.exp, math.sqrt
    return [
        r * exp(-(k - kmin) / t0 - (w - wmin) / (t0 + kappa * sqrt(g / r)))
        for k, w, r, g in zip(known, pr.wait, pr.rate, pr.age, strict=True)
    ]


def _pick(weights: Vec, rng: random.Random, taken: set[int]) -> int | None:
    """One position drawn with probability proportional to its weight, leaving out ``taken``."""
    if taken:
        if isinstance(weights, np.ndarray):
            weights = weights.copy()
            weights[list(taken)] = 0.0
        else:
            weights = [0.0 if k in taken else w for k, w in enumerate(weights)]
    if isinstance(weights, np.ndarray):
        cum_a = np.cumsum(weights)
        total = float(cum_a[-1])
        if not (total > 0.0 and math.isfinite(total)):
            return None
        return min(
            int(np.searchsorted(cum_a, rng.random() * total, side="right")), len(weights) - 1
        )
    cum = list(itertools.accumulate(weights))
    total = cum[-1]
    if not (total > 0.0 and math.isfinite(total)):
        return None
    return min(bisect.bisect_right(cum, rng.random() * total), len(cum) - 1)


def _choose_meshd(
    pr: _Predictions, idx: ModelIndex, policy: Policy, rng: random.Random
) -> tuple[int, Vec]:
    """meshd's default: compare a few candidates drawn by capacity and predicted TTFT.

    ``sample_d`` candidates are compared on their score: the local node when it qualifies (its
    figures are fresh) and the rest drawn by ``_weights`` without replacement. Returns the chosen
    position and the scores. See docs/routing.md, "Why meshd does not herd".
    """
    score, known = _scores(pr, policy)
    n = len(pr.e)
    if n == 1:
        return 0, score
    picked: list[int] = []
    if policy.sample_local and idx.local_at >= 0:
        if isinstance(pr.e, np.ndarray):
            at = int(np.searchsorted(pr.e, idx.local_at))
        else:
            at = bisect.bisect_left(pr.e, idx.local_at)
        if at < n and pr.e[at] == idx.local_at:
            picked = [at]
    if policy.softmax_temperature_ms > 0.0:
        # The softmax variant: one draw over every candidate at a fixed temperature.
        t = policy.softmax_temperature_ms
        smin = float(min(score))
        w = [r * math.exp(-(float(s) - smin) / t) for r, s in zip(pr.rate, score, strict=True)]
        one = _pick(w, rng, set())
        return (one if one is not None else _argmin(score)), score
    weights = _weights(pr, known, policy)
    taken = set(picked)
    for _ in range(max(policy.sample_d, 1) - len(picked)):
        if len(taken) >= n:
            break
        j = _pick(weights, rng, taken)
        if j is None:
            break
        picked.append(j)
        taken.add(j)
    if not picked:
        return _argmin(score), score
    return min(picked, key=lambda k: (float(score[k]), k)), score


def _argmin(v: Vec) -> int:
    return min(range(len(v)), key=lambda k: (float(v[k]), k))


def _ranked(score: Vec, k: int, then: Vec | None = None) -> list[int]:
    """Positions of the ``k`` lowest scores, lowest first; ties by ``then``, then by position
    (which is peer id order)."""
    n = len(score)
    if isinstance(score, np.ndarray) and n > 4 * k:
        part = np.argpartition(score, k)[:k]
        # argpartition splits ties at the boundary arbitrarily: keep every score tied with the kth.
        cand = np.flatnonzero(score <= score[part].max())
        keys = (
            (cand, np.asarray(then)[cand], score[cand]) if then is not None else (cand, score[cand])
        )
        return [int(cand[j]) for j in np.lexsort(keys)[:k]]
    if then is None:
        return heapq.nsmallest(k, range(n), key=lambda j: (float(score[j]), j))
    return heapq.nsmallest(k, range(n), key=lambda j: (float(score[j]), float(then[j]), j))


def route(
    req: RouteRequest,
    snap: MeshSnapshot,
    policy: Policy,
    rng: random.Random,
    rr_index: int = 0,
) -> RouteDecision:
    """Choose the node that serves ``req`` and its fallbacks, by ``policy.strategy``."""
    constraints = _global_constraints(req, snap, policy)
    idx = model_index(snap, req.model)
    if not idx.nodes:
        raise RoutingError(
            f"request {req.request_id}: no node serves the whole of model {req.model!r}"
        )
    e = _eligible(req, idx, policy)
    if len(e) == 0:
        excluded = [(n, exclusion_reason(req, n, policy) or "excluded") for n in idx.nodes]
        raise RoutingError(_nothing_qualifies(req, excluded))
    pr = _predict(req, idx, e, policy)
    strategy = policy.strategy
    n = len(e)
    want = max(policy.max_fallbacks + 1, 1)
    listed_n = max(policy.explain_limit, want)
    score: Vec | None
    if strategy in ("round_robin", "random"):
        start = rr_index % n if strategy == "round_robin" else rng.randrange(n)
        ranked = [(start + k) % n for k in range(min(n, listed_n))]
        score = None
    else:
        then: Vec | None = None
        if strategy == "meshd":
            chosen, score = _choose_meshd(pr, idx, policy, rng)
        else:
            q, rtt = _queue_and_rtt(idx, e)
            if strategy == "least_queue":
                score, then = q, rtt  # ties (frequent) go to the nearest
            elif strategy == "latency_only":
                score = rtt
            else:
                alpha, beta = policy.lwsq_alpha, policy.lwsq_beta
                if isinstance(q, np.ndarray):
                    score = alpha * np.asarray(rtt) + beta * q
                else:
                    score = [alpha * r + beta * x for r, x in zip(rtt, q, strict=True)]
            chosen = -1
        ranked = _ranked(score, listed_n + 1, then)
        if chosen < 0:
            chosen = ranked[0]
        ranked = [chosen, *(k for k in ranked if k != chosen)][:listed_n]
    order = tuple(idx.ids[int(e[k])] for k in ranked[:want])
    listed = _candidates(idx, pr, ranked, score)
    if n < len(idx.nodes) and policy.explain_limit > 0:
        ok = set(e.tolist() if isinstance(e, np.ndarray) else e)
        for j in range(len(idx.nodes)):
            if len(listed) >= len(ranked) + policy.explain_limit:
                break
            if j not in ok:
                node = idx.nodes[j]
                listed.append(_excluded(node, exclusion_reason(req, node, policy) or "excluded"))
    omitted = len(idx.nodes) - len(listed)
    return RouteDecision(
        req.request_id, strategy, tuple(listed), order, tuple(constraints), omitted
    )


def _queue_and_rtt(idx: ModelIndex, e: Positions) -> tuple[Vec, Vec]:
    """Queue length (advertised plus our own since) and RTT of the eligible nodes."""
    if isinstance(e, np.ndarray):
        a = idx.arrays()
        q: Floats = a["adv"][e] + a["sent"][e]
        r: Floats = a["rtt"][e]
        return q, r
    return [idx.adv[i] + idx.sent[i] for i in e], [idx.rtt[i] for i in e]


def _take(v: Vec, ks: list[int]) -> list[float]:
    """``v`` at positions ``ks`` as Python floats."""
    if isinstance(v, np.ndarray):
        out: list[float] = v[ks].tolist()
        return out
    return [float(v[k]) for k in ks]


def _candidates(
    idx: ModelIndex, pr: _Predictions, ks: list[int], score: Vec | None
) -> list[Candidate]:
    """The eligible candidates at positions ``ks``, in that order."""
    nodes = [idx.nodes[int(pr.e[k])] for k in ks]
    scores: list[float | None] = list(_take(score, ks)) if score is not None else [None] * len(ks)
    return [
        Candidate(
            n.peer_id,
            n.name,
            t if math.isfinite(t) and t < 1e15 else None,
            n.rtt_ms,
            n.rtt_source,
            w,
            p,
            sc,
            None,
        )  # fmt: skip
        for n, t, w, p, sc in zip(
            nodes,
            _take(pr.ttft, ks),
            _take(pr.wait, ks),
            _take(pr.prefill, ks),
            scores,
            strict=True,
        )
    ]


def _excluded(n: NodeView, why: str) -> Candidate:
    return Candidate(n.peer_id, n.name, None, n.rtt_ms, n.rtt_source, 0.0, 0.0, None, why)


def _nothing_qualifies(req: RouteRequest, excluded: Sequence[tuple[NodeView, str]]) -> str:
    """One line: every node that serves the model and why it was excluded (grouped by reason)."""
    groups: dict[str, list[str]] = {}
    for n, why in excluded:
        groups.setdefault(why.split(" (")[0], []).append(n.name or n.peer_id)
    parts = []
    for reason, names in sorted(groups.items()):
        more = f" and {len(names) - 5} more" if len(names) > 5 else ""
        parts.append(f"{reason}: {', '.join(names[:5])}{more}")
    tagged = f" with residency {req.residency!r}" if req.residency is not None else ""
    if not excluded:
        return f"request {req.request_id}: no node serves model {req.model!r}{tagged}"
    return (
        f"request {req.request_id}: no node may serve model {req.model!r}{tagged}; "
        f"{len(excluded)} excluded ({'; '.join(parts)})"
    )


def hedge_deadline_ms(decision: RouteDecision, policy: Policy) -> float | None:
    """When to send a second copy to the next peer in ``order`` if no first token has come.

    ``max(policy.hedge_min_ms, policy.hedge_factor * predicted TTFT of the chosen peer)``, in ms
    after sending. None when hedging is off, there is no fallback, or nothing was predicted.
    """
    if policy.hedge_factor <= 0.0 or len(decision.order) < 2:
        return None
    c = decision.candidate(decision.chosen)
    if c is None or c.predicted_ttft_ms is None:
        return None
    return max(policy.hedge_min_ms, policy.hedge_factor * c.predicted_ttft_ms)
