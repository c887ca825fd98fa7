"""Rows of the cache's labelled pairs from hand-written groups (benchmarks/data/README.md).

A group is an anchor (what the cache holds), its paraphrases, and near misses
``(text, kind, how)``; ``how`` stays in the group's file. ``build_groups`` gives one row per
(anchor, other prompt), paraphrases first, each near miss with an answer id of its own
(``<split>:<anchor>#<i>``). ``make_cache_pairs.py`` appends the held-out splits' rows to
cache_pairs.jsonl; each ``cache_train*.py`` writes its own file with ``write_split``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def pair_row(group: str, a: str, b: str, same: bool, kind: str, ans_a: str, ans_b: str
             ) -> dict[str, Any]:
    return {"group": group, "a": a, "b": b, "same": same, "kind": kind, "answer_a": ans_a,
            "answer_b": ans_b}


def build_groups(groups: Any, split: str) -> list[dict[str, Any]]:
    out = []
    for anchor, paraphrases, misses in groups:
        key = f"{split}:" + anchor
        for b in paraphrases:
            out.append(pair_row(key, anchor, b, True, "paraphrase", key, key))
        for i, (b, kind, _how) in enumerate(misses):
            out.append(pair_row(key, anchor, b, False, kind, key, f"{key}#{i}"))
    for r in out:
        r["split"] = split
    return out


def write_split(groups: Any, split: str, out: Path) -> None:
    """Write a training split's rows to ``out`` (deterministic) and say what it holds."""
    rows = build_groups(groups, split)
    with out.open("w") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    kinds: dict[str, int] = {}
    for r in rows:
        kinds[r["kind"]] = kinds.get(r["kind"], 0) + 1
    print(f"{len(groups)} groups, {len(rows)} pairs -> {out.name}; {kinds}")
