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
from meshd.api.tools import ToolFormat


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


def choices_of(stats: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The answer's choices: ``stats["choices"]`` (n > 1 or logprobs), else the one answer."""
    got = stats.get("choices")
    if got:
        return [dict(c) for c in got]
    return [{"index": 0, "text": stats.get("text", ""), "finish_reason": finish_reason(stats)}]


def chat_logprobs(entries: Sequence[Sequence[Any]]) -> dict[str, Any]:
    """OpenAI's chat ``logprobs`` from the engine's [token, log probability, top] entries."""
    return {"content": [{"token": t, "logprob": lp, "bytes": list(t.encode()),
                         "top_logprobs": [{"token": a, "logprob": b, "bytes": list(a.encode())}
                                          for a, b in top]}
                        for t, lp, top in entries], "refusal": None}


def completion_logprobs(entries: Sequence[Sequence[Any]], offset: int = 0) -> dict[str, Any]:
    """OpenAI's legacy completions ``logprobs`` (tokens, token_logprobs, top_logprobs,
    text_offset), offsets counted from ``offset``."""
    offsets = []
    for t, _, _ in entries:
        offsets.append(offset)
        offset += len(t)
    return {"tokens": [e[0] for e in entries], "token_logprobs": [e[1] for e in entries],
            "top_logprobs": [{a: b for a, b in e[2]} for e in entries], "text_offset": offsets}


def chat_completion(rid: str, created: int, model: str, stats: Mapping[str, Any], *,
                    tools: ToolFormat | None = None, logprobs: bool = False) -> dict[str, Any]:
    """``chat.completion``; with ``tools`` (the format the tool calls are written in) a reply
    that is a call becomes ``tool_calls`` (finish_reason ``tool_calls``); one cut short after
    whole calls keeps them as ``tool_calls`` and the rest as ``content``, with its finish
    reason (as the stream sends it)."""
    choices = []
    for c in choices_of(stats):
        i, text = int(c["index"]), str(c.get("text", ""))
        calls = tools.parse_reply(text, rid, i) if tools is not None else None
        message: dict[str, Any] = {"role": "assistant", "content": text, "refusal": None}
        finish = c.get("finish_reason") or finish_reason(stats)
        if calls:
            message = {"role": "assistant", "content": None, "refusal": None, "tool_calls": calls}
            finish = "tool_calls"
        elif tools is not None:
            done, rest = tools.split_calls(text, rid, i)
            if done:
                message = {"role": "assistant", "content": rest or None, "refusal": None,
                           "tool_calls": done}
        choices.append({"index": i, "message": message,
                        "logprobs": chat_logprobs(c.get("logprobs") or []) if logprobs else None,
                        "finish_reason": finish})
    return {
        "id": response_id("chat", rid),
        "object": "chat.completion",
        "created": created,
        "model": model,
        "system_fingerprint": None,
        "choices": choices,
        "usage": usage(stats),
        **retrieval(stats),
    }


def retrieval(stats: Mapping[str, Any]) -> dict[str, Any]:
    """meshd's extension of a non-streamed answer to a request with ``rag`` (docs/rag.md): the
    ``sources`` used (``[{source, score}]``) and the ``rag`` summary (trimmed, where retrieved)."""
    return {k: stats[k] for k in ("sources", "rag") if k in stats}


def text_completion(rid: str, created: int, model: str, stats: Mapping[str, Any], *,
                    tools: bool = False, logprobs: bool = False) -> dict[str, Any]:
    return {
        "id": response_id("completion", rid),
        "object": "text_completion",
        "created": created,
        "model": model,
        "system_fingerprint": None,
        "choices": [{"text": c.get("text", ""), "index": int(c["index"]),
                     "logprobs": completion_logprobs(c.get("logprobs") or []) if logprobs else None,
                     "finish_reason": c.get("finish_reason") or finish_reason(stats)}
                    for c in choices_of(stats)],
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
        self._offsets: dict[int, int] = {}  # completions' logprobs: text offset per choice
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

    def _choice(self, text: str | None, finish: str | None, *, role: bool = False,
                index: int = 0, lp: Sequence[Any] | None = None) -> dict[str, Any]:
        if self.kind == "chat":
            delta: dict[str, Any] = {}
            if role:
                delta["role"] = "assistant"
            if text is not None:
                delta["content"] = text
            return {"index": index, "delta": delta,
                    "logprobs": chat_logprobs(lp) if lp is not None else None,
                    "finish_reason": finish}
        return {"text": text or "", "index": index,
                "logprobs": completion_logprobs(lp, self._offsets.get(index, 0))
                if lp is not None else None, "finish_reason": finish}

    def first(self) -> dict[str, Any] | None:
        return self._chunk(self._choice("", None, role=True)) if self.kind == "chat" else None

    def firsts(self, n: int) -> bytes:
        """The role chunk of each of ``n`` choices (chat; nothing for completions)."""
        if self.kind != "chat":
            return b""
        return b"".join(sse.event(self._chunk(self._choice("", None, role=True, index=i)))
                        for i in range(n))

    def delta_event(self, text: str, index: int = 0, lp: Sequence[Any] | None = None) -> bytes:
        """The chunk of a choice's next text (and its tokens' log probabilities)."""
        if index == 0 and lp is None:
            return self.text_event(text)
        out = sse.event(self._chunk(self._choice(text, None, index=index, lp=lp)))
        if lp is not None and self.kind != "chat":
            self._offsets[index] = self._offsets.get(index, 0) + sum(len(e[0]) for e in lp)
        return out

    def tool_calls_event(self, calls: Sequence[Mapping[str, Any]], index: int = 0,
                         first: int = 0) -> bytes:
        """One chunk with tool calls of a choice, each whole (OpenAI's deltas: index, id, type,
        function name and arguments); ``first`` is the index of the first of them."""
        delta = {"tool_calls": [{"index": first + k, **c} for k, c in enumerate(calls)]}
        return sse.event(self._chunk({"index": index, "delta": delta, "logprobs": None,
                                      "finish_reason": None}))

    def last_event(self, finish: str, index: int = 0) -> bytes:
        return sse.event(self._chunk(self._choice(None, finish, index=index)))

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
    """``GET /v1/models``: OpenAI's list of model objects, ``auto`` first (the mesh picks a
    model by the prompt: docs/tiers.md); ``meshd`` holds how many nodes serve each, its context
    length, tier and weight format, when the adverts tell them (``auto``: the tiers served)."""
    ordered = sorted(models, key=lambda m: str(m["id"]))
    tiers = sorted({str(m["tier"]) for m in ordered if m.get("tier")})
    data = [{"id": "auto", "object": "model", "created": created, "owned_by": "meshd",
             "meshd": {"nodes": sum(int(m.get("nodes") or 0) for m in ordered),
                       "tiers": tiers, "auto": True}}]
    data += [{"id": m["id"], "object": "model", "created": created, "owned_by": "meshd",
              "meshd": {"nodes": m.get("nodes"), "context_length": m.get("context_length"),
                        "tier": m.get("tier"), "format": m.get("format")}}
             for m in ordered]
    return {"object": "list", "data": data}
