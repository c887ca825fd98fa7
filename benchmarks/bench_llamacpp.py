"""meshd against llama.cpp on the same model, side by side in one run, same thread count (issue 28).

Sides, each started fresh in every repeat, the repeats interleaved (the order rotates):

* ``llama``: llama-server on the GGUF (``-t/-tb THREADS``, ``--parallel STREAMS``, continuous
  batching, ``--cache-ram 0`` and ``cache_prompt: false`` so no prompt is reused);
* ``meshd``: the meshd model directory in a worker process (this script with ``--worker``),
  ``load_model(threads=THREADS, fused=True)`` as a batching daemon loads it: one stream through ``Model.generate_sync`` (the engine's own
  loop), the concurrent streams through the model's continuous-batching ``Batcher``;
* ``daemon`` (``--daemon``): one ``meshd run`` daemon serving the directory
  (``[engine] threads``), the concurrent streams through its OpenAI API;
* ``llama-bench`` (cross-check of (a) and (c), unless ``--no-llama-bench``): ``-p PROMPT -n
  TOKENS -r 1``.

Figures, each a median over the repeats:

a. decode tokens/s of one greedy stream of TOKENS tokens: (n - 1) / (last token - first token),
   timed at the client (llama-server streamed over SSE; llama-server's own ``timings`` kept too);
b. aggregate tokens/s of STREAMS concurrent greedy streams of TOKENS tokens each: all tokens /
   (last stream done - requests sent);
c. time to first token of a PROMPT-token prompt (one token asked for) and prefill tokens/s =
   PROMPT / TTFT;
d. model load: process start to ready (llama-server: /health ok; meshd: ``load_model`` returned;
   daemon: /v1/models lists the model), and meshd's ``load_model`` alone;
e. peak RSS (``VmHWM`` of /proc/PID/status) of each side's process at the end.

Prompts are token ids cut from benchmarks/data/kjv_heldout.txt by each side's own tokenizer
(the same recipe: disjoint runs of the text's ids, the first replaced by BOS where the model
adds one), so both sides run the same number of tokens. Both sides generate exactly TOKENS
tokens: llama-server with ``ignore_eos``, the meshd worker with the end-of-sequence ids taken
off its tokenizer; the daemon cannot be told to, so it reports the tokens it made. Where the
meshd model's context is too short (the shipped tiny model has 256), PROMPT and TOKENS are cut
to fit on both sides and the run says so.

Timed work holds /tmp/meshd-bench.lock (taken here; a lock inherited from ``flock(1)`` counts).

    .venv/bin/python benchmarks/bench_llamacpp.py --gguf FILE.gguf --meshd-model DIR \\
        [--threads 2] [--streams 8] [--tokens 128] [--prompt 512] [--repeats 3] [--daemon] \\
        [--label NAME] [--out benchmarks/results-llamacpp-NAME.json]
    .venv/bin/python benchmarks/bench_llamacpp.py --merge RUN1.json RUN2.json ... --out FILE.json

(``--merge``: runs of the same files and parameters pooled, the medians taken over all their
repeats; on a shared 2-core box runs of the same code differ by 10-20%.)
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from meshd.testing.decoding import IgnoreEos, decode_tps  # noqa: E402

TEXT = ROOT / "benchmarks" / "data" / "kjv_heldout.txt"
LOCK = Path("/tmp/meshd-bench.lock")
HTTP_TIMEOUT_S = 3600.0  # one request; a loaded 2-core box has taken 600 s for 8 x 128 tokens
LOGS = Path(tempfile.gettempdir()) / "meshd-bench-llamacpp"  # llama-server's logs, kept
STREAM_PROMPT_TOKENS = 32  # each concurrent stream's (and the single stream's) prompt


# ----------------------------------------------------------------------------- shared recipe


def make_prompts(ids: list[int], bos: int | None, *, stream_prompt: int, streams: int,
                 prompt: int) -> dict[str, Any]:
    """The prompts of a run from the text's ids (no special tokens): ``streams`` disjoint runs
    of ``stream_prompt`` tokens and one of ``prompt`` tokens after them, each one's first token
    replaced by ``bos`` (None: kept)."""
    need = streams * stream_prompt + prompt
    if len(ids) < need:
        raise SystemExit(f"the text has {len(ids)} tokens, fewer than the {need} the prompts need")

    def cut(a: int, n: int) -> list[int]:
        run = list(ids[a:a + n])
        if bos is not None:
            run[0] = bos
        return run

    return {"streams": [cut(i * stream_prompt, stream_prompt) for i in range(streams)],
            "prefill": cut(streams * stream_prompt, prompt)}


def median(xs: list[float]) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def status_kb(pid: int) -> dict[str, int | None]:
    from meshd.testing.llamacpp import proc_status_kb

    return {k: proc_status_kb(pid, k) for k in ("VmHWM", "VmRSS", "RssAnon", "RssFile")}


# ----------------------------------------------------------------------------- weight bytes

# Bytes each 32-weight block of a matrix costs a decode step in meshd, as onnxruntime's
# MatMulNBits holds it packed for int8 activations on x86 (MLAS, CompInt8): the codes, an fp32
# scale and an fp32 block sum (the kernel's zero-point term, always read); an 8-bit block the
# same at least (some kernels keep a second block sum). A 4-bit block with minimums (Q4_1,
# Q4_K) adds its fp32 minimum, read by the separate product of the activations' block sums.
PACKED_EXTRA_BYTES = 4 + 4
MIN_BYTES = 4
KERNEL_EXTRA_BYTES = 2 + 2  # meshd's 4-bit kernel: float16 scale and minimum a block


def weight_bytes_per_step(model_dir: Path | None, gguf: Path | None,
                          q4_kernel: bool = False) -> dict[str, float]:
    """Weight bytes one decode step reads, computed from the formats (not measured): every
    matrix once (the embedding's one row left out, a tied embedding counted as the output
    head). meshd's from its manifest, as MatMulNBits packs the blocks, or as meshd's 4-bit
    kernel reads 4-bit blocks with minimums (``q4_kernel``: codes, float16 scale and minimum);
    llama.cpp's from the GGUF's tensor sizes (its blocks are read as stored)."""
    out: dict[str, float] = {}
    if model_dir is not None:
        from meshd.engine import read_manifest
        from meshd.engine.planning import EMBED

        m = read_manifest(model_dir)
        names = {t.name for t in m.tensors}
        total = 0
        for t in m.tensors:
            if t.name.endswith((".scales", ".zero_points", ".mins")):
                continue
            if t.name == EMBED and not m.arch.tie_word_embeddings:
                continue
            if t.dtype == "q4" and q4_kernel and t.name + ".mins" in names:
                total += t.shape[0] * t.shape[1] * (t.shape[2] + KERNEL_EXTRA_BYTES)
            elif t.dtype in ("q4", "q8"):
                blocks = t.shape[0] * t.shape[1]
                total += blocks * (t.shape[2] + PACKED_EXTRA_BYTES
                                   + (MIN_BYTES if t.name + ".mins" in names else 0))
            else:
                total += t.nbytes
        out["meshd_weight_mib"] = total / 2**20
    if gguf is not None:
        import gguf as gguf_reader

        tensors = gguf_reader.GGUFReader(str(gguf)).tensors
        tied = not any(t.name == "output.weight" for t in tensors)
        out["llama_weight_mib"] = sum(int(t.n_bytes) for t in tensors
                                      if t.name != "token_embd.weight" or tied) / 2**20
    return out


# ----------------------------------------------------------------------------- the lock


@contextlib.contextmanager
def bench_lock(path: Path) -> Iterator[None]:
    """Hold the benchmark lock; a descriptor of it inherited from ``flock(1)`` already holds it
    (taking it again on a new descriptor would wait for ourselves)."""
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/self/fd/{fd}") == str(path):
                yield
                return
    with open(path, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"waiting for {path} (another benchmark holds it)", flush=True)
            fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


# ----------------------------------------------------------------------------- llama.cpp side


def _post(srv: Any, path: str, body: dict[str, Any]) -> Any:
    """One request on a connection of its own: the server closes an idle keep-alive connection
    after a few seconds, and a pooled one reused after a long step fails ("Server disconnected
    without sending a response")."""
    with srv.client(HTTP_TIMEOUT_S) as c:
        r = c.post(path, json=body)
        r.raise_for_status()
        return r.json()


def _sse_times(srv: Any, body: dict[str, Any]) -> tuple[list[float], dict[str, Any]]:
    """Arrival time of each streamed token of a /completion, and its last event."""
    times: list[float] = []
    last: dict[str, Any] = {}
    with srv.client(HTTP_TIMEOUT_S) as client, client.stream(
            "POST", "/completion", json={**body, "stream": True, "return_tokens": True}) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            ev = json.loads(line[6:])
            if not ev.get("stop") and (ev.get("content") or ev.get("tokens")):
                times.append(time.perf_counter())
            last = ev
    return times, last


def run_llama(gguf: Path, p: dict[str, Any]) -> dict[str, Any]:
    from meshd.testing.llamacpp import llama_server

    streams, tokens = p["streams"], p["tokens"]
    per_slot = -(-(max(p["prompt"], STREAM_PROMPT_TOKENS) + tokens + 16) // 256) * 256
    base = {"temperature": 0.0, "repeat_penalty": 1.0, "ignore_eos": True, "cache_prompt": False}
    out: dict[str, Any] = {}
    LOGS.mkdir(exist_ok=True)
    log = LOGS / f"llama-server-{os.getpid()}-{time.strftime('%H%M%S')}.log"
    out["log"] = str(log)
    with llama_server(gguf, threads=p["threads"], parallel=streams, ctx_size=streams * per_slot,
                      extra_args=("--cache-ram", "0"), timeout_s=300, log_path=log) as srv:
        out["load_s"] = srv.load_s
        out["argv"] = srv.argv
        text = TEXT.read_text(encoding="utf-8")
        ids = _post(srv, "/tokenize", {"content": text, "add_special": False})["tokens"]
        with_special = _post(srv, "/tokenize", {"content": "x", "add_special": True})
        plain = _post(srv, "/tokenize", {"content": "x", "add_special": False})
        bos = with_special["tokens"][0] if len(with_special["tokens"]) > len(plain["tokens"]) else None
        prompts = make_prompts(ids, bos, stream_prompt=STREAM_PROMPT_TOKENS, streams=streams,
                               prompt=p["prompt"])

        def warm(i: int) -> None:
            _post(srv, "/completion", {**base, "prompt": prompts["streams"][i], "n_predict": 8})

        with ThreadPoolExecutor(streams) as pool:
            list(pool.map(warm, range(streams)))
        # (a) one stream
        times, last = _sse_times(srv, {**base, "prompt": prompts["streams"][0],
                                       "n_predict": tokens})
        t = last.get("timings", {})
        out["a_tokens"] = len(times)
        out["a_decode_tps"] = decode_tps(times)
        out["a_server_predicted_tps"] = t.get("predicted_per_second")
        # (c) one long prompt
        t0 = time.perf_counter()
        r = _post(srv, "/completion", {**base, "prompt": prompts["prefill"], "n_predict": 1})
        ttft = time.perf_counter() - t0
        out["c_prompt_tokens"] = r["timings"]["prompt_n"]
        out["c_ttft_ms"] = ttft * 1000
        out["c_prefill_tps"] = len(prompts["prefill"]) / ttft
        out["c_server_prompt_tps"] = r["timings"]["prompt_per_second"]

        # (b) concurrent streams
        def one(i: int) -> tuple[float, int]:
            res = _post(srv, "/completion", {**base, "prompt": prompts["streams"][i],
                                             "n_predict": tokens})
            return time.perf_counter(), int(res["tokens_predicted"])

        with ThreadPoolExecutor(streams) as pool:
            t0 = time.perf_counter()
            done = list(pool.map(one, range(streams)))
        out["b_tokens_each"] = [n for _, n in done]
        total = sum(n for _, n in done)
        out["b_tokens"] = total
        out["b_aggregate_tps"] = total / (max(t for t, _ in done) - t0)
        out["rss_kb"] = status_kb(srv.pid)
    return out


def run_llama_bench(gguf: Path, p: dict[str, Any]) -> dict[str, Any]:
    from meshd.testing.llamacpp import run_tool

    args = ["-m", str(gguf), "-t", str(p["threads"]), "-p", str(p["prompt"]), "-n",
            str(p["tokens"]), "-r", "1", "-o", "json"]
    r = run_tool("llama-bench", args, timeout_s=HTTP_TIMEOUT_S)
    if r.returncode != 0:
        raise RuntimeError(f"llama-bench failed ({r.returncode}):\n{r.stderr[-2000:]}")
    rows = json.loads(r.stdout)
    out: dict[str, Any] = {"argv": ["llama-bench", *args]}
    for row in rows:
        if row.get("n_gen", 0) > 0 and row.get("n_prompt", 0) == 0:
            out["tg_tps"] = row["avg_ts"]
        elif row.get("n_prompt", 0) > 0 and row.get("n_gen", 0) == 0:
            out["pp_tps"] = row["avg_ts"]
    return out


# ----------------------------------------------------------------------------- meshd side


def run_meshd(model_dir: Path, p: dict[str, Any]) -> dict[str, Any]:
    """Run the meshd side in a fresh worker process (its own peak RSS)."""
    spawn = time.monotonic()
    params = json.dumps({**p, "model": str(model_dir), "spawn": spawn})
    r = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--worker", params],
                       capture_output=True, text=True, check=False, timeout=4 * HTTP_TIMEOUT_S)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]
    if r.returncode != 0 or not lines:
        raise RuntimeError(f"meshd worker failed ({r.returncode}):\n{r.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def worker(p: dict[str, Any]) -> dict[str, Any]:
    imported0 = time.monotonic()
    import trio

    from meshd.engine import GenerationConfig, load_model
    from meshd.engine.scheduler import warm_grammar

    t_imported = time.monotonic()
    # as a batching daemon loads it: the fused graph is the model's one session
    model = load_model(p["model"], threads=p["threads"], fused=True)
    t_loaded = time.monotonic()
    out: dict[str, Any] = {"load_s": t_loaded - p["spawn"], "load_model_s": t_loaded - t_imported,
                           "import_s": t_imported - imported0, "provider": model.provider}
    tok = model.tokenizer
    ids = tok.encode(TEXT.read_text(encoding="utf-8"), add_special_tokens=False)
    bos = tok.bos_token_id
    adds_bos = bos is not None and tok.encode("x")[:1] == [bos] and tok.encode(
        "x", add_special_tokens=False)[:1] != [bos]
    prompts = make_prompts(ids, bos if adds_bos else None, stream_prompt=STREAM_PROMPT_TOKENS,
                           streams=p["streams"], prompt=p["prompt"])
    # llguidance's view of the vocabulary, as a daemon's batcher builds it at start: from the
    # tokenizer with its EOS (the stand-in below hides EOS, and without one the view would be
    # built from tokenizer.json text, the larger route: meshd.engine.constrain)
    warm_grammar(model)
    model.tokenizer = IgnoreEos(tok)
    tokens = p["tokens"]
    cfg = GenerationConfig(max_tokens=tokens, temperature=0.0, repetition_penalty=1.0)
    one_cfg = GenerationConfig(max_tokens=1, temperature=0.0, repetition_penalty=1.0)
    for _ in model.generate_sync(prompts["streams"][0],
                                 GenerationConfig(max_tokens=8, temperature=0.0)):
        pass
    # (a) one stream, the engine's own loop
    times = [time.perf_counter() for _ in model.generate_sync(prompts["streams"][0], cfg)]
    out["a_tokens"] = len(times)
    out["a_decode_tps"] = decode_tps(times)
    # (c) one long prompt
    t0 = time.perf_counter()
    for _ in model.generate_sync(prompts["prefill"], one_cfg):
        ttft = time.perf_counter() - t0
    out["c_prompt_tokens"] = len(prompts["prefill"])
    out["c_ttft_ms"] = ttft * 1000
    out["c_prefill_tps"] = len(prompts["prefill"]) / ttft

    async def batched() -> None:
        async def stream(prompt: list[int], c: GenerationConfig, sink: list[float]) -> None:
            async for _ in model.generate(prompt, c):
                sink.append(time.perf_counter())

        async def round_(n: int, c: GenerationConfig) -> tuple[float, list[list[float]]]:
            sinks: list[list[float]] = [[] for _ in range(n)]
            t0 = time.perf_counter()
            async with trio.open_nursery() as nursery:
                for i in range(n):
                    nursery.start_soon(stream, prompts["streams"][i], c, sinks[i])
            return t0, sinks

        async with trio.open_nursery() as nursery:
            await nursery.start(model.batcher.run)
            # warm: calibration, the fused graph (a chunk beside running streams)
            await round_(p["streams"], GenerationConfig(max_tokens=8, temperature=0.0))
            t0, sinks = await round_(p["streams"], cfg)
            total = sum(len(s) for s in sinks)
            out["b_tokens"] = total
            out["b_aggregate_tps"] = total / (max(s[-1] for s in sinks) - t0)
            _, one = await round_(1, cfg)
            out["a_batcher_decode_tps"] = decode_tps(one[0])
            t0 = time.perf_counter()
            first: list[float] = []
            await stream(prompts["prefill"], one_cfg, first)
            out["c_batcher_ttft_ms"] = (first[0] - t0) * 1000
            out["batch_stats"] = {k: v for k, v in model.batcher.statistics().items()
                                  if k in ("fused", "chunk_tokens", "max_batch_seen", "kv_bytes")}
            nursery.cancel_scope.cancel()

    trio.run(batched)
    out["rss_kb"] = status_kb(os.getpid())
    return out


# ----------------------------------------------------------------------------- daemon side


def _check(r: Any) -> None:
    if r.status_code != 200:
        raise RuntimeError(f"{r.request.url}: HTTP {r.status_code}: {r.text[:500]}")


def run_daemon(model_dir: Path, p: dict[str, Any]) -> dict[str, Any]:
    """One ``meshd run`` daemon serving the model; the streams through its OpenAI API."""
    import httpx

    os.environ.setdefault("MESHD_TESTNET_CACHE", "0")  # answers from the model, never the cache
    from meshd.engine import Tokenizer, read_manifest
    from meshd.testing.wait import wait_for
    from meshd.testnet import launcher

    man = read_manifest(model_dir)
    tok = Tokenizer(model_dir / man.tokenizer.file, man.tokenizer)
    ids = tok.encode(TEXT.read_text(encoding="utf-8"), add_special_tokens=False)
    prompts = make_prompts(ids, None, stream_prompt=STREAM_PROMPT_TOKENS, streams=p["streams"],
                           prompt=p["prompt"])
    # text prompts (the API takes no token arrays); the daemon adds the BOS itself
    bos = 1 if tok.bos_token_id is not None and tok.encode("x")[:1] == [tok.bos_token_id] else 0
    texts = {"streams": [tok.decode(x[:len(x) - bos]) for x in prompts["streams"]],
             "prefill": tok.decode(prompts["prefill"][:p["prompt"] - bos])}
    base = Path(tempfile.mkdtemp(prefix="meshd-bench-llamacpp-"))
    spec = launcher.NodeSpec(name="bench1", models=[{"path": str(model_dir),
                                                     "max_concurrency": p["streams"],
                                                     "max_queue": 64}],
                             # no prompt reuse, as llama-server's --cache-ram 0
                             extra={"engine": {"threads": p["threads"], "prefix_cache_mb": 0}})
    out: dict[str, Any] = {}
    t_start = time.perf_counter()
    try:
        index = launcher.up(base / "net", [spec], advert_interval_s=2.0)
        node = index["nodes"][0]
        key = Path(index["api_key_file"]).read_text().strip()
        url = node["api_url"].rstrip("/")
        url = url[:-3] if url.endswith("/v1") else url
        headers = {"Authorization": f"Bearer {key}"}
        with httpx.Client(base_url=url, headers=headers, timeout=HTTP_TIMEOUT_S) as c:
            def listed() -> str | None:
                try:
                    data = c.get("/v1/models").json().get("data") or []
                except (httpx.HTTPError, ValueError):
                    return None
                ids = [str(m["id"]) for m in data if m.get("id") != "auto"]  # auto: the tiers' alias
                return ids[0] if ids else None

            name = wait_for(listed, 300, "the daemon to list its model", poll_s=0.05)
            out["load_s"] = time.perf_counter() - t_start
            body = {"model": name, "temperature": 0.0, "repetition_penalty": 1.0, "cache": False}

            def one(i: int, n: int) -> tuple[float, int]:
                with httpx.Client(base_url=url, headers=headers, timeout=HTTP_TIMEOUT_S) as ci:
                    r = ci.post("/v1/completions", json={**body, "prompt": texts["streams"][i],
                                                          "max_tokens": n})
                    _check(r)
                return time.perf_counter(), int(r.json()["usage"]["completion_tokens"])

            with ThreadPoolExecutor(p["streams"]) as pool:
                list(pool.map(lambda i: one(i, 8), range(p["streams"])))  # warm
                t0 = time.perf_counter()
                done = list(pool.map(lambda i: one(i, p["tokens"]), range(p["streams"])))
            total = sum(n for _, n in done)
            out["b_tokens"] = total
            out["b_aggregate_tps"] = total / (max(t for t, _ in done) - t0)
            with httpx.Client(base_url=url, headers=headers, timeout=HTTP_TIMEOUT_S) as ci:
                t0 = time.perf_counter()
                r = ci.post("/v1/completions", json={**body, "prompt": texts["prefill"],
                                                     "max_tokens": 1})
            _check(r)
            out["c_ttft_ms"] = (time.perf_counter() - t0) * 1000
            out["c_prompt_tokens"] = int(r.json()["usage"]["prompt_tokens"])
        out["rss_kb"] = status_kb(int(node["pid"]))
    finally:
        launcher.down(base / "net")
        shutil.rmtree(base, ignore_errors=True)
    return out


# ----------------------------------------------------------------------------- report


FIGURES = [  # (key, label, unit, higher is better)
    ("a_decode_tps", "(a) decode, 1 stream", "tok/s", True),
    ("b_aggregate_tps", "(b) aggregate, {streams} streams", "tok/s", True),
    ("c_prefill_tps", "(c) prefill, {prompt}-token prompt", "tok/s", True),
    ("c_ttft_ms", "(c) time to first token, {prompt}-token prompt", "ms", False),
    ("load_s", "(d) load, process start to ready", "s", False),
    ("peak_rss_mb", "(e) peak RSS", "MiB", False),
]


def summarize(runs: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, float | None]]:
    med: dict[str, dict[str, float | None]] = {}
    for side, rs in runs.items():
        for r in rs:
            if "rss_kb" in r and r["rss_kb"].get("VmHWM"):
                r["peak_rss_mb"] = r["rss_kb"]["VmHWM"] / 1024
        keys = sorted({k for r in rs for k, v in r.items() if isinstance(v, int | float)})
        med[side] = {k: median([r.get(k) for r in rs]) for k in keys}
    return med


