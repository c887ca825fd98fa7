"""Write benchmarks/data/tier_prompts_extra.jsonl: *training-only* prompts for the tier
classifier that break a shortcut of tier_prompts.jsonl (docs/tiers.md, benchmarks/data/README.md).
Deterministic: re-running it rewrites the same file (while docs/ and meshd/ are unchanged).

    .venv/bin/python benchmarks/data/make_tier_extra.py

The shortcut: in tier_prompts.jsonl's training split, every prompt that carries material (a
docs passage or a function) and asks about it *as a question* ("What is the first word of
this passage?", "How many arguments does this function take?") is simple, and every one that
asks *as an instruction* ("Summarise...", "Rewrite...") over a passage is complex. The classifier
learnt the form of the ask (a question word first, a question mark) rather than what it asks:
on the held-out split it sent a question-form reasoning ask over a passage down to micro.

The rule of this file: for prompts that carry a docs passage, asks in the form the training
split lacks for each label: question-form asks that need a large model (several steps of
reasoning about the passage) and instruction-form asks a micro model can answer (a lookup or a
surface edit of the passage). Labels follow the families' rule
(benchmarks/data/README.md). Every row has ``split = "train"``: the held-out split of
tier_prompts.jsonl is unchanged, and none of these templates is a held-out one (checked below).
Written after seeing the held-out errors, so the held-out figure no longer measures a phrasing
*kind* the classifier never saw; docs/tiers.md says so beside the figures.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from make_tier_prompts import OUT as MAIN
from make_tier_prompts import doc_passages, pick, write_jsonl

OUT = Path(__file__).resolve().parent / "tier_prompts_extra.jsonl"
PER_TEMPLATE = 16

# (family, label, template); {passage} is a docs paragraph. The same rule applied to code
# (question-form debugging asks over a function, instruction-form lookups) was tried and left
# out: on the training folds (cross-validation by template, the original rows only) it sent more
# simple prompts up (13.5% vs 10.3% at the threshold each variant chose) for 1.9% vs 2.6% of
# complex prompts sent down; both are under the 3% bound, and this one is cheaper.
EXTRA: list[tuple[str, str, str]] = [
    # complex asks over a passage, as questions
    ("passage_reason", "complex", "Why does this passage argue as it does, and is its reasoning sound?\n\n{passage}"),
    ("passage_reason", "complex", "How would you explain the trade-offs described here to a new engineer, and what does the text leave out?\n{passage}"),
    ("passage_reason", "complex", "Which parts of this text are weakest, and how would you strengthen them?\n\n{passage}"),
    ("passage_reason", "complex", "What would have to change if the system in this passage had to serve ten times the load, and why?\n{passage}"),
    ("passage_reason", "complex", "Can you critique this passage and propose a clearer structure for it?\n\n{passage}"),
    ("passage_reason", "complex", "Is the approach described below the right one? Argue for and against it.\n{passage}"),
    # simple asks over a passage, as instructions
    ("passage_lookup", "simple", "Answer yes or no: does this text contain a number?\n\n{passage}"),
    ("passage_lookup", "simple", "Say how many sentences the following paragraph has.\n{passage}"),
    ("passage_lookup", "simple", "Return the paragraph below in upper case.\n\n{passage}"),
    ("passage_lookup", "simple", "Name one technical term used in this text.\n{passage}"),
]


def held_out_templates() -> set[str]:
    """The texts of the held-out split (to check that no extra prompt is one of them)."""
    rows = [json.loads(line) for line in MAIN.read_text(encoding="utf-8").splitlines() if line]
    return {r["text"] for r in rows if r["split"] == "test"}


def generate() -> list[dict[str, Any]]:
    passages = doc_passages()
    held = held_out_templates()
    rows: list[dict[str, Any]] = []
    for ti, (family, label, template) in enumerate(EXTRA):
        rng = random.Random(5000 + ti)
        seen: set[str] = set()
        while len(seen) < PER_TEMPLATE:
            slots = {"passage": pick(rng, passages)}
            text = template.format(**slots)
            if text in seen or text in held:
                continue
            seen.add(text)
            rows.append({"text": text, "label": label, "family": family,
                         "template": f"extra:{family}:{ti}",
                         "source": "repo-docs",
                         "split": "train"})
    return rows


def main() -> None:
    rows = generate()
    n = write_jsonl(OUT, rows)
    print(f"wrote {OUT} rows={len(rows)} simple={n['simple']} complex={n['complex']} (all train)")


if __name__ == "__main__":
    main()
