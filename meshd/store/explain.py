"""``explain_text``: an explain record (``Store.explain``) in words a person understands.

Pure: a dict in, a few lines of text out; it never raises, whatever the record holds (a field
missing or of the wrong type is left out of the story). The record is::

    {"request_id", "decision": {"strategy", "candidates": [{name, peer_id, predicted_ttft_ms,
      rtt_ms, rtt_source, queue_wait_ms, prefill_ms, score, excluded_by, joules_per_token,
      prefix_tokens, prefix_credit_ms (both optional: the prompt's prefix cached there)}],
      "constraints": {},
      "chosen", "order": [peer ids, best first], "plan": {"hops": [{name, layer_start,
      layer_end, predicted_ms}]} | None},
     "outcome": {ttft_ms, tokens, tokens_per_s, served_by, route, error, retries, hedges},
     "events": [{ts, kind, node, payload}], "retries", "hedges"}

Event payload keys read here: ``retry`` {to, from, reason, tokens} or, from the entry node,
{target, reason, after_tokens}; ``back_to_refuser`` {target, predicted_ms, instead_of};
``hedge`` {to, after_ms, winner}, ``replan`` {reason}, ``failed`` {error}, ``cancelled`` {reason}. ``to``/``from``/
``winner`` may be a peer id or a name. Constraints may carry ``sample_d`` (the meshd strategy's
"best d"), ``softmax_temperature_ms`` and ``energy_weight``; other constraint keys are listed as they are.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

MAX_LISTED = 5  # other candidates named before "and N more"

_EXCLUSIONS = {
    "residency": "its certificate labels do not allow this request's residency tag",
    "model_allow": "the model is not on the allow-list",
    "model": "it does not serve this model",
    "quota": "the client has used its quota of requests in flight",
    "busy": "its queue is full",
    "tried": "it was already tried for this request",
    "hops": "the request reached the hop limit",
    "stale": "its advert is too old",
}
_RTT_SOURCE = {
    "vivaldi": "network, estimated from coordinates",
    "unknown": "network, a guess with no measurement yet",
}


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list | tuple) else []


def _num(value: Any) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def _text(value: Any) -> str:
    return value if isinstance(value, str) else "" if value is None else str(value)


def _ms(value: Any) -> str:
    x = _num(value)
    if x is None:
        return "? ms"
    if abs(x) >= 1000:
        return f"{x / 1000:.1f} s"
    if abs(x) < 10 and not x.is_integer():
        return f"{x:.1f} ms"
    return f"{x:.0f} ms"


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _plural(n: int, word: str) -> str:
    many = word[:-1] + "ies" if word.endswith("y") else word + "s"
    return f"{n} {word}" if n == 1 else f"{n} {many}"


class _Names:
    """Peer id -> name, from the candidates."""

    def __init__(self, candidates: list[Mapping[str, Any]]) -> None:
        self._by_id = {_text(c.get("peer_id")): _text(c.get("name")) for c in candidates}

    def __call__(self, who: Any) -> str:
        who = _text(who)
        return self._by_id.get(who) or who or "another node"


def _breakdown(c: Mapping[str, Any]) -> str:
    parts = []
    source = _text(c.get("rtt_source"))
    if source != "local" and _num(c.get("rtt_ms")) is not None:
        parts.append(f"{_ms(c.get('rtt_ms'))} {_RTT_SOURCE.get(source, 'network')}")
    if _num(c.get("queue_wait_ms")) is not None:
        parts.append(f"{_ms(c.get('queue_wait_ms'))} queue")
    if _num(c.get("prefill_ms")) is not None:
        held = _num(c.get("prefix_tokens"))
        credit = _num(c.get("prefix_credit_ms"))
        cached = (f" ({held:.0f} prompt tokens cached there, {_ms(credit)} saved)"
                  if held and credit is not None else "")
        parts.append(f"{_ms(c.get('prefill_ms'))} prefill{cached}")
    total = _ms(c.get("predicted_ttft_ms"))
    where = " on this node" if source == "local" else ""
    return f"{total}: {' + '.join(parts)}{where}" if parts else f"{total}{where}"


def _rank(chosen: Mapping[str, Any], eligible: list[Mapping[str, Any]], key: str) -> int:
    mine = _num(chosen.get(key))
    if mine is None:
        return 0
    return 1 + sum(1 for c in eligible if (v := _num(c.get(key))) is not None and v < mine)


def _because(
    strategy: str, chosen: Mapping[str, Any], eligible: list[Any], constraints: Any
) -> str:
    n = len(eligible)
    of_n = f"of {_plural(n, 'eligible node')}"
    ttft = f"its predicted time to first token ({_breakdown(chosen)})"
    predicted = f"(predicted time to first token {_breakdown(chosen)})"
    if strategy == "round_robin":
        return f"it was next in round-robin order among {_plural(n, 'eligible node')}"
    if strategy == "random":
        return f"it was picked at random among {_plural(n, 'eligible node')}"
    if strategy == "latency_only":
        return f"it had the lowest network round trip ({_ms(chosen.get('rtt_ms'))}) {of_n}"
    if strategy == "least_queue":
        return (
            f"it had the shortest expected queue wait ({_ms(chosen.get('queue_wait_ms'))}) {of_n}"
        )
    if strategy == "lwsq":
        score = _num(chosen.get("score"))
        shown = "?" if score is None else f"{score:.1f}"
        rank = _rank(chosen, eligible, "score")
        where = "the lowest" if rank <= 1 else f"the {_ordinal(rank)} lowest"
        return (
            f"its LWSQ score (weighted network latency plus queue length) of {shown} was "
            f"{where} {of_n} {predicted}"
        )
    if strategy not in ("meshd", "meshd_no_prefix", "", "default"):
        score = _num(chosen.get("score"))
        extra = "" if score is None else f", score {score:.1f}"
        return f"strategy {strategy} chose it {predicted[:-1]}{extra})"
    if n <= 1:
        return f"it was the only eligible node {predicted}"
    rank = _rank(chosen, eligible, "predicted_ttft_ms")
    d = _num(constraints.get("sample_d"))
    temp = _num(constraints.get("softmax_temperature_ms"))
    if temp is not None and temp > 0:
        how = (
            f"ranked {_ordinal(max(rank, 1))} {of_n}; meshd samples with a softmax over predicted "
            f"times (temperature {_ms(temp)}) so that nodes with stale load figures do not all "
            "pick the same peer"
        )
    elif d is not None and d > 1 and 1 <= rank <= d:
        how = (
            f"among the best {int(d)} {of_n}; meshd picks at random among the best {int(d)} so "
            "that nodes with stale load figures do not all pick the same peer"
        )
    elif rank == 1:
        how = f"the best {of_n}"
    else:
        how = f"ranked {_ordinal(max(rank, 1))} {of_n}"
    return f"{ttft} was {how}"


def _exclusion(c: Mapping[str, Any]) -> str:
    """``"(residency): its certificate labels ... (eu not in labels)"``, or the raw reason."""
    raw = _text(c.get("excluded_by"))
    code, _, detail = raw.partition(":")
    phrase = _EXCLUSIONS.get(code.strip())
    if phrase is None:
        return f": {raw}"
    detail = f" ({detail.strip()})" if detail.strip() else ""
    return f" ({code.strip()}): {phrase}{detail}"


def _energy_line(eligible: list[Mapping[str, Any]], constraints: Mapping[str, Any]) -> str:
    """``Energy per generated token (measured power): n2 0.42 J, n3 unknown; energy_weight 100
    ms per J/token.``, or "" when no candidate measured its power (docs/telemetry.md)."""
    shown = [(c, _num(c.get("joules_per_token"))) for c in eligible[:MAX_LISTED]]
    if all(j is None for _, j in shown):
        return ""
    parts = ", ".join(f"{_text(c.get('name')) or '?'} {'unknown' if j is None else f'{j:.3g} J'}"
                      for c, j in shown)
    weight = _num(constraints.get("energy_weight"))
    weighed = f"; energy_weight {weight:g} ms per J/token" if weight else " (not weighed)"
    return f"Energy per generated token (measured power): {parts}{weighed}."


def _decision_lines(decision: Mapping[str, Any], names: _Names) -> list[str]:
    candidates = [_map(c) for c in _list(decision.get("candidates"))]
    constraints = _map(decision.get("constraints"))
    eligible = [c for c in candidates if not c.get("excluded_by")]
    excluded = [c for c in candidates if c.get("excluded_by")]
    chosen_id = _text(decision.get("chosen"))
    chosen = next(
        (c for c in candidates if chosen_id and chosen_id in (c.get("peer_id"), c.get("name"))),
        None,
    )
    strategy = _text(decision.get("strategy"))
    lines = []
    hops = [_map(h) for h in _list(_map(decision.get("plan")).get("hops"))]
    if hops:
        stages = ", ".join(
            f"{_text(h.get('name')) or '?'} runs layers {_text(h.get('layer_start'))}-"
            f"{int(end) - 1 if (end := _num(h.get('layer_end'))) is not None else '?'} "
            f"(predicted {_ms(h.get('predicted_ms'))})"
            for h in hops
        )
        lines.append(f"Split into {_plural(len(hops), 'stage')}: {stages}.")
        why = _text(_map(decision.get("plan")).get("reason"))
        if why:
            lines.append(f"Why: the planner chose the {why}.")
    if chosen is not None:
        label = _text(chosen.get("name")) or chosen_id
        local = " (this node)" if _text(chosen.get("rtt_source")) == "local" else ""
        because = _because(strategy, chosen, eligible, constraints)
        lines.append(f"Routed to {label}{local} because {because}.")
    elif chosen_id:
        lines.append(f"Routed to {names(chosen_id)} (strategy {strategy or 'unknown'}).")
    elif not hops:
        lines.append("No node qualified: every candidate was excluded by a hard constraint.")
    order = [names(p) for p in _list(decision.get("order"))]
    others = [n for n in order if chosen is None or n != _text(chosen.get("name"))]
    if not others:
        others = [_text(c.get("name")) for c in eligible if c is not chosen]
    if others:
        shown = ", ".join(others[:MAX_LISTED])
        more = f" and {len(others) - MAX_LISTED} more" if len(others) > MAX_LISTED else ""
        lines.append(f"Next in line if it failed: {shown}{more}.")
    energy = _energy_line(eligible, constraints)
    if energy:
        lines.append(energy)
    for c in excluded:
        lines.append(f"Excluded {_text(c.get('name')) or names(c.get('peer_id'))}{_exclusion(c)}.")
    applied = [
        f"{k}={', '.join(map(_text, v)) if isinstance(v, list) else _text(v)}"
        for k, v in sorted(constraints.items(), key=lambda kv: str(kv[0]))
        if k not in ("sample_d", "softmax_temperature_ms", "energy_weight")
        and v not in (None, "", [], {})
    ]
    if applied:
        lines.append(f"Hard constraints applied: {'; '.join(applied)}.")
    return lines


def _event_lines(events: list[Mapping[str, Any]], names: _Names) -> list[str]:
    lines = []
    overtook = any(_text(e.get("kind")) == "cache_overtook" for e in events)
    for e in events:
        kind, p = _text(e.get("kind")), _map(e.get("payload"))
        if kind == "retry" and "to" not in p and p.get("target"):
            # the entry node's record of a failed attempt: {target, reason, after_tokens}
            reason = f": {_text(p['reason'])}" if p.get("reason") else ""
            tokens = _num(p.get("after_tokens"))
            streamed = f" after {int(tokens)} tokens" if tokens else ""
            lines.append(f"The attempt on {names(p['target'])} failed{streamed}{reason}.")
        elif kind == "retry":
            after = f" after {names(p['from'])} failed" if p.get("from") else ""
            reason = f" ({_text(p['reason'])})" if p.get("reason") else ""
            tokens = _num(p.get("tokens"))
            resumed = (
                f"; it resumed after the {int(tokens)} tokens already streamed, so the client "
                "saw one uninterrupted stream"
                if tokens
                else ""
            )
            lines.append(f"Retried on {names(p.get('to'))}{after}{reason}{resumed}.")
        elif kind == "back_to_refuser":
            when = f" (first token predicted in {_ms(p['predicted_ms'])})" if "predicted_ms" in p else ""
            instead = f", instead of {names(p['instead_of'])}" if p.get("instead_of") else ""
            lines.append(f"Went back to {names(p.get('target'))}, which had only been too busy to "
                         f"start within the wait allowed and reported the shortest wait{when}"
                         f"{instead}.")
        elif kind == "hedge":
            after = f"no first token after {_ms(p['after_ms'])}, so " if "after_ms" in p else ""
            won = f"; {names(p['winner'])} answered first" if p.get("winner") else ""
            lines.append(f"Hedged: {after}a second copy went to {names(p.get('to'))}{won}.")
        elif kind == "replan":
            reason = f": {_text(p['reason'])}" if p.get("reason") else ""
            lines.append(f"Replanned the route{reason}.")
        elif kind == "cancelled":
            reason = f" ({_text(p['reason'])})" if p.get("reason") else ""
            lines.append(f"Cancelled: the client went away{reason}.")
        elif kind == "cache_hit":
            sim = _num(p.get("similarity"))
            at = f" at cosine similarity {sim:.3f}" if sim is not None else ""
            thr = _num(p.get("threshold"))
            over = f" (threshold {thr:.3f})" if thr is not None else ""
            lines.append(f"Answered from this node's semantic cache: the prompt matched cached "
                         f"entry {_text(p.get('entry'))}{at}{over}"
                         f"{'' if overtook else '; no model ran'}.")
        elif kind == "cache_overtook":
            what = ("its finished answer was dropped" if p.get("model") == "dropped"
                    else "it was cancelled")
            lines.append(f"The semantic cache answered while the model ran: {what}.")
        elif kind == "clamped":
            lines.append(f"{_text(p.get('note'))}.")
    return lines


def _timeline(events: list[Mapping[str, Any]]) -> str:
    times = sorted(
        (t, i, _text(e.get("kind")))
        for i, e in enumerate(events)
        if (t := _num(e.get("ts"))) is not None
    )
    if len(times) < 2:
        return ""
    start = times[0][0]
    steps = ", ".join(f"{kind} +{_ms((t - start) * 1000)}" for t, _, kind in times[:12])
    return f"Timeline: {steps}{', ...' if len(times) > 12 else ''}."


def _headline(rid: str, outcome: Mapping[str, Any] | None, names: _Names) -> str:
    if outcome is None:
        return (
            f"Request {rid} has no recorded outcome (still running, or this node stopped "
            "before it ended)."
        )
    error = _text(outcome.get("error"))
    if error:
        return f"Request {rid} failed: {error}."
    served = names(outcome.get("served_by")) if outcome.get("served_by") else "an unknown node"
    route = [names(r) for r in _list(outcome.get("route"))]
    via = f" (route: {' -> '.join(route)})" if len(route) > 1 else ""
    figures = [f"first token after {_ms(outcome.get('ttft_ms'))}"]
    tokens = _num(outcome.get("tokens"))
    if tokens is not None:
        tps = _num(outcome.get("tokens_per_s"))
        rate = f" at {tps:.1f} tokens/s" if tps is not None else ""
        figures.append(f"{_plural(int(tokens), 'token')}{rate}")
    return f"Request {rid} was served by {served}{via}: {', '.join(figures)}."


def _tier_lines(tier: Mapping[str, Any]) -> list[str]:
    """model = "auto": the classifier's score and features, the tier and why (docs/tiers.md)."""
    if not tier:
        return []
    score = _num(tier.get("score"))
    said = f"score {score:.3f}" if score is not None else "no score"
    lines = [f"Model auto: {_text(tier.get('model'))} (tier {_text(tier.get('tier'))}; wanted "
             f"{_text(tier.get('wanted'))}, {said}, threshold {_num(tier.get('threshold')) or 0:.3f}, "
             f"prompt class {_text(tier.get('prompt_class'))})."]
    lines.extend(f"  {_text(r)}" for r in _list(tier.get("reasons")))
    feats = _map(tier.get("features"))
    if feats:
        lines.append("  features: " + ", ".join(f"{k}={v}" for k, v in feats.items()))
    return lines


def explain_text(record: Mapping[str, Any]) -> str:
    """The story of one request: outcome, why this route, what else happened."""
    record = _map(record)
    decision = _map(record.get("decision"))
    outcome = record.get("outcome")
    events = [_map(e) for e in _list(record.get("events"))]
    names = _Names([_map(c) for c in _list(decision.get("candidates"))])
    rid = _text(record.get("request_id")) or "?"
    lines = [_headline(rid, _map(outcome) if isinstance(outcome, Mapping) else None, names)]
    lines.extend(_tier_lines(_map(record.get("tier"))))
    if decision:
        strategy = _text(decision.get("strategy"))
        if strategy:
            lines.append(f"Strategy: {strategy}.")
        lines.extend(_decision_lines(decision, names))
    else:
        lines.append("No routing decision was recorded for it on this node.")
    lines.extend(_event_lines(events, names))
    retries = _num(record.get("retries")) or 0
    hedges = _num(record.get("hedges")) or 0
    if retries or hedges:
        lines.append(f"In all: {_plural(int(retries), 'retry')}, {_plural(int(hedges), 'hedge')}.")
    if timeline := _timeline(events):
        lines.append(timeline)
    return "\n".join(lines)
