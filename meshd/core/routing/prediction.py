"""Prediction: the predicted time to first token of one request at every eligible node.

This is the router's batched form of the formulas in ``meshd.core.predict`` (the reference,
one small pure function each, table-tested): prefill_ms, service_time_ms, service_rate_rps,
stale_load, queue_wait_ms, predicted_ttft_ms and request_cost, evaluated over the columns of a
``ModelIndex`` (``meshd.core.routing.index``, where every input of the prediction is gathered)
as a plain loop for the usual few dozen candidates and as numpy vectors past
``NUMPY_MIN_NODES``. tests/core/test_routing.py checks the loop against ``predict``'s formulas,
tests/core/test_routing_numpy.py the vectors against the loop.

A new term of the prediction (a hardware signal, a tier's speed) goes in three places, side by
side here and in predict.py: its scalar formula in ``meshd.core.predict``, its input column in
``index.py``, and its use in ``_predict`` and ``_predict_np`` below (and a row in the tests).
The strategies read the result, ``_Predictions``, and never the columns' raw speeds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from meshd.core.energy import joules_per_token
from meshd.core.predict import uncached_tokens
from meshd.core.prefix_names import (
    BLOCK_TOKENS,
    CHUNK_BLOCKS,
    block_hashes,
    held_chunks,
    probe_masks,
    sketch_probes,
    sketch_span,
)
from meshd.core.routing.index import Floats, Ints, ModelIndex, Positions, Vec, _Fixed
from meshd.core.snapshot import Policy, RouteRequest

NO_PREFIX = "meshd_no_prefix"  # the strategy that predicts without the prefix credit


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
    # joules per generated token from measured power (meshd.core.energy; NaN: not measured);
    # None when no candidate measures its power
    energy: Vec | None = None
    # prompt tokens each holds in its KV prefix cache (None: none advertised, or ids unknown)
    cached: list[int] | Ints | None = None


def _cached(req: RouteRequest, idx: ModelIndex, e: Positions) -> list[int] | Ints | None:
    """Prompt tokens of ``req`` each node ``e`` holds in its KV prefix cache, from the prefix
    sketches of the adverts (``prefix_names.matched_tokens``: the request's chunk-depth names,
    computed once per model identity, tested against each sketch as bit masks made once per
    identity and sketch size; a node's walk stops at its first name not held). None when no
    node holds a prefix of it or the ids are unknown."""
    if not req.prompt_ids or not idx.px:
        return None
    span = req.prompt_ids[:sketch_span(len(req.prompt_ids))]
    if not span:
        return None
    probes: dict[str, list[bytes]] = {}
    masks: dict[tuple[str, int], list[int]] = {}
    held: dict[int, int] = {}
    chunk = CHUNK_BLOCKS * BLOCK_TOKENS
    for i, mid, value, bits in idx.px:
        m = masks.get((mid, bits))
        if m is None:
            p = probes.get(mid)
            if p is None:
                p = probes[mid] = sketch_probes(block_hashes(span, mid))
            m = masks[(mid, bits)] = probe_masks(p, bits)
        n = held_chunks(value, m)
        if n:
            held[i] = n * chunk
    if not held:
        return None
    if isinstance(e, np.ndarray):
        full = np.zeros(len(idx.nodes), dtype=np.intp)
        for i, t in held.items():
            full[i] = t
        got: Ints = full[e]
        return got if got.any() else None
    out = [held.get(i, 0) for i in e]
    return out if any(out) else None


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
    cached = None if policy.strategy == NO_PREFIX else _cached(req, idx, e)
    if cached is None:
        prefill = [p * ipf[i] for i in e]
    else:
        n = max(req.prompt_tokens, 0)
        prefill = [float(uncached_tokens(n, m)) * ipf[i] for m, i in zip(cached, e, strict=True)]
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
    energy: list[float] | None = None
    if idx.has_power:
        pw, out = idx.pw, max(req.max_tokens, 1)
        energy = [
            math.nan if (j := joules_per_token(pw[i] if pw[i] >= 0.0 else None, svc[k], cs[i], out))
            is None else j
            for k, i in enumerate(e)
        ]
    return _Predictions(e, rate, wait, prefill, ttft, cost, age, None, energy, cached)


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
    cached = None if policy.strategy == NO_PREFIX else _cached(req, idx, ix)
    if cached is None or p <= 0.0:
        prefill = p * part.inv_pf
    else:  # predict.uncached_tokens as a vector: the rest of the prompt, and its last token
        prefill = (p - np.minimum(cached, p - 1.0)) * part.inv_pf
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
        return _Predictions(ix, part.rate, fx.wait, prefill, ttft, cost, part.age, fx,
                            _energy_np(req, idx, ix, svc, c), cached)
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
    return _Predictions(ix, rate, wait, prefill, ttft, cost, part.age, None,
                        _energy_np(req, idx, ix, svc, c), cached)


def _energy_np(req: RouteRequest, idx: ModelIndex, ix: Ints, svc: Floats, c: Floats) -> Floats | None:
    """``energy.joules_per_token`` as a vector (NaN where power is not measured)."""
    if not idx.has_power:
        return None
    pw = idx.cols().pw[ix]
    j = pw * svc / 1000.0 / np.maximum(c, 1.0) / float(max(req.max_tokens, 1))
    out: Floats = np.where(pw >= 0.0, j, np.nan)
    return out
