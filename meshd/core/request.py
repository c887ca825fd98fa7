"""What a client asks the mesh for, checked once at the entry node.

Every way into the mesh (the control socket's SUBMIT, the HTTP API) builds an ``EntryRequest``
with ``parse_submit`` from SUBMIT-shaped fields, so every check happens here, once, with the
rules the engine applies (``sampling_problem``, which ``meshd.engine.GenerationConfig`` uses
too). A bad value is a ``ProtocolError`` (code ``malformed``) naming the field; nothing past the
entry node ever sees it. Pure: no I/O, no clock.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from meshd.errors import ProtocolError

DEFAULT_MAX_TOKENS = 64  # what a request that names no max_tokens gets
MAX_MAX_TOKENS = 4096  # the most one request may ask for, whatever the model's context
MAX_ID_CHARS = 128  # request ids and client names
MAX_NAME_CHARS = 256  # model, strategy, residency, pipeline mode, collection names
MAX_PROMPT_CHARS = 512 * 1024  # fits the control socket's 1 MiB frame with room for the rest
MAX_STOP_STRINGS = 8
MAX_STOP_CHARS = 256
MAX_N = 8  # choices of one request (decoded as rows of one batch)
MAX_TOP_LOGPROBS = 20  # OpenAI's limit
MAX_LOGIT_BIAS = 1024  # entries of one request's logit_bias
MAX_GRAMMAR_CHARS = 256 * 1024  # a compiled response_format or tool grammar
MAX_MESSAGES = 256
ROLES = ("system", "user", "assistant", "tool", "developer")
STRATEGIES = ("meshd", "lwsq", "least_queue", "latency_only", "round_robin", "random",
              "round_robin_lockstep", "meshd_no_prefix", "prefix_only")
PIPELINE_MODES = ("auto", "never", "always")
# Fields that shape the answer beyond the prompt: the tools a request offers and the schema it
# asks the answer to follow. Whatever else reads them, the semantic cache keys on them
# (``EntryRequest.shape``): an answer is only ever served to a request offering the same.
SHAPE_FIELDS = ("tools", "tool_choice", "functions", "function_call", "response_format",
                "format", "json_schema", "grammar")


@dataclass(frozen=True, slots=True)
class Sampling:
    """The sampling settings a request carries; None means the engine's default."""

    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    repetition_penalty: float | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias)
    logprobs: int | None = None  # None: none; k: the chosen token's and the k likeliest
    n: int = 1  # choices, decoded together after one prefill
    grammar: str | None = None  # llguidance grammar: response_format or tools (engine.constrain)

    def fields(self) -> dict[str, Any]:
        """The settings that are set, as SUBMIT/REQ wire fields."""
        out: dict[str, Any] = {}
        for k in ("temperature", "top_k", "top_p", "repetition_penalty", "seed",
                  "presence_penalty", "frequency_penalty", "logprobs", "grammar"):
            v = getattr(self, k)
            if v is not None:
                out[k] = v
        if self.stop:
            out["stop"] = list(self.stop)
        if self.logit_bias:
            out["logit_bias"] = [[t, b] for t, b in self.logit_bias]
        if self.n != 1:
            out["n"] = self.n
        return out

    @property
    def shapes_output(self) -> bool:
        """Settings beyond the basic ones that shape the output: a grammar, several choices,
        log probabilities, OpenAI's penalties or a logit bias. (The answer cache keys on the
        grammar, the penalties and the bias, and skips n > 1 and logprobs: meshd.cache.keys.)"""
        return (self.grammar is not None or self.n != 1 or self.logprobs is not None
                or bool(self.presence_penalty) or bool(self.frequency_penalty)
                or bool(self.logit_bias))

    @property
    def greedy(self) -> bool:
        """Deterministic output: temperature 0 (the engine's default is 0.8)."""
        return self.temperature == 0


