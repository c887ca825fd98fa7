"""Issue 13's churn run: requests keep flowing while daemons are killed and restarted.

    .venv/bin/python benchmarks/bench_churn.py [--nodes 10] [--requests 500] [--rate 3]
        [--kill 0.3] [--cap 10] [--max-tokens 16] [--client-retries 2] [--seed 1] [--out churn.json]

It starts ``--nodes`` daemons on loopback (``meshd.testnet.launcher``, the shipped model, each
capped at ``--cap`` decode tokens/s), offers ``--requests`` open-loop Poisson arrivals at
``--rate`` per second, each at a uniformly chosen entry node, and meanwhile SIGKILLs
``--kill`` x nodes daemons, chosen at random, each at a random time in the middle 60% of the
run, restarting each 3-8 s later with the same config. A request that fails at the client (its
entry node is down, dies under it, or answers an error) is retried at another entry node, at
most ``--client-retries`` times. Goal (issue 13): no request lost, i.e. every one completes, or
fails with one clear line that a client retry fixes. Reported: how many the mesh failed over
(more than one ROUTE frame: the serving node died and the entry node moved the request) and
the latency that added (their end-to-end time minus the median of the requests that did not
fail over), and how many needed a client retry and why.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio
from loadgen import (
    Attempt,
    arrivals,
    attempt,
    capacity_rps,
    capped_specs,
    log,
    machine_note,
    percentile,
    request_fields,
)

from meshd.testnet.children import alive, reap
from meshd.testnet.launcher import down, start_process, up

# the daemons this benchmark starts answer from a model, never from the semantic cache
os.environ.setdefault("MESHD_TESTNET_CACHE", "0")


async def churn(index: dict[str, Any], victims: list[str], span_s: float, rng: random.Random,
                events: list[dict[str, Any]], t0: float) -> None:
    nodes = {n["name"]: n for n in index["nodes"]}

    async def one(name: str, kill_at: float, down_s: float) -> None:
        await trio.sleep_until(t0 + kill_at)
        n = nodes[name]
        os.kill(n["pid"], signal.SIGKILL)
        events.append({"t_s": round(trio.current_time() - t0, 2), "node": name, "event": "killed"})
        while alive(n["pid"]):
            await trio.sleep(0.05)
        reap(n["pid"])
        await trio.sleep(down_s)
        n["pid"] = start_process(Path(n["dir"]))
        events.append({"t_s": round(trio.current_time() - t0, 2), "node": name, "event": "restarted"})
        (Path(index["dir"]) / "testnet.json").write_text(json.dumps(index, indent=2))

    async with trio.open_nursery() as nursery:
        for name in victims:
            nursery.start_soon(one, name, rng.uniform(0.2, 0.8) * span_s, rng.uniform(3.0, 8.0))


async def drive(index: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    socks = {n["name"]: n["socket"] for n in index["nodes"]}
    names = sorted(socks)
    plan = arrivals(args.rate, args.requests, None, names, args.seed)
    rng = random.Random(args.seed + 1)
    victims = rng.sample(names, max(1, round(args.kill * len(names))))
    requests: list[list[Attempt]] = [[] for _ in plan]
    events: list[dict[str, Any]] = []
    spans: dict[tuple[int, int], tuple[float, float]] = {}
    t0 = trio.current_time()

    async def one(i: int, at: float, entry: str) -> None:
        await trio.sleep_until(t0 + at)
        fields = request_fields("churn", i, args.max_tokens)
        tried = []
        for k in range(1 + args.client_retries):
            fields["rid"] = f"churn-{i:05d}-{k}"
            start = trio.current_time() - t0
            a = await attempt(socks[entry], fields, entry)
            spans[(i, k)] = (start, trio.current_time() - t0)
            requests[i].append(a)
            tried.append(entry)
            if not a.error:
                return
            entry = rng.choice([n for n in names if n not in tried] or names)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(churn, index, victims, plan[-1][0], rng, events, t0)
        for i, (at, entry) in enumerate(plan):
            nursery.start_soon(one, i, at, entry)
    return {"requests": requests, "events": events, "victims": victims, "spans": spans,
            "wall_s": trio.current_time() - t0}


def _down_windows(events: list[dict[str, Any]]) -> list[tuple[float, float]]:
    """(killed, restarted + 10 s) per victim: while a node is down or rejoining."""
    killed = {e["node"]: e["t_s"] for e in events if e["event"] == "killed"}
    back = {e["node"]: e["t_s"] for e in events if e["event"] == "restarted"}
    return [(t, back.get(n, t) + 10.0) for n, t in killed.items()]


def _overlaps(span: tuple[float, float], windows: list[tuple[float, float]]) -> bool:
    return any(span[0] < b and span[1] > a for a, b in windows)


def summarize(run: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    reqs: list[list[Attempt]] = run["requests"]
    done = [r for r in reqs if not r[-1].error]
    lost = [r for r in reqs if r[-1].error]
    first_try = [r for r in done if len(r) == 1]
    def moved(a: Attempt) -> bool:  # the entry node moved it: mid-stream, or before tokens
        return len(a.served) > 1 or a.retries > 0

    windows = _down_windows(run["events"])
    last = {i: (i, len(r) - 1) for i, r in enumerate(reqs)}
    calm = [i for i, r in enumerate(reqs) if not _overlaps(run["spans"][last[i]], windows)]
    failed_over = [r[-1] for r in done if moved(r[-1])]
    plain = [r[-1].e2e_ms for r in done if not moved(r[-1]) and r[-1].e2e_ms]
    base = statistics.median(plain) if plain else 0.0
    added = [a.e2e_ms - base for a in failed_over if a.e2e_ms]
    retried = [r for r in done if len(r) > 1]
    why = sorted({f"{a.stage}: {a.error}" for r in reqs for a in r if a.error})
    ttft_plain = [r[-1].ttft_ms for r in done if not moved(r[-1]) and r[-1].ttft_ms]
    ttft_over = [a.ttft_ms for a in failed_over if a.ttft_ms]
    return {
        "command": "benchmarks/bench_churn.py " + " ".join(shlex.quote(a) for a in sys.argv[1:]),
        "when": time.strftime("%Y-%m-%d %H:%M"), "machine": machine_note(),
        "nodes": args.nodes, "requests": len(reqs), "rate_rps": args.rate,
        "capacity_rps": round(capacity_rps(args.nodes, args.cap, args.max_tokens), 2),
        "wall_s": round(run["wall_s"], 1), "victims": run["victims"], "events": run["events"],
        "completed": len(done), "completed_first_try": len(first_try),
        "completed_after_client_retry": len(retried), "lost": len(lost),
        "failed_over_in_mesh": len(failed_over),
        "failed_over_mid_stream": sum(1 for a in failed_over if len(a.served) > 1),
        "requests_while_no_node_down": len(calm),
        "moved_while_no_node_down": sum(1 for i in calm if moved(reqs[i][-1])),
        "e2e_ms_median_no_failover": round(base, 1),
        "added_ms_failover_median": round(statistics.median(added), 1) if added else None,
        "added_ms_failover_max": round(max(added), 1) if added else None,
        "ttft_ms_median_no_failover": round(statistics.median(ttft_plain), 1) if ttft_plain else None,
        "ttft_ms_median_failed_over": round(statistics.median(ttft_over), 1) if ttft_over else None,
        "e2e_ms_p95_all": round(percentile([r[-1].e2e_ms for r in done if r[-1].e2e_ms], 95), 1),
        "client_retry_causes": why[:20],
        "lost_errors": [r[-1].error for r in lost][:10],
    }


def report(s: dict[str, Any]) -> str:
    lines = [f"# {s['command']}", f"# {s['when']}, {s['machine']}",
             f"{s['nodes']} daemons, {s['requests']} requests at {s['rate_rps']} req/s "
             f"(capacity {s['capacity_rps']}), {s['wall_s']} s; killed and restarted: "
             + ", ".join(f"{e['node']} {e['event']} at {e['t_s']} s" for e in s["events"]),
             f"completed {s['completed']} ({s['completed_first_try']} at the first try, "
             f"{s['completed_after_client_retry']} after a client retry), lost {s['lost']}",
             f"moved by their entry node: {s['failed_over_in_mesh']} ({s['failed_over_mid_stream']} "
             f"mid-stream; {s['moved_while_no_node_down']} of the {s['requests_while_no_node_down']} "
             f"that ran while no node was down, i.e. busy refusals); added latency median "
             f"{s['added_ms_failover_median']} ms, max {s['added_ms_failover_max']} ms over the "
             f"{s['e2e_ms_median_no_failover']} ms median of the others; TTFT median "
             f"{s['ttft_ms_median_failed_over']} vs {s['ttft_ms_median_no_failover']} ms"]
    if s["client_retry_causes"]:
        lines.append("what the client saw before retrying:")
        lines.extend(f"  {c}" for c in s["client_retry_causes"])
    if s["lost_errors"]:
        lines.append("lost: " + "; ".join(s["lost_errors"]))
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, default=10)
    p.add_argument("--requests", type=int, default=500)
    p.add_argument("--rate", type=float, default=3.0, help="requests per second")
    p.add_argument("--kill", type=float, default=0.3, help="share of the daemons killed")
    p.add_argument("--cap", type=float, default=10.0, help="decode tokens/s of each node")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--client-retries", type=int, default=2)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="meshd-churn-") as tmp:
        d = Path(tmp) / "net"
        log(f"starting {args.nodes} daemons")
        index = up(d, capped_specs(args.nodes, args.cap), advert_interval_s=2.0)
        index["dir"] = str(d)
        try:
            run = trio.run(drive, index, args)
        finally:
            down(d)
    summary = summarize(run, args)
    print(report(summary))
    if args.out:
        args.out.write_text(json.dumps(summary, indent=1))
    return 0 if summary["lost"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
