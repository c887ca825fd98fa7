"""Strategies: how the router ranks the eligible nodes, given their predictions.

``rank(...)`` returns the positions (in the eligible set) of the chosen node and its
fallbacks, best first, and the score each strategy ranked by (None for the round-robins and
random). meshd's own choice (``_choose_meshd``) compares a few candidates drawn by capacity and
a Boltzmann factor over the predicted TTFT (``_weights``, ``known_temperature_ms``, ``_pick``;
docs/routing.md, "meshd's default"); the baselines rank by queue, RTT, both (lwsq) or the predicted
TTFT (least_ttft); the round-robin variants are in ``roundrobin.py``. Two exist for prefix
reuse (docs/routing.md, "Prefix credit"): ``meshd_no_prefix`` is meshd's choice without the
prefill credit for a cached prefix (the prediction ignores the adverts' prefix sketches), and
``prefix_only`` routes purely by the longest advertised prefix of the prompt, ties (and requests
that match nowhere) to the least loaded node: the idea of llm-d's precise prefix-cache scorer
used alone.

A new strategy: its name in ``STRATEGIES`` and one branch in ``rank``.
"""

from __future__ import annotations

import bisect
import functools
import heapq
import itertools
import math
import random

import numpy as np

from meshd.core.energy import energy_terms_ms
from meshd.core.routing.index import Floats, Ints, ModelIndex, Positions, Vec
from meshd.core.routing.prediction import NO_PREFIX, _Predictions
from meshd.core.routing.roundrobin import LOCKSTEP, _round_robin
from meshd.core.snapshot import Policy
from meshd.errors import ConfigError

PREFIX_ONLY = "prefix_only"
STRATEGIES = (
    "meshd", "round_robin", "random", "least_queue", "latency_only", "lwsq", "least_ttft",
    "round_robin_lockstep", NO_PREFIX, PREFIX_ONLY,
)  # fmt: skip
# meshd's sampling choice, with or without the prefix credit
MESHD_CHOICE = ("meshd", NO_PREFIX)
# The strategies compared by default (`meshd sim`, the benchmarks): every one but the herding
# round-robin, which is there only to show what a round-robin whose counters all start at 0 does.
BASELINE_STRATEGIES = STRATEGIES[:7]


def check_strategy(strategy: str) -> None:
    """Raise ``ConfigError`` unless ``strategy`` is one of ``STRATEGIES``."""
    if strategy not in STRATEGIES:
        raise ConfigError(
            f"unknown routing strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}"
        )


def rank(
    pr: _Predictions,
    idx: ModelIndex,
    policy: Policy,
    rng: random.Random,
    rr_index: int,
    local_peer_id: str,
    listed_n: int,
) -> tuple[list[int], Vec | None]:
    """Up to ``listed_n`` positions in ``pr.e``, the chosen first, and the scores (or None)."""
    strategy = policy.strategy
    e = pr.e
    n = len(e)
    score: Vec | None
    if strategy == "round_robin":
        return _round_robin(idx, e, local_peer_id, rr_index, listed_n), None
    if strategy in (LOCKSTEP, "random"):
        # Peer id order from the counter (lockstep: every node walks the same list) or from a
        # random start.
        start = rr_index % n if strategy == LOCKSTEP else rng.randrange(n)
        return [(start + k) % n for k in range(min(n, listed_n))], None
    then: Vec | None = None
    if strategy in MESHD_CHOICE:
        chosen, score = _choose_meshd(pr, idx, policy, rng)
    else:
        q, rtt = _queue_and_rtt(idx, e)
        if strategy == PREFIX_ONLY:
            # the longest prefix held first (as tokens, negated), then the least loaded
            if isinstance(e, np.ndarray):
                score = (np.zeros(n) if pr.cached is None
                         else -np.asarray(pr.cached, dtype=np.float64))
            else:
                score = [0.0] * n if pr.cached is None else [-float(t) for t in pr.cached]
            then = q
        elif strategy == "least_queue":
            score, then = q, rtt  # ties (frequent) go to the nearest
        elif strategy == "latency_only":
            score = rtt
        elif strategy == "least_ttft":
            # Shortest expected delay with the network and prefill: the global minimum of
            # the predicted TTFT (meshd's prediction without its sampling or price term).
            score = pr.ttft
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
    return [chosen, *(k for k in ranked if k != chosen)][:listed_n], score


def _queue_and_rtt(idx: ModelIndex, e: Positions) -> tuple[Vec, Vec]:
    """Queue length (advertised plus our own since) and RTT of the eligible nodes."""
    if isinstance(e, np.ndarray):
        part = idx.cols().part(e)
        q: Floats = part.adv + part.sent
        return q, part.rtt
    return [idx.adv[i] + idx.sent[i] for i in e], [idx.rtt[i] for i in e]


