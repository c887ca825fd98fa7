"""Issue 4's acceptance benchmark: every routing strategy on a testnet of real daemons with
emulated distances, side by side, plus the accuracy of the Vivaldi RTT estimates.

    .venv/bin/python benchmarks/bench_testnet.py [--scenario testnet/regions-12.toml] [--quick]
        [--duration S] [--load 0.7 | --load 0.4,0.7,0.9] [--max-tokens 16] [--entries 6] [--seed 1]
        [--strategies meshd,round_robin,...] [--isolation auto|netns|loopback] [--out FILE.json]

It starts the scenario (`meshd testnet up --scenario`: each daemon in its own network namespace,
links emulated in user space), warms every node up so that its adverts carry measured speeds,
computes the mesh's capacity from those speeds, and then, for each load of ``--load`` and each
strategy (default: ``meshd.core.routing.BASELINE_STRATEGIES``), replays the same seeded open-loop
Poisson arrivals at that load x capacity, spread over entry nodes in every region, through the
daemons' control sockets with the request's ``strategy`` field. Between runs the mesh drains to
idle. Each load's table gives meshd's p95 and p99 against the best other strategy of that load.
It samples every node's queue once a second, the CPU the testnet uses, and at the end (at least
60 s after the mesh formed) compares each node's Vivaldi estimate of its RTT to every peer with
the scenario's configured RTT. One table per run, the command line in its header; ``--out``
also writes every figure as JSON. A full run takes ~8 minutes, ``--quick`` ~4.

``--rates 0.5,1,2`` offers absolute requests/s instead of fractions of the measured capacity.
``--compare-batching`` (with ``--rates``) runs the whole benchmark twice on the same scenario,
once with every daemon at ``[engine] batching = false`` and ``--off-concurrency`` slots per model
(2, the default before continuous batching) and once with batching on and ``--on-concurrency``
(8, today's default), and prints, per strategy (default: meshd alone), the p95 TTFT of both at
each rate side by side and the highest rate each sustains before its p95 reaches twice its p95 at
the lowest rate (``meshd.testnet.sweep.sustained_rate``):

    .venv/bin/python benchmarks/bench_testnet.py --compare-batching --rates 1,2,4,6,8,10,12,16,20 \
        --duration 45 --out benchmarks/results-testnet-batching.json

Each mesh stops its sweep at the first rate where the p95 of every strategy has doubled (or more
than 1% of its requests failed); ``--full-sweep`` runs every rate.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import re
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

# the daemons this benchmark starts answer from a model, never from the semantic cache
os.environ.setdefault("MESHD_TESTNET_CACHE", "0")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from loadgen import ask_all  # noqa: E402

from meshd.control.client import call, connect, raise_if_error  # noqa: E402
from meshd.core.messages import MessageType  # noqa: E402
from meshd.core.routing import BASELINE_STRATEGIES, STRATEGIES  # noqa: E402
from meshd.errors import MeshdError  # noqa: E402
from meshd.testnet.children import alive  # noqa: E402
from meshd.testnet.launcher import down  # noqa: E402
from meshd.testnet.netem import percentile  # noqa: E402
from meshd.testnet.scenario import Scenario, load_scenario  # noqa: E402
from meshd.testnet.scenario_up import up_scenario  # noqa: E402
from meshd.testnet.sweep import RatePoint, sustained_rate, with_batching  # noqa: E402
from meshd.testnet.sweep import ratio as sweep_ratio  # noqa: E402

PROMPTS = [
    "In the beginning", "And the LORD said unto Moses", "Blessed are the meek",
    "The king of Babylon", "And it came to pass", "Now the serpent was", "Hear, O Israel",
    "For God so loved the world", "The heavens declare", "And Jesus answered and said",
    "Then went out the people", "Unto thee, O LORD", "And the children of Israel",
    "Let not your heart be troubled", "Praise ye the LORD", "And David said",
]  # fmt: skip
REQUEST_TIMEOUT_S = 60.0
DRAIN_TIMEOUT_S = 60.0
SAMPLE_EVERY_S = 1.0
VIVALDI_AFTER_S = 60.0


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------ control-socket helpers


@dataclass
class Result:
    strategy: str
    entry: str
    scheduled: float
    lag_ms: float = 0.0  # how late the client sent it (open-loop fidelity)
    ttft_ms: float | None = None
    e2e_ms: float | None = None
    served_by: str = ""
    tokens: int = 0
    hedges: int = 0
    retries: int = 0
    error: str = ""
    rid: str = ""


async def submit(sock: str, fields: dict[str, Any], res: Result) -> None:
    t0 = trio.current_time()
    res.lag_ms = (t0 - res.scheduled) * 1000.0
    try:
        with trio.fail_after(REQUEST_TIMEOUT_S):
            async with connect(sock) as framed:
                await framed.send(MessageType.SUBMIT, fields)
                while True:
                    msg = await framed.recv()
                    if msg is None:
                        res.error = "daemon closed the connection"
                        return
                    raise_if_error(msg)
                    if msg["t"] == MessageType.TOKENS and res.ttft_ms is None:
                        res.ttft_ms = (trio.current_time() - t0) * 1000.0
                    elif msg["t"] == MessageType.DONE:
                        st = msg.get("stats") or {}
                        res.e2e_ms = (trio.current_time() - t0) * 1000.0
                        res.served_by = st.get("served_by") or ""
                        res.tokens = int(st.get("tokens") or 0)
                        res.hedges = int(st.get("hedges") or 0)
                        res.retries = int(st.get("retries") or 0)
                        return
    except trio.TooSlowError:
        res.error = "timeout"
    except MeshdError as e:
        res.error = type(e).__name__ + ": " + str(e)[:100]
    except OSError as e:
        res.error = f"OSError: {e}"


def fields_for(i: int, strategy: str, max_tokens: int, run_tag: str) -> dict[str, Any]:
    return {"rid": f"{run_tag}-{strategy[:4]}-{i:05d}", "prompt": PROMPTS[i % len(PROMPTS)],
            "strategy": strategy, "max_tokens": max_tokens, "temperature": 0.0, "seed": i,
            "client": "bench"}


# ------------------------------------------------------------------ CPU accounting


def cpu_total() -> tuple[float, float]:
    """(busy, total) jiffies of the whole machine."""
    with open("/proc/stat") as f:
        vals = [float(x) for x in f.readline().split()[1:]]
    idle = vals[3] + (vals[4] if len(vals) > 4 else 0.0)
    return sum(vals) - idle, sum(vals)


def proc_cpu_s(pids: list[int]) -> float:
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for p in pids:
        try:
            with open(f"/proc/{p}/stat") as f:
                parts = f.read().rsplit(")", 1)[1].split()
            total += (float(parts[11]) + float(parts[12])) / tick
        except (OSError, IndexError, ValueError):
            pass
    return total


# ------------------------------------------------------------------ one strategy


@dataclass
class Run:
    strategy: str
    results: list[Result] = field(default_factory=list)
    samples: dict[str, list[tuple[int, int]]] = field(default_factory=dict)  # node -> (queued, running)
    served_delta: dict[str, int] = field(default_factory=dict)
    wall_s: float = 0.0
    cpu_machine_cores: float = 0.0
    cpu_testnet_cores: float = 0.0


async def drain(socks: dict[str, str], timeout_s: float = DRAIN_TIMEOUT_S) -> bool:
    deadline = trio.current_time() + timeout_s
    while trio.current_time() < deadline:
        st = await ask_all(socks, MessageType.STATUS_REQ)
        if all(s is not None and s["data"]["queue_depth"] == 0 and s["data"]["in_flight"] == 0
               for s in st.values()):
            return True
        await trio.sleep(0.5)
    return False


def served_counts(st: dict[str, dict[str, Any] | None]) -> dict[str, int]:
    return {n: sum(m["served"] for m in s["data"]["models"]) if s else 0 for n, s in st.items()}


async def run_strategy(strategy: str, arrivals: list[tuple[float, str]], socks: dict[str, str],
                       max_tokens: int, pids: list[int], run_tag: str,
                       make_fields: Callable[[int, str, int, str], dict[str, Any]] = fields_for) -> Run:
    """The ``arrivals`` (offset s, entry node) sent open-loop, request ``i`` as
    ``make_fields(i, strategy, max_tokens, run_tag)`` (bench_testnet_chat: chat turns)."""
    run = Run(strategy, samples={n: [] for n in socks})
    before = served_counts(await ask_all(socks, MessageType.STATUS_REQ))
    busy0, tot0 = cpu_total()
    proc0 = proc_cpu_s(pids)
    w0 = time.monotonic()
    done_arrivals = trio.Event()

    async def sampler() -> None:
        while not done_arrivals.is_set():
            st = await ask_all(socks, MessageType.STATUS_REQ)
            for n, s in st.items():
                if s is not None:
                    run.samples[n].append((s["data"]["queue_depth"], s["data"]["in_flight"]))
            with trio.move_on_after(SAMPLE_EVERY_S):
                await done_arrivals.wait()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(sampler)
        async with trio.open_nursery() as reqs:
            t0 = trio.current_time()
            for i, (at, entry) in enumerate(arrivals):
                await trio.sleep_until(t0 + at)
                res = Result(strategy, entry, t0 + at)
                run.results.append(res)
                fields = make_fields(i, strategy, max_tokens, run_tag)
                res.rid = fields["rid"]
                reqs.start_soon(submit, socks[entry], fields, res)
            await trio.sleep_until(t0 + arrivals[-1][0] + 0.01)
            done_arrivals.set()  # sample the offered-load window only, not the drain
        run.wall_s = time.monotonic() - w0
    busy1, tot1 = cpu_total()
    ncpu = os.cpu_count() or 1
    run.cpu_machine_cores = (busy1 - busy0) / max(tot1 - tot0, 1.0) * ncpu
    run.cpu_testnet_cores = (proc_cpu_s(pids) - proc0) / max(run.wall_s, 1e-6)
    after = served_counts(await ask_all(socks, MessageType.STATUS_REQ))
    run.served_delta = {n: after[n] - before.get(n, 0) for n in socks}
    return run


def arrivals_for(rate_rps: float, duration_s: float, entries: list[str], seed: int) -> list[tuple[float, str]]:
    rng = random.Random(seed)
    out: list[tuple[float, str]] = []
    t = 0.0
    while True:
        t += rng.expovariate(rate_rps)
        if t > duration_s:
            return out
        out.append((t, rng.choice(entries)))


# ------------------------------------------------------------------ summaries


def summarize(run: Run, slots: dict[str, int], region_of: dict[str, str]) -> dict[str, Any]:
    ok = [r for r in run.results if not r.error and r.ttft_ms is not None]
    ttft = [r.ttft_ms for r in ok if r.ttft_ms is not None]
    e2e = [r.e2e_ms for r in ok if r.e2e_ms is not None]
    mean_q = {n: statistics.fmean(q + f for q, f in s) if s else 0.0 for n, s in run.samples.items()}
    util = {n: statistics.fmean(min(f, slots[n]) / slots[n] for _, f in s) if s else 0.0
            for n, s in run.samples.items()}
    mesh_mean = statistics.fmean(mean_q.values()) if mean_q else 0.0
    cross = [r for r in ok if r.served_by and region_of.get(r.served_by) != region_of.get(r.entry)]
    errors: dict[str, int] = {}
    for r in run.results:
        if r.error:
            key = re.sub(r"[0-9a-f]{8,}|\d+(\.\d+)?", "N", r.error)[:70]
            errors[key] = errors.get(key, 0) + 1
    return {
        "strategy": run.strategy,
        "submitted": len(run.results),
        "completed": len(ok),
        "failed": len(run.results) - len(ok),
        "errors": errors,
        "ttft_ms": {q: round(percentile(ttft, q), 1) for q in (50, 95, 99)},
        "e2e_ms": {q: round(percentile(e2e, q), 1) for q in (50, 95)},
        "cross_region_pct": round(100.0 * len(cross) / max(len(ok), 1), 1),
        "hedged": sum(r.hedges for r in ok),
        "retried": sum(r.retries for r in ok),
        "mean_queue": {n: round(v, 2) for n, v in mean_q.items()},
        "utilisation": {n: round(v, 3) for n, v in util.items()},
        "served": run.served_delta,
        "max_over_mean_queue": round(max(mean_q.values()) / mesh_mean, 2) if mesh_mean > 0 else None,
        "client_lag_ms_p99": round(percentile([r.lag_ms for r in run.results], 99), 1),
        "cpu_machine_cores": round(run.cpu_machine_cores, 2),
        "cpu_testnet_cores": round(run.cpu_testnet_cores, 2),
        "_ttft": ttft,
    }


def pooled(per_seed: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """One summary per strategy over every seed: TTFT percentiles over all requests pooled, the
    spread of each seed's p95/p99 (``ttft_seed_ms``: median, min, max over seeds), and the
    counts and utilisations summed or averaged. With one seed it is that seed's summary."""
    out = []
    for i, first in enumerate(per_seed[0]):
        runs = [seed_runs[i] for seed_runs in per_seed]
        ttft = [x for r in runs for x in r["_ttft"]]
        merged = {k: v for k, v in first.items() if not k.startswith("_") and k not in ("seed", "slowest")}
        merged["submitted"] = sum(r["submitted"] for r in runs)
        merged["completed"] = sum(r["completed"] for r in runs)
        merged["failed"] = sum(r["failed"] for r in runs)
        merged["hedged"] = sum(r["hedged"] for r in runs)
        merged["retried"] = sum(r["retried"] for r in runs)
        errors: dict[str, int] = {}
        for r in runs:
            for k, v in r["errors"].items():
                errors[k] = errors.get(k, 0) + v
        merged["errors"] = errors
        merged["ttft_ms"] = {q: round(percentile(ttft, q), 1) for q in (50, 95, 99)} if ttft else first["ttft_ms"]
        merged["ttft_seed_ms"] = {
            q: {"median": round(statistics.median(r["ttft_ms"][q] for r in runs), 1),
                "min": round(min(r["ttft_ms"][q] for r in runs), 1),
                "max": round(max(r["ttft_ms"][q] for r in runs), 1)} for q in (95, 99)}
        merged["served"] = {n: sum(r["served"][n] for r in runs) for n in first["served"]}
        for key in ("mean_queue", "utilisation"):
            merged[key] = {n: round(statistics.fmean(r[key][n] for r in runs), 3) for n in first[key]}
        slow = [x for r in runs for x in r.get("slowest", [])]
        if slow:
            merged["slowest"] = sorted(slow, key=lambda x: -x["ttft_ms"])
        out.append(merged)
    return out


