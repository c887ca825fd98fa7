"""llama.cpp's command-line tools as a yardstick for tests and benchmarks; meshd never uses them.

``scripts/build_llama_cpp.sh`` builds llama-server, llama-bench, llama-cli, llama-tokenize and
llama-perplexity. ``llama_bin(name)`` finds one: in ``$MESHD_LLAMA_CPP_DIR`` (the build folder,
or its ``bin/``) when set, else in ``build/llama.cpp/bin`` of this checkout, else in that of
the main checkout when this is a git worktree (one build serves every worktree). It returns
None when there is none, so a test can skip. ``vendored_templates()`` finds, the same way, the
real chat templates llama.cpp vendors (the sdist the build unpacks).

``llama_server(gguf, ...)`` starts llama-server on a free loopback port, returns once its
``/health`` answers ok (a condition with a deadline; the process exiting early is an error
carrying its log's tail), and stops it on exit. ``write_tiny_gguf`` writes a small random
Llama in GGUF (needs the ``gguf`` package) for tests that want a model without a download.
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from meshd.testing.wait import wait_for

ENV_DIR = "MESHD_LLAMA_CPP_DIR"
BUILD_SUBDIR = Path("build") / "llama.cpp"
REPO = Path(__file__).resolve().parents[2]
TOOLS = ("llama-server", "llama-bench", "llama-cli", "llama-tokenize", "llama-perplexity")


def _main_checkout(repo: Path) -> Path | None:
    """The main checkout of the repository ``repo`` is a linked worktree of (None: it is not
    one). A worktree's ``.git`` is a file naming its git dir, whose ``commondir`` names the
    main checkout's ``.git``."""
    dot_git = repo / ".git"
    try:
        if not dot_git.is_file():
            return None
        line = dot_git.read_text().strip()
        if not line.startswith("gitdir:"):
            return None
        gitdir = (repo / line.removeprefix("gitdir:").strip()).resolve()
        common = (gitdir / (gitdir / "commondir").read_text().strip()).resolve()
    except OSError:
        return None
    return common.parent if common.name == ".git" else None


def search_dirs(repo: Path = REPO) -> list[Path]:
    """Where ``llama_bin`` looks, in order."""
    env = os.environ.get(ENV_DIR)
    if env:
        return [Path(env) / "bin", Path(env)]
    dirs = [repo / BUILD_SUBDIR / "bin"]
    main = _main_checkout(repo)
    if main is not None:
        dirs.append(main / BUILD_SUBDIR / "bin")
    return dirs


def llama_bin(name: str, repo: Path = REPO) -> Path | None:
    """The built llama.cpp tool ``name`` (e.g. ``"llama-server"``), or None."""
    for d in search_dirs(repo):
        p = d / name
        if p.is_file() and os.access(p, os.X_OK):
            return p
    return None


def vendored_templates(repo: Path = REPO) -> Path | None:
    """llama.cpp's collection of real chat templates (``models/templates``) in the
    llama-cpp-python sdist that scripts/build_llama_cpp.sh unpacks beside the binaries
    ``llama_bin`` finds (``<build>/src/llama_cpp_python-<version>/...``), or None."""
    for d in search_dirs(repo):
        build = d.parent if d.name == "bin" else d
        found = sorted(build.glob("src/llama_cpp_python-*/vendor/llama.cpp/models/templates"))
        if found:
            return found[-1]
    return None


def missing_reason(name: str) -> str:
    """One line for a skip: which tool is missing, where it was looked for, how to build it."""
    where = ", ".join(str(d) for d in search_dirs())
    return (f"{name} is not built (looked in {where}): run scripts/build_llama_cpp.sh "
            f"or set {ENV_DIR}")


def proc_status_kb(pid: int, field: str) -> int | None:
    """A ``kB`` figure of /proc/PID/status (``VmHWM``: peak resident set, ``VmRSS``,
    ``RssAnon``, ``RssFile``); None if the process or the field is gone."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return None


def cpu_features() -> dict[str, Any]:
    """This machine's CPU model and the vector extensions kernels choose by (int8 kernels round
    differently with and without AVX-512 VNNI), for a benchmark's record."""
    from meshd.telemetry.procfs import cpu_model, read_text

    root = Path("/")
    lines = (read_text(root / "proc/cpuinfo", limit=1 << 20) or "").splitlines()
    flags = next((ln.split(":", 1)[1].split() for ln in lines if ln.startswith("flags")), [])
    return {"model": cpu_model(root), "flags": [f for f in ("avx2", "avx512f", "avx512_vnni",
                                                            "avx_vnni", "amx_int8") if f in flags]}


def free_loopback_port() -> int:
    from meshd.testnet.launcher import free_port

    return free_port("127.0.0.1")


@dataclass
class LlamaServer:
    """A running llama-server."""

    proc: subprocess.Popen[bytes]
    port: int
    log_path: Path
    argv: list[str]
    started_s: float  # time.perf_counter() before the process was started
    ready_s: float  # time.perf_counter() when /health first answered ok

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def load_s(self) -> float:
        """Seconds from starting the process to a healthy server (the model loaded)."""
        return self.ready_s - self.started_s

    def client(self, timeout_s: float = 600.0) -> httpx.Client:
        return httpx.Client(base_url=self.base_url, timeout=timeout_s)

    def log_tail(self, lines: int = 20) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def peak_rss_kb(self) -> int | None:
        return proc_status_kb(self.pid, "VmHWM")


