"""OpenAI tool calling: the request's tools, and meshd's generic format. Pure: no I/O.

A chat template with tool syntax renders the tools itself (``meshd.api.tool_template``: it
wins whenever the template is one meshd knows). A chat template without tool syntax (SmolLM2's and Gemma 3's ChatML-like templates have none)
cannot render ``tools``, so meshd renders them itself, for any model, as plain messages the
template does render (docs/api.md, "Tools"):

- a system message lists the tools (name, description, parameter schema as JSON) and asks for
  the reply ``{"tool_calls": [{"name": ..., "arguments": {...}}]}`` to call them (appended to
  the request's own system message when it has one);
- an assistant message that called tools becomes ``I called <name> <arguments as JSON>.``
  (calls joined by ``; ``): in words, not as the JSON object, which a small model then copies
  instead of answering;
- a ``tool`` message becomes a user message: ``<name> returned: <content>``.

(SmolLM2-135M-Instruct, asked about the weather with the answer rendered this way, answers "I
returned 18 degrees Celsius and a sunny day."; with the call rendered as JSON it repeats the
call.)

The reply is constrained by a grammar (``meshd.engine.constrain.tool_grammar``): with
``tool_choice`` ``required`` or a named function it is such an object, with every call's
arguments valid against the function's parameter schema; with ``auto`` it is either that object
or text that does not begin with ``{``. ``parse_reply`` turns a reply into OpenAI's
``tool_calls``. The response says the format was used: header ``x-meshd-tool-format: generic``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from meshd.api.errors import bad_request, unsupported

FORMAT = "generic"
MAX_TOOLS = 128


@dataclass(frozen=True)
class ToolSpec:
    """The request's tools (their ``function`` objects), the choice and whether several calls
    may come in one reply. ``choice``: "none", "auto", "required" or a function's name."""

    functions: tuple[Mapping[str, Any], ...]
    choice: str
    parallel: bool = True
    tools: tuple[Mapping[str, Any], ...] = ()  # as the request sent them, for a chat template

    @property
    def active(self) -> bool:
        return bool(self.functions) and self.choice != "none"

    @property
    def forced(self) -> bool:
        """The reply must be a tool call (required or a named function)."""
        return self.active and self.choice != "auto"

    @property
    def named(self) -> str | None:
        return self.choice if self.choice not in ("none", "auto", "required") else None


class ToolFormat(Protocol):
    """How a reply's tool calls are written: meshd's generic format (``GENERIC``) or a chat
    template's own syntax (``meshd.api.tool_template``). ``split_calls``: the calls at the
    start of a reply that are whole already and the text after them (a stream sends each call
    once whole; a reply cut short keeps its rest as text); ``parse_reply``: the calls of a
    whole reply, None when it is text or cut short."""

    @property
    def name(self) -> str: ...

    def grammar(self, functions: Sequence[Mapping[str, Any]], choice: str | None, *,
                parallel: bool, text: bool) -> str: ...

    def starts_call(self, text: str) -> bool | None: ...

    def split_calls(self, text: str, rid: str, choice: int = 0
                    ) -> tuple[list[dict[str, Any]], str]: ...

    def parse_reply(self, text: str, rid: str, choice: int = 0) -> list[dict[str, Any]] | None: ...


class GenericFormat:
    """meshd's generic format as a ``ToolFormat`` (this module's functions)."""

    name = FORMAT

    def grammar(self, functions: Sequence[Mapping[str, Any]], choice: str | None, *,
                parallel: bool, text: bool) -> str:
        from meshd.engine.constrain import tool_grammar

        return tool_grammar(functions, choice, parallel=parallel, text=text)

    def starts_call(self, text: str) -> bool | None:
        return starts_call(text)

    def split_calls(self, text: str, rid: str, choice: int = 0
                    ) -> tuple[list[dict[str, Any]], str]:
        return [], text  # one JSON object: whole only at the end

    def parse_reply(self, text: str, rid: str, choice: int = 0) -> list[dict[str, Any]] | None:
        return parse_reply(text, rid, choice)


GENERIC = GenericFormat()


def parse_tools(body: Mapping[str, Any]) -> ToolSpec | None:
    """``tools``, ``tool_choice`` and ``parallel_tool_calls`` of a chat request, checked (400s
    name the field); None when the request has no tools."""
    tools = body.get("tools")
    choice = body.get("tool_choice")
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise bad_request("parallel_tool_calls must be true or false", "parallel_tool_calls")
    if tools is None:
        if choice not in (None, "none"):
            raise bad_request("tool_choice needs tools", "tool_choice")
        return None
    if not isinstance(tools, list) or len(tools) > MAX_TOOLS:
        raise bad_request(f"tools must be a list of at most {MAX_TOOLS} tools", "tools")
    functions = []
    sent = []
    names = set()
    for i, t in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(t, dict) or t.get("type") != "function":
            raise unsupported(f"{where}.type", "only function tools ({\"type\": \"function\"}) "
                              "are supported by meshd")
        fn = t.get("function")
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise bad_request(f"{where}.function must be an object with a name", f"{where}.function")
        params = fn.get("parameters")
        if params is not None and not isinstance(params, dict):
            raise bad_request(f"{where}.function.parameters must be a JSON schema object",
                              f"{where}.function.parameters")
        if fn["name"] in names:
            raise bad_request(f"{where}: two tools are named {fn['name']!r}", where)
        names.add(fn["name"])
        functions.append({k: fn[k] for k in ("name", "description", "parameters") if k in fn})
        sent.append(t)
    if choice is None:
        choice = "auto" if functions else "none"
    if isinstance(choice, dict):
        fn = choice.get("function")
        if choice.get("type") != "function" or not isinstance(fn, dict) or \
                not isinstance(fn.get("name"), str):
            raise bad_request("tool_choice must be none, auto, required or "
                              "{\"type\": \"function\", \"function\": {\"name\": ...}}", "tool_choice")
        choice = fn["name"]
        if choice not in names:
            raise bad_request(f"tool_choice names {choice!r}, which is not among the tools",
                              "tool_choice")
    elif choice not in ("none", "auto", "required"):
        raise bad_request("tool_choice must be none, auto, required or a named function",
                          "tool_choice")
    if choice in ("auto", "required") and not functions:
        raise bad_request(f"tool_choice {choice!r} needs at least one tool", "tool_choice")
    return ToolSpec(tuple(functions), str(choice), parallel is not False, tuple(sent))