def slow_line(x: dict[str, Any]) -> str:
    """One slow request in a line: where it entered, where it went, predicted vs seen, events."""
    rec = x.get("record") or {}
    dec = rec.get("decision") or {}
    chosen = dec.get("chosen")
    pred = next((c.get("predicted_ttft_ms") for c in dec.get("candidates") or []
                 if c.get("peer_id") == chosen or c.get("name") == chosen), None)
    kinds: dict[str, int] = {}
    for e in rec.get("events") or []:
        kinds[str(e.get("kind"))] = kinds.get(str(e.get("kind")), 0) + 1
    ev = ", ".join(f"{k} x{v}" if v > 1 else k for k, v in sorted(kinds.items())) or "no events"
    pred_s = f"{pred:.0f} ms" if isinstance(pred, int | float) else "?"
    return (f"{x['rid']}: {x['ttft_ms']:.0f} ms, entry {x['entry']} -> {x['served_by'] or '?'}, predicted {pred_s}, "
            f"client lag {x['lag_ms']:.0f} ms, hedges {x['hedges']}, retries {x['retries']}; {ev}")


def strip(per_seed: list[list[dict[str, Any]]]) -> list[list[dict[str, Any]]]:
    return [[{k: v for k, v in r.items() if not k.startswith("_")} for r in runs] for runs in per_seed]


