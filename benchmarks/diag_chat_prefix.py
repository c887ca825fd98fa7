"""Where the chat workload's TTFT goes, request by request (issue 32's diagnosis).

    PYTHONPATH=. .venv/bin/python benchmarks/diag_chat_prefix.py [--region us-east]
        [--duration 60] [--seed 1] [--strategies meshd,meshd_no_prefix] [--share 50]
        [--prompts-only] [--oracle-wait]

One region of ``testnet/scenarios/chat-512*.toml`` (its 128 nodes in 4 cells, its own chat
stream: the workload and the mesh's shape unchanged, a quarter of the nodes), run with each
strategy, each served request's TTFT split into network (the round trip to the serving node),
queue (arrival to the start of its prefill, less the network's first half: busy answers and
retries included) and prefill; its prompt tokens prefilled vs reused from the serving node's
cache; and, for every later turn of a conversation, whether it landed on the node that served
the turn before (where its history's KV is), and if not why: the holder was not among the
candidates the entry node saw, its advert's summary did not list the history (and whether
its cache still held it), or it was listed and lost on the score: then the holder's true wait
(until a slot of it would have been free, from the simulation's own state) beside the router's
prediction. ``--oracle-wait`` routes with every candidate's true wait in place of the predicted
one: what a perfect queue predictor would give.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import statistics
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from meshd.core.prefix_names import matched_tokens
from meshd.core.routing.constraints import eligible
from meshd.core.routing.index import model_index
from meshd.core.routing.prediction import _predict
from meshd.core.snapshot import RouteRequest
from meshd.sim.chat import ChatStream
from meshd.sim.loop import Simulation
from meshd.sim.prefixes import REUSE_ALIGN, SPACE, names_of
from meshd.sim.scenario import Scenario
from meshd.sim.scenario_parse import load_scenario

ROOT = Path(__file__).resolve().parents[1]
FILES = {"0": "chat-512-share-0.toml", "50": "chat-512.toml", "90": "chat-512-share-90.toml"}


def one_region(sc: Scenario, region: str) -> Scenario:
    """``sc`` with only ``region``'s nodes and arrivals."""
    return dataclasses.replace(
        sc, regions=tuple(r for r in sc.regions if r.name == region),
        arrivals=tuple(a for a in sc.arrivals if a.region == region))


def _held(node: Any, names: list[bytes], now: float) -> int:
    """Blocks of ``names`` (from the first) the node's cache holds at ``now``, without touching
    the LRU order (settling what ended by now, as any lookup would first)."""
    if node.px is None:
        return 0
    node.px._settle(now)  # noqa: SLF001 - diagnosis
    absent = node.px.cache.absent(SPACE, names)
    return absent[0] if absent else len(names)


def true_wait_ms(node: Any, now: float) -> float:
    """How long a request arriving at ``node`` now would wait for a slot: until as many of its
    running requests have ended as there are queued ones ahead of it, plus one (0: a slot is
    free; inf: more queued than running)."""
    k = len(node.queue) + 1 - (node.slots - node.running)
    if k <= 0:
        return 0.0
    ends = sorted(r.end_s for r in node.active)
    return max(ends[k - 1] - now, 0.0) * 1000.0 if k <= len(ends) else math.inf


def route_with_true_waits(sim: Simulation) -> None:
    """From now on the router sees every candidate's true wait (``true_wait_ms``, read from
    ``sim``'s state) in place of its prediction, in this process (the diagnosis' oracle; the
    next call points it at another simulation)."""
    predict = _predict

    def oracle(req: Any, idx: Any, e: Any, policy: Any) -> Any:
        pr = predict(req, idx, e, policy)
        at = sim.world.by_peer
        wait = [true_wait_ms(sim.world.nodes[at[idx.ids[i]]], sim.now) for i in e]
        ttft = [float(t) - float(w) + x for t, w, x in zip(pr.ttft, pr.wait, wait, strict=True)]
        if isinstance(e, np.ndarray):
            pr.wait, pr.ttft = np.array(wait), np.array(ttft)
        else:
            pr.wait, pr.ttft = wait, ttft
        pr.fixed = None  # its request-independent wait term would stand for the predicted wait
        return pr
    sys.modules["meshd.core.routing.route"]._predict = oracle  # noqa: SLF001 - diagnosis


