"""The two-turn tool loop on real models, through the API with the official ``openai`` client:
does the model use the tool's answer?

One daemon serves each ``--model`` directory. For each case (a city and what a weather tool
returns for it) the loop runs as tests/api/test_structured_live.py runs it, greedy:

1. "What's the weather in <city>?" with ``tool_choice: "required"``: the call (its name, and
   whether its ``city`` is the city asked about);
2. the model's own call and the tool's result, ``tool_choice: "auto"``: the answer. It *uses*
   the result when it quotes the result's temperature (the number) or its weather word without
   echoing how meshd's generic format rendered the call and the result ("I called ...",
   "... returned: ...", which a model copies instead of answering);
3. the same with another result: whether the answer changes (what the acceptance test asserts).

Quality figures (counts), not speed: valid on a busy box.

    python benchmarks/bench_tool_loop.py --model /tmp/smol --model /tmp/gemma \\
        --out benchmarks/results-tool-loop.json
"""

from __future__ import annotations

import argparse
import json
import re
import tempfile
import time
from pathlib import Path
from typing import Any

import openai

from meshd.testnet import launcher
from meshd.testnet.drive import wait_for

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
CITIES = ["Paris", "Tokyo", "Oslo", "Cairo", "Lima", "Sydney", "Toronto", "Madrid", "Nairobi",
          "Berlin"]
RESULTS = [("18", "sunny"), ("-7", "snow"), ("25", "rain"), ("31", "clear"), ("9", "cloudy"),
           ("12", "fog"), ("3", "windy"), ("27", "storm"), ("15", "drizzle"), ("22", "hail")]


def result_text(temp: str, word: str) -> str:
    return f"{temp} C and {word}"


def cases(n: int) -> list[tuple[str, tuple[str, str], tuple[str, str]]]:
    """(city, result, another result) for n cases: each city, then each city again with the
    results shifted."""
    out = []
    for k in range(n):
        city = CITIES[k % len(CITIES)]
        r = RESULTS[(k + k // len(CITIES) * 3) % len(RESULTS)]
        other = RESULTS[(k + 5) % len(RESULTS)]
        out.append((city, r, other))
    return out


def echoes(text: str) -> bool:
    """Whether ``text`` copies the generic format's rendering of the call or the result."""
    return "I called" in text or "returned:" in text


def uses(text: str, temp: str, word: str) -> bool:
    """Whether ``text`` quotes the result (its temperature as a number, or its weather word)
    without echoing the rendering."""
    quoted = bool(re.search(rf"(?<![\d.]){re.escape(temp.lstrip('-'))}(?![\d])", text)) or \
        word.lower() in text.lower()
    return quoted and not echoes(text)


def loop(c: openai.OpenAI, model: str, city: str, result: tuple[str, str],
         other: tuple[str, str], max_tokens: int) -> dict[str, Any]:
    kw: dict[str, Any] = {"model": model, "max_tokens": max_tokens, "temperature": 0,
                          "tools": [WEATHER]}
    messages: list[Any] = [{"role": "user", "content": f"What's the weather in {city}?"}]
    raw = c.chat.completions.with_raw_response.create(messages=messages, tool_choice="required",
                                                      **kw)
    first = raw.parse().choices[0]
    row: dict[str, Any] = {"city": city, "result": result_text(*result),
                           "format": raw.headers.get("x-meshd-tool-format"),
                           "finish_1": first.finish_reason}
    if not first.message.tool_calls:
        return {**row, "called": False}
    tc = first.message.tool_calls[0]
    call = {"id": tc.id, "type": "function",
            "function": {"name": tc.function.name, "arguments": tc.function.arguments}}  # type: ignore[union-attr]
    args = json.loads(call["function"]["arguments"])
    row.update(called=True, call=call["function"],
               right_city=str(args.get("city", "")).strip().lower() == city.lower())
    answers = []
    for r in (result, other):
        turn = messages + [{"role": "assistant", "content": None, "tool_calls": [call]},
                           {"role": "tool", "tool_call_id": call["id"], "content": result_text(*r)}]
        got = c.chat.completions.create(messages=turn, tool_choice="auto", **kw).choices[0]
        answers.append((got.message.content or "", bool(got.message.tool_calls)))
    (text, again), (text_other, _) = answers
    row.update(answer=text, answer_other=text_other, called_again=again, echoes=echoes(text),
               uses=not again and uses(text, *result), names_city=city.lower() in text.lower(),
               uses_other=uses(text_other, *other), differs=text != text_other)
    return row


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    def count(key: str) -> int:
        return sum(1 for r in rows if r.get(key))

    return {"cases": len(rows), "called": count("called"), "right_city": count("right_city"),
            "called_again": count("called_again"), "echoes_rendering": count("echoes"),
            "names_city": count("names_city"), "uses_result": count("uses"),
            "uses_other_result": count("uses_other"), "answer_differs": count("differs")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", action="append", required=True, help="a model directory")
    ap.add_argument("--cases", type=int, default=20)
    ap.add_argument("--max-tokens", type=int, default=60)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    names = [json.loads((Path(m) / "manifest.json").read_text())["name"] for m in args.model]
    base = Path(tempfile.mkdtemp(prefix="bench-tool-loop-"))
    spec = launcher.NodeSpec(name="n1", models=[{"path": str(Path(m).resolve()), "name": n}
                                                for m, n in zip(args.model, names, strict=True)])
    index = launcher.up(base / "net", [spec], advert_interval_s=1.0)
    result: dict[str, Any] = {"max_tokens": args.max_tokens, "models": {}}
    try:
        key = Path(index["api_key_file"]).read_text().strip()
        c = openai.OpenAI(base_url=index["nodes"][0]["api_url"], api_key=key, max_retries=0,
                          timeout=300)

        def listed() -> bool:
            try:
                return set(names) <= {m.id for m in c.models.list()}
            except openai.APIError:
                return False

        wait_for(listed, 120, "the node to list every model")
        for name in names:
            t0 = time.perf_counter()
            rows = [loop(c, name, *case, args.max_tokens) for case in cases(args.cases)]
            got = summary(rows)
            print(name, got, f"{time.perf_counter() - t0:.0f} s", flush=True)
            for r in rows[:3]:
                print("  ", r["city"], r.get("result"), "->", repr(r.get("answer")), flush=True)
            result["models"][name] = {**got, "rows": rows}
    finally:
        launcher.down(base / "net")
    if args.out:
        args.out.write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
