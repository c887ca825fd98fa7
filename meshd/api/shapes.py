"""OpenAI request bodies as SUBMIT fields. Pure: no I/O.

``chat_call`` and ``completion_call`` check the OpenAI-only parts of a request (``stream``,
``stream_options``, ``logprobs``, ``response_format``, ``tools``, ...) and turn the rest into the
SUBMIT-shaped fields that ``meshd.core.request.parse_submit`` checks, exactly as for `meshd
submit`. A field meshd cannot honour is a 400 naming it (``errors.unsupported``), never silently
ignored; a field that asks for OpenAI's neutral value (``store = false``) is accepted.

``response_format`` (json_object, json_schema) and ``tools`` become a grammar
(``meshd.engine.constrain``), checked and compiled here once; it travels with the request as its
``grammar`` field, and the serving node masks every token that would leave it. Tools are
rendered by the model's chat template when it has a tool syntax meshd knows
(``meshd.api.tool_template``), else in meshd's generic format (``meshd.api.tools``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from meshd.api import tool_template
from meshd.api.errors import ApiError, bad_request, unsupported
from meshd.api.tools import GENERIC, ToolFormat, ToolSpec, parse_tools, render_messages
from meshd.core.request import MAX_N, MAX_TOP_LOGPROBS

MAX_TEMPERATURE = 2.0  # OpenAI's range is [0, 2]
COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
MAX_STOP = 4  # OpenAI's limit
MAX_COMPLETION_LOGPROBS = 5  # OpenAI's limit for /v1/completions' logprobs

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


def _penalties(body: Mapping[str, Any], fields: dict[str, Any]) -> None:
    for key in ("presence_penalty", "frequency_penalty"):
        v = body.get(key)
        if v is None:
            continue
        if not isinstance(v, int | float) or isinstance(v, bool) or not -2 <= v <= 2:
            raise bad_request(f"{key} must be a number in [-2, 2]", key)
        if v != 0:
            fields[key] = float(v)


def _logit_bias(body: Mapping[str, Any], fields: dict[str, Any]) -> None:
    bias = body.get("logit_bias")
    if bias is None or bias == {}:
        return
    if not isinstance(bias, dict):
        raise bad_request("logit_bias must map token ids to biases", "logit_bias")
    pairs = []
    for k, v in bias.items():
        if not (isinstance(k, str) and k.isdigit()) or not isinstance(v, int | float) or \
                isinstance(v, bool) or not -100 <= v <= 100:
            raise bad_request("logit_bias must map token ids (as strings of digits) to numbers "
                              "in [-100, 100]", "logit_bias")
        pairs.append([int(k), float(v)])
    fields["logit_bias"] = pairs


def _n(body: Mapping[str, Any], fields: dict[str, Any]) -> int:
    n = body.get("n")
    if n is None:
        return 1
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise bad_request("n must be an integer >= 1", "n")
    if n > MAX_N:
        raise unsupported("n", f"at most {MAX_N} choices per request in meshd")
    if n > 1:
        fields["n"] = n
    return n


@dataclass(frozen=True)
class ApiCall:
    """A checked OpenAI request: SUBMIT fields for ``parse_submit`` and how to answer."""

    kind: str  # "chat" or "completion"
    fields: dict[str, Any]
    stream: bool = False
    include_usage: bool = False
    # SUBMIT field name -> the name the client used, for the ``param`` of an error
    params: dict[str, str] = field(default_factory=dict)
    n: int = 1
    logprobs: bool = False  # the answer carries log probabilities
    tools: ToolSpec | None = None  # active tools: the reply may be (or must be) tool calls
    structured: bool = False  # response_format json_object or json_schema
    tool_format: ToolFormat = GENERIC  # how tool calls are written (with ``tools``)


def _common(body: Any, allowed: frozenset[str]) -> tuple[dict[str, Any], bool, bool, int]:
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
    fields: dict[str, Any] = {"model": model, "origin": "http"}
    n = _n(body, fields)
    _logit_bias(body, fields)
    _penalties(body, fields)
    for key in (*_SAMPLING, *_EXTENSIONS):
        if body.get(key) is not None:
            fields[key] = body[key]
    stop = body.get("stop")
    if stop is not None:
        stop = [stop] if isinstance(stop, str) else stop
        if isinstance(stop, list) and len(stop) > MAX_STOP:
            raise bad_request(f"stop takes at most {MAX_STOP} strings", "stop")
        fields["stop"] = stop
    return fields, bool(stream), include_usage, n


_CHAT_FIELDS = frozenset({
    "model", "messages", "stream", "stream_options", "max_tokens", "max_completion_tokens",
    "temperature", "top_p", "seed", "stop", "presence_penalty", "frequency_penalty", "n",
    "logprobs", "top_logprobs", "logit_bias", "response_format", "modalities", "store",
    "tools", "tool_choice", "parallel_tool_calls", *_EXTENSIONS, *_INERT,
})


def wants_template(body: Any) -> str | None:
    """The model whose chat template ``chat_call`` needs (its tool syntax), or None: a request
    with tools or tool messages names a model (``auto`` chooses one later: the generic
    format serves it)."""
    if not isinstance(body, dict) or not isinstance(body.get("model"), str) or \
            body["model"] == "auto":
        return None
    msgs = body.get("messages")
    has = body.get("tools") is not None or (isinstance(msgs, list) and any(
        isinstance(m, dict) and (m.get("tool_calls") or m.get("role") == "tool") for m in msgs))
    return body["model"] if has else None


def chat_call(body: Any, template: str | None = None) -> ApiCall:
    """``POST /v1/chat/completions``: raises ``ApiError`` (400) naming the first bad field.
    ``template`` is the model's chat template (``wants_template``): one with a tool syntax
    meshd knows renders the tools and the tool messages itself."""
    fields, stream, include_usage, n = _common(body, _CHAT_FIELDS)
    logprobs = body.get("logprobs")
    if logprobs is not None and not isinstance(logprobs, bool):
        raise bad_request("logprobs must be true or false", "logprobs")
    top = body.get("top_logprobs")
    if top is not None:
        if not isinstance(top, int) or isinstance(top, bool) or not 0 <= top <= MAX_TOP_LOGPROBS:
            raise bad_request(f"top_logprobs must be an integer in [0, {MAX_TOP_LOGPROBS}]",
                              "top_logprobs")
        if not logprobs:
            raise bad_request("top_logprobs needs logprobs: true", "top_logprobs")
    if logprobs:
        fields["logprobs"] = top or 0
    _neutral(body, "store", False)
    modalities = body.get("modalities")
    if modalities is not None and modalities != ["text"]:
        raise unsupported("modalities", "only [\"text\"] is supported by meshd")
    tools = parse_tools(body)
    native = tool_template.detect(template)
    fmt: ToolFormat = native if native is not None else GENERIC
    grammar = _response_format(body.get("response_format"))
    if tools is not None and tools.active:
        if grammar is not None:
            raise unsupported("response_format", "a JSON response_format together with tools "
                              "is not supported by meshd; use one or the other")
        grammar = _tool_grammar(tools, fmt)
    structured = grammar is not None and not (tools is not None and tools.active)
    if grammar is not None:
        fields["grammar"] = grammar
    messages = _messages(body.get("messages"))
    if native is None:
        fields["messages"] = render_messages(messages, tools)
    else:
        tool_template.check_calls(native, messages)
        fields["messages"] = tool_template.template_messages(messages)
        if tools is not None and tools.active:
            fields["tools"] = list(tools.tools)
        elif tool_template.carries_tools(messages):
            fields["cache"] = False  # the cache's key holds the messages' text, not the calls
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
    return ApiCall("chat", fields, stream, include_usage, params, n=n, logprobs=bool(logprobs),
                   tools=tools if tools is not None and tools.active else None,
                   structured=structured, tool_format=fmt)


def _response_format(fmt: Any) -> str | None:
    """The grammar of ``response_format`` (None for text), compiled and checked: a 400 names
    the schema keyword meshd cannot enforce."""
    from meshd.engine.constrain import GrammarError, json_object_grammar, schema_grammar

    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") not in ("text", "json_object", "json_schema"):
        raise bad_request("response_format must be {\"type\": \"text\"}, "
                          "{\"type\": \"json_object\"} or {\"type\": \"json_schema\", "
                          "\"json_schema\": {...}}", "response_format")
    kind = fmt["type"]
    if kind == "text":
        return None
    try:
        if kind == "json_object":
            return json_object_grammar()
        spec = fmt.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
            raise bad_request("response_format.json_schema must be an object with a name and "
                              "a schema", "response_format.json_schema")
        strict = spec.get("strict")
        if strict is not None and not isinstance(strict, bool):
            raise bad_request("response_format.json_schema.strict must be true or false",
                              "response_format.json_schema.strict")
        schema = spec.get("schema", {})
        if not isinstance(schema, dict):
            raise bad_request("response_format.json_schema.schema must be a JSON schema object",
                              "response_format.json_schema.schema")
        return schema_grammar(schema)  # strict or not, the output follows the schema
    except GrammarError as e:
        param = "response_format.json_schema.schema" if kind == "json_schema" else "response_format"
        raise ApiError(400, f"{param}: {e}", param=param, code="unsupported_schema") from None


def _tool_grammar(tools: ToolSpec, fmt: ToolFormat) -> str:
    from meshd.engine.constrain import GrammarError

    try:
        return fmt.grammar(tools.functions, tools.named, parallel=tools.parallel,
                           text=not tools.forced)
    except GrammarError as e:
        raise ApiError(400, f"tools: a function's parameters: {e}", param="tools",
                       code="unsupported_schema") from None


def _messages(raw: Any) -> list[dict[str, Any]]:
    if not isinstance(raw, list) or not raw:
        raise bad_request("messages must be a non-empty list of messages", "messages")
    out = []
    for i, m in enumerate(raw):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise bad_request(f"{where} must be an object with role and content", where)
        for key in m:
            if key not in ("role", "content", "tool_calls", "tool_call_id", "refusal") and not (
                    key == "name" and m.get("role") == "tool"):
                raise unsupported(f"{where}.{key}", "not supported by meshd (participant names)")
        content = m.get("content")
        if isinstance(content, list):
            content = _text_parts(content, f"{where}.content")
        calls = m.get("tool_calls")
        if calls is not None:
            if m.get("role") != "assistant":
                raise bad_request(f"{where}.tool_calls: only assistant messages call tools",
                                  f"{where}.tool_calls")
            _tool_calls(calls, f"{where}.tool_calls")
            content = content or ""
        if not isinstance(content, str):
            raise bad_request(f"{where}.content must be a string or a list of text parts",
                              f"{where}.content")
        msg: dict[str, Any] = {"role": m.get("role"), "content": content}
        if calls:
            msg["tool_calls"] = calls
        if m.get("role") == "tool":
            if not isinstance(m.get("tool_call_id"), str):
                raise bad_request(f"{where}.tool_call_id is required in a tool message",
                                  f"{where}.tool_call_id")
            msg["tool_call_id"] = m["tool_call_id"]
        if isinstance(m.get("name"), str):
            msg["name"] = m["name"]
        out.append(msg)
    return out


def _tool_calls(calls: Any, where: str) -> None:
    if not isinstance(calls, list):
        raise bad_request(f"{where} must be a list", where)
    for j, c in enumerate(calls):
        fn = c.get("function") if isinstance(c, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise bad_request(f"{where}[{j}] must be {{id, type: function, function: {{name, "
                              f"arguments}}}}", f"{where}[{j}]")


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
    fields, stream, include_usage, n = _common(body, _COMPLETION_FIELDS)
    best_of = body.get("best_of")
    if best_of is not None and best_of != n:
        raise unsupported("best_of", f"{best_of!r} is not supported by meshd (only n, {n}, is)")
    _neutral(body, "echo", False)
    logprobs = body.get("logprobs")
    if logprobs is not None:
        if not isinstance(logprobs, int) or isinstance(logprobs, bool) or \
                not 0 <= logprobs <= MAX_COMPLETION_LOGPROBS:
            raise bad_request(f"logprobs must be an integer in [0, {MAX_COMPLETION_LOGPROBS}]",
                              "logprobs")
        fields["logprobs"] = logprobs
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
    return ApiCall("completion", fields, stream, include_usage, _identity(), n=n,
                   logprobs=logprobs is not None)


def _identity() -> dict[str, str]:
    return {k: k for k in (*_SAMPLING, *_EXTENSIONS, "stop", "model", "max_tokens", "prompt",
                           "presence_penalty", "frequency_penalty", "logit_bias", "n",
                           "logprobs")} | {"grammar": "response_format"}

