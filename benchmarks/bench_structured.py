"""Structured output, tools and n > 1 on the real instruct model, in the engine's batch scheduler.

Figures (docs/api.md, "Structured output"; docs/benchmarks.md quotes them):

- mask: the grammar's per-step cost (the llguidance masks of every constrained row, one call)
  at 1 and 8 concurrent streams, p50 and p99, against the decode step's own time;
- compile: what a grammar adds to time to first token for a 20-property schema (the matcher
  built and the first mask computed: the serving node does this once per request);
- validity: JSON parse rate and schema validity over ``--prompts`` schema prompts (10 schema
  families, strict), greedy, decoded 8 at a time;
- tools: how often a reply parses as tool calls over a fixed set of tool prompts, with
  tool_choice required and auto, in the format the API uses for the model (its chat template's
  tool syntax when it has one meshd knows, ``meshd.api.tool_template``, else meshd's generic
  format, ``meshd.api.tools``: SmolLM2's);
- n: aggregate decode tokens/s of one request with n = 4 (one prefill, 4 rows) against 4
  separate requests for the same prompt, joined together.

Everything runs in this process on the model's ``BatchScheduler`` (what a serving node runs),
with the prompts rendered as the API renders them (``meshd.api.tools``) and the grammars the
API compiles (``meshd.engine.constrain``); no HTTP, no mesh.

    flock /tmp/meshd-bench.lock python benchmarks/bench_structured.py \\
        --model /tmp/api30-models/smollm2-135m-instruct --out benchmarks/results-structured.json
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from meshd.api import tool_template
from meshd.api.tools import GENERIC, ToolFormat, ToolSpec, render_messages
from meshd.engine import GenerationConfig, load_model
from meshd.engine.constrain import Matcher, schema_grammar
from meshd.engine.scheduler import BatchScheduler, prepare

STR, INT, NUM, BOOL = {"type": "string"}, {"type": "integer"}, {"type": "number"}, {"type": "boolean"}


def obj(**props: Any) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": list(props),
            "additionalProperties": False}


FIRST = ["Alice", "Bob", "Chen", "Dana", "Emil", "Fatima", "Goran", "Hana", "Ivan", "Julia"]
CITIES = ["Lyon", "Oslo", "Kyoto", "Lima", "Austin", "Porto", "Cairo", "Perth", "Quito", "Riga"]
THINGS = ["lamp", "kettle", "bicycle", "backpack", "guitar", "tent", "drone", "watch", "sofa", "mug"]


def families(rng: random.Random) -> list[tuple[str, dict[str, Any], str]]:
    """(name, schema, one prompt) for each of 10 schema families, values drawn from ``rng``."""
    p, c, t = rng.choice(FIRST), rng.choice(CITIES), rng.choice(THINGS)
    age, price, year = rng.randint(18, 90), rng.randint(5, 900), rng.randint(1950, 2024)
    return [
        ("person", obj(name=STR, age=INT, city=STR), f"{p} is {age} years old and lives in {c}."),
        ("product", obj(name=STR, price=NUM, in_stock=BOOL),
         f"The {t} costs {price} dollars and is {'in' if age % 2 else 'out of'} stock."),
        ("event", obj(title=STR, city=STR, year=INT), f"The {t} fair took place in {c} in {year}."),
        ("book", obj(title=STR, author=STR, year=INT, pages=INT),
         f"'The {t.title()} of {c}' by {p} came out in {year} and has {price} pages."),
        ("weather", obj(city=STR, temperature_c=NUM, sunny=BOOL),
         f"In {c} it is {age % 35} degrees and {'sunny' if age % 2 else 'raining'}."),
        ("address", obj(street=STR, number=INT, city=STR), f"{p} lives at {price} Main Street, {c}."),
        ("rating", obj(item=STR, stars={"type": "integer", "minimum": 1, "maximum": 5},
                       recommend=BOOL), f"I give the {t} {age % 5 + 1} stars out of 5."),
        ("tags", obj(topic=STR, tags={"type": "array", "items": STR, "maxItems": 5}),
         f"An article about the {t} in {c}, tagged travel, {t} and {p.lower()}."),
        ("order", obj(customer=STR, items={"type": "array", "items": obj(name=STR, qty=INT),
                                          "maxItems": 4}, total=NUM),
         f"{p} ordered 2 {t}s and 1 mug for {price} dollars."),
        ("mood", obj(name=STR, mood={"enum": ["happy", "sad", "neutral"]}),
         f"{p} {'laughed all day' if age % 2 else 'cried at the news'}."),
    ]


def twenty_properties() -> dict[str, Any]:
    kinds = [STR, INT, NUM, BOOL]
    return obj(**{f"field_{i}": kinds[i % 4] for i in range(20)})


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def drive(sched: BatchScheduler, seqs: list[Any]) -> list[list[Any]]:
    """Add every sequence, step until idle; the events of each sequence (choices together)."""
    for s in seqs:
        sched.add(s)
    owner = {id(s): i for i, s in enumerate(seqs)}
    for i, s in enumerate(seqs):
        for f in s.forks:
            owner[id(f)] = i
    out: list[list[Any]] = [[] for _ in seqs]
    while sched.busy:
        for s in sched.step():
            out[owner[id(s)]] += s.events
            s.events = []
    return out


def chat_ids(model: Any, messages: list[dict[str, Any]]) -> list[int]:
    return list(model.tokenizer.encode_chat(messages))


def bench_mask(model: Any, sched: BatchScheduler, streams: int, tokens: int) -> dict[str, Any]:
    grammar = schema_grammar(twenty_properties())
    msg = [{"role": "user", "content": "Fill in a form of 20 fields as JSON."}]
    ids = chat_ids(model, msg)
    out: dict[str, Any] = {"streams": streams}
    for constrained in (False, True):
        cfg = GenerationConfig(max_tokens=tokens, temperature=0.0, repetition_penalty=1.0,
                               grammar=grammar if constrained else None)
        sched.trace.clear()
        sched.mask_trace.clear()
        drive(sched, [prepare(model, ids, cfg, False) for _ in range(streams)])
        steps = [ms for _, ms, what in sched.trace if what == "decode"]
        key = "constrained" if constrained else "plain"
        out[f"{key}_step_ms_p50"] = round(pct(steps, 0.5), 3)
        out[f"{key}_step_ms_p99"] = round(pct(steps, 0.99), 3)
        if constrained:
            masks = [ms for n, ms in sched.mask_trace if n == streams]
            out["mask_ms_p50"] = round(pct(masks, 0.5), 3)
            out["mask_ms_p99"] = round(pct(masks, 0.99), 3)
            out["mask_steps"] = len(masks)
            out["mask_share_of_step_p50"] = round(pct(masks, 0.5) / pct(steps, 0.5), 4)
    return out


def bench_compile(model: Any, runs: int = 20) -> dict[str, Any]:
    from meshd.engine.constrain import grammar_tokenizer

    grammar_tokenizer(model.tokenizer)  # built once per model, at the scheduler's calibration
    schema = twenty_properties()
    times, builds = [], []
    for _ in range(runs):
        t0 = time.perf_counter()
        grammar = schema_grammar(schema)  # the entry node's part (checked, once)
        t1 = time.perf_counter()
        m = Matcher(model.tokenizer, grammar)  # the serving node's part
        m.allowed()
        t2 = time.perf_counter()
        builds.append((t1 - t0) * 1000)
        times.append((t2 - t1) * 1000)
    return {"entry_check_ms_p50": round(pct(builds, 0.5), 3),
            "serving_compile_first_mask_ms_p50": round(pct(times, 0.5), 3),
            "serving_compile_first_mask_ms_p99": round(pct(times, 0.99), 3), "runs": runs}


def bench_validity(model: Any, sched: BatchScheduler, prompts: int, max_tokens: int,
                   seed: int) -> dict[str, Any]:
    import jsonschema

    rng = random.Random(seed)
    jobs = []
    while len(jobs) < prompts:
        for name, schema, text in families(rng):
            jobs.append((name, schema, text))
    jobs = jobs[:prompts]
    grammars = {}
    ok_json = ok_schema = cut = 0
    per_family: dict[str, list[int]] = {}
    examples: dict[str, str] = {}
    for k in range(0, len(jobs), 8):
        batch = jobs[k:k + 8]
        seqs = []
        for name, schema, text in batch:
            key = json.dumps(schema, sort_keys=True)
            if key not in grammars:
                grammars[key] = schema_grammar(schema)
            msgs = [{"role": "system", "content": "Reply with JSON only, with the fields: "
                     + ", ".join(schema["properties"]) + "."},
                    {"role": "user", "content": f"Extract the {name} as JSON: {text}"}]
            cfg = GenerationConfig(max_tokens=max_tokens, temperature=0.0,
                                   repetition_penalty=1.0, grammar=grammars[key])
            seqs.append(prepare(model, chat_ids(model, msgs), cfg, False))
        for (name, schema, _), evs in zip(batch, drive(sched, seqs), strict=True):
            text = "".join(e.text for e in evs)
            fam = per_family.setdefault(name, [0, 0])
            fam[1] += 1
            cut += evs[-1].finish_reason == "length"
            try:
                doc = json.loads(text)
                ok_json += 1
                jsonschema.validate(doc, schema)
                ok_schema += 1
                fam[0] += 1
                examples.setdefault(name, text)
            except (ValueError, jsonschema.ValidationError):
                examples.setdefault(f"{name}_failed", text)
    return {"prompts": len(jobs), "json_valid": ok_json, "schema_valid": ok_schema,
            "json_valid_pct": round(100 * ok_json / len(jobs), 2),
            "schema_valid_pct": round(100 * ok_schema / len(jobs), 2),
            "cut_by_max_tokens": cut, "max_tokens": max_tokens,
            "per_family": {k: f"{v[0]}/{v[1]}" for k, v in sorted(per_family.items())},
            "examples": examples}


TOOLS = [
    {"name": "get_weather", "description": "Get the current weather in a city",
     "parameters": obj(city=STR)},
    {"name": "convert_currency", "description": "Convert an amount between currencies",
     "parameters": obj(amount=NUM, source=STR, target=STR)},
    {"name": "search_flights", "description": "Find flights between two cities on a date",
     "parameters": obj(origin=STR, destination=STR, date=STR)},
    {"name": "set_timer", "description": "Set a timer for a number of minutes",
     "parameters": obj(minutes=INT)},
]
TOOL_PROMPTS = [
    "What's the weather in {c}?", "Is it raining in {c} right now?",
    "How much is {n} dollars in euros?", "Convert {n} yen to pounds.",
    "Find me a flight from {c} to {d} on 2025-06-{day:02d}.",
    "I need to fly {c} to {d} next Friday.", "Set a timer for {m} minutes.",
    "Remind me in {m} minutes.", "What should I wear in {c} today?",
    "Book the cheapest flight to {d}.",
]


def bench_tools(model: Any, sched: BatchScheduler, prompts: int, max_tokens: int,
                seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    native = tool_template.detect(model.tokenizer.info.chat_template)
    fmt: ToolFormat = native if native is not None else GENERIC
    out: dict[str, Any] = {"prompts": prompts, "max_tokens": max_tokens, "format": fmt.name}
    texts = []
    for k in range(prompts):
        template = TOOL_PROMPTS[k % len(TOOL_PROMPTS)]
        texts.append(template.format(c=rng.choice(CITIES), d=rng.choice(CITIES),
                                     n=rng.randint(5, 500), m=rng.randint(1, 60),
                                     day=rng.randint(1, 28)))
    for choice in ("required", "auto"):
        spec = ToolSpec(tuple(TOOLS), choice, True,
                        tuple({"type": "function", "function": t} for t in TOOLS))
        grammar = fmt.grammar(spec.functions, None, parallel=True, text=not spec.forced)
        parsed = calls = 0
        names: dict[str, int] = {}
        for k in range(0, prompts, 8):
            seqs = []
            for text in texts[k:k + 8]:
                user = [{"role": "user", "content": text}]
                if native is None:
                    ids = chat_ids(model, render_messages(user, spec))
                else:
                    ids = list(model.tokenizer.encode_chat(user, tools=list(spec.tools)))
                cfg = GenerationConfig(max_tokens=max_tokens, temperature=0.0,
                                       repetition_penalty=1.0, grammar=grammar)
                seqs.append(prepare(model, ids, cfg, False))
            for evs in drive(sched, seqs):
                reply = "".join(e.text for e in evs)
                got = fmt.parse_reply(reply, "bench")
                if fmt.starts_call(reply):
                    calls += 1
                if got:
                    parsed += 1
                    for c in got:
                        json.loads(c["function"]["arguments"])
                        names[c["function"]["name"]] = names.get(c["function"]["name"], 0) + 1
        out[choice] = {"replied_with_call": calls, "calls_parse": parsed,
                       "parse_rate_pct_of_calls": round(100 * parsed / max(calls, 1), 2),
                       "tools_called": names}
    return out


def bench_n(model: Any, sched: BatchScheduler, n: int, max_tokens: int, reps: int) -> dict[str, Any]:
    rng = random.Random(1)
    words = " ".join(rng.choice(THINGS + CITIES + FIRST) for _ in range(300))
    msgs = [{"role": "user", "content": f"Write a story about these words: {words}"}]
    ids = chat_ids(model, msgs)
    rows = []
    for rep in range(reps):
        for mode in ("n", "separate"):
            t0 = time.perf_counter()
            if mode == "n":
                cfg = GenerationConfig(max_tokens=max_tokens, temperature=0.8, seed=rep, n=n)
                evs = drive(sched, [prepare(model, ids, cfg, False)])[0]
            else:
                seqs = [prepare(model, ids, GenerationConfig(max_tokens=max_tokens, temperature=0.8,
                                                             seed=rep * 10 + i), False)
                        for i in range(n)]
                evs = [e for got in drive(sched, seqs) for e in got]
            wall = time.perf_counter() - t0
            rows.append((mode, len(evs), wall))
    out: dict[str, Any] = {"n": n, "prompt_tokens": len(ids), "max_tokens": max_tokens, "reps": reps}
    for mode in ("n", "separate"):
        toks = [t for m, t, _ in rows if m == mode]
        walls = [w for m, _, w in rows if m == mode]
        out[mode] = {"tokens": int(statistics.mean(toks)), "wall_s": round(statistics.median(walls), 3),
                     "tokens_per_s": round(statistics.mean(toks) / statistics.median(walls), 1)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="the model directory (smollm2-135m-instruct)")
    ap.add_argument("--prompts", type=int, default=200, help="schema prompts for validity")
    ap.add_argument("--tool-prompts", type=int, default=40)
    ap.add_argument("--max-tokens", type=int, default=120)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", default="", help="comma-separated parts: mask,compile,validity,tools,n")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    parts = set(args.only.split(",")) if args.only else {"mask", "compile", "validity", "tools", "n"}
    model = load_model(args.model)
    sched = BatchScheduler(model)
    sched.calibrate(max_batch=8)
    np.random.seed(args.seed)
    result: dict[str, Any] = {"model": model.manifest.name, "format": model.manifest.dtype}
    t0 = time.perf_counter()
    if "compile" in parts:
        result["compile"] = bench_compile(model)
        print("compile", result["compile"], flush=True)
    if "mask" in parts:
        result["mask"] = [bench_mask(model, sched, s, 48) for s in (1, 8)]
        print("mask", result["mask"], flush=True)
    if "validity" in parts:
        result["validity"] = bench_validity(model, sched, args.prompts, args.max_tokens, args.seed)
        print("validity", {k: v for k, v in result["validity"].items() if k != "examples"},
              flush=True)
    if "tools" in parts:
        result["tools"] = bench_tools(model, sched, args.tool_prompts, 160, args.seed)
        print("tools", result["tools"], flush=True)
    if "n" in parts:
        result["n"] = bench_n(model, sched, 4, 64, 3)
        print("n", result["n"], flush=True)
    result["wall_s"] = round(time.perf_counter() - t0, 1)
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
