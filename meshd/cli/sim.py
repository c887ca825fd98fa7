"""`meshd sim SCENARIO`: simulate a mesh and compare routing strategies (docs/sim.md)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from meshd.exitcodes import Exit

DESCRIPTION = """\
Run a discrete-event simulation of a mesh described by a scenario file (testnet/scenarios/)
under one or more routing strategies, each deciding with the daemon's own router on the stale
view a real node would have, and print TTFT percentiles, end-to-end latency, throughput, cost
per 1K tokens, utilisation spread and failures per strategy. Same seed, same result.

  meshd sim testnet/scenarios/mesh-512.toml --strategies meshd,round_robin --plot out.png

With --sweep-load, every strategy runs at each offered load (a fraction of the scenario's
capacity: its arrival rates are scaled) and the table compares each with the best other
strategy at that load:

  meshd sim testnet/scenarios/homog-128.toml --sweep-load 0.1,0.3,0.5,0.7,0.8,0.9,0.95
"""


def register(sub: Any) -> None:
    p = sub.add_parser(
        "sim",
        help="simulate a mesh and compare routing strategies",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("scenario", metavar="SCENARIO", help="scenario TOML file")
    p.add_argument("--duration", type=float, metavar="S", help="simulated seconds of arrivals")
    p.add_argument(
        "--strategies",
        metavar="A,B,...",
        help="strategies to compare (default: meshd,round_robin,random,least_queue,"
        "latency_only,lwsq; round_robin_lockstep, the herding round-robin, only when named)",
    )
    p.add_argument(
        "--sweep-load",
        metavar="L,L,...",
        help="run every strategy at each offered load, as a fraction of capacity "
        "(e.g. 0.1,0.5,0.9); prints one row per strategy and load, against the best other",
    )
    p.add_argument("--seed", type=int, metavar="N", help="random seed (default: the scenario's)")
    p.add_argument(
        "--advert-interval", type=float, metavar="S", help="override the advert interval"
    )
    p.add_argument(
        "--fail-fraction", type=float, metavar="F", help="fail this fraction of nodes mid-run"
    )
    p.add_argument("--jobs", type=int, default=1, metavar="N", help="strategies run in parallel")
    p.add_argument("--json", action="store_true", help="print JSON keyed by strategy")
    p.add_argument("--csv", metavar="FILE", help="also write the figures as CSV")
    p.add_argument("--plot", metavar="FILE.png", help="also draw a PNG comparing strategies")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.add_argument("--tiers", action="store_true",
                   help="model tiers (docs/tiers.md): run the scenario's model = \"auto\" "
                   "requests all-to-large, all-to-micro and tiered (meshd strategy) and print the "
                   "TTFT, cost and complex-sent-down table side by side")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from meshd.core.routing import BASELINE_STRATEGIES
    from meshd.errors import ConfigError
    from meshd.sim import report
    from meshd.sim.capacity import capacity
    from meshd.sim.progress import ProgressBar
    from meshd.sim.runner import check_strategies, run_all
    from meshd.sim.scenario_parse import load_scenario

    sc = load_scenario(args.scenario)
    if args.duration is not None and args.duration <= 0:
        raise ConfigError("--duration must be positive")
    if args.advert_interval is not None and args.advert_interval <= 0:
        raise ConfigError("--advert-interval must be positive")
    if args.fail_fraction is not None and not 0.0 <= args.fail_fraction <= 1.0:
        raise ConfigError("--fail-fraction must be between 0 and 1")
    sc = sc.with_overrides(
        duration_s=args.duration,
        seed=args.seed,
        advert_interval_s=args.advert_interval,
        fail_fraction=args.fail_fraction,
    )
    strategies = check_strategies((args.strategies or ",".join(BASELINE_STRATEGIES)).split(","))
    if args.tiers:
        return _tiers(args, sc)
    if args.sweep_load is not None:
        return _sweep(args, sc, strategies)
    cap = capacity(sc)
    header = (
        f"scenario {sc.name}: {sc.node_count} nodes, {sc.run.duration_s:g} s, seed {sc.run.seed}, "
        f"offered {cap.offered_rps:.0f} req/s = {cap.load * 100:.0f}% of capacity "
        f"({cap.capacity_rps:.0f} req/s), advert interval {sc.gossip.advert_interval_s:g} s"
    )
    bar = None if args.no_progress else ProgressBar(len(strategies))
    if bar:
        print(header, file=sys.stderr)
    results = run_all(sc, strategies, seed=args.seed, jobs=args.jobs, progress=bar)
    if bar:
        bar.close()
    if args.csv:
        report.write_csv(results, args.csv)
    if args.plot:
        report.plot(
            results, args.plot, f"{sc.name}: {sc.node_count} nodes, {sc.run.duration_s:g} s"
        )
    if args.json:
        print(report.to_json(results))
    else:
        print(header)
        print(report.table(results))
        line = report.ratios(results)
        if line:
            print(line)
    return Exit.OK


def _sweep(args: argparse.Namespace, sc: Any, strategies: tuple[str, ...]) -> int:
    import json

    from meshd.sim import sweep
    from meshd.sim.capacity import capacity
    from meshd.sim.progress import ProgressBar

    loads = sweep.parse_loads(args.sweep_load)
    cap = capacity(sc)
    header = (
        f"scenario {sc.name}: {sc.node_count} nodes, {sc.run.duration_s:g} s, seed {sc.run.seed}, "
        f"capacity {cap.capacity_rps:.0f} req/s, loads {', '.join(f'{x:g}' for x in loads)} "
        f"({', '.join(f'{x * cap.capacity_rps:.0f}' for x in loads)} req/s), "
        f"advert interval {sc.gossip.advert_interval_s:g} s; loads below {cap.load:.2f} run "
        f"longer, with as many requests as at {cap.load:.2f}"
    )
    floor = sweep.floor_ms(sc)
    if floor:
        header += (
            "\nfloor (every request started at once on the fastest hardware, no network): "
            + ", ".join(f"{k[5:8]} {v:.0f} ms" for k, v in floor.items())
        )
    bar = None if args.no_progress else ProgressBar(len(strategies) * len(loads))
    if bar:
        print(header, file=sys.stderr)
    res = sweep.run_sweep(sc, strategies, loads, seed=args.seed, jobs=args.jobs, progress=bar)
    if bar:
        bar.close()
    if args.csv:
        sweep.write_csv(res, args.csv)
    if args.plot:
        sweep.plot(res, args.plot, f"{sc.name}: {sc.node_count} nodes, "
                   f"adverts every {sc.gossip.advert_interval_s:g} s")  # fmt: skip
    if args.json:
        print(json.dumps({"header": header, "floor": floor, **sweep.to_json(res)}, indent=2))
        return Exit.OK
    print(header)
    print(sweep.table(res))
    for line in sweep.yardstick(res, floor=floor):
        print(line)
    return Exit.OK


def _tiers(args: argparse.Namespace, sc: Any) -> int:
    import json

    from meshd.sim.runner import compare_tiers
    from meshd.sim.tiers import table

    if not any(a.model == "auto" for a in sc.arrivals):
        from meshd.errors import ConfigError

        raise ConfigError(f"{sc.file}: --tiers needs [[arrivals]] with model = \"auto\"")
    if not args.no_progress:
        print(f"scenario {sc.name}: {sc.node_count} nodes, {sc.run.duration_s:g} s, seed "
              f"{sc.run.seed}; three runs (all_large, all_micro, tiered)", file=sys.stderr)
    results = compare_tiers(sc, seed=args.seed)
    if args.json:
        print(json.dumps(results, indent=1, default=str))
    else:
        print(table(results))
    return Exit.OK
