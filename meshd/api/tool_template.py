"""Tool calling through the model's own chat template. Pure: no I/O.

A chat template with tool syntax renders the request's ``tools`` itself and has its own call
syntax, which the model was trained on; meshd then uses it instead of its generic format
(meshd.api.tools, docs/api.md "Tools"). Two families are known:

- *hermes* (Qwen2.5's, Qwen3's, others in the Hermes style: ``TemplateFormat``): each call
  tagged, ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``, several a reply;
- *llama3* (Meta's Llama 3.1, 3.2 and 3.3 Instruct templates: ``JsonCallFormat``): the reply
  is one bare ``{"name": ..., "parameters": {...}}``; the template renders one call per
  assistant message (``check_calls``) and a tool's result in the ``ipython`` role.

- detection (``detect``): the template's source uses the ``tools`` variable inside a Jinja tag
  (``{% if tools %}``, ``{{ tools ... }}``) and writes a family's call syntax. For hermes the
  template renders a probe chat (one tool, one call of it, its result) and must list the tool
  inside ``<tools>...</tools>`` and write the call exactly as ``<tool_call>\\n{"name": ...,
  "arguments": {...}}\\n</tool_call>``: ``<tool_call>`` alone is no proof, GLM-4.x, MiniMax-M3,
  Qwen3-Coder and Qwen3.5 write other syntaxes inside it (``<arg_key>``, ``<function=...>``). For
  llama3 the source holds the ``ipython`` header and ``"parameters": ``. A template that uses
  tools in a syntax meshd does not know, or none, or fails on the probe, keeps the generic
  format;
- rendering (``template_messages``): the messages go to the template as Hugging Face's
  ``apply_chat_template`` takes them: an assistant's ``tool_calls`` with ``arguments`` as an
  object (OpenAI sends JSON text, which the template's ``tojson`` would quote), a tool message
  with its ``tool_call_id`` and ``name``; the tools as OpenAI sent them (``{"type": "function",
  "function": {...}}``), in their order;
- the reply is constrained by the family's grammar (``meshd.engine.constrain.
  tagged_tool_grammar``), the JSON spaced as the template's ``tojson`` writes it, the arguments
  valid against the tool's parameters; with ``auto`` it may be text that does not begin with
  the call's first character (``<``, ``{``);
- ``parse_reply`` turns the reply back into OpenAI's ``tool_calls``; ``split_calls`` gives the
  calls already whole and the text after them, so a stream sends each call as soon as it is
  whole, and a reply cut short after whole calls keeps its rest as text.

The response says which format was used: header ``x-meshd-tool-format: hermes`` or ``llama3``.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from meshd.api.errors import bad_request
from meshd.api.tools import call_arguments, tool_calls

# a Jinja tag ({% ... %} or {{ ... }}) that reads the variable ``tools``
_USES_TOOLS = re.compile(r"\{[{%][^}]*?\btools\b")

# the probe chat a template renders to show its tool syntax: one tool, one call of it, its result
_PROBE_NAME = "get_weather"
_PROBE_ARGS = {"city": "Paris"}


def _probe_chat() -> dict[str, Any]:
    tool = {"type": "function", "function": {
        "name": _PROBE_NAME, "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}}
    call = {"id": "call0", "type": "function",
            "function": {"name": _PROBE_NAME, "arguments": dict(_PROBE_ARGS)}}
    return {"tools": [tool], "messages": [
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call0", "name": _PROBE_NAME, "content": "sunny"}]}


@functools.lru_cache(maxsize=16)
def _probe(template: str) -> str | None:
    """The template's rendering of the probe chat (as the entry node renders a chat:
    meshd.engine.tokenizer), None if it does not compile or fails on it."""
    from meshd.engine.tokenizer import compile_template

    try:
        return str(compile_template(template).render(
            **_probe_chat(), add_generation_prompt=True, bos_token="", eos_token=""))
    except Exception:  # a template fails in any way (raise_exception, undefined, the sandbox)
        return None


def _lists(text: str, open_tag: str, close_tag: str, needle: str) -> bool:
    """Whether some ``open_tag ... close_tag`` span of ``text`` holds ``needle``."""
    start = text.find(open_tag)
    while start >= 0:
        end = text.find(close_tag, start + len(open_tag))
        if end < 0:
            return False
        if needle in text[start + len(open_tag):end]:
            return True
        start = text.find(open_tag, end)
    return False


@dataclass(frozen=True)
class TemplateFormat:
    """A family of chat templates whose calls are tagged: each call is ``open_tag`` +
    ``{"name": ..., "<args_key>": {...}}`` + ``close_tag``, several joined by ``separator``;
    the template lists the tools between ``tools_open`` and ``tools_close``."""

    name: str
    open_tag: str
    close_tag: str
    separator: str
    tools_open: str
    tools_close: str
    args_key: str = "arguments"
    calls_per_message: int | None = None  # the template renders any number

    def recognizes(self, template: str) -> bool:
        """Whether the template, rendering the probe chat, lists its tool between the tools
        tags and writes its call in exactly this syntax (JSON spaced as ``tojson`` writes it)."""
        out = _probe(template)
        if out is None:
            return False
        call = self.open_tag + json.dumps({"name": _PROBE_NAME, self.args_key: _PROBE_ARGS}) \
            + self.close_tag
        return call in out and _lists(out, self.tools_open, self.tools_close,
                                      json.dumps({"name": _PROBE_NAME})[1:-1])

    def grammar(self, functions: Sequence[Mapping[str, Any]], choice: str | None, *,
                parallel: bool, text: bool) -> str:
        from meshd.engine.constrain import tagged_tool_grammar

        return tagged_tool_grammar(functions, choice, parallel=parallel, text=text,
                                   open_tag=self.open_tag, close_tag=self.close_tag,
                                   separator=self.separator, args_key=self.args_key)

    def starts_call(self, text: str) -> bool | None:
        """Whether a reply that begins with ``text`` is a call (True), text (False), or not
        known yet (None: nothing but whitespace so far). The grammar's text cannot begin with
        the tag's first character."""
        stripped = text.lstrip()
        if not stripped:
            return None
        return stripped[0] == self.open_tag[0]

    def split_calls(self, text: str, rid: str, choice: int = 0
                    ) -> tuple[list[dict[str, Any]], str]:
        """The calls at the start of ``text`` whose closing tag has come (what a stream may
        send already, with the ids ``parse_reply`` gives them), and the text after the last."""
        opening, closing = self.open_tag.strip(), self.close_tag.strip()
        bodies: list[Any] = []
        pos = 0
        while True:
            start = len(text) - len(text[pos:].lstrip())
            end = text.find(closing, start + len(opening))
            if not text.startswith(opening, start) or end < 0:
                break
            try:
                bodies.append(json.loads(text[start + len(opening):end]))
            except ValueError:
                return [], text
            pos = end + len(closing)
        calls = tool_calls(bodies, self.args_key, rid, choice)
        return (calls, text[pos:]) if calls is not None else ([], text)

    def parse_reply(self, text: str, rid: str, choice: int = 0) -> list[dict[str, Any]] | None:
        """OpenAI ``tool_calls`` from a reply in this syntax, or None when the reply is text or
        a call cut short by max_tokens."""
        calls, rest = self.split_calls(text, rid, choice)
        return calls if calls and not rest.strip() else None


