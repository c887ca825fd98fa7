"""OpenAI request bodies as SUBMIT fields. Pure: no I/O.

``chat_call`` and ``completion_call`` check the OpenAI-only parts of a request (``stream``,
``stream_options``, ``n``, ``logprobs``, ...) and turn the rest into the SUBMIT-shaped fields that
``meshd.core.request.parse_submit`` checks, exactly as for `meshd submit`. A field meshd cannot
honour is a 400 naming it (``errors.unsupported``), never silently ignored; a field that asks for
OpenAI's neutral value (``n = 1``, ``logprobs = false``, ``presence_penalty = 0``) is accepted.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from meshd.api.errors import bad_request, unsupported

MAX_TEMPERATURE = 2.0  # OpenAI's range is [0, 2]
COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions

# fields every endpoint passes on to SUBMIT under the same name
_SAMPLING = ("temperature", "top_p", "seed")
# extensions other OpenAI-compatible servers (vLLM) accept too, and meshd's own
_EXTENSIONS = ("top_k", "repetition_penalty", "strategy", "residency", "pipeline", "cache",
               "rag", "allow_lower_tier",  # rag: a retrieval collection (docs/rag.md)
               "cache_max_error")  # the cache's error bound for this request (docs/cache.md)
# accepted, and not used: they cannot change the answer ("user" is an end-user id for abuse
# monitoring at OpenAI)
_INERT = ("user",)


def _neutral(body: Mapping[str, Any], key: str, *values: Any) -> None:
    v = body.get(key)
    if v is None or any(v == x and type(v) is type(x) for x in values):
        return
    raise unsupported(key, f"{v!r} is not supported by meshd (only {values[0]!r} is)")


def _penalties(body: Mapping[str, Any]) -> None:
    for key in ("presence_penalty", "frequency_penalty"):
        v = body.get(key)
        if v is None:
            continue
        if not isinstance(v, int | float) or isinstance(v, bool) or not -2 <= v <= 2:
            raise bad_request(f"{key} must be a number in [-2, 2]", key)
        if v != 0:
            raise unsupported(key, "meshd's engine has no presence or frequency penalty (only "
                              "0 is accepted); use repetition_penalty instead")


@dataclass(frozen=True)
class ApiCall:
    """A checked OpenAI request: SUBMIT fields for ``parse_submit`` and how to answer."""

    kind: str  # "chat" or "completion"
    fields: dict[str, Any]
    stream: bool = False
    include_usage: bool = False
    # SUBMIT field name -> the name the client used, for the ``param`` of an error
    params: dict[str, str] = field(default_factory=dict)


def _common(body: Any, allowed: frozenset[str]) -> tuple[dict[str, Any], bool, bool]:
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    for key in body:
        if key not in allowed:
            raise unsupported(key, "this field is not supported by meshd")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad_request("model is required: the name of a model the mesh serves "
                          "(GET /v1/models lists them)", "model")
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise bad_request("stream must be true or false", "stream")
    options = body.get("stream_options")
    include_usage = False
    if options is not None:
        if not stream:
            raise bad_request("stream_options is only allowed when stream is true", "stream_options")
        if not isinstance(options, dict):
            raise bad_request("stream_options must be an object", "stream_options")
        for key, v in options.items():
            if key != "include_usage":
                raise unsupported(f"stream_options.{key}", "not supported by meshd")
            if not isinstance(v, bool):
                raise bad_request("stream_options.include_usage must be true or false",
                                  "stream_options.include_usage")
            include_usage = v
    temperature = body.get("temperature")
    if isinstance(temperature, int | float) and not isinstance(temperature, bool) and (
            not math.isfinite(temperature) or temperature > MAX_TEMPERATURE):
        raise bad_request(f"temperature must be in [0, {MAX_TEMPERATURE:g}]", "temperature")
    _neutral(body, "n", 1)
    logit_bias = body.get("logit_bias")
    if logit_bias not in (None, {}):
        raise unsupported("logit_bias", "not supported by meshd")
    _penalties(body)
    fields: dict[str, Any] = {"model": model, "origin": "http"}
    for key in (*_SAMPLING, *_EXTENSIONS):
        if body.get(key) is not None:
            fields[key] = body[key]
    stop = body.get("stop")
    if stop is not None:
        fields["stop"] = [stop] if isinstance(stop, str) else stop
    return fields, bool(stream), include_usage


_CHAT_FIELDS = frozenset({
    "model", "messages", "stream", "stream_options", "max_tokens", "max_completion_tokens",
    "temperature", "top_p", "seed", "stop", "presence_penalty", "frequency_penalty", "n",
    "logprobs", "top_logprobs", "logit_bias", "response_format", "modalities", "store",
    *_EXTENSIONS, *_INERT,
})


def chat_call(body: Any) -> ApiCall:
    """``POST /v1/chat/completions``: raises ``ApiError`` (400) naming the first bad field."""
    fields, stream, include_usage = _common(body, _CHAT_FIELDS)
    _neutral(body, "logprobs", False)
    if body.get("top_logprobs") is not None:
        raise unsupported("top_logprobs", "log probabilities are not supported by meshd")
    _neutral(body, "store", False)
    fmt = body.get("response_format")
    if fmt is not None and fmt != {"type": "text"}:
        raise unsupported("response_format", "only {\"type\": \"text\"} is supported by meshd")
    modalities = body.get("modalities")
    if modalities is not None and modalities != ["text"]:
        raise unsupported("modalities", "only [\"text\"] is supported by meshd")
    fields["messages"] = _messages(body.get("messages"))
    max_tokens = body.get("max_completion_tokens")
    legacy = body.get("max_tokens")
    if max_tokens is not None and legacy is not None and max_tokens != legacy:
        raise bad_request("give max_tokens or max_completion_tokens, not both",
                          "max_completion_tokens")
    if max_tokens is None:
        max_tokens = legacy
    if max_tokens is not None:
        fields["max_tokens"] = max_tokens
    name = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
    params = {**_identity(), "max_tokens": name, "prompt": "messages", "messages": "messages"}
    return ApiCall("chat", fields, stream, include_usage, params)


def _messages(raw: Any) -> list[dict[str, Any]]:
    if not isinstance(raw, list) or not raw:
        raise bad_request("messages must be a non-empty list of messages", "messages")
    out = []
    for i, m in enumerate(raw):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise bad_request(f"{where} must be an object with role and content", where)
        for key in m:
            if key not in ("role", "content"):
                raise unsupported(f"{where}.{key}", "not supported by meshd (no tools, no names)")
        content = m.get("content")
        if isinstance(content, list):
            content = _text_parts(content, f"{where}.content")
        if not isinstance(content, str):
            raise bad_request(f"{where}.content must be a string or a list of text parts",
                              f"{where}.content")
        out.append({"role": m.get("role"), "content": content})
    return out


def _text_parts(parts: list[Any], where: str) -> str:
    texts = []
    for j, p in enumerate(parts):
        if not isinstance(p, dict) or p.get("type") != "text" or not isinstance(p.get("text"), str):
            raise unsupported(f"{where}[{j}]", "only text parts ({\"type\": \"text\", \"text\": "
                              "...}) are supported by meshd")
        texts.append(p["text"])
    return "".join(texts)


_COMPLETION_FIELDS = frozenset({
    "model", "prompt", "stream", "stream_options", "max_tokens", "temperature", "top_p", "seed",
    "stop", "presence_penalty", "frequency_penalty", "n", "best_of", "logprobs", "echo",
    "suffix", "logit_bias", *_EXTENSIONS, *_INERT,
})


def completion_call(body: Any) -> ApiCall:
    """``POST /v1/completions`` (legacy text completions)."""
    fields, stream, include_usage = _common(body, _COMPLETION_FIELDS)
    _neutral(body, "best_of", 1)
    _neutral(body, "echo", False)
    if body.get("logprobs") is not None:
        raise unsupported("logprobs", "log probabilities are not supported by meshd")
    if body.get("suffix") is not None:
        raise unsupported("suffix", "insertion (suffix) is not supported by meshd")
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, list):
        raise unsupported("prompt", "give one prompt as a string (batches and token arrays are "
                          "not supported by meshd)")
    if not isinstance(prompt, str):
        raise bad_request("prompt must be a string", "prompt")
    fields["prompt"] = prompt
    max_tokens = body.get("max_tokens")
    fields["max_tokens"] = COMPLETIONS_DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens
    return ApiCall("completion", fields, stream, include_usage, _identity())


def _identity() -> dict[str, str]:
    return {k: k for k in (*_SAMPLING, *_EXTENSIONS, "stop", "model", "max_tokens", "prompt")}