def _scores(pr: _Predictions, policy: Policy) -> tuple[Vec, Vec]:
    """meshd's score (predicted TTFT plus a small price term) and its part known for sure.

    The price term is ``cost_weight_ms * (cost / cheapest - 1)``: nothing for the cheapest node,
    ``cost_weight_ms`` for one twice its price per request. The known part leaves out the queue
    wait, which stale adverts make uncertain.
    """
    cw = policy.cost_weight_ms
    ew = policy.energy_weight if pr.energy is not None else 0.0
    if isinstance(pr.ttft, np.ndarray):
        cost = np.asarray(pr.cost)
        ref = float(cost.min())
        known = pr.ttft - np.asarray(pr.wait)
        if cw > 0.0 and ref > 0.0:
            price = cost / ref  # in place from here: the same operations, fewer arrays
            price -= 1.0
            price *= cw
            known += price
        if ew > 0.0:
            known += _energy_terms_np(np.asarray(pr.energy), ew)
        return known + pr.wait, known
    ref = min(pr.cost)
    if cw > 0.0 and ref > 0.0:
        known_l = [
            t - w + cw * (c / ref - 1.0) for t, w, c in zip(pr.ttft, pr.wait, pr.cost, strict=True)
        ]
    else:
        known_l = [t - w for t, w in zip(pr.ttft, pr.wait, strict=True)]
    if ew > 0.0 and pr.energy is not None:
        terms = energy_terms_ms([None if x != x else x for x in pr.energy], ew)
        known_l = [k + t for k, t in zip(known_l, terms, strict=True)]
    return [k + w for k, w in zip(known_l, pr.wait, strict=True)], known_l


def _energy_terms_np(jpt: Floats, weight: float) -> Floats:
    """``energy.energy_terms_ms`` as a vector: NaN (power not measured) counts as the largest
    measured figure."""
    known = ~np.isnan(jpt)
    if not known.any():
        return np.zeros_like(jpt)
    full = np.where(known, jpt, jpt[known].max())
    out: Floats = weight * (full - full.min())
    return out


def _occupancy(idx: ModelIndex, e: Positions) -> float:
    """Requests per slot over the eligible nodes, as advertised plus what we sent since: how
    busy the mesh looks (0 idle, 1 every slot taken)."""
    if isinstance(e, np.ndarray):
        part = idx.cols().part(e)
        slots = float(part.c.sum())
        return (part.adv_sum + float(part.sent.sum())) / slots if slots > 0.0 else 1.0
    slots_l = sum(idx.c[i] for i in e)
    return sum(idx.adv[i] + idx.sent[i] for i in e) / slots_l if slots_l > 0.0 else 1.0


def known_temperature_ms(policy: Policy, occupancy: float) -> float:
    """The temperature of the known part (RTT, prefill, price) of meshd's sampling weights.

    ``sample_temperature_ms`` times ``occupancy / known_temperature_full_at``, at least
    ``known_temperature_floor`` and at most 1 of it: on a mesh with free slots nearly everywhere
    the facts that do not go stale decide (the fastest, nearest, cheapest nodes take the work,
    as a global minimum would); from half busy on (the default) the draw spreads over
    near-equals exactly as with a fixed temperature.
    """
    full = policy.known_temperature_full_at
    f = min(max(occupancy / full if full > 0.0 else 1.0, policy.known_temperature_floor), 1.0)
    return policy.sample_temperature_ms * f if f == f else policy.sample_temperature_ms


def _weights(pr: _Predictions, known: Vec, policy: Policy, tk: float | None = None) -> Vec:
    """Sampling weights: capacity times a Boltzmann factor (docs/routing.md, "meshd's default").

    ``rate * exp(-(known - min known) / Tk - (wait - min wait) / (T + k * sigma))`` with
    ``T = sample_temperature_ms``, ``Tk = tk`` (``known_temperature_ms``; T when not given),
    ``k = staleness_temperature`` and ``sigma`` the standard
    deviation, in ms of waiting, of the arrivals and completions a node may have seen since its
    advert: ``1000 * sqrt(age / rate)``. The wait of a node with old figures counts for little.
    """
    t0 = max(policy.sample_temperature_ms, 1e-9)
    kappa = policy.staleness_temperature * 1000.0
    tk = t0 if tk is None else max(tk, 1e-9)
    if isinstance(known, np.ndarray):
        wait = np.asarray(pr.wait)
        rate = np.asarray(pr.rate)
        age = np.asarray(pr.age)
        if pr.fixed is not None:  # the wait term does not depend on the request
            term = pr.fixed.wait_term(rate, age, t0, kappa)
        else:
            temp = age / rate  # then in place: t0 + kappa * sqrt(age / rate)
            np.sqrt(temp, out=temp)
            temp *= kappa
            temp += t0
            term = wait - wait.min()
            term /= temp
        # -x computed as (kmin - known) / t0 - term: IEEE rounding is symmetric, so these are
        # the bits of -((known - kmin) / t0 + term); then exp and the rate, in place.
        out: Floats = known.min() - known
        out /= tk
        out -= term
        np.exp(out, out=out)
        out *= rate
        return out
    kmin, wmin = min(known), min(pr.wait)
    exp, sqrt = math.exp, math.sqrt
    return [
        r * exp(-(k - kmin) / tk - (w - wmin) / (t0 + kappa * sqrt(g / r)))
        for k, w, r, g in zip(known, pr.wait, pr.rate, pr.age, strict=True)
    ]