async def slowest(run: Run, socks: dict[str, str], k: int) -> list[dict[str, Any]]:
    """The k slowest requests (by TTFT) of a run with their explain records from the entry node:
    the evidence for what makes a tail (busy refusals, stale adverts, late hedges, failovers)."""
    ok = sorted((r for r in run.results if r.ttft_ms is not None), key=lambda r: -(r.ttft_ms or 0.0))
    out = []
    for r in ok[:k]:
        reply = None
        try:
            with trio.fail_after(5.0):
                reply = await call(socks[r.entry], MessageType.EXPLAIN_REQ, {"rid": r.rid})
        except (trio.TooSlowError, MeshdError, OSError):
            pass
        out.append({"rid": r.rid, "entry": r.entry, "ttft_ms": round(r.ttft_ms or 0.0, 1),
                    "lag_ms": round(r.lag_ms, 1), "served_by": r.served_by, "hedges": r.hedges,
                    "retries": r.retries, "record": (reply or {}).get("record")})
    return out


async def vivaldi_errors(socks: dict[str, str], scenario: Scenario) -> dict[str, Any]:
    listing = await ask_all(socks, MessageType.PEERS_REQ)
    est_err, meas_err, est_vs_meas = [], [], []
    by_kind: dict[str, list[float]] = {"intra": [], "inter": []}
    missing = 0
    for node, reply in listing.items():
        for p in (reply or {}).get("peers", []):
            try:
                conf = scenario.link(node, p["name"]).rtt_ms
            except KeyError:
                continue
            est, meas = p.get("rtt_estimated_ms"), p.get("rtt_measured_ms")
            if est is None or conf <= 0:
                missing += 1
                continue
            e = abs(est - conf) / conf
            est_err.append(e)
            same = scenario.node(node).region == scenario.node(p["name"]).region
            by_kind["intra" if same else "inter"].append(e)
            if meas is not None:
                meas_err.append(abs(meas - conf) / conf)
                est_vs_meas.append(abs(est - meas) / meas if meas > 0 else 0.0)
    def med(xs: list[float]) -> float | None:
        return round(100 * statistics.median(xs), 1) if xs else None

    return {
        "pairs": len(est_err), "pairs_without_estimate": missing,
        "median_rel_error_pct": med(est_err),
        "p90_rel_error_pct": round(100 * percentile(est_err, 90), 1) if est_err else None,
        "median_rel_error_intra_pct": med(by_kind["intra"]),
        "median_rel_error_inter_pct": med(by_kind["inter"]),
        "measured_vs_configured_median_pct": med(meas_err),
        "estimated_vs_measured_median_pct": med(est_vs_meas),
    }


