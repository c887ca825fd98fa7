"""Would prompt-lookup speculation make one greedy stream faster? A diagnostic, not a feature.

    PYTHONPATH=. .venv/bin/python benchmarks/diag_lookup.py --model DIR [--tokens 128] [--out FILE]

Prompt-lookup decoding drafts the next tokens by finding the context's last n-gram (n = 3, 2,
1) earlier in the context and copying what followed it; one run over the draft's rows then
checks them all, and every drafted token that equals the greedy choice is a token without a
pass over the weights of its own. This script measures both halves on the real model:

1. what a run over T rows of one sequence costs against one row (T = 1..4, the plain graph, a
   200-token cache; medians of 20 runs, 5 rounds);
2. how many drafted tokens the greedy output would have accepted, replayed offline on the
   output itself, for the raw KJV continuation ``bench_llamacpp.py`` decodes and for chat
   prompts of the kinds the API serves (summaries, a story, JSON, code, an answer from a text).

It prints, per prompt and per largest draft (1-3 tokens), the tokens, the runs they would take
and the speed-up: tokens / sum of each run's cost from (1).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "benchmarks" / "data" / "edge_corpus.json"
KJV = ROOT / "benchmarks" / "data" / "kjv_heldout.txt"


def draft(ctx: list[int], k: int) -> list[int]:
    """Up to ``k`` tokens that followed the latest earlier occurrence of the context's last
    3-, 2- or 1-gram (the longest found)."""
    for n in (3, 2, 1):
        if len(ctx) <= n:
            continue
        tail = ctx[-n:]
        for j in range(len(ctx) - n - 1, -1, -1):
            if ctx[j:j + n] == tail:
                return ctx[j + n:j + n + k]
    return []


def replay(prompt: list[int], out: list[int], k: int, cost: dict[int, float]) -> dict[str, Any]:
    """Decode ``out`` again with drafts of up to ``k`` tokens: runs, accepted tokens, speed-up."""
    ctx, i, runs, spent, accepted = list(prompt), 0, 0, 0.0, 0
    while i < len(out):
        d = draft(ctx, k)
        a = 0
        while a < len(d) and i + a < len(out) and d[a] == out[i + a]:
            a += 1
        runs += 1
        spent += cost[len(d) + 1]
        ctx += out[i:i + a + 1]
        i += a + 1
        accepted += a
    return {"tokens": len(out), "runs": runs, "accepted": accepted,
            "speedup": round(len(out) / spent, 3)}


def row_costs(model: Any) -> dict[int, float]:
    import numpy as np

    stage = model.stage(0, model.num_layers)
    ids = np.arange(100, 400, dtype=np.int64)
    ms: dict[int, list[float]] = {t: [] for t in (1, 2, 3, 4)}
    for _ in range(5):
        for t in ms:
            s = stage.open_session(1024)
            s.step(ids[:200], np.arange(200))
            n, times = 200, []
            for _ in range(20):
                t0 = time.perf_counter()
                s.step(ids[:t], np.arange(n, n + t))
                times.append(time.perf_counter() - t0)
                n += t
            s.free()
            ms[t].append(statistics.median(times))
    one = statistics.median(ms[1])
    return {t: statistics.median(v) / one for t, v in ms.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="a meshd model directory")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()

    from meshd.engine import GenerationConfig, load_model

    model = load_model(args.model)
    tok = model.tokenizer
    cost = row_costs(model)
    print("a run over T rows against one:", {t: round(c, 2) for t, c in cost.items()})
    english = json.loads(CORPUS.read_text(encoding="utf-8"))["english"]
    kjv = tok.encode(KJV.read_text(encoding="utf-8"), add_special_tokens=False)
    cases: list[tuple[str, list[int]]] = [(f"kjv-raw-{i}", kjv[i * 32:(i + 1) * 32])
                                          for i in range(4)]
    chats = [("summary", f"Summarize this in two sentences:\n\n{p}") for p in english[:3]]
    chats += [
        ("story", "Write a short story about a lighthouse keeper who finds a message in a bottle."),
        ("json", 'Return a JSON object describing three cities with keys "name", "country", '
                 '"population".'),
        ("code", "Write a Python function that parses a CSV line with quoted fields."),
        ("text-answer", f"Answer from the text only.\n\n{english[0]}\n\n"
                        "Question: What did the baker sell out of, and when?"),
    ]
    cases += [(name, model.encode_prompt(text, chat=True)) for name, text in chats]
    cfg = GenerationConfig(max_tokens=args.tokens, temperature=0.0)
    rows = []
    for name, prompt in cases:
        out = [ev.token_id for ev in model.generate_sync(prompt, cfg)]
        for k in (1, 2, 3):
            r = {"prompt": name, "draft": k, **replay(prompt, out, k, cost)}
            rows.append(r)
            print(f"{name:12s} draft<={k} tokens {r['tokens']:3d} runs {r['runs']:3d} "
                  f"accepted {r['accepted']:3d} speed-up {r['speedup']:.2f}x")
    if args.out:
        args.out.write_text(json.dumps({"row_cost": cost, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
