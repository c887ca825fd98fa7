"""Tools through Llama 3.x's own chat template (meshd.api.tool_template, the llama3 family):
detection, the prompt rendered byte for byte as Hugging Face's ``apply_chat_template`` renders
it, the grammar of a bare JSON call and its reply parsed back into OpenAI's ``tool_calls``.

The template is Llama 3.2 Instruct's (tests/engine/chat_templates.py); the expected prompts were
rendered once with ``transformers``, not by meshd.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from meshd.api import tool_template
from meshd.api.errors import ApiError
from meshd.api.shapes import chat_call
from meshd.core.request import parse_submit
from meshd.engine.manifest import TokenizerInfo
from meshd.engine.tokenizer import Tokenizer

from .helpers import grammar_accepts, stream_and_answer

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engine"))

from chat_templates import (  # noqa: E402
    LLAMA32,
    LLAMA_FIRST_PROMPT,
    LLAMA_LOOP,
    LLAMA_LOOP_PROMPT,
    QUESTION,
    QWEN25,
    TIME,
    WEATHER,
    dated,
)
from hf_fixtures import make_tokenizer  # noqa: E402

LLAMA3 = tool_template.LLAMA3
CALL = '{"name": "get_weather", "parameters": {"city": "Paris"}}'


@pytest.fixture(scope="module")
def llama_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    make_tokenizer(path)
    return Tokenizer(path, TokenizerInfo("tokenizer.json", "", 0, (1,), "<|begin_of_text|>",
                                         "<|eot_id|>", LLAMA32))


def body_of(messages: list[dict[str, Any]], **kw: Any) -> dict[str, Any]:
    return {"model": "llama", "messages": messages, "tools": [WEATHER, TIME], **kw}


def test_detect_knows_the_llama3_family() -> None:
    assert tool_template.detect(LLAMA32) is LLAMA3
    assert tool_template.detect(QWEN25) is tool_template.HERMES
    # the Llama 3 header without the JSON call syntax, or the call without reading tools
    assert tool_template.detect("{% if tools %}{{ tools | tojson }}{% endif %}"
                                "<|start_header_id|>ipython<|end_header_id|>") is None
    assert tool_template.detect(LLAMA32.replace("tools", "tool_list")) is None


def test_the_first_turn_renders_as_hugging_face_renders_it(llama_tokenizer: Tokenizer) -> None:
    call = chat_call(body_of([QUESTION], tool_choice="required"), LLAMA32)
    assert call.tool_format is LLAMA3 and call.tools is not None
    req = parse_submit(call.fields, lambda: "r1")
    assert req.tools == (WEATHER, TIME)
    text = llama_tokenizer.apply_chat_template(list(req.messages or ()), tools=req.tools)
    assert text == dated(LLAMA_FIRST_PROMPT)


def test_the_tool_loop_renders_as_hugging_face_renders_it(llama_tokenizer: Tokenizer) -> None:
    """The assistant's call (arguments sent as JSON text) as the template's bare JSON, the
    tool's result in the ipython role, byte for byte."""
    call = chat_call(body_of(LLAMA_LOOP, tool_choice="auto"), LLAMA32)
    req = parse_submit(call.fields, lambda: "r2")
    assert llama_tokenizer.apply_chat_template(list(req.messages or ()), tools=req.tools) == \
        dated(LLAMA_LOOP_PROMPT)


def test_two_calls_in_one_message_are_refused_with_the_message_named() -> None:
    """The template renders one call per assistant message (it raises on more): a clear 400
    at the API instead of the template's error at the serving node."""
    two = [dict(m) for m in LLAMA_LOOP]
    two[2] = {**two[2], "tool_calls": [*two[2]["tool_calls"], {
        "id": "call_2", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}]}
    with pytest.raises(ApiError) as e:
        chat_call(body_of(two, tool_choice="auto"), LLAMA32)
    assert e.value.status == 400 and e.value.param == "messages[2].tool_calls"
    assert "at most 1 call" in str(e.value)
    assert chat_call(body_of(two, tool_choice="auto"), QWEN25).tool_format.name == "hermes"