def probe_links(index: dict[str, Any], scenario: Scenario) -> list[dict[str, Any]]:
    """A raw TCP round trip (no daemon) for one pair per region pair: the emulator's accuracy."""
    if (index.get("network") or {}).get("mode") != "netns":
        return []
    nodes = {n["name"]: n for n in index["nodes"]}
    firsts: dict[str, list[str]] = {}
    for n in scenario.nodes:
        firsts.setdefault(n.region, []).append(n.name)
    regions = sorted(firsts)
    pairs = [(firsts[r][0], firsts[r][1]) for r in regions if len(firsts[r]) > 1]
    pairs += [(firsts[a][0], firsts[b][0]) for i, a in enumerate(regions) for b in regions[i + 1:]]
    out = []
    py = sys.executable
    for a, b in pairs:
        host = nodes[b]["host"]
        srv = subprocess.Popen(["ip", "netns", "exec", nodes[b]["netns"], py, "-m", "meshd.testnet.probe",
                                "serve", host, "7001", "--idle", "5"], stdout=subprocess.PIPE, text=True)
        try:
            assert srv.stdout is not None
            srv.stdout.readline()  # "ready"
            r = subprocess.run(["ip", "netns", "exec", nodes[a]["netns"], py, "-m", "meshd.testnet.probe",
                                "ping", host, "7001", "--count", "10"], capture_output=True, text=True,
                               timeout=30)
            got = json.loads(r.stdout)
        finally:
            srv.terminate()
            srv.wait(timeout=10)
            if srv.stdout is not None:
                srv.stdout.close()
        out.append({"a": a, "b": b, "configured_ms": scenario.link(a, b).rtt_ms,
                    "probe_median_ms": got["median_ms"], "probe_min_ms": got["min_ms"]})
    return out


# ------------------------------------------------------------------ main


def pick_entries(scenario: Scenario, k: int) -> list[str]:
    """``k`` entry nodes, round-robin over the regions (so every region has one)."""
    per: dict[str, list[str]] = {}
    for n in scenario.nodes:
        per.setdefault(n.region, []).append(n.name)
    out: list[str] = []
    while len(out) < min(k, len(scenario.nodes)):
        for r in sorted(per):
            if per[r] and len(out) < k:
                out.append(per[r].pop(0))
    return out


async def warm_up(socks: dict[str, str], entries: list[str], max_tokens: int, n_nodes: int,
                  make_fields: Callable[[int, int], dict[str, Any]] | None = None) -> None:
    """round_robin from each entry until every node has served and measured its speeds, then
    wait until every entry's peer table carries those speeds. ``make_fields(round, i)``: the
    i-th warm-up request of a round (default: ``fields_for``'s)."""
    if make_fields is None:
        def make_fields(rounds: int, i: int) -> dict[str, Any]:
            return fields_for(rounds * 1000 + i, "round_robin", max_tokens, "warm")
    rounds = 0
    while True:
        st = await ask_all(socks, MessageType.STATUS_REQ)
        cold = [n for n, s in st.items() if s is None or any(m["decode_tps"] <= 0 for m in s["data"]["models"])]
        if not cold or rounds >= 6:
            break
        rounds += 1
        async with trio.open_nursery() as n:
            for i in range(n_nodes):
                e = entries[i % len(entries)]
                res = Result("warmup", e, trio.current_time())
                n.start_soon(submit, socks[e], make_fields(rounds, i), res)
    deadline = trio.current_time() + 30
    while trio.current_time() < deadline:
        peers = await ask_all({e: socks[e] for e in entries}, MessageType.PEERS_REQ)
        if all(r is not None and all(p["decode_tps"] > 0 for p in r["peers"]) for r in peers.values()):
            return
        await trio.sleep(0.5)


def capacity(statuses: dict[str, dict[str, Any] | None], max_tokens: int, prompt_tokens: float,
             scenario: Scenario) -> tuple[float, float, dict[str, int]]:
    """(measured, configured) requests/s the mesh completes when saturated; slots per node.
    Configured: from the first model's decode cap (and prefill cap, where it has one)."""
    measured = configured = 0.0
    slots: dict[str, int] = {}
    for n in scenario.nodes:
        s = statuses[n.name]
        m = s["data"]["models"][0] if s else None
        slots[n.name] = int(m["max_concurrency"]) if m else 2
        if m and m["decode_tps"] > 0 and m["prefill_tps"] > 0:
            t = prompt_tokens / m["prefill_tps"] + (max_tokens - 1) / m["decode_tps"]
            measured += slots[n.name] / t
        caps = n.daemon_models()[0] if n.models else {}
        cap = float(caps.get("max_decode_tokens_per_s", 0.0))
        pre = float(caps.get("max_prefill_tokens_per_s", 0.0))  # bench_testnet_chat's devices
        if cap > 0:
            configured += slots[n.name] / ((max_tokens - 1) / cap + (prompt_tokens / pre if pre > 0 else 0.0))
    return measured, configured, slots


