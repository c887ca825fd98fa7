"""Issue 32's testnet figure: the multi-turn chat workload through real daemons, prefix-aware
routing (``meshd``) against the same mesh blind to cached prefixes (``meshd_no_prefix``) and
against routing by the longest advertised prefix alone (``prefix_only``).

    .venv/bin/python benchmarks/bench_testnet_chat.py --model /work/models/smol-q41-l4 \\
        [--emulated-model] [--prefill-per-decode R] [--scenario testnet/regions-12.toml] \\
        [--load 0.7] [--seeds 1,2,3] [--requests 1000] [--max-tokens 16] [--rate RPS] \\
        [--strategies meshd,meshd_no_prefix,prefix_only] [--out FILE.json]
    .venv/bin/python benchmarks/bench_testnet_chat.py --merge SEED1.json SEED2.json ... --out FILE.json

(``--merge``: runs made a seed at a time, about 45 minutes each, become one figure: the ratios
per seed and their median; runs that differ in more than their seeds are refused.)

It starts the scenario as ``bench_testnet`` does (12 daemons in network namespaces, emulated
RTTs, the scenario's decode caps and slots), every node serving ``--model`` (the scenario's
``default`` model, through $MESHD_DEFAULT_MODEL) with its KV prefix cache (``[engine]
prefix_cache_mb``, default 256). Requests are ``meshd.sim.chat.chat_requests`` (the simulator's
chat workload: each turn resends the system prompt and the whole history) at ``--load`` x the
mesh's capacity for an uncached prompt of the workload's mean length; each conversation enters
at one entry node (drawn per conversation, seeded) and keeps it. Synthetic token ids become
text one word per id (words that are one token each of the model's tokenizer), so equal id
prefixes are equal text and token prefixes: the entry node names the prompt's blocks, nodes
advertise the prefixes they hold, and a node reuses its cached KV as for real chat. Each
(seed, strategy) run draws its words with its own salt: the same conversations, lengths and
arrival times, but no prefix cached by an earlier run matches. The answer asked for is capped
at ``--max-tokens`` (the history still grows by the workload's answer length) so that the
decode caps do not hold a slot for tens of seconds.

**Emulated devices.** Twelve daemons that really prefill ~600-token prompts of SmolLM2-135M need
about a core each; on a 2-core box the box, not the mesh, sets the figure. ``--prefill-per-decode
R`` gives every node's models ``max_prefill_tokens_per_s`` = R x their decode cap (a model's own
``max_decode_tokens_per_s``, else its node's in the scenario; a model's own
``max_prefill_tokens_per_s`` wins), so a request's first token waits for its computed prompt
tokens (those not restored from the KV prefix cache) at that speed. ``--emulated-model`` serves ``benchmarks/emulated_model.py``'s copy of ``--model``: one
random tiny layer with the real tokenizer and chat template (a 2,000-token prefill costs 0.3 s of
CPU in 16-token chunks, the daemon's, against 16 s for SmolLM2-135M int4), and each node's
``[engine] prefix_cache_mb`` scaled so that it holds as many tokens as the real model's budget
(256 MiB -> 5 MiB). With both, each node is a slower device whose compute is its own while text,
blocks, prefix caches, adverts and routing credit stay real.

R is the device's prefill speed over its decode speed. Decode reads every weight once a token
(memory-bound); prefill processes many tokens a read (compute-bound), so R is the device's
compute over its bandwidth, in tokens. llama.cpp's pp512 over tg128 for 3-8 B 4-bit models: Apple
M1 Max GPU 500/46 = 10.8x and Mac mini M4 225/21 = 10.8x (github.com/brand-o/normiebench issues
40 and 3), M2 Max CPU 125/9.7 = 13x (ikawrakow/ik_llama.cpp PR 544), RX 580 over Vulkan 347/36 =
9.6x (geerlingguy/ai-benchmarks issue 20); on this box's 2 vCPUs SmolLM2-135M int4 prefills 363
and decodes 57 tokens/s in meshd (6.4x; llama.cpp 2.8x, docs/benchmarks.md issue 28); datacenter
GPUs reach tens to a hundred. R = 10 is the edge device's value: regions-12's nodes (decode 2.5-12
tokens/s) then prefill 25-120 tokens/s, an uncached 615-token prompt 5-25 s. Such a device also
meets the daemon's ``[routing] first_token_timeout_s`` (20 s) on long uncached prompts: an
attempt without a first token by then is cancelled and retried elsewhere, as it would be on real
hardware (``retried`` in the JSON).

It reports TTFT p50/p95/p99 per strategy and seed, each seed's p50 and p95 as a ratio to
``meshd_no_prefix`` of the same seed, the medians of those over the seeds (the issue's goals:
p50 <= 0.4x, p95 <= 0.6x, and meshd's p95 below prefix_only's), the requests that reused a
cached prefix and how many tokens, and the busiest node's mean queue over the mesh mean (the
herd). ``--out`` writes every figure as JSON.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import random
import re
import shlex
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

os.environ.setdefault("MESHD_TESTNET_CACHE", "0")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import bench_testnet as bt  # noqa: E402
import emulated_model as em  # noqa: E402
from loadgen import ask_all  # noqa: E402

from meshd.config import EngineConfig  # noqa: E402
from meshd.core.messages import MessageType  # noqa: E402
from meshd.core.routing import STRATEGIES  # noqa: E402
from meshd.errors import MeshdError  # noqa: E402
from meshd.sim.chat import ChatTurn, chat_requests, mean_sizes  # noqa: E402
from meshd.sim.scenario import ChatSpec  # noqa: E402
from meshd.testnet.children import alive  # noqa: E402
from meshd.testnet.launcher import down  # noqa: E402
from meshd.testnet.netem import percentile  # noqa: E402
from meshd.testnet.scenario import NodeDef, Scenario, load_scenario  # noqa: E402
from meshd.testnet.scenario_up import up_scenario  # noqa: E402

STRATEGIES_RUN = ("meshd", "meshd_no_prefix", "prefix_only")
BASE = "meshd_no_prefix"
GOALS = {50: 0.4, 95: 0.6}
WARM_WORDS = 300  # words of each warm-up prompt: the speeds adverts carry come from long prompts


def log(msg: str) -> None:
    bt.log(msg)


# ------------------------------------------------------------------ token ids -> text


def one_token_words(tokenizer_json: Path) -> list[str]:
    """Lower-case words of 3-8 letters that the model's tokenizer makes one token each after a
    space (byte-level BPE: "Ġword"), sorted: id ``i`` of the workload becomes one of them."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_json))
    vocab = tok.get_vocab()
    words = sorted(w[1:] for w in vocab if re.fullmatch(r"Ġ[a-z]{3,8}", w))
    sample = words[::max(len(words) // 400, 1)]
    enc = tok.encode("".join(" " + w for w in sample), add_special_tokens=False)
    if len(words) < 1000 or len(enc.ids) != len(sample):
        raise SystemExit(f"error: {tokenizer_json}: not a byte-level BPE tokenizer with one-token "
                         f"words ({len(words)} found); pick another --model")
    return words


def to_text(ids: tuple[int, ...], words: list[str], salt: int) -> str:
    """One word per id; ``salt`` draws another word for every id (another run's prefixes)."""
    n = len(words)
    return "".join(" " + words[(i * 2_654_435_761 + salt * 97_531) % n] for i in ids)


# ------------------------------------------------------------------ emulated devices


def emulate_devices(scenario: Scenario, prefill_per_decode: float,
                    prefix_cache_mb: Any = None) -> Scenario:
    """The scenario with every node's models prefill-capped at ``prefill_per_decode`` x their
    decode cap (a model's own ``max_decode_tokens_per_s``, else the node's; a model's own
    ``max_prefill_tokens_per_s`` wins; 0 = no change) and, where ``prefix_cache_mb`` (a function
    of a node's budget in MiB) is given, every node's ``[engine] prefix_cache_mb`` mapped by it."""
    nodes: list[NodeDef] = []
    for n in scenario.nodes:
        models = []
        for m in n.daemon_models():
            decode = float(m.get("max_decode_tokens_per_s", 0.0))
            if prefill_per_decode > 0 and decode > 0 and "max_prefill_tokens_per_s" not in m:
                m["max_prefill_tokens_per_s"] = round(prefill_per_decode * decode, 3)
            models.append(m)
        config = n.daemon_config()
        if prefix_cache_mb is not None:
            engine = dict(config.get("engine") or {})
            engine["prefix_cache_mb"] = prefix_cache_mb(int(engine.get("prefix_cache_mb",
                                                                        EngineConfig.prefix_cache_mb)))
            config["engine"] = engine
        nodes.append(dataclasses.replace(n, models=tuple(models), config=config))
    return dataclasses.replace(scenario, nodes=tuple(nodes))


# ------------------------------------------------------------------ one run


def entries_of(turns: list[ChatTurn], entries: list[str], seed: int) -> list[str]:
    """Each request's entry node: its conversation's, drawn once per conversation."""
    rng = random.Random(seed * 7_919 + 1)
    of: dict[int, str] = {}
    return [of.setdefault(t.conversation, rng.choice(entries)) for t in turns]


def make_fields(turns: list[ChatTurn], words: list[str], salt: int, max_tokens: int):  # type: ignore[no-untyped-def]
    def fields(i: int, strategy: str, _max: int, tag: str) -> dict[str, Any]:
        t = turns[i]
        return {"rid": f"{tag}-{strategy[:6]}-{i:05d}", "prompt": to_text(t.prompt_ids, words, salt),
                "strategy": strategy, "max_tokens": min(max_tokens, t.max_tokens),
                "temperature": 0.0, "seed": i, "client": "bench"}
    return fields


def prefix_stats(st: dict[str, dict[str, Any] | None]) -> dict[str, dict[str, int]]:
    out = {}
    for n, s in st.items():
        px = ((s or {}).get("data", {}).get("models") or [{}])[0].get("prefix_cache") or {}
        stats = px.get("stats") or px
        out[n] = {k: int(stats.get(k) or 0) for k in ("lookups", "hits", "reused_tokens")}
    return out


async def warm(socks: dict[str, str], entries: list[str], words: list[str], max_tokens: int,
               n_nodes: int) -> None:
    """bench_testnet's warm-up with long prompts of their own words: round_robin from each
    entry until every node has measured its speeds and every entry's peer table carries them."""
    def fields(rounds: int, i: int) -> dict[str, Any]:
        start = 10_000_000 + (rounds * n_nodes + i) * WARM_WORDS
        return {"rid": f"warm-{rounds}-{i}", "prompt": to_text(tuple(range(start, start + WARM_WORDS)),
                                                               words, 0),
                "strategy": "round_robin", "max_tokens": max_tokens, "temperature": 0.0,
                "client": "bench"}

    await bt.warm_up(socks, entries, max_tokens, n_nodes, fields)


async def bench(args: argparse.Namespace, scenario: Scenario, index: dict[str, Any],
                t_mesh: float, words: list[str]) -> dict[str, Any]:
    socks = {n["name"]: n["socket"] for n in index["nodes"]}
    pids = [n["pid"] for n in index["nodes"]]
    region_of = {n.name: n.region for n in scenario.nodes}
    entries = bt.pick_entries(scenario, args.entries)
    log(f"warming up (entries {', '.join(entries)})")
    await warm(socks, entries, words, args.max_tokens, len(scenario.nodes))
    spec = args.spec
    prompt_mean, answer_mean = mean_sizes(spec)
    st = await ask_all(socks, MessageType.STATUS_REQ)
    measured, configured, slots = bt.capacity(st, args.max_tokens, prompt_mean, scenario)
    base = measured if measured > 0 else configured
    rate = args.rate or args.load * base
    args.load = rate / base if base > 0 else args.load
    log(f"capacity for an uncached {prompt_mean:.0f}-token prompt and {args.max_tokens} tokens: "
        f"measured {measured:.2f} rps (configured caps {configured:.2f}); offering "
        f"{rate:.2f} rps")
    wait = t_mesh + args.settle_s - time.monotonic()
    if wait > 0:
        log(f"waiting {wait:.0f} s for the mesh's coordinates to settle")
        await trio.sleep(wait)
    per_seed: list[list[dict[str, Any]]] = []
    for si, seed in enumerate(args.seeds):
        turns = chat_requests(dataclasses.replace(spec, rate_per_s=rate), args.requests, seed)
        entry = entries_of(turns, entries, seed)
        arrivals = [(t.at_s, e) for t, e in zip(turns, entry, strict=True)]
        runs = []
        for ki, strategy in enumerate(args.strategies):
            salt = 1 + si * len(args.strategies) + ki
            tag = f"c{int(time.time()) % 100000}s{seed}"
            log(f"seed {seed}, {strategy}: {len(turns)} requests over {arrivals[-1][0]:.0f} s "
                f"({sum(1 for t in turns if t.turn)} later turns, "
                f"{sum(1 for t in turns if t.system >= 0)} with a shared system prompt)")
            px0 = prefix_stats(await ask_all(socks, MessageType.STATUS_REQ))
            run = await bt.run_strategy(strategy, arrivals, socks, args.max_tokens, pids, tag,
                                        make_fields(turns, words, salt, args.max_tokens))
            s = bt.summarize(run, slots, region_of)
            s["seed"] = seed
            if not await bt.drain(socks):
                log(f"  warning: the mesh did not drain within {bt.DRAIN_TIMEOUT_S:.0f} s")
            px1 = prefix_stats(await ask_all(socks, MessageType.STATUS_REQ))
            s["prefix_hits"] = sum(px1[n]["hits"] - px0[n]["hits"] for n in px1)
            s["prefix_reused_tokens"] = sum(px1[n]["reused_tokens"] - px0[n]["reused_tokens"] for n in px1)
            s["prompt_tokens_mean"] = round(statistics.fmean(len(t.prompt_ids) for t in turns), 1)
            ok = [(r, t) for r, t in zip(run.results, turns, strict=True) if r.ttft_ms is not None and not r.error]
            for label, keep in (("first_turn", lambda t: t.turn == 0), ("later_turn", lambda t: t.turn > 0)):
                xs = [r.ttft_ms for r, t in ok if keep(t) and r.ttft_ms is not None]
                s[f"ttft_{label}_ms"] = {q: round(percentile(xs, q), 1) for q in (50, 95)} if xs else None
            log(f"  done {s['completed']}/{s['submitted']} ttft p50/p95/p99 {s['ttft_ms'][50]}/"
                f"{s['ttft_ms'][95]}/{s['ttft_ms'][99]} ms; prefix hits {s['prefix_hits']}, "
                f"{s['prefix_reused_tokens']} tokens reused; busiest/mean queue "
                f"{s['max_over_mean_queue']}; cpu {s['cpu_machine_cores']} cores")
            dead = [n["name"] for n in index["nodes"] if not alive(n["pid"])]
            if dead:
                s["nodes_down_after"] = dead
                log(f"  warning: daemons no longer running: {', '.join(dead)}")
            runs.append(s)
        per_seed.append(runs)
    return {"capacity_measured_rps": round(measured, 3), "capacity_configured_rps": round(configured, 3),
            "offered_rps": round(rate, 3), "load": args.load, "entries": entries,
            "workload_prompt_mean_tokens": round(prompt_mean, 1),
            "workload_answer_mean_tokens": round(answer_mean, 1),
            "ratios": ratios(per_seed), "runs": bt.pooled(per_seed), "per_seed": bt.strip(per_seed)}


def ratios(per_seed: list[list[dict[str, Any]]]) -> dict[str, Any]:
    """Each strategy's TTFT p50/p95 over meshd_no_prefix's, per seed and the median over seeds."""
    out: dict[str, Any] = {}
    for runs in per_seed:
        by = {r["strategy"]: r for r in runs}
        if BASE not in by:
            return {}
        for name, r in by.items():
            for q in (50, 95):
                b = by[BASE]["ttft_ms"][q]
                out.setdefault(name, {}).setdefault(f"p{q}_per_seed", []).append(
                    round(r["ttft_ms"][q] / b, 3) if b > 0 else None)
    for v in out.values():
        for q in (50, 95):
            xs = [x for x in v[f"p{q}_per_seed"] if x is not None]
            v[f"p{q}_median"] = round(statistics.median(xs), 3) if xs else None
    return out


def report(out: dict[str, Any]) -> str:
    rows = []
    for r in out["runs"]:
        ra = out["ratios"].get(r["strategy"], {})
        rows.append([r["strategy"], f"{r['completed']}/{r['submitted']}", f"{r['ttft_ms'][50]:,.0f}",
                     f"{r['ttft_ms'][95]:,.0f}", f"{r['ttft_ms'][99]:,.0f}",
                     f"{ra.get('p50_median', float('nan')):.2f}", f"{ra.get('p95_median', float('nan')):.2f}",
                     str(sum(s['prefix_hits'] for s in out['per_seed_flat'] if s['strategy'] == r['strategy'])),
                     f"{r['max_over_mean_queue']}", f"{r['cross_region_pct']}%"])
    lines = [f"chat workload at {out['load']:.0%} of {out['capacity_measured_rps']} rps "
             f"({out['offered_rps']} rps), mean prompt {out['workload_prompt_mean_tokens']} tokens; "
             f"TTFT ms pooled over seeds; ratios: median over seeds of p / {BASE}'s p",
             bt.fmt_table(rows, ["strategy", "ok", "p50", "p95", "p99", "p50/base", "p95/base",
                                 "prefix hits", "busiest/mean queue", "cross-region"])]
    return "\n".join(lines + verdict(out["ratios"]))


def verdict(ra: dict[str, Any]) -> list[str]:
    """The issue's goals against the ratios' medians over the seeds."""
    lines = []
    if "meshd" in ra:
        m = ra["meshd"]
        lines.append(f"goal p50 <= {GOALS[50]}x: {m['p50_median']}x ({'met' if m['p50_median'] <= GOALS[50] else 'NOT met'}); "
                     f"p95 <= {GOALS[95]}x: {m['p95_median']}x ({'met' if m['p95_median'] <= GOALS[95] else 'NOT met'})")
        if "prefix_only" in ra:
            p = ra["prefix_only"]
            lines.append(f"p95 meshd {m['p95_median']}x vs prefix_only {p['p95_median']}x of {BASE}: "
                         f"{'meshd ahead' if m['p95_median'] < p['p95_median'] else 'meshd NOT ahead'}")
    return lines


# the settings that must agree between runs merged into one figure (each run measures the
# capacity its --load is a fraction of, so the rate offered may differ a little: kept per run)
MERGE_SAME = ("load", "requests", "max_tokens", "chat", "prefill_per_decode", "emulated_model",
              "scenario", "node_models")


def merge(files: list[Path]) -> dict[str, Any]:
    """One figure from runs of other seeds (one invocation a seed, so that a long figure is
    made a seed at a time): their per-seed summaries together and the ratios over all seeds.
    Pooled percentiles need every request's TTFT, which a run's JSON does not keep, so the
    merged figure has per-seed percentiles only. Runs that differ in more than their seeds are
    refused."""
    outs = [json.loads(f.read_text()) for f in files]
    first = outs[0]
    for f, o in zip(files[1:], outs[1:], strict=True):
        differ = [k for k in MERGE_SAME if o.get(k) != first.get(k)]
        if differ:
            raise ValueError(f"{f}: differs from {files[0]} in {', '.join(differ)}")
    seeds = [s for o in outs for s in o["seeds"]]
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"a seed appears twice: {seeds}")
    per_seed = [runs for o in outs for runs in o["per_seed"]]
    for runs in per_seed:  # JSON made the percentiles' keys strings
        for r in runs:
            r["ttft_ms"] = {int(q): v for q, v in r["ttft_ms"].items()}
    merged = {k: first[k] for k in first if k not in (
        "runs", "per_seed", "ratios", "seeds", "command", "load_average", "wall_s",
        "capacity_measured_rps", "offered_rps")}
    merged.update(seeds=seeds, per_seed=per_seed, ratios=ratios(per_seed),
                  merged_from=[{"file": f.name, "command": o.get("command"), "seeds": o["seeds"],
                                "capacity_measured_rps": o.get("capacity_measured_rps"),
                                "offered_rps": o.get("offered_rps"),
                                "load_average": o.get("load_average"), "wall_s": o.get("wall_s")}
                               for f, o in zip(files, outs, strict=True)])
    return merged


def merged_report(out: dict[str, Any]) -> str:
    lines = [f"seeds {', '.join(map(str, out['seeds']))} at {out['load']:.0%} load (offered "
             + ", ".join(f"{m['offered_rps']} rps" for m in out["merged_from"])
             + f"): TTFT p50 / p95 ms per seed, and each seed's ratio to {BASE}'s; ratios' "
             "median over the seeds"]
    for name, ra in out["ratios"].items():
        runs = [r for seed_runs in out["per_seed"] for r in seed_runs if r["strategy"] == name]
        per = "; ".join(f"{r['ttft_ms'][50]:,.0f} / {r['ttft_ms'][95]:,.0f} "
                        f"({r['completed']}/{r['submitted']})" for r in runs)
        lines.append(f"{name}: {per}; p50 {ra['p50_per_seed']} -> {ra['p50_median']}x, "
                     f"p95 {ra['p95_per_seed']} -> {ra['p95_median']}x")
    return "\n".join(lines + verdict(out["ratios"]))


def main() -> int:
    if sys.argv[1:2] == ["--merge"]:
        m = argparse.ArgumentParser(prog="bench_testnet_chat.py --merge",
                                    description="merge runs of other seeds into one figure")
        m.add_argument("files", nargs="+", type=Path)
        m.add_argument("--out", type=Path, required=True)
        margs = m.parse_args(sys.argv[2:])
        try:
            out = merge(margs.files)
        except (OSError, ValueError, KeyError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        print(merged_report(out))
        margs.out.write_text(json.dumps(out, indent=2))
        return 0
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scenario", default=str(ROOT / "testnet" / "regions-12.toml"))
    p.add_argument("--model", default=os.environ.get("MESHD_DEFAULT_MODEL"),
                   help="model directory every node serves (default: $MESHD_DEFAULT_MODEL); its "
                        "context must hold --context-tokens")
    p.add_argument("--load", type=float, default=0.7,
                   help="offered load as a fraction of the measured capacity (the sum of every "
                        "node's slots over its measured prefill and decode time)")
    p.add_argument("--rate", type=float, default=None,
                   help="offer this many requests/s instead of --load x capacity (the nodes of a "
                        "testnet share the box's cores: their summed capacity overstates the box's)")
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--requests", type=int, default=1000, help="requests per strategy and seed")
    p.add_argument("--strategies", default=",".join(STRATEGIES_RUN))
    p.add_argument("--max-tokens", type=int, default=16, help="cap on each answer asked for")
    p.add_argument("--context-tokens", type=int, default=2048,
                   help="a conversation ends before its prompt and answer pass this")
    p.add_argument("--shared-share", type=float, default=0.5,
                   help="conversations opening with one of the shared system prompts")
    p.add_argument("--think-s", type=float, default=20.0, help="mean think time between turns")
    p.add_argument("--entries", type=int, default=6)
    p.add_argument("--settle-s", type=float, default=45.0,
                   help="wait until the mesh is this old before the first run (coordinates)")
    p.add_argument("--prefill-per-decode", type=float, default=0.0, metavar="R",
                   help="emulated devices: every node's models prefill at most R x their decode "
                        "cap (max_prefill_tokens_per_s; a model's own wins); 0 = no prefill cap")
    p.add_argument("--emulated-model", action="store_true",
                   help="serve --model's emulated-device copy (benchmarks/emulated_model.py: "
                        "random tiny weights, --model's tokenizer; built once under build/) with "
                        "each node's prefix-cache budget scaled to hold as many tokens")
    p.add_argument("--isolation", default="auto", choices=("auto", "netns", "loopback"))
    p.add_argument("--dir", help="testnet directory (default: a fresh temporary one)")
    p.add_argument("--out", help="write every figure to this JSON file")
    args = p.parse_args()
    try:
        args.seeds = [int(x) for x in args.seeds.split(",") if x.strip()]
    except ValueError:
        p.error(f"--seeds: not a list of integers: {args.seeds!r}")
    args.strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    for s in args.strategies:
        if s not in STRATEGIES:
            p.error(f"unknown strategy {s!r}; choose from {', '.join(STRATEGIES)}")
    if not args.seeds or args.requests < 20 or not 0 < args.load <= 2 or args.max_tokens < 1:
        p.error("need at least one seed, --requests >= 20, 0 < --load <= 2, --max-tokens >= 1")
    if args.rate is not None and args.rate <= 0:
        p.error("--rate: must be above 0")
    if not args.model or not (Path(args.model) / "tokenizer.json").is_file():
        p.error(f"--model: not a model directory with a tokenizer.json: {args.model!r}")
    if args.prefill_per_decode < 0:
        p.error("--prefill-per-decode: must be >= 0 (0 = no prefill cap)")
    args.model = str(Path(args.model).resolve())
    scale = None
    try:
        scenario = load_scenario(args.scenario)
        real = Path(args.model)
        emulated = em.build(real) if args.emulated_model else real
    except MeshdError as e:
        p.error(str(e))
    if args.emulated_model:
        log(f"emulated model {emulated} (KV {em.kv_bytes_per_token(emulated)} bytes a token, "
            f"{args.model}'s {em.kv_bytes_per_token(real)})")
        args.model = str(emulated)

        def scale(mb: int) -> int:
            return em.prefix_cache_mb_for(mb, real, emulated)
    scenario = emulate_devices(scenario, args.prefill_per_decode, scale)
    try:
        context = json.loads((Path(args.model) / "manifest.json").read_text())["architecture"][
            "max_position_embeddings"]
    except (OSError, ValueError, KeyError) as e:
        p.error(f"--model: no readable manifest.json in {args.model} ({e})")
    if context < args.context_tokens:
        p.error(f"--model: its context is {context} tokens, less than --context-tokens "
                f"{args.context_tokens}")
    os.environ["MESHD_DEFAULT_MODEL"] = args.model  # the scenario's "default" model, in every daemon
    args.spec = ChatSpec(shared_share=args.shared_share, think_s=args.think_s,
                         context_tokens=args.context_tokens)
    words = one_token_words(Path(args.model) / "tokenizer.json")
    header = "# bench_testnet_chat: " + " ".join(shlex.quote(a) for a in [sys.executable, *sys.argv])
    print(f"{header}\n# {time.strftime('%Y-%m-%d %H:%M:%S')}  {platform.node()}  {os.cpu_count()} CPUs  "
          f"scenario {scenario.name}; model {args.model}; prefill cap "
          f"{f'{args.prefill_per_decode:g} x decode' if args.prefill_per_decode else 'none'}; load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    directory = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="bench-chat-"))

    def on_term(*_: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    t_start = time.monotonic()
    log(f"starting {scenario.name} in {directory}")
    try:
        index = up_scenario(directory, scenario, isolation=args.isolation)  # stops it if it fails
    except MeshdError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    t_mesh = time.monotonic()
    net = (index.get("network") or {}).get("mode")
    log(f"mesh formed in {t_mesh - t_start:.1f} s (network: {net})")
    try:
        out = trio.run(bench, args, scenario, index, t_mesh, words)
    finally:
        log("stopping the testnet")
        down(directory)
    out["per_seed_flat"] = [r for runs in out["per_seed"] for r in runs]
    out.update(command=header[len("# bench_testnet_chat: "):], model=args.model, network=net,
               scenario=scenario.name, seeds=args.seeds, requests=args.requests,
               max_tokens=args.max_tokens, chat=dataclasses.asdict(args.spec),
               prefill_per_decode=args.prefill_per_decode, emulated_model=args.emulated_model,
               node_models={n.name: n.daemon_models() for n in scenario.nodes},
               load_average=[round(x, 2) for x in os.getloadavg()],
               wall_s=round(time.monotonic() - t_start, 1))
    print(report(out), flush=True)
    out.pop("per_seed_flat")
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
