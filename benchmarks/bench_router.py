"""Router decision time: ``meshd.core.routing.route`` with 10, 100 and 1,000 nodes in the snapshot.

Issue 4's goal: under 200 us at p99 with 1,000 peers. Two figures per size and strategy:

* ``warm``: repeated decisions on one snapshot (its per-model index is memoised in
  ``snap.cache``): what a node pays while its peer table has not changed;
* ``cold``: every decision on a new snapshot (the index is rebuilt): the worst case, and what
  a node pays right after its peer table changed.

Every node serves the model, a third have stale adverts, loads and speeds vary. The policy lists
the default 16 candidates in each decision (``explain_limit``) and 8 fallbacks.

    .venv/bin/python benchmarks/bench_router.py [--n 10,100,1000] [--decisions 2000] [--out FILE.json]
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
from meshd.core.snapshot import MeshSnapshot, NodeView, Policy, RouteRequest, Serving  # noqa: E402

HARDWARE = [  # prefill tps, decode tps, slots, max queue, cost per hour
    (5000.0, 50.0, 8, 32, 0.60),
    (2500.0, 30.0, 8, 32, 0.75),
    (400.0, 12.0, 2, 8, 0.30),
    (120.0, 6.0, 1, 4, 0.08),
]


def make_snapshot(n: int, seed: int) -> MeshSnapshot:
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
            service_rate_rps=slots / (256 / pf + 79 / dc),
        ))  # fmt: skip
    return MeshSnapshot("12D3KooW000000", tuple(nodes))


def percentile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, round(q / 100.0 * (len(s) - 1)))]


def measure(n: int, strategy: str, decisions: int, cold: bool) -> dict[str, float]:
    rng = random.Random(1)
    policy = Policy(strategy=strategy)
    base = make_snapshot(n, seed=n)
    reqs = [
        RouteRequest(f"r{k}", "llama-3-8b", rng.randint(16, 1024), rng.randint(8, 256))
        for k in range(64)
    ]
    # Cold runs get a fresh snapshot object per decision (built outside the timed region).
    snaps = [dataclasses.replace(base) for _ in range(decisions)] if cold else [base]
    times = []
    for k in range(decisions + 50):
        s = snaps[k % len(snaps)] if not cold else snaps[min(k, decisions - 1)]
        if cold:
            s.cache.clear()
        r = reqs[k % len(reqs)]
        t0 = time.perf_counter_ns()
        route(r, s, policy, rng, k)
        t1 = time.perf_counter_ns()
        if k >= 50:  # warm-up: imports, caches
            times.append((t1 - t0) / 1000.0)
    return {
        "p50_us": percentile(times, 50),
        "p99_us": percentile(times, 99),
        "mean_us": statistics.fmean(times),
        "min_us": min(times),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--n", default="10,100,1000", help="snapshot sizes")
    ap.add_argument("--decisions", type=int, default=2000)
    ap.add_argument("--strategies", default=",".join(STRATEGIES))
    ap.add_argument("--out", help="also write the figures as JSON")
    args = ap.parse_args(argv)
    sizes = [int(x) for x in args.n.split(",")]
    results: list[dict[str, object]] = []
    print(
        f"{'nodes':>6} {'strategy':<13} {'warm p50':>9} {'warm p99':>9} {'cold p50':>9} {'cold p99':>9}  (us)"
    )
    for n in sizes:
        for strategy in args.strategies.split(","):
            warm = measure(n, strategy, args.decisions, cold=False)
            cold = measure(n, strategy, max(args.decisions // 4, 100), cold=True)
            results.append({"nodes": n, "strategy": strategy, "warm": warm, "cold": cold})
            print(
                f"{n:>6} {strategy:<13} {warm['p50_us']:>9.0f} {warm['p99_us']:>9.0f} "
                f"{cold['p50_us']:>9.0f} {cold['p99_us']:>9.0f}",
                flush=True,
            )
    if args.out:
        meta = {
            "python": platform.python_version(),
            "machine": platform.machine(),
            "decisions": args.decisions,
        }
        Path(args.out).write_text(json.dumps({"meta": meta, "results": results}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