def fmt_table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=True)]

    def line(r: list[Any]) -> str:
        return "  ".join(str(x).rjust(w) if i else str(x).ljust(w) for i, (x, w) in enumerate(zip(r, widths, strict=True)))

    return "\n".join([line(header), line(["-" * w for w in widths])] + [line(r) for r in rows])


async def bench(args: argparse.Namespace, scenario: Scenario, index: dict[str, Any], t_mesh: float) -> dict[str, Any]:
    socks = {n["name"]: n["socket"] for n in index["nodes"]}
    pids = [n["pid"] for n in index["nodes"]]
    fwd = (index.get("network") or {}).get("forwarder_pid")
    if fwd:
        pids.append(int(fwd))
    region_of = {n.name: n.region for n in scenario.nodes}
    entries = pick_entries(scenario, args.entries)
    log(f"warming up (entries {', '.join(entries)})")
    await warm_up(socks, entries, args.max_tokens, len(scenario.nodes))
    c0, b0, w0 = proc_cpu_s(pids), cpu_total(), time.monotonic()
    await trio.sleep(5.0)
    idle_cores = (proc_cpu_s(pids) - c0) / (time.monotonic() - w0)
    b1 = cpu_total()
    machine_cores = (b1[0] - b0[0]) / max(b1[1] - b0[1], 1.0) * (os.cpu_count() or 1)
    log(f"idle testnet uses {idle_cores:.2f} cores (machine-wide {machine_cores:.2f})")
    st = await ask_all(socks, MessageType.STATUS_REQ)
    prompt_tokens = 8.0
    measured, configured, slots = capacity(st, args.max_tokens, prompt_tokens, scenario)
    base = measured if measured > 0 else configured
    log(f"capacity measured {measured:.2f} rps, configured {configured:.2f} rps")
    wait = t_mesh + args.vivaldi_wait_s - time.monotonic()
    if wait > 0:
        log(f"waiting {wait:.0f} s on the idle mesh so Vivaldi has had {args.vivaldi_wait_s:.0f} s")
        await trio.sleep(wait)
    viv = await vivaldi_errors(socks, scenario)
    viv["after_s"] = round(time.monotonic() - t_mesh, 1)
    log(f"Vivaldi on the idle mesh: median relative error {viv['median_rel_error_pct']}%")
    loads = []
    levels = ([(r, r / base if base > 0 else 0.0) for r in args.rates] if args.rates
              else [(load * base, load) for load in args.loads])
    for li, (rate, load) in enumerate(levels):
        duration = args.requests / rate if args.requests else args.duration
        per_seed: list[list[dict[str, Any]]] = []
        for seed in args.seeds:
            arrivals = arrivals_for(rate, duration, entries, seed + li)
            runs = []
            tag = f"b{int(time.time()) % 100000}s{seed}"
            for strategy in args.strategies:
                log(f"load {load:.0%}, seed {seed}, strategy {strategy}: {len(arrivals)} requests over "
                    f"{duration:.0f} s ({rate:.2f} rps)")
                run = await run_strategy(strategy, arrivals, socks, args.max_tokens, pids, tag)
                s = summarize(run, slots, region_of)
                s["seed"] = seed
                log(f"  done {s['completed']}/{s['submitted']} ttft p50/p95/p99 {s['ttft_ms'][50]}/"
                    f"{s['ttft_ms'][95]}/{s['ttft_ms'][99]} ms; cpu {s['cpu_machine_cores']} cores "
                    f"(testnet {s['cpu_testnet_cores']})")
                if strategy == "meshd" and args.slowest:
                    s["slowest"] = await slowest(run, socks, args.slowest)
                runs.append(s)
                if not await drain(socks):
                    log(f"  warning: the mesh did not drain within {DRAIN_TIMEOUT_S:.0f} s")
                dead = [n["name"] for n in index["nodes"] if not alive(n["pid"])]
                if dead:
                    s["nodes_down_after"] = dead
                    log(f"  warning: daemons no longer running: {', '.join(dead)}")
            per_seed.append(runs)
        loads.append({"load": load, "offered_rps": round(rate, 3), "duration_s": round(duration, 1),
                      "requests_per_strategy": sum(r["submitted"] for r in per_seed[0]) // len(per_seed[0]),
                      "seeds": list(args.seeds), "runs": pooled(per_seed), "per_seed": strip(per_seed)})
        if args.rates and not args.full_sweep and li + 1 < len(levels):
            stopped = [sustained_rate(rate_points(loads, st))[0] for st in args.strategies]
            if all(x is None or x < rate for x in stopped):
                log(f"every strategy's p95 TTFT has doubled (or requests failed) at {rate:g} rps: "
                    f"the higher rates are not run (--full-sweep runs them)")
                break
    viv_load = await vivaldi_errors(socks, scenario)
    viv_load["after_s"] = round(time.monotonic() - t_mesh, 1)
    batched = sum(1 for x in st.values() if x and any("batch" in m for m in x["data"]["models"]))
    return {"loads": loads, "runs": loads[-1]["runs"], "batch_schedulers": batched, "vivaldi": viv, "vivaldi_after_load": viv_load,
            "idle_testnet_cores": round(idle_cores, 2),
            "idle_machine_cores": round(machine_cores, 2), "capacity_measured_rps": round(measured, 3),
            "capacity_configured_rps": round(configured, 3), "entries": entries,
            "speeds": {n: {"decode_tps": s["data"]["models"][0]["decode_tps"],
                           "prefill_tps": s["data"]["models"][0]["prefill_tps"]} if s else None
                       for n, s in st.items()}}