@dataclass(frozen=True)
class JsonCallFormat:
    """A family of chat templates whose call is the whole reply, one bare JSON object
    ``{"name": ..., "<args_key>": {...}}``; ``markers`` all in a template's source say it
    writes this syntax. The template renders one call per assistant message (more raise), so
    a reply holds one call whatever ``parallel_tool_calls`` says."""

    name: str
    markers: tuple[str, ...]
    args_key: str = "parameters"
    calls_per_message: int | None = 1

    def recognizes(self, template: str) -> bool:
        return all(m in template for m in self.markers)

    def grammar(self, functions: Sequence[Mapping[str, Any]], choice: str | None, *,
                parallel: bool, text: bool) -> str:
        from meshd.engine.constrain import tagged_tool_grammar

        return tagged_tool_grammar(functions, choice, parallel=False, text=text, open_tag="",
                                   close_tag="", separator="", args_key=self.args_key)

    def starts_call(self, text: str) -> bool | None:
        """As ``TemplateFormat.starts_call``: the grammar's text cannot begin with ``{``."""
        stripped = text.lstrip()
        if not stripped:
            return None
        return stripped[0] == "{"

    def split_calls(self, text: str, rid: str, choice: int = 0
                    ) -> tuple[list[dict[str, Any]], str]:
        """The call once its JSON object is whole (a stream may send it then), and the text
        after it."""
        stripped = text.lstrip()
        try:
            obj, end = json.JSONDecoder().raw_decode(stripped)
        except ValueError:
            return [], text
        calls = tool_calls([obj], self.args_key, rid, choice)
        return (calls, stripped[end:]) if calls else ([], text)

    def parse_reply(self, text: str, rid: str, choice: int = 0) -> list[dict[str, Any]] | None:
        calls, rest = self.split_calls(text, rid, choice)
        return calls if calls and not rest.strip() else None


