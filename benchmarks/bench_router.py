"""Router decision time: ``meshd.core.routing.route`` with 10, 100 and 1,000 nodes in the snapshot.

Issue 4's goal: under 200 us at p99 with 1,000 peers. Two figures per size and strategy:

* ``warm``: repeated decisions on one snapshot (its per-model index and the terms that do not
  depend on the request are memoised in ``snap.cache``): what a node pays when it keeps its
  snapshot while its peer table has not changed (today's daemon does not: it builds a new
  snapshot per request, so it pays ``cold`` and more; see ``--daemon``);
* ``cold``: every decision on a new snapshot (the index is rebuilt): the worst case, and what
  a node pays right after its peer table changed.

Wall-clock percentiles, and for warm decisions also the thread's CPU time per decision (``cpu``):
on a shared box the wall-clock tail includes time other processes held the core.

Every node serves the model, a third have stale adverts, loads and speeds vary. The policy lists
the default 16 candidates in each decision (``explain_limit``) and 8 fallbacks.

``--rates``: ``measured`` (the default, as in the figures recorded so far, and as the simulator's
snapshots are) gives every node a measured service rate, so the queue wait does not depend on
the request and the router computes it once per snapshot; ``derived`` gives none (as the
daemon's snapshots are today: rates are derived per request from the speeds); ``both`` runs
each.

``--daemon`` also times what a daemon does per submitted request around the router, with N
peers in its table: build the snapshot from the peer table (``table.live()`` and
``meshd.node.view.build_snapshot``, which keeps what it derives from each advert in the table's
entries), then ``meshd.core.decide.decide`` on that fresh (cold) snapshot (the pipeline
planner's check, the router, wait bounds and hedge deadline, as the entry chain's route step). Two cases: ``steady`` (the table did not change since the last request: only the
time moved) and ``churn`` (between two requests ``--churn`` peers sent a new advert, as many
RTT samples came in, and our own coordinate moved, so every Vivaldi estimate is taken again).
A third case, ``stages``, is ``steady`` with two of the peers serving half the model each, so
``choose_pipeline`` cannot skip the planner (fewer rounds: it is the slow one).

    .venv/bin/python benchmarks/bench_router.py [--n 10,100,1000] [--decisions 2000] \
        [--rates measured|derived|both] [--daemon [--churn 10]] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from meshd.core.routing import STRATEGIES, route  # noqa: E402
from meshd.core.snapshot import (  # noqa: E402
    MeshSnapshot,
    NodeView,
    Policy,
    RouteRequest,
    Serving,
)

HARDWARE = [  # prefill tps, decode tps, slots, max queue, cost per hour
    (5000.0, 50.0, 8, 32, 0.60),
    (2500.0, 30.0, 8, 32, 0.75),
    (400.0, 12.0, 2, 8, 0.30),
    (120.0, 6.0, 1, 4, 0.08),
]


def make_snapshot(n: int, seed: int, measured: bool = True) -> MeshSnapshot:
    rng = random.Random(seed)
    serving = (Serving("llama-3-8b", 32, 0, 32),)
    nodes = []
    for i in range(n):
        pf, dc, slots, mq, cph = HARDWARE[i % len(HARDWARE)]
        nodes.append(NodeView(
            peer_id=f"12D3KooW{i:06d}", name=f"node-{i}", region=f"r{i % 4}", serving=serving,
            labels=frozenset({f"r{i % 4}"}), queue_depth=rng.randint(0, mq // 2),
            in_flight=rng.randint(0, slots), max_concurrency=slots, max_queue=mq, prefill_tps=pf,
            decode_tps=dc, rtt_ms=0.0 if i == 0 else rng.uniform(2.0, 150.0),
            rtt_source="local" if i == 0 else "vivaldi", advert_age_s=rng.uniform(0.0, 2.5),
            sent_since_advert=rng.randint(0, 1), cost_per_hour=cph, is_local=i == 0,
            service_rate_rps=slots / (256 / pf + 79 / dc) if measured else 0.0,
        ))  # fmt: skip
    return MeshSnapshot("12D3KooW000000", tuple(nodes))


def percentile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, round(q / 100.0 * (len(s) - 1)))]


def measure(n: int, strategy: str, decisions: int, cold: bool, measured: bool = True) -> dict[str, float]:
    rng = random.Random(1)
    policy = Policy(strategy=strategy)
    base = make_snapshot(n, seed=n, measured=measured)
    reqs = [
        RouteRequest(f"r{k}", "llama-3-8b", rng.randint(16, 1024), rng.randint(8, 256))
        for k in range(64)
    ]
    # Cold runs get a fresh snapshot object per decision (built outside the timed region).
    snaps = [dataclasses.replace(base) for _ in range(decisions)] if cold else [base]
    times = []
    cpu = []  # this thread's CPU time: what the decision costs, without the time other
    # processes held the core (on a shared box they inflate the wall-clock tail)
    for k in range(decisions + 50):
        s = snaps[k % len(snaps)] if not cold else snaps[min(k, decisions - 1)]
        if cold:
            s.cache.clear()
        r = reqs[k % len(reqs)]
        c0 = time.thread_time_ns()
        t0 = time.perf_counter_ns()
        route(r, s, policy, rng, k)
        t1 = time.perf_counter_ns()
        c1 = time.thread_time_ns()
        if k >= 50:  # warm-up: imports, caches
            times.append((t1 - t0) / 1000.0)
            cpu.append((c1 - c0) / 1000.0)
    return {
        "p50_us": percentile(times, 50),
        "p99_us": percentile(times, 99),
        "mean_us": statistics.fmean(times),
        "min_us": min(times),
        "cpu_p50_us": percentile(cpu, 50),
        "cpu_p99_us": percentile(cpu, 99),
    }


def daemon_path(n: int, rounds: int, churn: int = 0, stages: bool = False) -> dict[str, float]:
    """Median ms per request of the daemon's steps around the router, with ``n`` peers; with
    ``churn``, that many adverts and RTT samples arrive (and our coordinate moves) between two
    requests (outside the timed steps: what the next snapshot pays for them is timed); with
    ``stages``, peers 1 and 2 serve layers [0, 16) and [16, 32) instead of the whole model."""
    from meshd.core.advert import Advert, ModelAdvert
    from meshd.core.decide import decide
    from meshd.core.peertable import PeerTable
    from meshd.node.view import build_snapshot, coord_of

    rng = random.Random(n)

    def advert(i: int, seq: int = 1) -> Advert:
        pf, dc, slots, mq, cph = HARDWARE[i % len(HARDWARE)]
        a, b = ((0, 16) if i == 1 else (16, 32)) if stages and i in (1, 2) else (0, 32)
        return Advert(
            peer_id=f"12D3KooW{i:06d}", name=f"node-{i}", seq=seq, ts=0.0, region=f"r{i % 4}",
            labels={"region": f"r{i % 4}"}, models=(ModelAdvert("llama-3-8b", 32, a, b, pf, dc, 1 << 20),),
            queue_depth=rng.randint(0, mq // 2), in_flight=rng.randint(0, slots),
            max_concurrency=slots, max_queue=mq, prefill_tps=pf, decode_tps=dc, cost_per_hour=cph,
            coord=tuple(rng.uniform(-50, 50) for _ in range(8)), coord_height=1.0, coord_error=0.3,
        )  # fmt: skip

    local = advert(0)
    table = PeerTable(local.peer_id, expiry_s=1e9, max_skew_s=1e9)
    for i in range(1, n):
        table.apply(advert(i), rng.uniform(0.0, 5.0), 0.0)
        if i % 2:
            table.record_rtt(f"12D3KooW{i:06d}", rng.uniform(2, 150), 4.0)
    coord = coord_of(local)
    assert coord is not None
    policy = Policy()
    req = RouteRequest("r", "llama-3-8b", 300, 100)
    steps: dict[str, list[float]] = {"build_snapshot": [], "decide": [], "total": []}
    seq = 1
    for k in range(rounds):
        now = 6.0 + k * 0.001
        if churn:
            seq += 1
            for _ in range(churn):
                i = rng.randrange(1, n)
                table.apply(advert(i, seq), now, 0.0)
                table.record_rtt(f"12D3KooW{rng.randrange(1, n):06d}", rng.uniform(2, 150), now)
            coord = dataclasses.replace(coord, vec=tuple(x + 0.01 for x in coord.vec))
        t0 = time.perf_counter()
        snap = build_snapshot(local, table.live(), coord, now)
        t1 = time.perf_counter()
        decide(req, snap, policy, rng, k)  # what the entry chain's route step calls
        t3 = time.perf_counter()
        for name, dt in (("build_snapshot", t1 - t0), ("decide", t3 - t1), ("total", t3 - t0)):
            steps[name].append(dt * 1000.0)
    return {name: statistics.median(v) for name, v in steps.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--n", default="10,100,1000", help="snapshot sizes")
    ap.add_argument("--decisions", type=int, default=2000)
    ap.add_argument("--strategies", default=",".join(STRATEGIES))
    ap.add_argument("--rates", choices=("measured", "derived", "both"), default="measured",
                    help="service rates in the snapshot (see above)")
    ap.add_argument("--daemon", action="store_true", help="also time the daemon's steps around the router")
    ap.add_argument("--cases", default="steady,churn,stages", help="--daemon: which cases")
    ap.add_argument("--churn", type=int, default=10,
                    help="--daemon: adverts and RTT samples between two requests in the churn case")
    ap.add_argument("--out", help="also write the figures as JSON")
    args = ap.parse_args(argv)
    sizes = [int(x) for x in args.n.split(",")]
    results: list[dict[str, object]] = []
    rates = ["measured", "derived"] if args.rates == "both" else [args.rates]
    print(
        f"{'nodes':>6} {'strategy':<13} {'rates':<9} {'warm p50':>9} {'warm p99':>9} "
        f"{'cpu p50':>8} {'cpu p99':>8} {'cold p50':>9} {'cold p99':>9}  (us; cpu: warm, CPU time)"
    )
    for n in sizes:
        for strategy in args.strategies.split(","):
            for r in rates:
                m = r == "measured"
                warm = measure(n, strategy, args.decisions, cold=False, measured=m)
                cold = measure(n, strategy, max(args.decisions // 4, 100), cold=True, measured=m)
                results.append({"nodes": n, "strategy": strategy, "rates": r, "warm": warm, "cold": cold})
                print(
                    f"{n:>6} {strategy:<13} {r:<9} {warm['p50_us']:>9.0f} {warm['p99_us']:>9.0f} "
                    f"{warm['cpu_p50_us']:>8.0f} {warm['cpu_p99_us']:>8.0f} "
                    f"{cold['p50_us']:>9.0f} {cold['p99_us']:>9.0f}",
                    flush=True,
                )
    daemon: list[dict[str, float]] = []
    if args.daemon:
        print(f"\n{'peers':>6} {'case':<7} {'build snapshot':>15} {'decide':>8} "
              f"{'total':>8}  (ms per request, median)")
        for n in sizes:
            for case, churn in (("steady", 0), ("churn", args.churn), ("stages", 0)):
                if case not in args.cases.split(","):
                    continue
                rounds = max(5, min(200, 20_000 // n))
                if case == "stages":
                    rounds = max(3, min(50, 2_000 // n))
                d = daemon_path(n, rounds, churn=churn, stages=case == "stages")
                daemon.append({"nodes": n, "case": case, "churn": churn, **d})
                print(f"{n:>6} {case:<7} {d['build_snapshot']:>15.2f} {d['decide']:>8.2f} "
                      f"{d['total']:>8.2f}", flush=True)
    if args.out:
        meta = {
            "python": platform.python_version(),
            "machine": platform.machine(),
            "decisions": args.decisions,
        }
        out = {"meta": meta, "results": results, "daemon_ms": daemon}
        Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