class Traced(Simulation):
    """The simulation, recording each request's decision and service."""

    def __init__(self, *a: Any, **k: Any) -> None:
        super().__init__(*a, **k)
        self.turn_of: dict[int, Any] = {}
        for s in self.streams:
            if isinstance(s, ChatStream):
                for t in s.turns:
                    self.turn_of[id(t.prompt_ids)] = t
        self.last_server: dict[int, int] = {}  # conversation -> the node serving its last turn
        self.rows: list[dict[str, Any]] = []
        self.anywhere: set[bytes] = set()
        self.seen: dict[int, dict[str, Any]] = {}  # rid -> at its first decision
        self._cur: Any = None
        orig = self.views.snapshot

        def snap(*a: Any, **k: Any) -> Any:
            out = orig(*a, **k)
            if self._cur is not None:
                self._note(self._cur, out)
                self._cur = None
            return out
        self.views.snapshot = snap  # type: ignore[method-assign]

    def decide_request(self, r: Any, now: float, exclude: frozenset[int] = frozenset()) -> None:
        if r.rid not in self.seen and r.ids:
            self._cur = r  # the snapshot taken for its first decision is noted
        super().decide_request(r, now, exclude)

    def _note(self, r: Any, snapshot: Any) -> None:
        turn = self.turn_of.get(id(r.ids))
        info: dict[str, Any] = {"holder_seen": None, "holder_listed": 0, "holder_cached": 0,
                                "candidates": len(snapshot.nodes)}
        holder = self.last_server.get(turn.conversation, -1) if turn else -1
        info["holder"] = holder
        if holder >= 0:
            h = self.world.nodes[holder]
            names = names_of(r.model, r.ids)
            view = next((v for v in snapshot.nodes if v.peer_id == h.peer_id), None)
            info["holder_seen"] = view is not None
            info["holder_cached"] = _held(h, names, self.now) * 32 // REUSE_ALIGN * REUSE_ALIGN
            if view is not None and view.serving:
                info["holder_listed"] = matched_tokens(names, view.serving[0].prefix_sketch)
            if view is not None and self.strategy == "meshd":
                info.update(self._predicted(r, snapshot, h.peer_id))
            info["cell_same"] = h.cell == self.world.nodes[r.entry].cell
            info["h_true_wait"] = true_wait_ms(h, self.now)
        self.seen[r.rid] = info

    def _predicted(self, r: Any, snapshot: Any, holder: str) -> dict[str, Any]:
        """The router's prediction for the holder and the best other candidate."""
        req = RouteRequest(request_id="x", model=r.model, prompt_tokens=r.effective_prompt,
                           max_tokens=r.remaining_output, prompt_ids=r.ids)
        idx = model_index(snapshot, r.model)
        e = eligible(req, idx, self.policy)
        pr = _predict(req, idx, e, self.policy)
        ids = [idx.ids[i] for i in e]
        if holder not in ids:
            return {}
        k = ids.index(holder)
        best = min((j for j in range(len(ids)) if j != k), key=lambda j: float(pr.ttft[j]),
                   default=None)
        cached = pr.cached if pr.cached is not None else [0] * len(ids)
        out = {"h_ttft": float(pr.ttft[k]), "h_wait": float(pr.wait[k]),
               "h_credit": int(cached[k]), "local_is_holder": idx.local_at == e[k]}
        if best is not None:
            out.update(o_ttft=float(pr.ttft[best]), o_wait=float(pr.wait[best]),
                       o_credit=int(cached[best]))
        return out

    def _serve(self, t: Any, r: Any, now: float) -> None:
        # the most any node could reuse: the prompt's blocks prefilled anywhere so far (one
        # shared cache without bound), cut as the engine cuts a reuse
        names = names_of(r.model, r.ids) if r.ids else []
        run = 0
        while run < len(names) and names[run] in self.anywhere:
            run += 1
        limit = (r.effective_prompt - 1) // 32
        ideal = min(run, limit) * 32 // REUSE_ALIGN * REUSE_ALIGN if limit >= 4 else 0
        self.anywhere.update(names)
        if r.answer_ids and t.px is not None and t.px.keep_answers:  # kept where it is made
            self.anywhere.update(names_of(r.model, r.ids + r.answer_ids))
        before = t.px.reused_tokens if t.px is not None else 0
        super()._serve(t, r, now)
        reused = (t.px.reused_tokens - before) if t.px is not None else 0
        turn = self.turn_of.get(id(r.ids))
        if turn is None:
            return
        info = self.seen.get(r.rid, {})
        self.rows.append({
            "rid": r.rid, "measured": r.measured, "turn": turn.turn, "conv": turn.conversation,
            "system": turn.system, "prompt": r.effective_prompt, "reused": reused,
            "server": t.idx, "entry": r.entry, "hw": t.hw.name, "arrival": r.arrival,
            "rtt": r.rtt_s, "start": now, "first": r.first_s,
            "on_holder": t.idx == info.get("holder", -2), "ideal": ideal,
            "pf_tps": t.prefill_tps, **info,
        })
        self.last_server[turn.conversation] = t.idx


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(int(q * len(xs)), len(xs) - 1)]