@dataclass(frozen=True, slots=True)
class EntryRequest:
    """One request as the entry node accepted it. ``prompt`` is text; ``messages`` (chat, from
    the API) is rendered with the model's chat template, with ``tools`` (OpenAI function tools,
    for a template with tool syntax: meshd.api.tool_template) when given; ``chat`` renders
    ``prompt`` as one user message. ``max_tokens`` None means DEFAULT_MAX_TOKENS (the entry
    chain clamps it to the model's limits once the model is known)."""

    request_id: str
    prompt: str | None
    client: str = "local"
    messages: tuple[Mapping[str, Any], ...] | None = None
    chat: bool = False
    model: str | None = None
    max_tokens: int | None = None
    sampling: Sampling = field(default_factory=Sampling)
    strategy: str | None = None
    residency: str | None = None
    pipeline: str | None = None
    cache: bool | None = None  # None: the node's default (greedy requests cached)
    rag: str | None = None  # a collection to retrieve context from
    allow_lower_tier: bool = False  # model "auto": a lower tier may serve it (docs/tiers.md)
    origin: str = "control"  # "control" or "http": where the request came in
    tools: tuple[Mapping[str, Any], ...] | None = None  # rendered by the model's chat template
    cache_max_error: float | None = None  # the cache's error bound for it (None: the node's)
    shape: str = ""  # the SHAPE_FIELDS it carries, canonical JSON ("" for none)

    @property
    def wanted_tokens(self) -> int:
        return self.max_tokens if self.max_tokens is not None else DEFAULT_MAX_TOKENS


def sampling_problem(
    *, max_tokens: Any = 1, temperature: Any = 0.0, top_k: Any = 0, top_p: Any = 1.0,
    repetition_penalty: Any = 1.0, seed: Any = None, stop: Any = (), presence_penalty: Any = 0.0,
    frequency_penalty: Any = 0.0, logit_bias: Any = (), logprobs: Any = None, n: Any = 1,
) -> str | None:
    """What is wrong with these sampling settings, in one line, or None. The engine's
    ``GenerationConfig`` and the entry node's ``parse_submit`` both apply this rule."""
    if not _is_int(max_tokens) or max_tokens < 1:
        return f"max_tokens={max_tokens!r} must be an integer >= 1"
    if not _is_num(temperature) or not temperature >= 0 or not math.isfinite(temperature):
        return f"temperature={temperature!r} must be a finite number >= 0"
    if not _is_int(top_k) or top_k < 0:
        return f"top_k={top_k!r} must be an integer >= 0"
    if not _is_num(top_p) or not 0 < top_p <= 1:
        return f"top_p={top_p!r} must be in (0, 1]"
    if not _is_num(repetition_penalty) or not repetition_penalty > 0 or not math.isfinite(repetition_penalty):
        return f"repetition_penalty={repetition_penalty!r} must be a finite number > 0"
    if seed is not None and (not _is_int(seed) or not 0 <= seed < 2**63):
        return f"seed={seed!r} must be an integer in [0, 2**63)"
    if isinstance(stop, str) or any(not isinstance(s, str) or not s for s in stop):
        return "stop must be a list of non-empty strings"
    for name, v in (("presence_penalty", presence_penalty), ("frequency_penalty", frequency_penalty)):
        if not _is_num(v) or not -2 <= v <= 2:
            return f"{name}={v!r} must be a number in [-2, 2]"
    if not isinstance(logit_bias, list | tuple) or len(logit_bias) > MAX_LOGIT_BIAS or any(
            not isinstance(e, list | tuple) or len(e) != 2 or not _is_int(e[0]) or e[0] < 0
            or not _is_num(e[1]) or not -100 <= e[1] <= 100 for e in logit_bias):
        return (f"logit_bias must map at most {MAX_LOGIT_BIAS} token ids (integers >= 0) to "
                f"biases in [-100, 100]")
    if logprobs is not None and (not _is_int(logprobs) or not 0 <= logprobs <= MAX_TOP_LOGPROBS):
        return f"logprobs={logprobs!r} must be an integer in [0, {MAX_TOP_LOGPROBS}]"
    if not _is_int(n) or not 1 <= n <= MAX_N:
        return f"n={n!r} must be an integer in [1, {MAX_N}]"
    return None