def report(args: argparse.Namespace, scenario: Scenario, out: dict[str, Any]) -> str:
    lines = []
    for at in out["loads"]:
        lines.extend(report_load(args, scenario, out, at))
        lines.append("")
    lines.extend(report_vivaldi(out))
    return "\n".join(lines)


def best_other(by: dict[str, dict[str, Any]], q: int) -> tuple[str, float]:
    """The strategy other than meshd (and the lockstep strawman) with the lowest TTFT pq."""
    got = [(r["ttft_ms"][q], name) for name, r in by.items()
           if name not in ("meshd", "round_robin_lockstep") and r["completed"] and r["ttft_ms"][q] > 0]
    if not got:
        return "", float("nan")
    v, name = min(got)
    return name, v


def report_load(args: argparse.Namespace, scenario: Scenario, out: dict[str, Any], at: dict[str, Any]) -> list[str]:
    runs = at["runs"]
    lines = []
    lines.append(f"{out.get('label', '')}offered load: {at['offered_rps']} requests/s = {at['load']:.0%} of measured capacity "
                 f"{out['capacity_measured_rps']} rps (configured caps: {out['capacity_configured_rps']} rps); "
                 f"{at['requests_per_strategy']} requests per strategy and seed over {at['duration_s']:.0f} s, "
                 f"seeds {', '.join(map(str, at['seeds']))}, "
                 f"max_tokens {args.max_tokens}, entries {', '.join(out['entries'])}")
    rows = []
    for r in runs:
        rows.append([r["strategy"], r["completed"], r["failed"], r["ttft_ms"][50], r["ttft_ms"][95],
                     r["ttft_ms"][99], r["e2e_ms"][50], r["e2e_ms"][95], f"{r['cross_region_pct']}%",
                     r["max_over_mean_queue"], r["hedged"], f"{r['cpu_machine_cores']}/{r['cpu_testnet_cores']}"])
    lines.append("")
    lines.append(fmt_table(rows, ["strategy", "done", "failed", "TTFT p50", "p95", "p99", "e2e p50", "p95",
                                  "cross-region", "maxQ/meanQ", "hedges", "CPU cores all/testnet"]))
    for r in runs:
        if r["errors"] or r.get("nodes_down_after"):
            lines.append(f"  {r['strategy']}: errors {r['errors'] or '{}'}"
                         + (f"; daemons down afterwards: {', '.join(r['nodes_down_after'])}"
                            if r.get("nodes_down_after") else ""))
    lines.append(f"idle mesh (before the runs): the testnet's processes use {out['idle_testnet_cores']} "
                 f"cores, the whole machine {out['idle_machine_cores']} of {os.cpu_count()}")
    if len(at["seeds"]) > 1:
        rows = [[r["strategy"], r["completed"],
                 *(f"{r['ttft_seed_ms'][q]['median']} [{r['ttft_seed_ms'][q]['min']}-{r['ttft_seed_ms'][q]['max']}]"
                   for q in (95, 99))] for r in runs]
        lines.append("")
        lines.append("TTFT percentiles above are pooled over all seeds' requests; per seed, median [min-max]:")
        lines.append(fmt_table(rows, ["strategy", "done (all seeds)", "p95 per seed", "p99 per seed"]))
    lines.append("(times in ms at the client; maxQ/meanQ = the busiest node's mean queue (waiting + "
                 "running) over the mesh mean; CPU = machine-wide / the testnet's processes)")
    names = [n.name for n in scenario.nodes]
    rows = []
    for n in names:
        row = [f"{n} ({scenario.node(n).max_decode_tokens_per_s:g} t/s)"]
        for r in runs:
            row.append(f"{100 * r['utilisation'][n]:.0f}% / {r['mean_queue'][n]:.1f} / {r['served'][n]}")
        rows.append(row)
    lines.append("")
    lines.append("per node: utilisation (running / slots) / mean queue (waiting + running) / requests served")
    lines.append(fmt_table(rows, ["node (decode cap)"] + [r["strategy"] for r in runs]))
    by = {r["strategy"]: r for r in runs}
    lines.append("")
    if by.get("meshd", {}).get("slowest"):
        lines.append("meshd's slowest requests (TTFT at the client; the entry node's predicted TTFT for its "
                     "choice; what its journal recorded):")
        for x in by["meshd"]["slowest"][:8]:
            lines.append("  " + slow_line(x))
        lines.append("")
    if "meshd" in by:
        for q in (95, 99):
            other, v = best_other(by, q)
            if other:
                lines.append(f"load {at['load']:.0%}: TTFT p{q} meshd / best other ({other}): "
                             f"{by['meshd']['ttft_ms'][q] / v:.2f}")
        for other in ("round_robin", "lwsq"):
            if other in by and by[other]["ttft_ms"][95] > 0:
                ratio = by["meshd"]["ttft_ms"][95] / by[other]["ttft_ms"][95]
                lines.append(f"load {at['load']:.0%}: TTFT p95 meshd / {other}: {ratio:.2f}")
        q = by["meshd"]["max_over_mean_queue"]
        if q is not None:
            lines.append(f"load {at['load']:.0%}: meshd busiest node's mean queue / mesh mean: {q:.2f}")
    return lines


def report_vivaldi(out: dict[str, Any]) -> list[str]:
    lines = []
    for label, v in (("idle mesh", out["vivaldi"]), ("after the load", out["vivaldi_after_load"])):
        lines.append(f"Vivaldi, {label}, {v['after_s']} s after start: median relative error of estimated vs "
                     f"configured RTT {v['median_rel_error_pct']}% over {v['pairs']} node pairs (goal < 15%; "
                     f"p90 {v['p90_rel_error_pct']}%; inside regions {v['median_rel_error_intra_pct']}%, across "
                     f"{v['median_rel_error_inter_pct']}%); daemons' measured RTT vs configured "
                     f"{v['measured_vs_configured_median_pct']}%; estimated vs measured "
                     f"{v['estimated_vs_measured_median_pct']}%")
    if out.get("probes"):
        lines.append("emulated links, raw TCP probe (no daemon): " + "; ".join(
            f"{p['a']}-{p['b']} configured {p['configured_ms']:g} ms, median {p['probe_median_ms']:.1f}"
            for p in out["probes"]))
    if out.get("forwarder"):
        f = out["forwarder"]
        lines.append(f"link emulator: {f.get('delayed')} packets delayed, {f.get('dropped')} dropped; released "
                     f"late by p50 {f.get('late_ms_p50')} ms / p99 {f.get('late_ms_p99')} ms / max {f.get('late_ms_max')} ms")
    return lines