def table(med: dict[str, dict[str, float | None]], p: dict[str, Any]) -> str:
    def f(x: float | None) -> str:
        return "-" if x is None else (f"{x:.1f}" if abs(x) >= 10 else f"{x:.2f}")

    lines = ["| figure (median) | llama.cpp | meshd | meshd / llama.cpp | meshd daemon | "
             "daemon / llama.cpp |", "|---|---|---|---|---|---|"]
    lm, mm, dm = med.get("llama", {}), med.get("meshd", {}), med.get("daemon", {})
    for key, label, unit, _ in FIGURES:
        a, b, d = lm.get(key), mm.get(key), dm.get(key)
        lines.append(f"| {label.format(**p)}, {unit} | {f(a)} | {f(b)} | "
                     f"{f(b / a) if a and b else '-'} | {f(d)} | {f(d / a) if a and d else '-'} |")
    lines.append(f"| meshd load_model alone, s | | {f(mm.get('load_model_s'))} | | | |")
    lines.append(f"| meshd through its batcher: 1-stream decode, tok/s | {f(lm.get('a_decode_tps'))} "
                 f"| {f(mm.get('a_batcher_decode_tps'))} | | | |")
    lines.append(f"| meshd through its batcher: TTFT, ms | {f(lm.get('c_ttft_ms'))} | "
                 f"{f(mm.get('c_batcher_ttft_ms'))} | | | |")
    lines.append(f"| llama-server's own timings: decode / prefill, tok/s | "
                 f"{f(lm.get('a_server_predicted_tps'))} / {f(lm.get('c_server_prompt_tps'))} "
                 "| | | | |")
    wb = p.get("weight_bytes") or {}
    lw, mw = wb.get("llama_weight_mib"), wb.get("meshd_weight_mib")
    if lw and mw:
        la, ma = lm.get("a_decode_tps"), mm.get("a_decode_tps")
        lines.append(f"| weight bytes a decode step reads (computed from the formats), MiB | "
                     f"{f(lw)} | {f(mw)} | {f(mw / lw)} | | |")
        if la and ma:
            lines.append(f"| those bytes at (a)'s rate, GiB/s | {f(lw * la / 1024)} | "
                         f"{f(mw * ma / 1024)} | {f(mw * ma / (lw * la))} | | |")
    bm = med.get("llama-bench", {})
    if bm:
        lines.append(f"| llama-bench tg{p['tokens']} / pp{p['prompt']}, tok/s | "
                     f"{f(bm.get('tg_tps'))} / {f(bm.get('pp_tps'))} | | | | |")
    return "\n".join(lines)