def _pick(weights: Vec, rng: random.Random, taken: set[int]) -> int | None:
    """One position drawn with probability proportional to its weight, leaving out ``taken``."""
    if taken:
        if isinstance(weights, np.ndarray):
            weights = weights.copy()
            if len(taken) == 1:
                weights[next(iter(taken))] = 0.0
            else:
                weights[list(taken)] = 0.0
        else:
            weights = [0.0 if k in taken else w for k, w in enumerate(weights)]
    if isinstance(weights, np.ndarray):
        cum_a = weights.cumsum()
        total = float(cum_a[-1])
        if not (total > 0.0 and math.isfinite(total)):
            return None
        return min(int(cum_a.searchsorted(rng.random() * total, side="right")), len(weights) - 1)
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
            at = int(pr.e.searchsorted(idx.local_at))
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
    tk = None
    if policy.known_temperature_floor < 1.0 or policy.argmin_below_occupancy > 0.0:
        occupancy = _occupancy(idx, pr.e)
        if occupancy < policy.argmin_below_occupancy:
            return _argmin(score), score
        if policy.known_temperature_floor < 1.0:
            tk = known_temperature_ms(policy, occupancy)
    weights = _weights(pr, known, policy, tk)
    taken = set(picked)
    if policy.sample_prefix and pr.cached is not None and len(picked) < max(policy.sample_d, 1):
        # one of those compared holds the deepest advertised prefix of the prompt (drawn by
        # the weights among the nodes holding that much): its credit is weighed against its
        # queue in the score, as the local node's fresh figures are
        cached = np.asarray(pr.cached)
        deepest = cached == cached.max()
        held = [w if h else 0.0 for w, h in zip(np.asarray(weights).tolist(), deepest.tolist(),
                                                strict=True)]
        j = _pick(held, rng, taken)
        if j is not None:
            picked.append(j)
            taken.add(j)
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
        return _lowest_np(score, k, then)
    if then is None:
        return heapq.nsmallest(k, range(n), key=lambda j: (float(score[j]), j))
    return heapq.nsmallest(k, range(n), key=lambda j: (float(score[j]), float(then[j]), j))


@functools.lru_cache(maxsize=64)
def _block_starts(n: int, k: int) -> Ints:
    """Starts of at least ``max(2k, 64)`` blocks covering ``n`` positions (see ``_lowest_np``)."""
    starts: Ints = np.arange(0, n, max(n // max(2 * k, 64), 1), dtype=np.intp)
    starts.flags.writeable = False
    return starts


def _lowest_np(score: Floats, k: int, then: Vec | None) -> list[int]:
    """``_ranked`` for a long vector: positions of the ``k`` lowest scores, lowest first, ties
    by ``then`` and then by position.

    Every position scoring at most the kth lowest score must be a candidate (ties at the
    boundary all stay in). Instead of a partition of the whole vector, a threshold at least
    that high comes from the minima of ``>= k`` blocks: their kth lowest is at least the kth
    lowest score, since the k lowest minima are k distinct scores. The few extra candidates it
    lets in score above the kth and sort after the k kept.
    """
    mins = np.minimum.reduceat(score, _block_starts(len(score), k))
    mins.partition(k - 1)
    bound = mins[k - 1]
    if not bound <= bound:  # NaN: a NaN score poisoned a block minimum; partition it all
        bound = np.partition(score, k - 1)[k - 1]
    cand = (score <= bound).nonzero()[0]
    sub = score[cand]
    if then is None:  # a stable sort keeps ties in position order (cand is ascending)
        picked: list[int] = cand[sub.argsort(kind="stable")[:k]].tolist()
    else:
        picked = cand[np.lexsort((cand, np.asarray(then)[cand], sub))[:k]].tolist()
    return picked