def rate_points(loads: list[dict[str, Any]], strategy: str) -> list[RatePoint]:
    """One strategy's outcome at each offered rate run so far (pooled over the seeds)."""
    pts = []
    for at in loads:
        r = next((x for x in at["runs"] if x["strategy"] == strategy), None)
        if r is not None:
            p95 = r["ttft_ms"][95] if r["completed"] else None
            pts.append(RatePoint(at["offered_rps"], p95, r["failed"] / max(r["submitted"], 1)))
    return pts


def compare_batching(outs: dict[str, dict[str, Any]], strategies: list[str]) -> dict[str, Any]:
    """Per strategy: each rate's p95 TTFT with batching off and on, and each side's highest rate
    sustained before its p95 doubles. A rate one side did not run (it had doubled below it)
    shows None there."""
    out: dict[str, Any] = {}
    for strategy in strategies:
        per = {side: {p.rate_rps: p for p in rate_points(o["loads"], strategy)}
               for side, o in outs.items()}
        rows = []
        for rate in sorted(set(per["off"]) | set(per["on"])):
            off, on = per["off"].get(rate), per["on"].get(rate)
            rows.append({"rate_rps": rate, "p95_off_ms": off.p95_ms if off else None,
                         "p95_on_ms": on.p95_ms if on else None,
                         "failed_off": round(off.failed_share, 3) if off else None,
                         "failed_on": round(on.failed_share, 3) if on else None,
                         "on_over_off": sweep_ratio(on.p95_ms if on else None,
                                                    off.p95_ms if off else None)})
        sustained = {side: sustained_rate(list(pts.values())) for side, pts in per.items()}
        out[strategy] = {"rates": rows,
                         "sustained_rps": {k: v[0] for k, v in sustained.items()},
                         "sustained_why": {k: v[1] for k, v in sustained.items()}}
    return out


def report_comparison(args: argparse.Namespace, cmp: dict[str, Any]) -> str:
    lines = [f"batching off ({args.off_concurrency} slots per model, each request its own decode loop) "
             f"vs on ({args.on_concurrency} slots, continuous batching), same scenario and arrivals "
             f"(nodes running a batch scheduler: off {cmp['_nodes']['off']}, on {cmp['_nodes']['on']}):"]
    for strategy, c in cmp.items():
        if strategy.startswith("_"):
            continue
        rows = [[f"{r['rate_rps']:g}",
                 "-" if r["p95_off_ms"] is None else f"{r['p95_off_ms']:.0f}",
                 "-" if r["p95_on_ms"] is None else f"{r['p95_on_ms']:.0f}",
                 "-" if r["on_over_off"] is None else f"{r['on_over_off']:.2f}",
                 " / ".join("not run" if f is None else f"{100 * f:.0f}%"
                            for f in (r["failed_off"], r["failed_on"]))] for r in c["rates"]]
        lines.append("")
        lines.append(f"strategy {strategy}:")
        lines.append(fmt_table(rows, ["offered rps", "TTFT p95 off", "p95 on", "on / off",
                                      "failed off / on"]))
        for side in ("off", "on"):
            rate = c["sustained_rps"][side]
            lines.append(f"sustained before p95 TTFT doubles, batching {side}: "
                         f"{'none' if rate is None else f'{rate:g} rps'} ({c['sustained_why'][side]})")
        off, on = c["sustained_rps"]["off"], c["sustained_rps"]["on"]
        if off and on:
            open_ended = [side for side in ("off", "on") if "lower bound" in c["sustained_why"][side]]
            note = (f" (only a bound: the sweep did not reach the limit with batching "
                    f"{' and '.join(open_ended)})" if open_ended else "")
            lines.append(f"sustained rate on / off: {on / off:.2f}x{note}")
    return "\n".join(lines)