MERGE_SAME = ("gguf", "meshd_model", "params")


def merge(files: list[Path], out: Path) -> int:
    """Pool the repeats of earlier runs (``--out`` files) into one figure."""
    loaded = []
    for f in files:
        try:
            loaded.append(json.loads(f.read_text(encoding="utf-8")))
        except (OSError, ValueError) as err:
            sys.exit(f"{f}: cannot read a run ({err})")
    first = loaded[0]
    for f, d in zip(files, loaded, strict=True):
        diff = [k for k in MERGE_SAME if d.get(k) != first.get(k)]
        if diff:
            sys.exit(f"{f} differs from {files[0]} in {', '.join(diff)}: not merged")
    runs: dict[str, list[dict[str, Any]]] = {}
    for d in loaded:
        for side, rs in d["runs"].items():
            runs.setdefault(side, []).extend(rs)
    med = summarize(runs)
    res = {**first, "repeats": sum(d["repeats"] for d in loaded), "medians": med,
           "ratios_meshd_over_llama": ratios_of(med), "runs": runs,
           "merged_from": [{"file": f.name, "commit": d.get("commit"), "repeats": d["repeats"],
                            "machine": d.get("machine")} for f, d in zip(files, loaded, strict=True)]}
    print(f"{len(files)} runs pooled, medians of {res['repeats']} repeats")
    print(table(med, first["params"]))
    out.write_text(json.dumps(res, indent=1) + "\n")
    print(f"\nwrote {out}")
    return 0


