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
import functools
import hashlib
import heapq
import itertools
import math
import operator
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from meshd.core.snapshot import MeshSnapshot, NodeView, Policy, RouteRequest, Serving
from meshd.errors import ConfigError, QuotaError, RoutingError

STRATEGIES = (
    "meshd", "round_robin", "random", "least_queue", "latency_only", "lwsq", "least_ttft",
    "round_robin_lockstep",
)  # fmt: skip
# The strategies compared by default (`meshd sim`, the benchmarks): every one but the herding
# round-robin, which is there only to show what a round-robin whose counters all start at 0 does.
BASELINE_STRATEGIES = STRATEGIES[:7]
LOCKSTEP = "round_robin_lockstep"

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


class Candidate(NamedTuple):
    """One node that serves the model, as the router saw it.

    ``predicted_ttft_ms`` = ``rtt_ms`` + ``queue_wait_ms`` + ``prefill_ms`` (staleness corrected,
    the same model whatever the strategy, so hedging and ``meshd explain`` can use it). ``score``
    is what the strategy ranked by, lower is better (None for the round-robins and random).
    ``excluded_by`` names the hard constraint that ruled the node out, or is None. (A named
    tuple: a decision lists up to ``explain_limit`` of them, and a tuple is built in a third of
    the time of a frozen dataclass.)
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


def round_robin_offset(peer_id: str, strategy: str = "round_robin") -> int:
    """Where a node's round-robin counter starts: a number fixed by its identity.

    Independent balancers do not start in step. If every node's counter started at 0 and every
    node walked the same list, all entry nodes would point at the same few servers at any
    moment (``round_robin_lockstep``, kept to show that herd: its counters start at 0). The
    daemon starts its counter here; the simulator draws each node's offset from its seeded
    generator instead (so that a seed changes it). Stable across restarts and platforms.
    """
    if strategy == LOCKSTEP:
        return 0
    digest = hashlib.blake2b(b"rr-offset\0" + peer_id.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 33  # 31 bits


def round_robin_rank(local_peer_id: str, peer_id: str) -> int:
    """``peer_id``'s place in ``local_peer_id``'s own order of peers (lower first).

    Each node walks its own permutation of the candidates, a stable hash of the pair, so two
    entry nodes whose counters happen to agree still point at different servers.
    """
    key = f"{local_peer_id}\0{peer_id}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big")


def _round_robin(idx: ModelIndex, e: Positions, local_peer_id: str, rr_index: int,
                 k: int) -> list[int]:  # fmt: skip
    """The first ``k`` positions (in ``e``) of the local node's own order, from ``rr_index``."""
    order = idx.rr_order(local_peer_id)
    n = len(e)
    if n == len(order):
        seq = order  # every node is eligible: positions in e are positions in the index
    elif isinstance(e, np.ndarray):
        at = np.full(len(order), -1, dtype=np.intp)
        at[e] = np.arange(n, dtype=np.intp)
        seq = [p for p in at[order].tolist() if p >= 0]
    else:
        where = dict(zip(e, range(n), strict=True))
        seq = [where[i] for i in order if i in where]
    start = rr_index % n
    return [seq[(start + j) % n] for j in range(min(k, n))]


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
        "cph", "kv", "local", "local_at", "queued", "max_queue", "_residency", "_cols", "_rr",
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
        self._cols: _Columns | None = None
        self._rr: tuple[str, list[int]] | None = None

    def rr_order(self, local_peer_id: str) -> list[int]:
        """The positions of every node in ``local_peer_id``'s own round-robin order (memoised:
        a snapshot is one node's)."""
        hit = self._rr
        if hit is None or hit[0] != local_peer_id:
            keys = [round_robin_rank(local_peer_id, pid) for pid in self.ids]
            hit = self._rr = (local_peer_id, sorted(range(len(keys)), key=keys.__getitem__))
        return hit[1]

    def residency(self, tag: str) -> list[bool]:
        """Which nodes' labels allow residency ``tag`` (memoised per tag)."""
        m = self._residency.get(tag)
        if m is None:
            m = [residency_allows(n.labels, tag) for n in self.nodes]
            self._residency[tag] = m
        return m

    def cols(self) -> _Columns:
        """The columns as numpy arrays, for the vectorised path (built on first use)."""
        if self._cols is None:
            self._cols = _Columns(self)
        return self._cols


