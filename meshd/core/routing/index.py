"""The column cache: the nodes serving the whole of one model, as columns of numbers.

``model_index(snap, model)`` gathers, once per snapshot and model (memoised in ``snap.cache``),
every figure the router reads about a node: the prediction inputs (RTT, advertised load, load
we sent since, slots, measured service rate, ms per prefill and decode token, advert age,
price), the constraint inputs (queue, queue limit, free KV cache, labels, is-local). A new
per-node input (a hardware signal, a tier) is one more column here: add it to ``_COLUMNS`` and
``ModelIndex``, and to ``_Columns`` if the numpy path reads it.

``ModelIndex`` holds the columns as lists (the plain-loop path, a few dozen candidates);
``cols()`` gives them as read-only numpy arrays (``_Columns``) for candidate sets of
``NUMPY_MIN_NODES`` or more, and ``_Part``/``_Fixed`` keep the terms of the prediction that do
not depend on the request, computed with the same operations in the same order as a decision
would (so keeping them changes no bit). Nothing here decides anything.
"""

from __future__ import annotations

import itertools
import operator
from typing import Any

import numpy as np
import numpy.typing as npt

from meshd.core.hwsignals import kv_tokens_in_memory
from meshd.core.routing.candidate import Candidate
from meshd.core.snapshot import MeshSnapshot, NodeView, Serving

# Eligible candidates from which the vectorised (numpy) path is used.
NUMPY_MIN_NODES = 64

Floats = npt.NDArray[np.float64]
Ints = npt.NDArray[np.intp]
Vec = list[float] | Floats
Positions = list[int] | Ints


def serves_whole(serving: tuple[Serving, ...], model: str) -> bool:
    for s in serving:
        if s.model == model and s.layer_start == 0 and s.layer_end == s.num_layers:
            return True
    return False


def kv_bytes_per_token(n: NodeView, model: str) -> int:
    """KV cache bytes per token of ``model`` on ``n`` (its whole-model entry; 0: unknown)."""
    s = n.serves(model)
    return s.kv_bytes_per_token if s is not None else 0


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
        "cph", "kv", "local", "local_at", "queued", "max_queue", "residency_memo", "_cols", "rr",
        "pw", "has_power", "px",
    )  # fmt: skip

    def __init__(self, nodes: tuple[NodeView, ...], model: str = "") -> None:
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
        # live hardware signals (meshd.core.hwsignals): the KV cache must also fit in free
        # memory (constraints.memory), and measured power gives energy (-1: not measured)
        if any(n.free_memory_bytes is not None for n in nodes):
            self.kv = [
                k if n.free_memory_bytes is None
                else min(k, kv_tokens_in_memory(n.free_memory_bytes, kv_bytes_per_token(n, model)))
                for k, n in zip(self.kv, nodes, strict=True)
            ]
        self.pw: list[float] = []  # empty when no node measures its power (the usual case)
        if any(n.power_w is not None for n in nodes):
            self.pw = [
                p if p is not None and 0.0 <= p <= 1e9 else -1.0 for p in (n.power_w for n in nodes)
            ]
        self.has_power = any(p >= 0.0 for p in self.pw)
        # the prefix sketches the nodes' adverts carry (meshd.core.prefix_names.sketch):
        # (position, the model identity its names are made with, the sketch as an integer,
        # its bits), for the nodes that carry one; empty when none does
        self.px: list[tuple[int, str, int, int]] = []
        for i, n in enumerate(nodes):
            whole = n.serves(model) if n.serving else None
            if whole is not None and whole.prefix_sketch:
                sk = whole.prefix_sketch
                self.px.append((i, whole.model_id, int.from_bytes(sk, "little"), len(sk) * 8))
        self.local: list[bool] = list(local)
        self.pos = {pid: i for i, pid in enumerate(self.ids)}
        self.local_at = self.local.index(True) if True in self.local else -1
        # Memos of the constraints and the round-robin (constraints.py, roundrobin.py).
        self.residency_memo: dict[str, list[bool]] = {}
        self._cols: _Columns | None = None
        self.rr: tuple[str, list[int]] | None = None

    def cols(self) -> _Columns:
        """The columns as numpy arrays, for the vectorised path (built on first use)."""
        if self._cols is None:
            self._cols = _Columns(self)
        return self._cols


class _Columns:
    """A ``ModelIndex`` as numpy arrays, built on first use (once per snapshot)."""

    __slots__ = (
        "n", "rtt", "adv", "sent", "c", "rate", "inv_pf", "inv_dc", "age", "cph", "not_busy",
        "free", "kv", "kv_min", "local", "residency_memo", "_free_part", "busy_memo", "pw",
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
        self.pw = np.array(idx.pw, dtype=f64)  # -1: not measured (empty: nobody measures)
        self.pw.flags.writeable = False
        _read_only(self.rtt, self.adv, self.sent, self.c, self.rate, self.inv_pf, self.inv_dc,
                   self.age, self.cph, self.not_busy, self.kv, self.local)  # fmt: skip
        self.residency_memo: dict[str, npt.NDArray[np.bool_]] = {}  # constraints.py
        self._free_part: _Part | None = None
        # The excluded listing when only busy nodes are out, per explain_limit (route.py).
        self.busy_memo: dict[int, list[Candidate]] = {}

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
        """The queue terms when every rate is measured (see ``prediction._predict_np``)."""
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
    nodes = [n for n in snap.nodes if serves_whole(n.serving, model)]
    if any(a.peer_id > b.peer_id for a, b in itertools.pairwise(nodes)):
        nodes.sort(key=_peer_id)
    idx = ModelIndex(tuple(nodes), model)
    snap.cache[key] = idx
    return idx


def _peer_id(n: NodeView) -> str:
    return n.peer_id