def ratios_of(med: dict[str, dict[str, float | None]]) -> dict[str, float | None]:
    lm, mm = med.get("llama", {}), med.get("meshd", {})
    return {k: mm[k] / lm[k] if mm.get(k) and lm.get(k) else None for k, *_ in FIGURES}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--gguf", type=Path)
    ap.add_argument("--meshd-model", type=Path, help="a meshd model directory (of the same model)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--prompt", type=int, default=512, help="tokens of the prefill prompt")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--sides", default="llama,meshd,llama-bench",
                    help="which of llama, meshd, daemon, llama-bench to run")
    ap.add_argument("--daemon", action="store_true", help="add the daemon side")
    ap.add_argument("--no-lock", action="store_true",
                    help="run without the benchmark lock (a smoke run whose timings do not count)")
    ap.add_argument("--label", default="")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--merge", type=Path, nargs="+", metavar="RUN.json",
                    help="pool earlier runs' repeats into one figure (needs --out)")
    args = ap.parse_args()
    if args.merge:
        if args.out is None:
            ap.error("--merge needs --out")
        return merge(args.merge, args.out)
    if args.worker:
        print("RESULT " + json.dumps(worker(json.loads(args.worker))), flush=True)
        return 0
    if args.meshd_model is None:
        ap.error("--meshd-model is required")
    args.meshd_model = args.meshd_model.resolve()
    from meshd.engine import read_manifest
    from meshd.testing.llamacpp import cpu_features, llama_bin, missing_reason

    chosen = [x for x in args.sides.split(",") if x] + (["daemon"] if args.daemon else [])
    unknown = set(chosen) - {"llama", "meshd", "daemon", "llama-bench"}
    if unknown:
        ap.error(f"unknown sides: {', '.join(sorted(unknown))}")
    if args.gguf is None and {"llama", "llama-bench"} & set(chosen):
        ap.error("--gguf is required for the llama and llama-bench sides")
    for side, tool in (("llama", "llama-server"), ("llama-bench", "llama-bench")):
        if side in chosen and llama_bin(tool) is None:
            sys.exit(missing_reason(tool))
    p = {"threads": args.threads, "streams": args.streams, "tokens": args.tokens,
         "prompt": args.prompt}
    # the meshd model's context bounds both sides, when a meshd side runs
    ctx = read_manifest(args.meshd_model).arch.max_position_embeddings \
        if {"meshd", "daemon"} & set(chosen) else 1 << 30
    notes: list[str] = []
    if p["prompt"] + 1 > ctx:
        notes.append(f"prompt cut from {p['prompt']} to {ctx - 1} tokens (meshd context {ctx})")
        p["prompt"] = ctx - 1
    if STREAM_PROMPT_TOKENS + p["tokens"] > ctx:
        notes.append(f"tokens cut from {p['tokens']} to {ctx - STREAM_PROMPT_TOKENS} "
                     f"(meshd context {ctx})")
        p["tokens"] = ctx - STREAM_PROMPT_TOKENS
    for n in notes:
        print("note:", n, flush=True)
    every = {"llama": lambda: run_llama(args.gguf, p),
             "meshd": lambda: run_meshd(args.meshd_model, p),
             "daemon": lambda: run_daemon(args.meshd_model, p),
             "llama-bench": lambda: run_llama_bench(args.gguf, p)}
    sides = {k: every[k] for k in every if k in chosen}
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in sides}
    loads = [os.getloadavg()[0]]
    with contextlib.nullcontext() if args.no_lock else bench_lock(LOCK):
        for rep in range(args.repeats):
            names = list(sides)
            order = names[rep % len(names):] + names[:rep % len(names)]
            for name in order:
                t0 = time.perf_counter()
                load0 = os.getloadavg()[0]
                try:
                    r = sides[name]()
                except Exception as err:  # one side failing leaves the others' figures
                    r = {"error": f"{type(err).__name__}: {err}"[:2000]}
                r.update(repeat=rep, load_before=load0, load_after=os.getloadavg()[0])
                runs[name].append(r)
                print(f"repeat {rep + 1}/{args.repeats} {name}: {time.perf_counter() - t0:.0f} s "
                      + json.dumps({k: round(v, 2) if isinstance(v, float) else v
                                    for k, v in r.items()
                                    if isinstance(v, float) or k == "error"}), flush=True)
            loads.append(os.getloadavg()[0])
    med = summarize(runs)
    ratios = ratios_of(med)
    print()
    print(f"{args.gguf.name if args.gguf else '(no GGUF)'} against {args.meshd_model}, {args.threads} threads, medians of "
          f"{args.repeats} interleaved repeats; load average {' '.join(f'{x:.2f}' for x in loads)}")
    from meshd.engine import q4kernel

    kernel = q4kernel.status()
    p["q4_kernel"] = kernel.label
    p["weight_bytes"] = weight_bytes_per_step(
        args.meshd_model if {"meshd", "daemon"} & set(chosen) else None, args.gguf,
        q4_kernel=kernel.library is not None)
    print(table(med, p))
    res = {"gguf": str(args.gguf), "meshd_model": str(args.meshd_model), "params": p,
           "notes": notes, "repeats": args.repeats, "locked": not args.no_lock, "medians": med,
           "ratios_meshd_over_llama": ratios, "runs": runs, "label": args.label,
           "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                    text=True, check=False, cwd=ROOT).stdout.strip(),
           "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                       "load_avg": loads, "cpu": cpu_features()}}
    out = args.out or ROOT / "benchmarks" / f"results-llamacpp-{args.label or 'run'}.json"
    out.write_text(json.dumps(res, indent=1) + "\n")
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