def run_mesh(args: argparse.Namespace, scenario: Scenario, directory: Path, label: str = "") -> dict[str, Any]:
    """Start the scenario in ``directory``, run the benchmark on it, stop it; its figures."""
    t_start = time.monotonic()
    log(f"starting {scenario.name} in {directory}")
    index = up_scenario(directory, scenario, isolation=args.isolation)
    t_mesh = time.monotonic()
    net = index.get("network") or {}
    if net.get("mode") == "netns":
        net_line = "network: one namespace per node, links emulated in user space (delay, jitter, loss)"
    else:
        net_line = f"network: LOOPBACK WITHOUT LATENCY EMULATION ({net.get('reason')}): RTTs are not the scenario's"
    print(f"# {label}{net_line}; mesh formed in {t_mesh - t_start:.1f} s", flush=True)
    try:
        probes = probe_links(index, scenario)
        out = trio.run(bench, args, scenario, index, t_mesh)
        out["probes"] = probes
        stats = net.get("stats")
        if stats and Path(stats).exists():
            out["forwarder"] = json.loads(Path(stats).read_text())
    finally:
        log("stopping the testnet")
        down(directory)
    out["network"] = net_line
    out["label"] = label
    out["load_average"] = [round(x, 2) for x in os.getloadavg()]
    out["wall_s"] = round(time.monotonic() - t_start, 1)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scenario", default=str(ROOT / "testnet" / "regions-12.toml"))
    p.add_argument("--quick", action="store_true", help="20 s per strategy instead of 45")
    p.add_argument("--duration", type=float, default=None, help="seconds of arrivals per strategy")
    p.add_argument("--load", default="0.7", help="offered load(s) as a fraction of capacity, e.g. 0.4,0.7,0.9")
    p.add_argument("--rates", default=None,
                   help="offered loads as absolute requests/s, e.g. 0.5,1,2,4 (instead of --load; the "
                        "same for every mesh, as --compare-batching needs)")
    p.add_argument("--compare-batching", action="store_true",
                   help="run everything twice, [engine] batching off (--off-concurrency slots) and on "
                        "(--on-concurrency slots), and compare p95 TTFT per rate and the rate each "
                        "sustains before p95 doubles; needs --rates")
    p.add_argument("--full-sweep", action="store_true",
                   help="with --rates: run every rate, even above the one where every strategy's p95 "
                        "TTFT had doubled (by default the sweep stops there)")
    p.add_argument("--off-concurrency", type=int, default=2,
                   help="max_concurrency per model with batching off (2: the default before batching)")
    p.add_argument("--on-concurrency", type=int, default=8,
                   help="max_concurrency per model with batching on (8: today's default)")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--entries", type=int, default=6, help="entry nodes, spread over the regions")
    p.add_argument("--seed", type=int, default=1, help="arrival seed (one run per strategy)")
    p.add_argument("--seeds", default=None,
                   help="several arrival seeds, e.g. 1,7,13: every strategy runs once per seed and each "
                        "table reports the pooled percentiles and the spread of the seeds' p95/p99")
    p.add_argument("--requests", type=int, default=None,
                   help="requests per strategy and seed (sets the duration from the offered rate)")
    p.add_argument("--slowest", type=int, default=5,
                   help="keep the explain records of meshd's N slowest requests per seed in the JSON")
    p.add_argument("--strategies", default=None,
                   help=f"default: {','.join(BASELINE_STRATEGIES)}; meshd alone with --compare-batching")
    p.add_argument("--vivaldi-wait-s", type=float, default=VIVALDI_AFTER_S,
                   help="wait on the idle mesh until it is this old before measuring Vivaldi and the loads")
    p.add_argument("--isolation", default="auto", choices=("auto", "netns", "loopback"))
    p.add_argument("--dir", help="testnet directory (default: a fresh temporary one)")
    p.add_argument("--out", help="write every figure to this JSON file")
    args = p.parse_args()
    args.duration = args.duration or (20.0 if args.quick else 45.0)
    try:
        args.loads = [float(x) for x in args.load.split(",") if x.strip()]
    except ValueError:
        p.error(f"--load: not a list of numbers: {args.load!r}")
    if not args.loads or not all(0.0 < x <= 2.0 for x in args.loads):
        p.error("--load: each load must be above 0 and at most 2")
    try:
        args.rates = sorted(float(x) for x in args.rates.split(",") if x.strip()) if args.rates else []
    except ValueError:
        p.error(f"--rates: not a list of numbers: {args.rates!r}")
    if not all(x > 0 for x in args.rates):
        p.error("--rates: each rate must be above 0")
    if args.compare_batching and len(args.rates) < 2:
        p.error("--compare-batching needs --rates with at least two rates (the meshes' capacities differ)")
    if args.off_concurrency < 1 or args.on_concurrency < 1:
        p.error("--off-concurrency and --on-concurrency: at least 1")
    try:
        args.seeds = [int(x) for x in args.seeds.split(",") if x.strip()] if args.seeds else [args.seed]
    except ValueError:
        p.error(f"--seeds: not a list of integers: {args.seeds!r}")
    if args.requests is not None and args.requests < 20:
        p.error("--requests: at least 20")
    if args.strategies is None:
        args.strategies = "meshd" if args.compare_batching else ",".join(BASELINE_STRATEGIES)
    args.strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    for s in args.strategies:
        if s not in STRATEGIES:
            p.error(f"unknown strategy {s!r}; choose from {', '.join(STRATEGIES)}")
    scenario = load_scenario(args.scenario)
    header = [
        "# bench_testnet: " + " ".join(shlex.quote(a) for a in [sys.executable, *sys.argv]),
        f"# {time.strftime('%Y-%m-%d %H:%M:%S')}  {platform.node()}  {os.cpu_count()} CPUs  "
        f"python {platform.python_version()}  scenario {scenario.name} ({len(scenario.nodes)} nodes, "
        f"{len(scenario.regions)} regions); load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}",
    ]
    print("\n".join(header), flush=True)
    directory = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="bench-testnet-"))
    t_start = time.monotonic()

    def on_term(*_: Any) -> None:
        raise KeyboardInterrupt  # so that `finally` stops the testnet

    signal.signal(signal.SIGTERM, on_term)
    if not args.compare_batching:
        out = run_mesh(args, scenario, directory)
        print(report(args, scenario, out))
    else:
        sides = {"off": (False, args.off_concurrency), "on": (True, args.on_concurrency)}
        outs = {}
        for side, (batching, slots) in sides.items():
            label = f"batching {side}, {slots} slots: "
            outs[side] = run_mesh(args, with_batching(scenario, batching, slots), directory / side, label)
            print(report(args, scenario, outs[side]), flush=True)
            print(flush=True)
        cmp = compare_batching(outs, args.strategies)
        cmp["_nodes"] = {side: f"{o['batch_schedulers']}/{len(scenario.nodes)}" for side, o in outs.items()}
        print(report_comparison(args, cmp))
        out = {"compare_batching": cmp, "batching_off": outs["off"], "batching_on": outs["on"],
               "off_concurrency": args.off_concurrency, "on_concurrency": args.on_concurrency}
    out["command"] = header[0][len("# bench_testnet: "):]
    out["wall_s"] = round(time.monotonic() - t_start, 1)
    print(f"# wall time {out['wall_s']} s; load average now "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}; daemon and emulator logs in {directory}")
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