# Qwen2.5's, QwQ's, Qwen3's (not Qwen3-Coder's or Qwen3.5's), NousResearch Hermes 2 Pro's and
# 3's, IBM Granite 4's: tools as JSON lines inside <tools></tools>, each call tagged
HERMES = TemplateFormat("hermes", open_tag="<tool_call>\n", close_tag="\n</tool_call>",
                        separator="\n", tools_open="<tools>", tools_close="</tools>")
# Meta's Llama 3.1, 3.2 and 3.3 Instruct templates: tools as JSON in the first user message,
# the call as {"name": ..., "parameters": ...}, tool results in the ipython role
LLAMA3 = JsonCallFormat("llama3", markers=("<|start_header_id|>ipython<|end_header_id|>",
                                           '"parameters": '))
FAMILIES: tuple[TemplateFormat | JsonCallFormat, ...] = (HERMES, LLAMA3)


def detect(template: str | None) -> TemplateFormat | JsonCallFormat | None:
    """The call syntax of a chat template that renders tools, None when it renders none (or in
    a syntax meshd does not know: the generic format serves then)."""
    if not template or not _USES_TOOLS.search(template):
        return None
    return next((f for f in FAMILIES if f.recognizes(template)), None)


def template_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The chat's messages as a chat template takes them (Hugging Face's convention): an
    assistant's calls with their arguments as objects, a tool message with its call's id and
    name."""
    out: list[dict[str, Any]] = []
    for m in messages:
        msg: dict[str, Any] = {"role": m["role"], "content": m.get("content") or ""}
        calls = m.get("tool_calls")
        if calls:
            msg["tool_calls"] = [
                {"id": str(c.get("id") or ""), "type": "function",
                 "function": {"name": c["function"]["name"],
                              "arguments": call_arguments(c["function"].get("arguments"))}}
                for c in calls]
        for key in ("tool_call_id", "name"):
            if isinstance(m.get(key), str):
                msg[key] = m[key]
        out.append(msg)
    return out


def carries_tools(messages: Sequence[Mapping[str, Any]]) -> bool:
    """Whether some message is a tool call or a tool's result."""
    return any(m.get("tool_calls") or m.get("role") == "tool" for m in messages)


def check_calls(family: TemplateFormat | JsonCallFormat, messages: Sequence[Mapping[str, Any]]
                ) -> None:
    """Refuse (400 naming the message) an assistant message with more calls than the
    family's template renders (llama3's raises on more than one)."""
    most = family.calls_per_message
    for i, m in enumerate(messages):
        calls = m.get("tool_calls") or ()
        if most is not None and len(calls) > most:
            raise bad_request(f"messages[{i}].tool_calls: the model's chat template "
                              f"({family.name}) renders at most {most} call per assistant "
                              f"message, this one has {len(calls)}", f"messages[{i}].tool_calls")
