"""Constrained decoding: grammars for structured output and tool calls, and their token masks.

The grammar engine is llguidance (the one llama.cpp and onnxruntime-genai use). Measured on
SmolLM2's 49,152-token vocabulary against xgrammar and outlines-core (docs/api.md,
"Structured output"), it compiles a 20-property schema in 3 to 12 ms and computes a mask in
0.02 ms at the median (0.25 ms p99); outlines-core took 2.2 s to compile the same schema, and
xgrammar needs torch and transformers (gigabytes) and rejected a byte-level token of this
vocabulary (``":"``) that the schema allows.

Two halves:

- At the entry node (or the API): ``schema_grammar``, ``json_object_grammar`` and
  ``tool_grammar`` build a grammar (llguidance's own text form, which travels in the request as
  the ``grammar`` field) and ``check`` refuses one llguidance cannot compile, naming the
  keyword. No tokenizer is needed for either.
- On the serving node: ``Matcher`` follows one generation through the grammar and gives the
  mask of allowed tokens at each step; ``fill_masks`` computes the masks of a whole batch in one
  call (llguidance's executor, in parallel). ``grammar_tokenizer`` builds llguidance's view of a
  model's tokenizer once per tokenizer (meshd.engine.grammar_vocab; 0.35 s for 49k tokens: the
  batch scheduler warms it at calibration, in its worker thread).
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from meshd.errors import LocalError

# Compact JSON: no whitespace outside strings. A small model given free whitespace may spend its
# whole budget on newlines; compact output parses the same.
JSON_OPTIONS: dict[str, Any] = {"whitespace_flexible": False}
_UNIMPLEMENTED = re.compile(r'Unimplemented keys: \[([^\]]*)\]')
_LOCK = threading.Lock()


class GrammarError(LocalError):
    """A schema or grammar the engine cannot enforce; ``keyword`` names the schema keyword when
    one is to blame."""

    def __init__(self, message: str, keyword: str | None = None) -> None:
        super().__init__(message)
        self.keyword = keyword


def _llg() -> Any:
    import llguidance

    return llguidance


def json_object_grammar() -> str:
    """Any JSON object (``response_format: {"type": "json_object"}``)."""
    return schema_grammar({"type": "object"})


def closed(schema: Any) -> Any:
    """``schema`` with ``additionalProperties: false`` wherever an object lists its
    ``properties`` and says nothing of others (OpenAI's strict mode means it). Every document
    valid against the result is valid against ``schema``; a small model otherwise invents keys
    instead of closing the object."""
    if isinstance(schema, list):
        return [closed(s) for s in schema]
    if not isinstance(schema, Mapping):
        return schema
    out = {k: closed(v) if k not in ("const", "enum", "default", "examples") else v
           for k, v in schema.items()}
    if "properties" in out and "additionalProperties" not in out and \
            "patternProperties" not in out:
        out["additionalProperties"] = False
    return out


def schema_grammar(schema: Mapping[str, Any]) -> str:
    """The grammar of JSON documents valid against ``schema`` (``closed``; checked:
    ``GrammarError``)."""
    if not isinstance(schema, Mapping):
        raise GrammarError("the schema must be a JSON object")
    grammar = str(_llg().LLMatcher.grammar_from_json_schema(closed(schema), defaults=JSON_OPTIONS))
    check(grammar)
    return grammar


def tool_grammar(tools: Sequence[Mapping[str, Any]], choice: str | None, *, parallel: bool = True,
                 text: bool) -> str:
    """The grammar of a reply in meshd's generic tool format (docs/api.md, "Tools"): the JSON
    object ``{"tool_calls": [{"name": ..., "arguments": {...}}, ...]}`` whose names are the
    tools' (only ``choice`` when it names one) and whose arguments are valid against each
    tool's parameter schema (``closed``); one call unless ``parallel``, and then at most one
    more than the tools offered (a small model repeats a call until max_tokens otherwise). With
    ``text`` (tool_choice auto) a
    reply may instead be plain text that does not start with ``{`` or whitespace.

    ``tools`` are OpenAI function definitions' ``function`` objects (name, parameters)."""
    calls = call_schemas(tools, choice, "arguments")
    items: dict[str, Any] = calls[0] if len(calls) == 1 else {"anyOf": calls}
    array: dict[str, Any] = {"type": "array", "items": items, "minItems": 1}
    array["maxItems"] = len(calls) + 1 if parallel else 1
    schema = {"type": "object", "properties": {"tool_calls": array}, "required": ["tool_calls"],
              "additionalProperties": False, "x-guidance": JSON_OPTIONS}
    lark = f"start: calls{' | text' if text else ''}\ncalls: %json {json.dumps(schema)}\n"
    if text:
        lark += "text: /[^{\\s](.|\\n)*/\n"
    grammar = str(_llg().LLMatcher.grammar_from_lark(lark))
    check(grammar)
    return grammar


SAFE_INTEGER = 2**53 - 1  # JSON's safe integers (what a JavaScript client can hold)


def bounded(schema: Any) -> Any:
    """``schema`` with every integer kept within +-``SAFE_INTEGER`` on the sides it leaves
    open: 16 digits at most, where a small model greedy-decoding ``"minutes": 1000...`` otherwise writes
    zeros until max_tokens and the call does not parse. Every document valid against the
    result is valid against ``schema``."""
    if isinstance(schema, list):
        return [bounded(s) for s in schema]
    if not isinstance(schema, Mapping):
        return schema
    out = {k: bounded(v) if k not in ("const", "enum", "default", "examples") else v
           for k, v in schema.items()}
    if out.get("type") in ("integer", ["integer"]):
        low = out.get("minimum", out.get("exclusiveMinimum"))
        high = out.get("maximum", out.get("exclusiveMaximum"))
        if high is None and not (isinstance(low, int | float) and low > SAFE_INTEGER):
            out["maximum"] = SAFE_INTEGER
        if low is None and not (isinstance(high, int | float) and high < -SAFE_INTEGER):
            out["minimum"] = -SAFE_INTEGER
    return out


def call_schemas(tools: Sequence[Mapping[str, Any]], choice: str | None, args_key: str
                 ) -> list[dict[str, Any]]:
    """One JSON schema per tool that may be called (only ``choice`` when it names one):
    ``{"name": <the name>, <args_key>: <arguments valid against its parameters, closed and
    bounded>}``."""
    calls = []
    for fn in tools:
        if choice is not None and fn["name"] != choice:
            continue
        params = bounded(closed(fn.get("parameters") or {"type": "object", "properties": {}}))
        calls.append({"type": "object", "properties": {
            "name": {"const": fn["name"]}, args_key: params},
            "required": ["name", args_key], "additionalProperties": False})
    if not calls:
        raise GrammarError(f"no tool is named {choice!r}")
    return calls


# A template's own JSON is what its ``tojson`` (Python's json.dumps) writes: ", " and ": "
TEMPLATE_JSON: dict[str, Any] = {"whitespace_flexible": False, "item_separator": ", ",
                                 "key_separator": ": "}


def tagged_tool_grammar(tools: Sequence[Mapping[str, Any]], choice: str | None, *,
                        parallel: bool, text: bool, open_tag: str, close_tag: str,
                        separator: str, args_key: str = "arguments") -> str:
    """The grammar of a reply in a chat template's own call syntax: one or more
    ``<open_tag>{"name": ..., "<args_key>": {...}}<close_tag>`` joined by ``separator`` (Qwen2.5's
    ``<tool_call>\n...\n</tool_call>``; Llama 3's bare ``{"name": ..., "parameters": ...}``
    has empty tags), the JSON as the template's ``tojson`` writes it and the arguments valid
    against the tool's parameters (``call_schemas``); one call unless ``parallel``, else at most
    one more than the tools offered. With ``text`` (tool_choice auto) the reply may instead be
    text that does not begin with the call's first character (the open tag's, else ``{``) or
    with whitespace."""
    calls = call_schemas(tools, choice, args_key)
    one: dict[str, Any] = calls[0] if len(calls) == 1 else {"anyOf": calls}
    schema = {**one, "x-guidance": TEMPLATE_JSON}
    most = len(calls) + 1 if parallel else 1
    rows = [" ".join(["call"] + ["SEP call"] * k) for k in range(most)]
    call = " ".join([json.dumps(open_tag)] * bool(open_tag) + [f"%json {json.dumps(schema)}"]
                    + [json.dumps(close_tag)] * bool(close_tag))
    lark = (f"start: calls{' | text' if text else ''}\n"
            f"calls: {' | '.join(rows)}\n"
            f"call: {call}\n")
    if most > 1:
        lark += f"SEP: {json.dumps(separator)}\n"
    if text:
        first = re.escape(open_tag[:1] or "{")
        lark += f"text: /[^{first}\\s](.|\\n)*/\n"
    grammar = str(_llg().LLMatcher.grammar_from_lark(lark))
    check(grammar)
    return grammar


def check(grammar: str) -> None:
    """Raise ``GrammarError`` if llguidance cannot compile ``grammar``; an unimplemented JSON
    schema keyword is named (``keyword``)."""
    failed, messages = _llg().LLMatcher.validate_grammar_with_warnings(grammar)
    if not failed:
        return
    message = messages[0] if messages else "the grammar does not compile"
    hit = _UNIMPLEMENTED.search(message)
    if hit:
        keys = [k.strip().strip('"') for k in hit.group(1).split(",") if k.strip()]
        first = keys[0] if keys else "?"
        more = f" (also: {', '.join(keys[1:])})" if len(keys) > 1 else ""
        raise GrammarError(f"the JSON schema keyword {first!r} is not supported{more}", first)
    raise GrammarError(f"the schema cannot be enforced: {message.splitlines()[0]}")


def grammar_tokenizer(tokenizer: Any) -> Any:
    """llguidance's tokenizer for a model's ``meshd.engine.Tokenizer``, made once and kept on
    it (thread-safe)."""
    held = getattr(tokenizer, "_grammar_tokenizer", None)
    if held is not None:
        return held
    with _LOCK:
        held = getattr(tokenizer, "_grammar_tokenizer", None)
        if held is None:
            held = _build_grammar_tokenizer(tokenizer)
            tokenizer._grammar_tokenizer = held
    return held


def _build_grammar_tokenizer(tokenizer: Any) -> Any:
    """From the tokens' bytes and the tokenizer meshd holds (meshd.engine.grammar_vocab) where
    the vocabulary allows, else from its ``tokenizer.json`` text."""
    from meshd.engine.grammar_vocab import token_source

    llg = _llg()
    eos = list(tokenizer.eos_token_ids)
    source = token_source(tokenizer.hf, eos[0], tokenizer.bos_token_id) if eos else None
    if source is None:
        return llg.LLTokenizer(tokenizer.to_json(), n_vocab=tokenizer.vocab_size,
                               eos_token=eos or None)
    wrapper = llg.TokenizerWrapper(source)
    held = llg.LLTokenizer(wrapper, n_vocab=tokenizer.vocab_size, eos_token=eos)
    wrapper.tokens = source.tokens = []  # llguidance copied them; it calls only the callback
    return held


class Matcher:
    """One generation's place in a grammar. ``allowed()`` is the mask of the next token (a bool
    array over the vocabulary); ``consume`` advances past a token; ``done`` once the grammar is
    complete and admits no more tokens."""

    def __init__(self, tokenizer: Any, grammar: str) -> None:
        self.vocab = int(tokenizer.vocab_size)
        self._m = _llg().LLMatcher(grammar_tokenizer(tokenizer), grammar, log_level=0)
        if self._m.is_error():
            raise GrammarError(f"the grammar does not compile: {self._m.get_error()}")
        self._bits = np.full((1, (self.vocab + 31) // 32), -1, dtype=np.int32)

    @property
    def inner(self) -> Any:
        return self._m

    def allowed(self) -> np.ndarray:
        self._m.unsafe_compute_mask_ptr(self._bits.ctypes.data, self._bits.nbytes)
        return bits_to_bool(self._bits[0], self.vocab)

    def consume(self, token: int) -> bool:
        """Advance past ``token``; False if the grammar does not allow it (then the matcher is
        in error and stays there)."""
        return bool(self._m.consume_token(token))

    @property
    def done(self) -> bool:
        return bool(self._m.is_stopped())

    @property
    def error(self) -> str | None:
        return str(self._m.get_error()) if self._m.is_error() else None


def bits_to_bool(bits: np.ndarray, vocab: int) -> np.ndarray:
    """A packed little-endian bitmask (int32 words) as a bool array of ``vocab`` entries."""
    return np.unpackbits(bits.view(np.uint8), bitorder="little")[:vocab].view(bool)


_EXECUTOR: Any = None


def fill_masks(matchers: Sequence[Matcher]) -> list[np.ndarray]:
    """The next-token masks of several matchers (of one vocabulary) in one parallel call."""
    global _EXECUTOR
    if not matchers:
        return []
    if len(matchers) == 1:
        return [matchers[0].allowed()]
    llg = _llg()
    if _EXECUTOR is None:
        _EXECUTOR = llg.LLExecutor()
    vocab = matchers[0].vocab
    words = (vocab + 31) // 32
    bits = np.full((len(matchers), words), -1, dtype=np.int32)
    _EXECUTOR.unsafe_compute_mask_ptr([(m.inner, i) for i, m in enumerate(matchers)],
                                      bits.ctypes.data, words * 4, len(matchers))
    return [bits_to_bool(bits[i], vocab) for i in range(len(matchers))]