def parse_submit(fields: Mapping[str, Any], new_id: Callable[[], str]) -> EntryRequest:
    """The request in SUBMIT-shaped ``fields`` (proto/registry.toml), checked; raises
    ``ProtocolError`` naming the first bad field. ``new_id`` makes an id when none is given (the
    HTTP API gives none); an empty one is refused like any other bad value."""
    rid = _text(fields, "rid", MAX_ID_CHARS) or new_id()
    messages = _messages(fields.get("messages"))
    prompt = fields.get("prompt")
    if messages is None:
        if not isinstance(prompt, str) or not prompt.strip():
            raise ProtocolError("prompt must be a non-empty string")
        if len(prompt) > MAX_PROMPT_CHARS:
            raise ProtocolError(f"prompt is {len(prompt)} characters; the limit is {MAX_PROMPT_CHARS}")
    elif prompt is not None:
        raise ProtocolError("give either prompt or messages, not both")
    max_tokens = fields.get("max_tokens")
    if max_tokens is not None and (not _is_int(max_tokens) or max_tokens < 1):
        raise ProtocolError(f"max_tokens={max_tokens!r} must be an integer >= 1")
    stop = fields.get("stop") or ()
    if isinstance(stop, str):
        stop = (stop,)
    if not isinstance(stop, list | tuple) or len(stop) > MAX_STOP_STRINGS:
        raise ProtocolError(f"stop must be a list of at most {MAX_STOP_STRINGS} strings")
    if any(isinstance(s, str) and len(s) > MAX_STOP_CHARS for s in stop):
        raise ProtocolError(f"each stop string is at most {MAX_STOP_CHARS} characters")
    grammar = fields.get("grammar")
    if grammar is not None and (not isinstance(grammar, str) or not grammar
                                or len(grammar) > MAX_GRAMMAR_CHARS):
        raise ProtocolError(f"grammar must be a non-empty string of at most {MAX_GRAMMAR_CHARS} "
                            f"characters")
    bias = fields.get("logit_bias") or ()
    if not isinstance(bias, list | tuple):
        raise ProtocolError("logit_bias must be a list of [token id, bias] pairs")
    sampling = Sampling(
        temperature=_num_or_none(fields, "temperature"),
        top_k=fields.get("top_k"),
        top_p=_num_or_none(fields, "top_p"),
        repetition_penalty=_num_or_none(fields, "repetition_penalty"),
        seed=fields.get("seed"),
        stop=tuple(stop),
        presence_penalty=_num_or_none(fields, "presence_penalty"),
        frequency_penalty=_num_or_none(fields, "frequency_penalty"),
        logit_bias=tuple((e[0], float(e[1])) if isinstance(e, list | tuple) and len(e) == 2
                         and _is_num(e[1]) else e for e in bias),
        logprobs=fields.get("logprobs"),
        n=fields.get("n", 1),
        grammar=grammar,
    )
    problem = sampling_problem(**_with_defaults(sampling))
    if problem is not None:
        raise ProtocolError(problem)
    strategy = _text(fields, "strategy", MAX_NAME_CHARS)
    if strategy is not None and strategy not in STRATEGIES:
        raise ProtocolError(f"strategy must be one of {', '.join(STRATEGIES)}, not {strategy!r}")
    pipeline = _text(fields, "pipeline", MAX_NAME_CHARS)
    if pipeline is not None and pipeline not in PIPELINE_MODES:
        raise ProtocolError(f"pipeline must be one of {', '.join(PIPELINE_MODES)}, not {pipeline!r}")
    if sampling.n > 1:  # the choices share one node's batch; a pipeline decodes one sequence
        if pipeline == "always":
            raise ProtocolError("n > 1 cannot run as a pipeline (pipeline = \"always\")")
        pipeline = "never"
    cache = fields.get("cache")
    if cache is not None and not isinstance(cache, bool):
        raise ProtocolError("cache must be true or false")
    chat = fields.get("chat", False)
    if not isinstance(chat, bool):
        raise ProtocolError("chat must be true or false")
    allow_lower = fields.get("allow_lower_tier", False)
    if not isinstance(allow_lower, bool):
        raise ProtocolError("allow_lower_tier must be true or false")
    max_error = _num_or_none(fields, "cache_max_error")
    if max_error is not None and not 0 <= max_error < 1:
        raise ProtocolError(f"cache_max_error={max_error!r} must be in [0, 1) (0: exact repeats "
                            "only)")
    return EntryRequest(
        request_id=rid,
        prompt=prompt if messages is None else None,
        client=_text(fields, "client", MAX_ID_CHARS) or "local",
        messages=messages,
        chat=chat,
        model=_text(fields, "model", MAX_NAME_CHARS),
        max_tokens=max_tokens,
        sampling=sampling,
        strategy=strategy,
        residency=_text(fields, "residency", MAX_NAME_CHARS),
        pipeline=pipeline,
        cache=cache,
        rag=_text(fields, "rag", MAX_NAME_CHARS),
        allow_lower_tier=allow_lower,
        origin=str(fields.get("origin") or "control"),
        tools=_tools(fields.get("tools"), messages),
        cache_max_error=max_error,
        shape=answer_shape(fields),
    )