class _Columns:
    """A ``ModelIndex`` as numpy arrays, built on first use (once per snapshot)."""

    __slots__ = (
        "n", "rtt", "adv", "sent", "c", "rate", "inv_pf", "inv_dc", "age", "cph", "not_busy",
        "free", "kv", "kv_min", "local", "_residency", "_free_part", "_busy",
    )  # fmt: skip

    def __init__(self, idx: ModelIndex) -> None:
        f64 = np.float64
        self.n = len(idx.ids)
        self.rtt = np.array(idx.rtt, dtype=f64)
        self.adv = np.array(idx.adv, dtype=f64)
        self.sent = np.array(idx.sent, dtype=f64)
        self.c = np.array(idx.c, dtype=f64)
        self.rate = np.array(idx.rate, dtype=f64)  # measured completions/s, 0: derive
        self.inv_pf = np.array(idx.inv_pf, dtype=f64)
        self.inv_dc = np.array(idx.inv_dc, dtype=f64)
        self.age = np.array(idx.age, dtype=f64)
        self.cph = np.array(idx.cph, dtype=f64)
        self.not_busy = np.array(idx.queued) < np.array(idx.max_queue)
        self.free = self.not_busy.nonzero()[0]  # eligible when no other constraint applies
        self.free.flags.writeable = False
        self.kv = np.array(idx.kv, dtype=np.int64)
        self.kv_min = int(self.kv.min()) if self.n else 0
        self.local = np.array(idx.local, dtype=np.bool_)
        _read_only(self.rtt, self.adv, self.sent, self.c, self.rate, self.inv_pf, self.inv_dc,
                   self.age, self.cph, self.not_busy, self.kv, self.local)  # fmt: skip
        self._residency: dict[str, npt.NDArray[np.bool_]] = {}
        self._free_part: _Part | None = None
        self._busy: dict[int, list[Candidate]] = {}

    def residency(self, idx: ModelIndex, tag: str) -> npt.NDArray[np.bool_]:
        m = self._residency.get(tag)
        if m is None:
            m = self._residency[tag] = np.array(idx.residency(tag), dtype=np.bool_)
        return m

    def busy_listing(self, idx: ModelIndex, req: RouteRequest, policy: Policy) -> list[Candidate]:
        """The first ``explain_limit`` excluded nodes of a decision whose eligible set is
        ``free``: busy nodes only, whose reason depends on nothing else (kept per limit)."""
        limit = policy.explain_limit
        got = self._busy.get(limit)
        if got is None:
            gone = (~self.not_busy).nonzero()[0][:limit].tolist()
            got = self._busy[limit] = [
                _excluded(idx.nodes[j], exclusion_reason(req, idx.nodes[j], policy) or "excluded")
                for j in gone
            ]
        return got

    def part(self, ix: Ints) -> _Part:
        """The columns of the eligible positions ``ix``; kept (with the terms derived from them)
        when ``ix`` is the usual set, ``free``."""
        if ix is self.free:
            if self._free_part is None:
                self._free_part = _Part(self, ix)
            return self._free_part
        return _Part(self, ix)


