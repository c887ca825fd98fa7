"""OpenAI response objects from the entry chain's results. Pure: no I/O, the time comes in.

Shapes follow OpenAI's API reference: ``chat.completion`` and ``chat.completion.chunk``,
``text_completion`` (streamed and not), the ``list`` of ``model`` objects. The ids carry meshd's
request id (``chatcmpl-<id>``), which is also the ``x-request-id`` header that `meshd explain`
takes.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from meshd.api import sse


def usage(stats: Mapping[str, Any]) -> dict[str, int]:
    prompt = int(stats.get("prompt_tokens") or 0)
    completion = int(stats.get("completion_tokens", stats.get("tokens")) or 0)
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}


def finish_reason(stats: Mapping[str, Any]) -> str:
    reason = stats.get("finish_reason")
    return reason if reason in ("stop", "length") else "stop"


def response_id(kind: str, rid: str) -> str:
    return f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{rid}"


def chat_completion(rid: str, created: int, model: str, stats: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "id": response_id("chat", rid),
        "object": "chat.completion",
        "created": created,
        "model": model,
        "system_fingerprint": None,
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": stats.get("text", ""), "refusal": None},
            "logprobs": None,
            "finish_reason": finish_reason(stats),
        }],
        "usage": usage(stats),
        **retrieval(stats),
    }


def retrieval(stats: Mapping[str, Any]) -> dict[str, Any]:
    """meshd's extension of a non-streamed answer to a request with ``rag`` (docs/rag.md): the
    ``sources`` used (``[{source, score}]``) and the ``rag`` summary (trimmed, where retrieved)."""
    return {k: stats[k] for k in ("sources", "rag") if k in stats}


def text_completion(rid: str, created: int, model: str, stats: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "id": response_id("completion", rid),
        "object": "text_completion",
        "created": created,
        "model": model,
        "system_fingerprint": None,
        "choices": [{"text": stats.get("text", ""), "index": 0, "logprobs": None,
                     "finish_reason": finish_reason(stats)}],
        "usage": usage(stats),
        **retrieval(stats),
    }


class Chunks:
    """The chunks of one streamed answer, in order: ``first`` (chat only: the assistant's role),
    ``text`` for each batch of tokens, ``last`` with the finish reason, then ``usage`` when the
    client asked for it (``stream_options.include_usage``: every chunk before it carries
    ``"usage": null``, and it has no choices)."""

    def __init__(self, kind: str, rid: str, created: int, model: str, include_usage: bool) -> None:
        self.kind = kind
        self.include_usage = include_usage
        self._template: tuple[bytes, bytes] | None = None
        self.base: dict[str, Any] = {
            "id": response_id(kind, rid),
            "object": "chat.completion.chunk" if kind == "chat" else "text_completion",
            "created": created,
            "model": model,
            "system_fingerprint": None,
        }

    def _chunk(self, choice: dict[str, Any]) -> dict[str, Any]:
        out = {**self.base, "choices": [choice]}
        if self.include_usage:
            out["usage"] = None
        return out

    def _choice(self, text: str | None, finish: str | None, *, role: bool = False) -> dict[str, Any]:
        if self.kind == "chat":
            delta: dict[str, Any] = {}
            if role:
                delta["role"] = "assistant"
            if text is not None:
                delta["content"] = text
            return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return {"text": text or "", "index": 0, "logprobs": None, "finish_reason": finish}

    def first(self) -> dict[str, Any] | None:
        return self._chunk(self._choice("", None, role=True)) if self.kind == "chat" else None

    def text(self, text: str) -> dict[str, Any]:
        return self._chunk(self._choice(text, None))

    def text_event(self, text: str) -> bytes:
        """``sse.event(self.text(text))``, from a template made once per stream: the text is the
        only part that changes, and a stream sends one of these per batch of tokens."""
        if self._template is None:
            marker = "\u0000meshd-text\u0000"
            whole = sse.event(self.text(marker))
            quoted = json.dumps(marker, ensure_ascii=False).encode()
            head, _, tail = whole.partition(quoted)
            self._template = (head, tail)
        head, tail = self._template
        return head + json.dumps(text, ensure_ascii=False).encode() + tail

    def last(self, stats: Mapping[str, Any]) -> dict[str, Any]:
        return self._chunk(self._choice(None, finish_reason(stats)))

    def usage(self, stats: Mapping[str, Any]) -> dict[str, Any] | None:
        if not self.include_usage:
            return None
        return {**self.base, "choices": [], "usage": usage(stats)}


def model_list(models: Sequence[Mapping[str, Any]], created: int) -> dict[str, Any]:
    """``GET /v1/models``: OpenAI's list of model objects; ``meshd`` holds how many nodes serve
    each and its context length, when the adverts tell it."""
    data = [{"id": m["id"], "object": "model", "created": created, "owned_by": "meshd",
             "meshd": {"nodes": m.get("nodes"), "context_length": m.get("context_length")}}
            for m in sorted(models, key=lambda m: str(m["id"]))]
    return {"object": "list", "data": data}
