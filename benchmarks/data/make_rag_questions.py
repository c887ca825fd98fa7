"""Write benchmarks/data/rag_questions.jsonl: labelled questions over meshd's own documentation
(README.md, docs/*.md, proto/*.md), for benchmarks/bench_rag.py, and a snapshot of those files
in benchmarks/data/rag_corpus/ (the labels are line ranges: the benchmark indexes the snapshot,
so later edits of the docs do not move them). Deterministic: re-running it on the same
documents rewrites the same files. The documents are this project's own (Apache-2.0).

Two kinds of question, each labelled with the passage that answers it (file and line range):

- ``heading``: every Markdown section (##, ###, ####) whose heading names it alone in the corpus
  (a heading text used in two files, such as "Errors", is left out) and whose body holds at
  least 200 characters; the heading, stripped of Markdown and of "(issue N)", is put into one of
  four question templates chosen by a hash of the text. The passage is the section's body.
- ``row``: every row of a reference table whose first cell is a `name` (metrics in
  docs/metrics.md, request fields in docs/api.md, error codes in proto/errors.md, ...); the
  question asks what that name means. The passage is that row's line.

    .venv/bin/python benchmarks/data/make_rag_questions.py
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = Path(__file__).with_name("rag_questions.jsonl")
SNAPSHOT = Path(__file__).with_name("rag_corpus")
HEADING = re.compile(r"^(#{2,4})\s+(.*\S)\s*$")
ROW = re.compile(r"^\|\s*`([^`|]{2,60})`\s*\|")
TEMPLATES = ("What does the documentation say about {h}?", "How does {h} work in meshd?",
             "Explain {h}.", "Where can I read about {h}?")


def corpus() -> list[Path]:
    return sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "proto").glob("*.md")])


def clean(h: str) -> str:
    h = re.sub(r"\(issues? [\d, and]+\)", "", h)
    h = h.replace("`", "").replace("*", "").strip(" :,-")
    return re.sub(r"\s+", " ", h)


def sections(path: Path) -> list[tuple[str, int, int, int]]:
    """(heading, heading line, body start, body end) of each ##..#### section, 1-based."""
    lines = path.read_text().split("\n")
    marks: list[tuple[int, str, int]] = []  # (line, heading, level)
    fence = False
    for i, line in enumerate(lines, 1):
        if line.lstrip().startswith(("```", "~~~")):
            fence = not fence
        m = None if fence else HEADING.match(line)
        if m:
            marks.append((i, m.group(2), len(m.group(1))))
    out = []
    for n, (i, h, _) in enumerate(marks):
        end = marks[n + 1][0] - 1 if n + 1 < len(marks) else len(lines)
        out.append((h, i, i + 1, end))
    return out


def main() -> None:
    rows: list[dict[str, object]] = []
    files = corpus()
    names = Counter(clean(h).lower() for f in files for h, *_ in sections(f))
    for f in files:
        rel = str(f.relative_to(ROOT))
        lines = f.read_text().split("\n")
        for h, _, start, end in sections(f):
            text = clean(h)
            body = "\n".join(lines[start - 1:end]).strip()
            if names[text.lower()] > 1 or len(body) < 200 or len(text) < 4:
                continue
            t = TEMPLATES[int(hashlib.sha256(text.encode()).hexdigest(), 16) % len(TEMPLATES)]
            rows.append({"question": t.format(h=text), "kind": "heading", "file": rel,
                         "start_line": start, "end_line": end, "heading": h})
        for i, line in enumerate(lines, 1):
            m = ROW.match(line)
            if m and not set(m.group(1)) <= set("-: "):
                rows.append({"question": f"What does {m.group(1)} mean?", "kind": "row",
                             "file": rel, "start_line": i, "end_line": i, "heading": ""})
    counts = Counter(str(r["question"]) for r in rows)
    kept = [r for r in rows if counts[str(r["question"])] == 1]  # a name in two tables: ambiguous
    with OUT.open("w") as fh:
        for r in kept:
            fh.write(json.dumps(r, sort_keys=True) + "\n")
    for f in files:
        dest = SNAPSHOT / f.relative_to(ROOT)
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(f.read_text())
    kinds = Counter(str(r["kind"]) for r in kept)
    print(f"wrote {len(kept)} questions to {OUT} ({dict(kinds)}) and {len(files)} files to {SNAPSHOT}")


if __name__ == "__main__":
    main()
