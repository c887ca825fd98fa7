"""Write the golden token ids of the tokenizer corpus, as llama.cpp's ``llama-tokenize`` gives
them, for each GGUF file of ``meshd.testing.gguf_corpus.GGUF_FILES`` that is installed.

    MESHD_TEST_GGUF_DIR=/path/to/ggufs MESHD_LLAMA_CPP_DIR=build/llama.cpp \\
        .venv/bin/python scripts/gguf_tokenizer_golden.py [smollm2 gemma3]

Each sample is one ``llama-tokenize`` run (special tokens parsed, BOS as the model asks), so a
few minutes for the two files. The output, tests/data/tokenizer_golden_<name>.json, holds one
list of ids per corpus sample, the corpus's and the GGUF's sha256 and the llama.cpp build's
stamp; tests/engine/test_gguf_vocab.py compares meshd's encodings with it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

from meshd.testing.gguf_corpus import (
    CORPUS,
    GGUF_FILES,
    REPO,
    find_gguf,
    llama_cpp_version,
    llama_tokenize,
    llama_tokenize_bin,
    load_corpus,
)


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def write_golden(out: Path, *, gguf: Path, binary: Path, samples: list[str]) -> None:
    ids = [llama_tokenize(binary, gguf, s) for s in samples]
    head = {
        "gguf": gguf.name, "gguf_sha256": sha256_of(gguf),
        "corpus": CORPUS.relative_to(REPO).as_posix(), "corpus_sha256": sha256_of(CORPUS),
        "reference": "llama.cpp llama-tokenize --ids (special tokens parsed, BOS as the model "
                     "asks)",
        "llama_cpp": llama_cpp_version(binary),
    }
    # one sample's ids a line, so that a change shows as a one-line diff
    lines = [json.dumps(head, indent=1)[:-2] + ',\n "ids": [']
    lines += [" " + json.dumps(row) + ("," if i < len(ids) - 1 else "") for i, row in
              enumerate(ids)]
    lines.append("]}\n")
    out.write_text("\n".join(lines), encoding="utf-8")


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", default=sorted(GGUF_FILES), choices=sorted(GGUF_FILES))
    args = ap.parse_args(argv)
    binary, why = llama_tokenize_bin()
    if binary is None:
        print(why, file=sys.stderr)
        return 1
    samples = load_corpus()
    for name in args.names:
        gguf, why = find_gguf(name)
        if gguf is None:
            print(f"skipped {name}: {why}", file=sys.stderr)
            continue
        out = REPO / "tests" / "data" / f"tokenizer_golden_{name}.json"
        write_golden(out, gguf=gguf, binary=binary, samples=samples)
        print(f"wrote {out.relative_to(REPO)} ({len(samples)} samples)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
