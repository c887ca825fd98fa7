"""Ollama response objects from the entry chain's results. Pure: no I/O; times come in.

Shapes follow Ollama's API (docs/api.md of github.com/ollama/ollama): a generation streams one
JSON object per line (NDJSON), ``done: false`` with a piece of text, then ``done: true`` with
``done_reason`` and the counts and durations (nanoseconds); unstreamed, that last object carries
the whole text. Durations are this node's own measurements of the request (``Timings``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from meshd.api.errors import ApiError

CONTENT_TYPE = b"application/x-ndjson"


def line(obj: Any) -> bytes:
    """One NDJSON line: compact JSON (``json.dumps`` escapes every newline inside), then \\n."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"


def created_at(unix_ns: int) -> str:
    """RFC 3339 in UTC with microseconds, as Ollama's ``created_at`` (``...T12:00:00.123456Z``)."""
    s, ns = divmod(unix_ns, 1_000_000_000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(s)) + f".{ns // 1000:06d}Z"


@dataclass(frozen=True, slots=True)
class Timings:
    """When this node took the request in, saw its first text, and had the answer
    (``time.perf_counter_ns``; ``first_ns`` None when no text came)."""

    start_ns: int
    first_ns: int | None
    end_ns: int

    def durations(self) -> dict[str, int]:
        """Ollama's durations: ``total_duration`` is the whole request here;
        ``prompt_eval_duration`` is up to the first text (routing, any forwarding, queueing and
        the prompt's prefill on the serving node); ``eval_duration`` the rest (decoding)."""
        first = self.first_ns if self.first_ns is not None else self.end_ns
        return {"total_duration": max(0, self.end_ns - self.start_ns),
                "prompt_eval_duration": max(0, first - self.start_ns),
                "eval_duration": max(0, self.end_ns - first)}


def done_reason(stats: Mapping[str, Any]) -> str:
    reason = stats.get("finish_reason")
    return reason if reason in ("stop", "length") else "stop"


def final(kind: str, model: str, now_ns: int, stats: Mapping[str, Any], timings: Timings,
          text: str) -> dict[str, Any]:
    """The ``done: true`` object of a chat or generate answer: ``text`` is the whole answer
    (unstreamed) or the part not streamed yet (usually "")."""
    prompt = int(stats.get("prompt_tokens") or 0)
    completion = int(stats.get("completion_tokens", stats.get("tokens")) or 0)
    d = timings.durations()
    return {
        **piece(kind, model, now_ns, text), "done": True, "done_reason": done_reason(stats),
        "total_duration": d["total_duration"], "prompt_eval_count": prompt,
        "prompt_eval_duration": d["prompt_eval_duration"], "eval_count": completion,
        "eval_duration": d["eval_duration"],
    }


def piece(kind: str, model: str, now_ns: int, text: str) -> dict[str, Any]:
    """A streamed piece of the answer (``done: false``)."""
    out: dict[str, Any] = {"model": model, "created_at": created_at(now_ns)}
    if kind == "chat":
        out["message"] = {"role": "assistant", "content": text}
    else:
        out["response"] = text
    out["done"] = False
    return out


def loaded(kind: str, model: str, now_ns: int) -> dict[str, Any]:
    """The answer to a request without a prompt (Ollama's way to load a model): meshd's models
    are loaded already."""
    return {**piece(kind, model, now_ns, ""), "done": True, "done_reason": "load"}


def error(err: ApiError) -> dict[str, str]:
    """Ollama's error shape. Messages from the entry chain say ``max_tokens`` where an Ollama
    client said ``num_predict``."""
    return {"error": err.message.replace("max_tokens", "num_predict")}


def human_count(n: int) -> str:
    """A parameter count as Ollama writes it: 7.2B, 135M, 1.2K, 900."""
    for size, unit in ((10**12, "T"), (10**9, "B"), (10**6, "M"), (10**3, "K")):
        if n >= size:
            v = n / size
            return f"{v:.0f}{unit}" if v >= 100 else f"{v:.1f}{unit}".replace(".0" + unit, unit)
    return str(n)


def details(row: Mapping[str, Any]) -> dict[str, Any]:
    """Ollama's ``details`` of a model from what the mesh knows of it: ``format`` is ``meshd``
    (meshd's model directory) or ``upstream`` (a server the node fronts); ``quantization_level``
    how the weights are stored (fp32, fp16, int8, int4); "" where not known."""
    stored = str(row.get("format") or "")
    arch = str(row.get("architecture") or "")
    params = row.get("parameters")
    return {
        "parent_model": "",
        "format": "upstream" if stored == "upstream" else ("meshd" if stored else ""),
        "family": arch,
        "families": [arch] if arch else None,
        "parameter_size": human_count(int(params)) if params else "",
        "quantization_level": "" if stored == "upstream" else stored,
    }


def tags(models: Sequence[Mapping[str, Any]], modified_at: str) -> dict[str, Any]:
    """``GET /api/tags``: every model the mesh serves (as ``GET /v1/models``). ``modified_at`` is
    when this node's API started; ``meshd`` holds how many nodes serve it and its context."""
    out = []
    for m in sorted(models, key=lambda m: str(m["id"])):
        entry: dict[str, Any] = {
            "name": m["id"], "model": m["id"], "modified_at": modified_at,
            "size": int(m.get("size_bytes") or 0), "digest": str(m.get("digest") or ""),
            "details": details(m),
            "meshd": {"nodes": m.get("nodes"), "context_length": m.get("context_length")},
        }
        out.append(entry)
    return {"models": out}


def show(row: Mapping[str, Any], modified_at: str) -> dict[str, Any]:
    """``POST /api/show``: what the mesh knows of one model. ``model_info`` uses GGUF's key names
    (``general.architecture``, ``<arch>.context_length``, ...) with ``meshd.`` in place of the
    architecture when it is not known here (a model only peers serve)."""
    arch = str(row.get("architecture") or "")
    prefix = arch or "meshd"
    info: dict[str, Any] = {}
    if arch:
        info["general.architecture"] = arch
    if row.get("parameters"):
        info["general.parameter_count"] = int(row["parameters"])
    for key, name in (("context_length", "context_length"), ("layers", "block_count"),
                      ("hidden_size", "embedding_length")):
        if row.get(key):
            info[f"{prefix}.{name}"] = int(row[key])
    info["meshd.nodes"] = row.get("nodes")
    return {
        "modelfile": "",
        "parameters": "",
        "template": str(row.get("chat_template") or ""),
        "details": details(row),
        "model_info": info,
        "capabilities": ["completion"],
        "modified_at": modified_at,
    }