def _health_ok(base_url: str) -> bool:
    try:
        r = httpx.get(base_url + "/health", timeout=2.0)
    except httpx.HTTPError:
        return False
    if r.status_code != 200:  # 503 while the model loads
        return False
    try:
        return bool(r.json().get("status") == "ok")
    except ValueError:
        return False


def _stop(proc: subprocess.Popen[bytes], timeout_s: float = 10.0) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextmanager
def llama_server(gguf: str | Path, *, threads: int = 2, parallel: int = 1, ctx_size: int = 2048,
                 extra_args: tuple[str, ...] | list[str] = (), timeout_s: float = 120.0,
                 log_path: Path | None = None, binary: Path | None = None,
                 env: dict[str, str] | None = None) -> Iterator[LlamaServer]:
    """Run llama-server on ``gguf`` (``threads`` for decoding and prompts alike, ``parallel``
    slots sharing ``ctx_size`` tokens of KV cache, no web UI); yield once /health says ok."""
    exe = binary or llama_bin("llama-server")
    if exe is None:
        raise FileNotFoundError(missing_reason("llama-server"))
    port = free_loopback_port()
    own_log = log_path is None
    if log_path is None:
        fd, name = tempfile.mkstemp(prefix="llama-server-", suffix=".log")
        os.close(fd)
        log_path = Path(name)
    argv = [str(exe), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port),
            "-t", str(threads), "-tb", str(threads), "-np", str(parallel), "-c", str(ctx_size),
            "--no-webui", *extra_args]
    with open(log_path, "wb") as log:
        started = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env={**os.environ, **(env or {})})
    server = LlamaServer(proc, port, log_path, argv, started, started)
    try:
        def ready() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"llama-server exited with {proc.returncode} while "
                                   f"starting:\n{server.log_tail()}")
            return _health_ok(server.base_url)

        wait_for(ready, timeout_s, lambda: f"llama-server /health ok\n{server.log_tail()}",
                 poll_s=0.02)
        server.ready_s = time.perf_counter()
        yield server
    finally:
        _stop(proc)
        if own_log:
            log_path.unlink(missing_ok=True)


def run_tool(name: str, args: list[str], *, timeout_s: float = 600.0,
             env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run a built llama.cpp tool to completion (FileNotFoundError when it is not built)."""
    exe = llama_bin(name)
    if exe is None:
        raise FileNotFoundError(missing_reason(name))
    return subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=timeout_s,
                          check=False, env={**os.environ, **(env or {})})


def write_tiny_gguf(path: Path, *, layers: int = 2, hidden: int = 64, heads: int = 4,
                    kv_heads: int = 2, ffn: int = 128, context: int = 256,
                    seed: int = 0) -> Path:
    """A small random Llama in GGUF (f32 weights, a SentencePiece-style vocabulary of the three
    special tokens, 256 byte tokens and a few words), enough for llama.cpp to load and run."""
    import gguf
    import numpy as np

    rng = np.random.default_rng(seed)
    words = ["\u2581the", "\u2581and", "\u2581of", "\u2581a", "\u2581to", "\u2581in", "e", "t"]
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + words
    types = ([gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
             + [gguf.TokenType.BYTE] * 256 + [gguf.TokenType.NORMAL] * len(words))
    scores = [0.0] * (3 + 256) + [-float(i) for i in range(len(words))]
    vocab = len(tokens)
    head_dim = hidden // heads
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_context_length(context)
    w.add_embedding_length(hidden)
    w.add_block_count(layers)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(head_dim)
    w.add_vocab_size(vocab)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(True)

    def t(*shape: int, scale: float = 0.05) -> Any:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    w.add_tensor("token_embd.weight", t(vocab, hidden))
    w.add_tensor("output_norm.weight", np.ones(hidden, np.float32))
    w.add_tensor("output.weight", t(vocab, hidden))
    for i in range(layers):
        b = f"blk.{i}."
        w.add_tensor(b + "attn_norm.weight", np.ones(hidden, np.float32))
        w.add_tensor(b + "attn_q.weight", t(hidden, hidden))
        w.add_tensor(b + "attn_k.weight", t(kv_heads * head_dim, hidden))
        w.add_tensor(b + "attn_v.weight", t(kv_heads * head_dim, hidden))
        w.add_tensor(b + "attn_output.weight", t(hidden, hidden))
        w.add_tensor(b + "ffn_norm.weight", np.ones(hidden, np.float32))
        w.add_tensor(b + "ffn_gate.weight", t(ffn, hidden))
        w.add_tensor(b + "ffn_up.weight", t(ffn, hidden))
        w.add_tensor(b + "ffn_down.weight", t(hidden, ffn))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def have_gguf_writer() -> bool:
    """Whether the ``gguf`` package (to write a test model) is importable."""
    import importlib.util

    return importlib.util.find_spec("gguf") is not None


__all__ = ["ENV_DIR", "TOOLS", "LlamaServer", "free_loopback_port", "have_gguf_writer",
           "llama_bin", "llama_server", "missing_reason", "proc_status_kb", "run_tool",
           "search_dirs", "write_tiny_gguf"]