class _Part:
    """The columns of some eligible nodes, and every term of the prediction that does not
    depend on the request, each computed on first use.

    Each term is computed exactly as a decision would compute it (the same operations in the
    same order), so keeping it changes no bit of any result. When every one of these nodes has
    a measured service rate (the simulator's snapshots), the queue wait itself does not depend
    on the request: ``fixed`` keeps it, per staleness factor.
    """

    __slots__ = (
        "rtt", "adv", "sent", "c", "c1000", "rate", "measured", "all_measured", "inv_pf",
        "inv_dc", "age", "neg_age", "cph_h", "maxac", "adv_sum", "_fmaxac", "_fixed",
    )  # fmt: skip

    def __init__(self, cols: _Columns, ix: Ints) -> None:
        if len(ix) == cols.n:  # everyone: no gathering
            self.rtt, self.adv, self.sent, self.c, self.rate = (
                cols.rtt, cols.adv, cols.sent, cols.c, cols.rate,
            )  # fmt: skip
            self.inv_pf, self.inv_dc, self.age, cph = cols.inv_pf, cols.inv_dc, cols.age, cols.cph
        else:
            self.rtt, self.adv, self.sent, self.c, self.rate = (
                cols.rtt[ix], cols.adv[ix], cols.sent[ix], cols.c[ix], cols.rate[ix],
            )  # fmt: skip
            self.inv_pf, self.inv_dc, self.age, cph = (
                cols.inv_pf[ix], cols.inv_dc[ix], cols.age[ix], cols.cph[ix],
            )  # fmt: skip
        self.c1000 = self.c * 1000.0
        self.measured = self.rate > 0.0
        self.all_measured = bool(self.measured.all())
        self.neg_age = -self.age
        self.cph_h = cph / 3600.0
        self.maxac = np.maximum(self.adv, self.c)
        self.adv_sum = float(self.adv.sum())
        _read_only(self.rtt, self.adv, self.sent, self.c, self.rate, self.inv_pf, self.inv_dc,
                   self.age, self.c1000, self.measured, self.neg_age, self.cph_h, self.maxac)  # fmt: skip
        self._fmaxac: dict[float, Floats] = {}
        self._fixed: dict[float, _Fixed] = {}

    def fmaxac(self, f: float) -> Floats:
        """``f * max(adv, c)``: the numerator of the staleness relaxation time."""
        v = self._fmaxac.get(f)
        if v is None:
            v = self._fmaxac[f] = _read_only(f * self.maxac)
        return v

    def fixed(self, f: float) -> _Fixed:
        """The queue terms when every rate is measured (see ``_predict_np``)."""
        fx = self._fixed.get(f)
        if fx is None:
            rate = self.rate
            load = self.adv
            if f > 0.0:
                typical = self.adv_sum / float(rate.sum()) * rate
                relax = self.fmaxac(f) / rate
                load = typical + (self.adv - typical) * np.exp(self.neg_age / relax)
            ahead = load + self.sent - self.c + 1.0
            wait = np.where(ahead > 0.0, ahead / rate * 1000.0, 0.0)
            fx = self._fixed[f] = _Fixed(_read_only(wait), _read_only(self.rtt + wait))
        return fx


class _Fixed:
    """Queue wait (and RTT plus wait) of every node, when it does not depend on the request;
    and the weights' wait term per sampling temperature, likewise."""

    __slots__ = ("wait", "rtt_wait", "wait_min", "_terms")

    def __init__(self, wait: Floats, rtt_wait: Floats) -> None:
        self.wait = wait
        self.rtt_wait = rtt_wait
        self.wait_min = wait.min() if len(wait) else 0.0
        self._terms: dict[tuple[float, float], Floats] = {}

    def wait_term(self, rate: Floats, age: Floats, t0: float, kappa: float) -> Floats:
        key = (t0, kappa)
        v = self._terms.get(key)
        if v is None:
            temp = t0 + kappa * np.sqrt(age / rate)
            v = self._terms[key] = _read_only((self.wait - self.wait_min) / temp)
        return v


