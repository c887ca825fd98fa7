"""llama-server's own endpoints, as the upstream model speaks them. Pure: bodies out, events in.

meshd moves requests as token ids, and llama-server takes and returns ids on its native
``POST /completion`` (not the OpenAI routes): ``prompt`` may be a list of ids and
``return_tokens`` adds each chunk's ids to the stream. So a request tokenized anywhere in the
mesh, or resumed after a failover with the ids already streamed, runs on llama-server exactly as
on a native node: no text round trip, no re-tokenization.

The stream is server-sent events of ``{"content", "tokens", "stop", ...}``; the last has
``"stop": true`` (and ``timings``); an error is ``{"error": {...}}``. There is no ``[DONE]``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from meshd.errors import PeerGoneError
from meshd.upstream.events import event_object


def completion_body(ids: list[int], cfg: Any) -> dict[str, Any]:
    """The ``/completion`` body generating from ``ids`` with meshd's generation config: the
    same sampling meshd's engine does (its repetition penalty over the whole history, prompt
    included, no min-p), so a greedy request gives the engine's answer on the same weights."""
    body: dict[str, Any] = {"prompt": list(ids), "n_predict": int(cfg.max_tokens), "stream": True,
                            "return_tokens": True, "cache_prompt": True, "min_p": 0.0,
                            "repeat_last_n": len(ids) + int(cfg.max_tokens)}  # all of it
    for ours, theirs in (("temperature", "temperature"), ("top_k", "top_k"), ("top_p", "top_p"),
                         ("repetition_penalty", "repeat_penalty"), ("seed", "seed")):
        v = getattr(cfg, ours, None)
        if v is not None:
            body[theirs] = v
    stop = getattr(cfg, "stop", ())
    if stop:
        body["stop"] = list(stop)
    return body


def tokenize_body(text: str, *, add_special: bool) -> dict[str, Any]:
    """``/tokenize``: special-token texts (``<|im_start|>``) are parsed as the tokens they name,
    as llama-server does for prompts."""
    return {"content": text, "add_special": add_special, "parse_special": True}


def token_list(answer: Any, where: str) -> list[int]:
    """The ids of a ``/tokenize`` answer (llama-server's ``tokens``; vLLM's too)."""
    toks = answer.get("tokens") if isinstance(answer, dict) else None
    if not isinstance(toks, list) or not all(isinstance(t, int) and not isinstance(t, bool)
                                             and t >= 0 for t in toks):
        raise PeerGoneError(f"upstream {where} answered /tokenize without a list of token ids")
    return toks


@dataclass(frozen=True, slots=True)
class Chunk:
    """One event of a ``/completion`` stream."""

    ids: tuple[int, ...]
    text: str
    stop: bool
    stop_type: str = ""  # the last event's: "eos", "limit", "word"
    prompt_ms: float | None = None  # the last event's timings
    predicted_per_s: float | None = None


def parse_event(data: str, where: str) -> Chunk:
    """One ``data:`` payload of the stream; ``PeerGoneError`` for anything that is not a chunk
    of llama-server's (the node fails over as from a dead peer)."""
    obj = event_object(data, where)
    toks = obj.get("tokens", [])
    text = obj.get("content", "")
    stop = obj.get("stop")
    if (not isinstance(toks, list) or not isinstance(text, str) or not isinstance(stop, bool)
            or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in toks)):
        raise PeerGoneError(f"upstream {where} sent a chunk that is not llama-server's "
                            f"(content, tokens, stop): {data[:80]!r}")
    timings = obj.get("timings")
    if not isinstance(timings, dict):
        timings = {}
    return Chunk(tuple(toks), text, stop, str(obj.get("stop_type") or ""),
                 _num(timings.get("prompt_ms")), _num(timings.get("predicted_per_second")))


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None