def preamble(spec: ToolSpec) -> str:
    """The system text that lists the tools and says how to call them."""
    listed = spec.functions if spec.named is None else [
        f for f in spec.functions if f["name"] == spec.named]
    tools = json.dumps(list(listed), ensure_ascii=False)
    form = '{"tool_calls": [{"name": "<tool name>", "arguments": {<arguments>}}]}'
    if spec.named is not None:
        ask = f"Call the tool {spec.named}: reply with only a JSON object {form}."
    elif spec.choice == "required":
        ask = f"Call one or more of the tools: reply with only a JSON object {form}."
    else:
        ask = (f"To call tools, reply with only a JSON object {form}. To answer without a "
               f"tool, reply with plain text.")
    return f"You can use these tools (JSON schemas of their arguments):\n{tools}\n{ask}"


def render_messages(messages: Sequence[Mapping[str, Any]], spec: ToolSpec | None
                    ) -> list[dict[str, str]]:
    """The chat's messages as plain ``{role, content}`` messages in the generic format: tool
    calls and tool results rendered as text, the tools' preamble in the system message."""
    names: dict[str, str] = {}
    out: list[dict[str, str]] = []
    for m in messages:
        role, content = m["role"], m.get("content") or ""
        calls = m.get("tool_calls")
        if role == "assistant" and calls:
            said = "; ".join(
                f"{c['function']['name']} " + json.dumps(call_arguments(c["function"].get("arguments")),
                                                         ensure_ascii=False, separators=(",", ":"))
                for c in calls)
            for c in calls:
                names[str(c.get("id"))] = c["function"]["name"]
            text = f"I called {said}."
            out.append({"role": "assistant", "content": f"{content}\n{text}" if content else text})
        elif role == "tool":
            cid = str(m.get("tool_call_id") or "")
            name = m.get("name") or names.get(cid, "the tool")
            out.append({"role": "user", "content": f"{name} returned: {content}"})
        else:
            out.append({"role": role, "content": content})
    if spec is not None and spec.active:
        text = preamble(spec)
        if out and out[0]["role"] in ("system", "developer"):
            out[0] = {"role": out[0]["role"], "content": f"{out[0]['content']}\n\n{text}"}
        else:
            out.insert(0, {"role": "system", "content": text})
    return out


def call_arguments(raw: Any) -> Any:
    """A call's ``arguments`` as an object: OpenAI sends them as JSON text (kept as text if it
    does not parse), a missing one is ``{}``."""
    if isinstance(raw, str):
        try:
            return json.loads(raw)
        except ValueError:
            return raw
    return raw if raw is not None else {}


def parse_reply(text: str, rid: str, choice: int = 0) -> list[dict[str, Any]] | None:
    """OpenAI ``tool_calls`` from a reply in the generic format, or None when the reply is text
    (or a call cut short by max_tokens, which does not parse). Each call has an id
    (``call_<request id>_<choice>_<k>``), type ``function``, and ``arguments`` as JSON text."""
    stripped = text.strip()
    if not stripped.startswith("{"):
        return None
    try:
        obj = json.loads(stripped)
    except ValueError:
        return None
    calls = obj.get("tool_calls") if isinstance(obj, dict) else None
    if not isinstance(calls, list) or not calls:
        return None
    return tool_calls(calls, "arguments", rid, choice)


def tool_calls(objs: Sequence[Any], args_key: str, rid: str, choice: int
               ) -> list[dict[str, Any]] | None:
    """OpenAI ``tool_calls`` of parsed calls ``{"name": ..., <args_key>: {...}}`` (ids
    ``call_<request id>_<choice>_<k>``, arguments as JSON text), an identical call repeated
    once; None if one is not such an object."""
    out: list[dict[str, Any]] = []
    seen: set[tuple[str, str]] = set()
    for obj in objs:
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            return None
        args = json.dumps(obj.get(args_key, {}), ensure_ascii=False)
        if (obj["name"], args) in seen:  # a small model may repeat a call: once is enough
            continue
        seen.add((obj["name"], args))
        out.append({"id": f"call_{rid}_{choice}_{len(out)}", "type": "function",
                    "function": {"name": obj["name"], "arguments": args}})
    return out


def starts_call(text: str) -> bool | None:
    """Whether a reply that begins with ``text`` is a tool call (True), text (False), or not
    known yet (None: only whitespace so far)."""
    stripped = text.lstrip()
    if not stripped:
        return None
    return stripped.startswith("{")