def answer_shape(fields: Mapping[str, Any]) -> str:
    """The ``SHAPE_FIELDS`` that ``fields`` carries, as canonical JSON; "" when none (a
    ``response_format`` of plain text is no shape)."""
    shape = {k: fields[k] for k in SHAPE_FIELDS if fields.get(k) is not None}
    if shape.get("response_format") == {"type": "text"}:
        del shape["response_format"]
    if not shape:
        return ""
    return json.dumps(shape, sort_keys=True, ensure_ascii=False, separators=(",", ":"),
                      default=repr)


def _with_defaults(s: Sampling) -> dict[str, Any]:
    out: dict[str, Any] = {"stop": s.stop, "seed": s.seed, "logit_bias": s.logit_bias,
                           "logprobs": s.logprobs, "n": s.n}
    for k in ("temperature", "top_k", "top_p", "repetition_penalty", "presence_penalty",
              "frequency_penalty"):
        v = getattr(s, k)
        if v is not None:
            out[k] = v
    return out


def _messages(raw: Any) -> tuple[Mapping[str, Any], ...] | None:
    """Chat messages: role and text content; an assistant message may carry ``tool_calls``
    (``[{"id", "type", "function": {"name", "arguments"}}]``, arguments as an object) and a tool
    message ``tool_call_id`` and ``name``, for a template that renders them."""
    if raw is None:
        return None
    if not isinstance(raw, list | tuple) or not raw or len(raw) > MAX_MESSAGES:
        raise ProtocolError(f"messages must be a list of 1 to {MAX_MESSAGES} messages")
    total = 0
    out: list[dict[str, Any]] = []
    for i, m in enumerate(raw):
        if not isinstance(m, Mapping) or m.get("role") not in ROLES or not isinstance(m.get("content"), str):
            raise ProtocolError(f"messages[{i}] must have a role ({', '.join(ROLES)}) and text content")
        total += len(m["content"])
        msg: dict[str, Any] = {"role": m["role"], "content": m["content"]}
        for key in ("tool_call_id", "name"):
            if m.get(key) is not None:
                if not isinstance(m[key], str) or len(m[key]) > MAX_NAME_CHARS:
                    raise ProtocolError(f"messages[{i}].{key} must be a string of at most "
                                        f"{MAX_NAME_CHARS} characters")
                msg[key] = m[key]
        calls = m.get("tool_calls")
        if calls is not None:
            if m["role"] != "assistant" or not _calls_ok(calls):
                raise ProtocolError(f"messages[{i}].tool_calls must be an assistant's list of "
                                    f"{{id, type, function: {{name, arguments}}}}")
            msg["tool_calls"] = calls
            total += len(json.dumps(calls))
        out.append(msg)
    if total > MAX_PROMPT_CHARS:
        raise ProtocolError(f"messages hold {total} characters; the limit is {MAX_PROMPT_CHARS}")
    if not any(m["content"].strip() for m in out):
        raise ProtocolError("messages must contain some text")
    return tuple(out)


def _calls_ok(calls: Any) -> bool:
    return isinstance(calls, list | tuple) and all(
        isinstance(c, Mapping) and isinstance(c.get("function"), Mapping)
        and isinstance(c["function"].get("name"), str) for c in calls)


def _tools(raw: Any, messages: Any) -> tuple[Mapping[str, Any], ...] | None:
    """OpenAI function tools for the chat template (``{"type": "function", "function": {...}}``),
    only with messages."""
    if raw is None:
        return None
    if messages is None:
        raise ProtocolError("tools need chat messages")
    if not isinstance(raw, list | tuple) or not raw or not all(
            isinstance(t, Mapping) and isinstance(t.get("function"), Mapping) for t in raw):
        raise ProtocolError("tools must be a non-empty list of {type: function, function: {...}}")
    if len(json.dumps(raw)) > MAX_PROMPT_CHARS:
        raise ProtocolError(f"tools hold over {MAX_PROMPT_CHARS} characters")
    return tuple(raw)


def _text(fields: Mapping[str, Any], key: str, limit: int) -> str | None:
    v = fields.get(key)
    if v is None:
        return None
    if not isinstance(v, str) or not v:
        raise ProtocolError(f"{key} must be a non-empty string")
    if len(v) > limit:
        raise ProtocolError(f"{key} is {len(v)} characters; the limit is {limit}")
    if any(ord(c) < 32 for c in v):
        raise ProtocolError(f"{key} must not contain control characters")
    return v


def _num_or_none(fields: Mapping[str, Any], key: str) -> float | None:
    v = fields.get(key)
    if v is None:
        return None
    if not _is_num(v):
        raise ProtocolError(f"{key}={v!r} must be a number")
    return float(v)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)