@pytest.mark.parametrize(("choice", "parallel", "reply", "ok"), [
    ("required", True, CALL, True),
    ("required", True, '{"name": "get_time", "parameters": {}}', True),
    ("required", True, CALL + "; " + CALL, False),  # one call, parallel or not
    ("required", True, CALL + "\n" + CALL, False),
    ("required", True, "It is sunny.", False),
    ("required", True, CALL.replace('": "', '":"'), False),  # spaced as tojson writes it
    ("required", True, CALL.replace("parameters", "arguments"), False),
    ("required", True, CALL.replace('"Paris"}', '"Paris", "x": 1}'), False),  # closed
    ("required", True, CALL.replace("Paris", "Oslo"), False),  # the parameters' enum
    ("required", True, "<tool_call>\n" + CALL + "\n</tool_call>", False),
    ({"type": "function", "function": {"name": "get_time"}}, True, CALL, False),
    ("auto", True, "It is sunny.", True),
    ("auto", False, CALL, True),
    ("auto", True, "{sunny}", False),  # text may not begin with the call's "{"
    ("auto", True, " sunny", False),
])
def test_the_llama3_grammar(llama_tokenizer: Tokenizer, choice: Any, parallel: bool, reply: str,
                            ok: bool) -> None:
    call = chat_call(body_of([QUESTION], tool_choice=choice, parallel_tool_calls=parallel),
                     LLAMA32)
    assert grammar_accepts(call.fields["grammar"], reply, llama_tokenizer) is ok


def test_a_llama3_reply_becomes_tool_calls() -> None:
    assert LLAMA3.parse_reply(CALL, "r9") == [
        {"id": "call_r9_0_0", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]
    assert LLAMA3.parse_reply("\n" + CALL + "\n", "r9", 2)[0]["id"] == "call_r9_2_0"  # type: ignore[index]
    assert LLAMA3.parse_reply("It is sunny.", "r9") is None
    assert LLAMA3.parse_reply(CALL[:30], "r9") is None  # cut short by max_tokens
    assert LLAMA3.parse_reply(CALL + " and more", "r9") is None
    assert LLAMA3.parse_reply('{"city": "Paris"}', "r9") is None  # not a call
    assert LLAMA3.parse_reply("[1]", "r9") is None
    # a stream sends the call once its object is whole; what follows stays text
    assert LLAMA3.split_calls(CALL[:-1], "r9") == ([], CALL[:-1])
    done, rest = LLAMA3.split_calls(CALL + " and", "r9")
    assert [c["function"]["name"] for c in done] == ["get_weather"] and rest == " and"
    assert (LLAMA3.starts_call(""), LLAMA3.starts_call(" \n"), LLAMA3.starts_call("{"),
            LLAMA3.starts_call("It")) == (None, None, True, False)
    assert json.loads(done[0]["function"]["arguments"]) == {"city": "Paris"}


def test_a_llama3_call_streams_as_an_openai_delta(tmp_path: Path) -> None:
    """On a fake node whose model carries LLAMA32 and answers the call token by token: one
    tool_calls delta with the whole call, finish_reason tool_calls, as the answer not
    streamed; the header names the format."""
    headers, deltas, answer = stream_and_answer(
        tmp_path, LLAMA32, tuple(CALL), body_of([QUESTION], tool_choice="required", max_tokens=400))
    assert headers["x-meshd-tool-format"] == "llama3"
    calls = [c for d in deltas for c in d.get("tool_calls") or []]
    assert len(calls) == 1 and calls[0]["index"] == 0
    assert calls[0]["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    assert not any(d.get("content") for d in deltas)
    assert deltas[-1]["finish_reason"] == "tool_calls"
    message = answer["choices"][0]["message"]
    assert message["content"] is None
    assert [c["function"] for c in message["tool_calls"]] == [calls[0]["function"]]


def test_a_llama3_call_cut_short_is_text(tmp_path: Path) -> None:
    _, deltas, answer = stream_and_answer(tmp_path, LLAMA32, tuple(CALL[:30]),
                                          body_of([QUESTION], max_tokens=30))
    assert not any(d.get("tool_calls") for d in deltas)
    assert "".join(d.get("content") or "" for d in deltas) == CALL[:30]
    assert deltas[-1]["finish_reason"] == "length"
    choice = answer["choices"][0]
    assert (choice["message"]["content"], choice["finish_reason"]) == (CALL[:30], "length")