def report(name: str, rows: list[dict[str, Any]]) -> None:
    rows = [x for x in rows if x["measured"]]
    n = len(rows)
    ttft = [(x["first"] + x["rtt"] / 2 - x["arrival"]) * 1000 for x in rows]
    net = [x["rtt"] * 1000 for x in rows]
    queue = [(x["start"] - x["arrival"] - x["rtt"] / 2) * 1000 for x in rows]
    pre = [(x["first"] - x["start"]) * 1000 for x in rows]
    print(f"== {name}: {n} measured requests served")
    print(f"  TTFT p50 {pct(ttft, .5):7.1f}  p95 {pct(ttft, .95):7.1f}  mean {statistics.fmean(ttft):7.1f} ms")
    for lab, v in (("network", net), ("queue", queue), ("prefill", pre)):
        print(f"  {lab:8s} mean {statistics.fmean(v):7.1f} ms ({statistics.fmean(v) / statistics.fmean(ttft):5.1%} of mean TTFT)"
              f"  p50 {pct(v, .5):7.1f}  p95 {pct(v, .95):7.1f}")
    prompt = sum(x["prompt"] for x in rows)
    reused = sum(x["reused"] for x in rows)
    print(f"  prompt tokens {prompt}, reused {reused} ({reused / prompt:.1%}), computed {prompt - reused}")
    by_hw = Counter(x["hw"] for x in rows)
    print("  served by " + ", ".join(f"{k} {v / n:.1%}" for k, v in sorted(by_hw.items())))
    pre_hw: dict[str, list[float]] = {}
    for x, p in zip(rows, pre, strict=True):
        pre_hw.setdefault(x["hw"], []).append(p)
    print("  prefill mean by hardware: " + ", ".join(
        f"{k} {statistics.fmean(v):.0f} ms" for k, v in sorted(pre_hw.items())))
    # share of TTFT that is prefill at the percentiles: the slowest 5% requests' composition
    top = sorted(range(n), key=lambda i: ttft[i])[int(.95 * n):]
    if top:
        print(f"  slowest 5%: network {statistics.fmean(net[i] for i in top):.0f}, queue "
              f"{statistics.fmean(queue[i] for i in top):.0f}, prefill "
              f"{statistics.fmean(pre[i] for i in top):.0f} ms mean; hardware "
              + ", ".join(f"{k} {v}" for k, v in Counter(rows[i]['hw'] for i in top).most_common()))
    ideal = sum(x["ideal"] for x in rows)
    print(f"  reusable anywhere (an unbounded cache shared by all): {ideal} tokens "
          f"({ideal / prompt:.1%} of prompt tokens)")
    # every request reusing all that at the node that served it, its queue as it was
    best = [t - (x["ideal"] - x["reused"]) / x["pf_tps"] * 1000 if x["ideal"] > x["reused"]
            else t for t, x in zip(ttft, rows, strict=True)]
    # and with no network, no queue, on the fastest prefill
    fast = max(x["pf_tps"] for x in rows)
    floor = [(x["prompt"] - x["ideal"]) / fast * 1000 for x in rows]
    print(f"  perfect affinity, queues as they were: p50 {pct(best, .5):.1f} p95 {pct(best, .95):.1f};"
          f" floor (no network, no queue, {fast:.0f} tok/s, all reusable reused): "
          f"p50 {pct(floor, .5):.1f} p95 {pct(floor, .95):.1f} ms")
    first = [x for x in rows if x["turn"] == 0]
    print(f"  first turns {len(first)} ({len(first) / n:.1%}): with a shared system prompt "
          f"{sum(1 for x in first if x['system'] >= 0)}, prompt mean "
          f"{statistics.fmean(x['prompt'] for x in first):.0f}, reused mean "
          f"{statistics.fmean(x['reused'] for x in first):.0f}, reusable mean "
          f"{statistics.fmean(x['ideal'] for x in first):.0f}")
    later = [x for x in rows if x["turn"] > 0]
    if not later:
        return
    m = len(later)
    on = [x for x in later if x["on_holder"]]
    print(f"  later turns: {m} ({m / n:.1%} of requests); on the node holding the history: "
          f"{len(on)} ({len(on) / m:.1%})")
    off = [x for x in later if not x["on_holder"]]
    why = Counter()
    for x in off:
        if x.get("holder", -1) < 0:
            why["holder unknown (previous turn before the trace)"] += 1
        elif not x["holder_seen"]:
            why["holder not among the candidates" + (" (other cell)" if not x.get("cell_same") else " (same cell: stale/dead)")] += 1
        elif x["holder_cached"] == 0:
            why["holder's cache no longer holds it (evicted)"] += 1
        elif not x["holder_listed"]:
            why["holder holds it, its advert summary does not list it"] += 1
        else:
            why["listed and credited, lost on the score"] += 1
    for k, v in why.most_common():
        print(f"    {k}: {v} ({v / m:.1%} of later turns)")
    seen = [x for x in later if x["holder_seen"]]
    if seen:
        listed = sum(1 for x in seen if x["holder_listed"])
        cached = sum(1 for x in seen if x["holder_cached"])
        print(f"  of later turns whose holder was a candidate ({len(seen)}): its cache held the "
              f"history {cached} ({cached / len(seen):.1%}), its advert listed it {listed} "
              f"({listed / len(seen):.1%})")
    cross = sum(1 for x in later if x.get("holder", -1) >= 0 and not x.get("cell_same"))
    print(f"  later turns whose holder is outside the entry node's cell: {cross} ({cross / m:.1%})")
    hist = [x["prompt"] for x in later]
    got = [x["reused"] for x in later]
    print(f"  later turns: prompt mean {statistics.fmean(hist):.0f} tokens, reused mean "
          f"{statistics.fmean(got):.0f}, reusable mean {statistics.fmean(x['ideal'] for x in later):.0f}")
    lost = [x for x in later if x["holder_seen"] and x["holder_listed"] and not x["on_holder"]]
    if lost:
        print(f"  listed but lost: credited {statistics.fmean(x['holder_listed'] for x in lost):.0f}"
              f" of {statistics.fmean(x['holder_cached'] for x in lost):.0f} held tokens (mean); "
              f"served on " + ", ".join(f"{k} {v}" for k, v in Counter(x['hw'] for x in lost).most_common())
              + f"; reused there {statistics.fmean(x['reused'] for x in lost):.0f}")
        pred = [x for x in lost if "o_ttft" in x]
        if pred:
            worse = sum(1 for x in pred if x["h_ttft"] > x["o_ttft"])
            print(f"  listed but lost, predictions: the holder predicted slower than the best other "
                  f"in {worse} of {len(pred)}; holder ttft mean {statistics.fmean(x['h_ttft'] for x in pred):.0f}"
                  f" (wait {statistics.fmean(x['h_wait'] for x in pred):.0f}, credit "
                  f"{statistics.fmean(x['h_credit'] for x in pred):.0f} tok), best other "
                  f"{statistics.fmean(x['o_ttft'] for x in pred):.0f} (wait "
                  f"{statistics.fmean(x['o_wait'] for x in pred):.0f}, credit "
                  f"{statistics.fmean(x['o_credit'] for x in pred):.0f} tok)")
            true = [x["h_true_wait"] for x in pred]
            faster = sum(1 for x in pred
                         if x["h_ttft"] - x["h_wait"] + x["h_true_wait"] < x["o_ttft"])
            print(f"  listed but lost, the holder's true wait: mean {statistics.fmean(true):.0f} ms"
                  f" (predicted {statistics.fmean(x['h_wait'] for x in pred):.0f}), p50 "
                  f"{pct(true, .5):.0f}, p90 {pct(true, .9):.0f}; truly faster there: {faster} of "
                  f"{len(pred)}")
    went = [x for x in on if "h_wait" in x]
    if went:
        print(f"  on the holder: its wait predicted {statistics.fmean(x['h_wait'] for x in went):.0f}"
              f" ms mean, true {statistics.fmean(x['h_true_wait'] for x in went):.0f}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--region", default="us-east")
    ap.add_argument("--share", default="50", choices=sorted(FILES))
    ap.add_argument("--duration", type=float, default=60.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--strategies", default="meshd,meshd_no_prefix")
    ap.add_argument("--oracle-wait", action="store_true",
                    help="route with each candidate's true wait for a slot (a perfect queue "
                         "predictor) in place of the predicted one")
    ap.add_argument("--prompts-only", action="store_true",
                    help="nodes keep prompts' blocks only (keep_answers = false on every node)")
    args = ap.parse_args()
    sc = load_scenario(ROOT / "testnet" / "scenarios" / FILES[args.share])
    sc = one_region(sc, args.region).with_overrides(duration_s=args.duration, seed=args.seed)
    if args.prompts_only:
        sc = dataclasses.replace(sc, hardware={k: dataclasses.replace(h, keep_answers=False)
                                               for k, h in sc.hardware.items()})
    for strategy in args.strategies.split(","):
        sim = Traced(sc, strategy, seed=args.seed)
        if args.oracle_wait:
            route_with_true_waits(sim)
        res = sim.run()
        report(strategy, sim.rows)
        print(f"  (runner: p50 {res['ttft_p50_ms']:.1f} p95 {res['ttft_p95_ms']:.1f}, "
              f"failed {res['failed']})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
