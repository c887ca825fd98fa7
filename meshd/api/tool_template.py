"""Tool calling through the model's own chat template. Pure: no I/O.

A chat template with tool syntax (Qwen2.5's, Qwen3's, others in the Hermes style: the *hermes*
family) renders the request's ``tools`` itself and has its own call syntax, which the model was
trained on; meshd then uses it instead of its generic format (meshd.api.tools, docs/api.md "Tools"):

- detection (``detect``): the template's source uses the ``tools`` variable inside a Jinja tag
  (``{% if tools %}``, ``{{ tools ... }}``) and writes a family's call markup (``<tool_call>``
  for hermes). A template that uses tools in a syntax meshd does not know, or none, keeps the
  generic format;
- rendering (``template_messages``): the messages go to the template as Hugging Face's
  ``apply_chat_template`` takes them: an assistant's ``tool_calls`` with ``arguments`` as an
  object (OpenAI sends JSON text, which the template's ``tojson`` would quote), a tool message
  with its ``tool_call_id`` and ``name``; the tools as OpenAI sent them (``{"type": "function",
  "function": {...}}``), in their order;
- the reply is constrained by the family's grammar (``meshd.engine.constrain.
  tagged_tool_grammar``): ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``,
  the JSON spaced as the template's ``tojson`` writes it, the arguments valid against the
  tool's parameters; with ``auto`` it may be text that does not begin with ``<``;
- ``parse_reply`` turns the reply back into OpenAI's ``tool_calls``; ``closed_calls`` gives the
  calls whose closing tag has come, so a stream sends each call as soon as it is whole.

The response says which format was used: header ``x-meshd-tool-format: hermes``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from meshd.api.tools import call_arguments

# a Jinja tag ({% ... %} or {{ ... }}) that reads the variable ``tools``
_USES_TOOLS = re.compile(r"\{[{%][^}]*?\btools\b")


@dataclass(frozen=True)
class TemplateFormat:
    """A family of chat templates' call syntax: each call is ``open_tag`` + ``{"name": ...,
    "<args_key>": {...}}`` + ``close_tag``, several joined by ``separator``; ``marker`` in a
    template's source says it writes this syntax."""

    name: str
    marker: str
    open_tag: str
    close_tag: str
    separator: str
    args_key: str = "arguments"

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

    def _bodies(self, text: str) -> tuple[list[str], str]:
        """The JSON of each call whose closing tag has come, and what follows the last."""
        bodies = []
        rest = text.lstrip()
        while rest.startswith(self.open_tag.strip()):
            end = rest.find(self.close_tag.strip())
            if end < 0:
                break
            bodies.append(rest[len(self.open_tag.strip()):end].strip())
            rest = rest[end + len(self.close_tag.strip()):].lstrip()
        return bodies, rest

    def _calls(self, bodies: Sequence[str], rid: str, choice: int) -> list[dict[str, Any]] | None:
        out: list[dict[str, Any]] = []
        seen: set[tuple[str, str]] = set()
        for body in bodies:
            try:
                obj = json.loads(body)
            except ValueError:
                return None
            if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
                return None
            args = json.dumps(obj.get(self.args_key, {}), ensure_ascii=False)
            if (obj["name"], args) in seen:  # a small model may repeat a call: once is enough
                continue
            seen.add((obj["name"], args))
            out.append({"id": f"call_{rid}_{choice}_{len(out)}", "type": "function",
                        "function": {"name": obj["name"], "arguments": args}})
        return out

    def closed_calls(self, text: str, rid: str, choice: int = 0) -> list[dict[str, Any]]:
        """The calls of a reply that begins with ``text`` whose closing tag has come (what a
        stream may send already), with the ids ``parse_reply`` gives them."""
        bodies, _ = self._bodies(text)
        return self._calls(bodies, rid, choice) or []

    def parse_reply(self, text: str, rid: str, choice: int = 0) -> list[dict[str, Any]] | None:
        """OpenAI ``tool_calls`` from a reply in this syntax (ids ``call_<request id>_<choice>_
        <k>``, arguments as JSON text), or None when the reply is text or a call cut short by
        max_tokens."""
        bodies, rest = self._bodies(text)
        if not bodies or rest:
            return None
        return self._calls(bodies, rid, choice) or None


HERMES = TemplateFormat("hermes", marker="<tool_call>", open_tag="<tool_call>\n",
                        close_tag="\n</tool_call>", separator="\n")
FAMILIES = (HERMES,)


def detect(template: str | None) -> TemplateFormat | None:
    """The call syntax of a chat template that renders tools, None when it renders none (or in
    a syntax meshd does not know: the generic format serves then)."""
    if not template or not _USES_TOOLS.search(template):
        return None
    return next((f for f in FAMILIES if f.marker in template), None)


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