def _read_only(*arrays: npt.NDArray[Any]) -> Floats:
    """Freeze memoised arrays (a decision must never write into a snapshot's memo); returns the
    first."""
    for a in arrays:
        a.flags.writeable = False
    first: Floats = arrays[0]
    return first


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
    within = quota_constraint(req, snap, policy)
    if within is not None:
        applied.append(within)
    if req.residency is not None:
        applied.append(f"residency {req.residency}: only nodes whose labels allow it")
    if req.exclude:
        applied.append(f"excluding {len(req.exclude)} peer(s) already tried")
    if req.hops >= policy.max_hops:
        applied.append(f"hop limit reached ({req.hops}/{policy.max_hops}): local node only")
    return applied


def quota_constraint(req: RouteRequest, snap: MeshSnapshot, policy: Policy) -> str | None:
    """The client's quota of requests in flight, in words; raises when it is used up. None when
    the client has no quota. (Pipelines check it too, before planning.)"""
    quota = policy.client_quota.get(req.client)
    if quota is None:
        return None
    used = snap.client_in_flight.get(req.client, 0)
    if used >= quota:
        raise QuotaError(
            f"request {req.request_id}: client {req.client!r} has {used} requests in flight, "
            f"its quota is {quota}"
        )
    return f"client {req.client} within quota ({used + 1}/{quota})"


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
    cols = idx.cols()
    ok = cols.not_busy if need <= cols.kv_min else cols.not_busy & (cols.kv >= need)
    if req.exclude:
        gone = [idx.pos[p] for p in req.exclude if p in idx.pos]
        if gone:
            ok = ok.copy() if ok is cols.not_busy else ok
            ok[gone] = False
    if req.residency is not None:
        ok = ok & cols.residency(idx, req.residency)
    if req.hops >= policy.max_hops:
        ok = ok & cols.local
    if ok is cols.not_busy:
        return cols.free  # the usual case: the same positions as last time
    out: Ints = ok.nonzero()[0]
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
    fixed: _Fixed | None = None  # the vectorised path's request-independent terms, if any


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
    """``_predict`` as numpy vectors: the same formulas, for large candidate sets.

    Terms that do not depend on the request come from ``_Part`` (computed with the same
    operations in the same order, so the same bits as computing them here); in place below
    where an array is not kept (operands of + and * swapped at most: the same bits again).
    """
    part = idx.cols().part(ix)
    p = float(max(req.prompt_tokens, 0))
    o = float(max(req.max_tokens - 1, 0))
    f = policy.stale_relax_factor
    c = part.c
    prefill = p * part.inv_pf
    svc = o * part.inv_dc
    svc += prefill
    np.maximum(svc, 1e-3, out=svc)
    cost = part.cph_h * svc
    cost /= 1000.0
    cost /= c
    if part.all_measured:
        # Every rate is measured: the queue wait does not depend on the request.
        fx = part.fixed(f if f > 0.0 else 0.0)
        ttft = fx.rtt_wait + prefill
        return _Predictions(ix, part.rate, fx.wait, prefill, ttft, cost, part.age, fx)
    if part.measured.any():
        rate = np.where(part.measured, part.rate, part.c1000 / svc)
    else:
        rate = part.c1000 / svc  # none measured (the daemon's snapshots): every rate derived
    if f > 0.0:
        load = part.adv_sum / float(rate.sum()) * rate  # the typical load, for now
        decay = part.fmaxac(f) / rate  # the relaxation time, for now
        np.divide(part.neg_age, decay, out=decay)
        np.exp(decay, out=decay)
        gap = part.adv - load
        gap *= decay
        load += gap  # typical + (adv - typical) * exp(-age / relax)
        ahead = load
        ahead += part.sent
    else:
        ahead = part.adv + part.sent
    ahead -= c
    ahead += 1.0
    wait = ahead / rate
    wait *= 1000.0
    wait = np.where(ahead > 0.0, wait, 0.0)
    ttft = part.rtt + wait
    ttft += prefill
    return _Predictions(ix, rate, wait, prefill, ttft, cost, part.age)


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
            price = cost / ref  # in place from here: the same operations, fewer arrays
            price -= 1.0
            price *= cw
            known += price
        return known + pr.wait, known
    ref = min(pr.cost)
    if cw > 0.0 and ref > 0.0:
        known_l = [
            t - w + cw * (c / ref - 1.0) for t, w, c in zip(pr.ttft, pr.wait, pr.cost, strict=True)
        ]
    else:
        known_l = [t - w for t, w in zip(pr.ttft, pr.wait, strict=True)]
    return [k + w for k, w in zip(known_l, pr.wait, strict=True)], known_l


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
    """Sampling weights: capacity times a Boltzmann factor (docs/routing.md, "Choosing").

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
    if policy.known_temperature_floor < 1.0:
        tk = known_temperature_ms(policy, _occupancy(idx, pr.e))
    weights = _weights(pr, known, policy, tk)
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
    if strategy == "round_robin":
        ranked = _round_robin(idx, e, snap.local_peer_id, rr_index, listed_n)
        score = None
    elif strategy in (LOCKSTEP, "random"):
        # Peer id order from the counter (lockstep: every node walks the same list) or from a
        # random start.
        start = rr_index % n if strategy == LOCKSTEP else rng.randrange(n)
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
        ranked = [chosen, *(k for k in ranked if k != chosen)][:listed_n]
    ids = idx.ids
    if isinstance(e, np.ndarray):
        order = tuple([ids[i] for i in e[ranked[:want]].tolist()])
    else:
        order = tuple([ids[e[k]] for k in ranked[:want]])
    listed = _candidates(idx, pr, ranked, score)
    if n < len(idx.nodes) and policy.explain_limit > 0 and isinstance(e, np.ndarray) and e is idx.cols().free:
        # Only the busy nodes are out (see _eligible_np): the same list for every such request.
        listed.extend(idx.cols().busy_listing(idx, req, policy))
    elif n < len(idx.nodes) and policy.explain_limit > 0:
        # The first explain_limit excluded nodes, in index (peer id) order.
        if isinstance(e, np.ndarray):
            out = np.ones(len(idx.nodes), dtype=np.bool_)
            out[e] = False
            gone: list[int] = out.nonzero()[0][: policy.explain_limit].tolist()
        else:
            ok = set(e)
            gone = [j for j in range(len(idx.nodes)) if j not in ok][: policy.explain_limit]
        for j in gone:
            node = idx.nodes[j]
            listed.append(_excluded(node, exclusion_reason(req, node, policy) or "excluded"))
    omitted = len(idx.nodes) - len(listed)
    return RouteDecision(
        req.request_id, strategy, tuple(listed), order, tuple(constraints), omitted
    )


def _queue_and_rtt(idx: ModelIndex, e: Positions) -> tuple[Vec, Vec]:
    """Queue length (advertised plus our own since) and RTT of the eligible nodes."""
    if isinstance(e, np.ndarray):
        part = idx.cols().part(e)
        q: Floats = part.adv + part.sent
        return q, part.rtt
    return [idx.adv[i] + idx.sent[i] for i in e], [idx.rtt[i] for i in e]


def _take(v: Vec, ks: list[int] | Ints) -> list[float]:
    """``v`` at positions ``ks`` as Python floats."""
    if isinstance(v, np.ndarray):
        out: list[float] = v[ks].tolist()
        return out
    return [float(v[k]) for k in ks]


def _candidates(
    idx: ModelIndex, pr: _Predictions, ks: list[int], score: Vec | None
) -> list[Candidate]:
    """The eligible candidates at positions ``ks``, in that order."""
    if isinstance(pr.e, np.ndarray):
        at: list[int] | Ints = np.array(ks, dtype=np.intp)  # one conversion for every column
        nodes = [idx.nodes[i] for i in pr.e[at].tolist()]
    else:
        at = ks
        nodes = [idx.nodes[pr.e[k]] for k in ks]
    scores: list[float | None] = list(_take(score, at)) if score is not None else [None] * len(ks)
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
