"""Tools through the model's own chat template (meshd.api.tool_template): detection, the
prompt rendered byte for byte as Hugging Face's ``apply_chat_template`` renders it, the grammar
of the template's call syntax and its reply parsed back into OpenAI's ``tool_calls``.

The expected prompts (tests/engine/chat_templates.py) were rendered once with ``transformers``,
not by meshd.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from meshd.api import tool_template
from meshd.api.shapes import chat_call, wants_template
from meshd.api.tools import GENERIC
from meshd.core.request import parse_submit
from meshd.engine.manifest import TokenizerInfo
from meshd.engine.tokenizer import Tokenizer

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engine"))

from chat_templates import FIRST_PROMPT, LOOP, LOOP_PROMPT, QUESTION, QWEN25, TIME, WEATHER  # noqa: E402
from hf_fixtures import CHAT_TEMPLATE, make_tokenizer  # noqa: E402

from .helpers import grammar_accepts, stream_and_answer  # noqa: E402

SMOLLM2 = (  # SmolLM2-135M-Instruct's template: no tool syntax
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}")


@pytest.fixture(scope="module")
def qwen_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    make_tokenizer(path)
    return Tokenizer(path, TokenizerInfo("tokenizer.json", "", 0, (1,), "<s>", "</s>", QWEN25))


def body_of(messages: list[dict[str, Any]], **kw: Any) -> dict[str, Any]:
    return {"model": "qwen", "messages": messages, "tools": [WEATHER, TIME], **kw}


@pytest.mark.parametrize(("template", "family"), [
    (QWEN25, "hermes"),
    (SMOLLM2, None),
    (CHAT_TEMPLATE, None),
    (None, None),
    ("", None),
    # uses tools, in a syntax meshd does not know: the generic format serves
    ("{% if tools %}{{ tools | tojson }}{% endif %}{{ messages[0]['content'] }}", None),
    # writes <tool_call> only in a message's text, never reads tools
    ("{{ '<tool_call>' }}{% for m in messages %}{{ m.content }}{% endfor %}", None),
])
def test_detect_reads_the_template_source(template: str | None, family: str | None) -> None:
    found = tool_template.detect(template)
    assert (found.name if found is not None else None) == family


def test_the_first_turn_renders_as_hugging_face_renders_it(qwen_tokenizer: Tokenizer) -> None:
    call = chat_call(body_of([QUESTION], tool_choice="required"), QWEN25)
    assert call.tool_format.name == "hermes" and call.tools is not None
    req = parse_submit(call.fields, lambda: "r1")
    assert req.tools == (WEATHER, TIME)
    text = qwen_tokenizer.apply_chat_template(list(req.messages or ()), tools=req.tools)
    assert text == FIRST_PROMPT
    ids = qwen_tokenizer.encode_chat(list(req.messages or ()), tools=req.tools)
    assert ids == qwen_tokenizer.encode(FIRST_PROMPT, add_special_tokens=False)


def test_the_tool_loop_renders_as_hugging_face_renders_it(qwen_tokenizer: Tokenizer) -> None:
    """The assistant's calls (arguments sent as JSON text) and both tool results in the
    template's own markup, byte for byte."""
    call = chat_call(body_of(LOOP, tool_choice="auto"), QWEN25)
    req = parse_submit(call.fields, lambda: "r2")
    assert qwen_tokenizer.apply_chat_template(list(req.messages or ()), tools=req.tools) == \
        LOOP_PROMPT
    assert "cache" not in call.fields  # the grammar keeps it out of the cache already


def test_without_a_tool_template_the_generic_format_serves() -> None:
    for template in (SMOLLM2, None):
        call = chat_call(body_of(LOOP, tool_choice="auto"), template)
        assert call.tool_format is GENERIC and "tools" not in call.fields
        assert all(set(m) == {"role", "content"} for m in call.fields["messages"])
        assert '"tool_calls"' in call.fields["messages"][0]["content"]  # the generic preamble


def test_tool_choice_none_renders_the_loop_without_tools() -> None:
    call = chat_call(body_of(LOOP, tool_choice="none"), QWEN25)
    assert call.tools is None and "grammar" not in call.fields and "tools" not in call.fields
    assert call.fields["messages"][2]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"}
    assert call.fields["cache"] is False  # the cache's key would not hold the calls


def test_wants_template_only_for_tools_and_a_named_model() -> None:
    assert wants_template(body_of([QUESTION])) == "qwen"
    assert wants_template({"model": "qwen", "messages": LOOP}) == "qwen"
    assert wants_template({"model": "qwen", "messages": [QUESTION]}) is None
    assert wants_template(body_of([QUESTION], model="auto")) is None
    assert wants_template("junk") is None


ONE = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
TWO = ONE + '\n<tool_call>\n{"name": "get_time", "arguments": {"zone": "CET"}}\n</tool_call>'


@pytest.mark.parametrize(("choice", "parallel", "reply", "ok"), [
    ("required", True, ONE, True),
    ("required", True, TWO, True),
    ("required", False, TWO, False),  # one call only
    ("required", True, "It is sunny.", False),
    ("required", True, ONE.replace('": "', '":"'), False),  # spaced as tojson writes it
    ("required", True, ONE.replace('"Paris"}', '"Paris", "x": 1}'), False),  # closed arguments
    ("required", True, ONE.replace("Paris", "Oslo"), False),  # the parameters' enum
    ("required", True, ONE.replace("get_weather", "get_wind"), False),
    ({"type": "function", "function": {"name": "get_time"}}, True, ONE, False),
    ("auto", True, "It is sunny.", True),
    ("auto", True, ONE, True),
    ("auto", True, "<b>sunny</b>", False),  # text may not begin with the tag's "<"
    ("auto", True, " sunny", False),
])
def test_the_hermes_grammar(qwen_tokenizer: Tokenizer, choice: Any, parallel: bool, reply: str,
                            ok: bool) -> None:
    call = chat_call(body_of([QUESTION], tool_choice=choice, parallel_tool_calls=parallel), QWEN25)
    assert grammar_accepts(call.fields["grammar"], reply, qwen_tokenizer) is ok


def test_a_hermes_reply_becomes_tool_calls() -> None:
    fmt = tool_template.HERMES
    calls = fmt.parse_reply(TWO + "\n" + ONE, "r9")
    assert calls == [  # the repeated call once
        {"id": "call_r9_0_0", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
        {"id": "call_r9_0_1", "type": "function",
         "function": {"name": "get_time", "arguments": '{"zone": "CET"}'}}]
    assert fmt.parse_reply("It is sunny.", "r9") is None
    assert fmt.parse_reply(ONE[:30], "r9") is None  # cut short by max_tokens
    assert fmt.parse_reply(ONE + "\nand more", "r9") is None
    # a stream sends each call once its closing tag has come; the rest follows as text
    assert fmt.split_calls(ONE[:-3], "r9") == ([], ONE[:-3])
    done, rest = fmt.split_calls(TWO[:-2], "r9")
    assert [c["function"]["name"] for c in done] == ["get_weather"] and rest == TWO[len(ONE):-2]
    assert fmt.split_calls(TWO, "r9", 1)[0][1]["id"] == "call_r9_1_1"
    assert fmt.split_calls(ONE.replace("}}", "}"), "r9") == ([], ONE.replace("}}", "}"))
    assert (fmt.starts_call(""), fmt.starts_call(" \n"), fmt.starts_call("<"),
            fmt.starts_call("It")) == (None, None, True, False)
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Paris"}


@pytest.mark.parametrize(("schema", "expected"), [
    ({"type": "integer"}, {"type": "integer", "minimum": -(2**53 - 1), "maximum": 2**53 - 1}),
    ({"type": "integer", "minimum": 0}, {"type": "integer", "minimum": 0, "maximum": 2**53 - 1}),
    ({"type": "integer", "exclusiveMaximum": 5},
     {"type": "integer", "exclusiveMaximum": 5, "minimum": -(2**53 - 1)}),
    ({"type": "integer", "minimum": 2**60}, {"type": "integer", "minimum": 2**60}),
    ({"type": "number"}, {"type": "number"}),
    ({"enum": [1, 2]}, {"enum": [1, 2]}),
    ({"type": "object", "properties": {"n": {"type": "integer"}, "e": {"const": {"type": "integer"}}}},
     {"type": "object", "properties": {"n": {"type": "integer", "minimum": -(2**53 - 1),
                                             "maximum": 2**53 - 1},
                                       "e": {"const": {"type": "integer"}}}}),
])
def test_tool_arguments_keep_integers_to_16_digits(schema: Any, expected: Any) -> None:
    from meshd.engine.constrain import bounded

    assert bounded(schema) == expected


def test_a_runaway_integer_cannot_fill_the_budget(qwen_tokenizer: Tokenizer) -> None:
    """SmolLM2 greedy writes "minutes": 1000... until max_tokens: the grammar stops it."""
    timer = {"type": "function", "function": {"name": "set_timer", "parameters": {
        "type": "object", "properties": {"minutes": {"type": "integer"}}}}}
    for template in (QWEN25, None):
        grammar = chat_call({"model": "m", "messages": [QUESTION], "tools": [timer],
                             "tool_choice": "required"}, template).fields["grammar"]
        for digits, ok in ((16, True), (17, False)):
            n = "1" + "0" * (digits - 1)
            reply = (f'<tool_call>\n{{"name": "set_timer", "arguments": {{"minutes": {n}}}}}'
                     f'\n</tool_call>' if template else
                     f'{{"tool_calls":[{{"name":"set_timer","arguments":{{"minutes":{n}}}}}]}}')
            assert grammar_accepts(grammar, reply, qwen_tokenizer) is ok


def test_a_stream_sends_each_call_once_its_tag_closes(tmp_path: Path) -> None:
    """On a fake node whose model carries QWEN25 and answers two hermes calls token by token:
    the first call's delta goes out before the second call's text has come."""
    import httpx

    from meshd.testing.fake_entry import FakeChain, FakeModel, FakeNode

    from .helpers import run

    pieces = tuple(ONE) + ("\n",) + tuple(TWO[len(ONE) + 1:])
    model = FakeModel("qwen", context_length=4096, facts={"chat_template": QWEN25}, reply=pieces)
    node = FakeNode(FakeChain(models_served={"qwen": model}))
    seen: list[tuple[int, list[Any]]] = []

    async def body(c: httpx.AsyncClient, key: str) -> None:
        req = {**body_of([QUESTION]), "stream": True, "max_tokens": 400}
        async with c.stream("POST", "/v1/chat/completions", json=req,
                            headers={"authorization": f"Bearer {key}"}) as r:
            assert r.headers["x-meshd-tool-format"] == "hermes"
            async for line in r.aiter_lines():
                if line.startswith("data: {"):
                    ch = json.loads(line[6:])
                    for choice in ch["choices"]:
                        calls = choice["delta"].get("tool_calls")
                        if calls or choice["finish_reason"]:
                            seen.append((node.entry.steps, calls or choice["finish_reason"]))

    run(tmp_path, node, body)
    (first_at, first), (second_at, second), (_, finish) = seen
    assert [c["index"] for c in first] == [0] and [c["index"] for c in second] == [1]
    assert first[0]["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    assert second[0]["function"]["name"] == "get_time" and finish == "tool_calls"
    assert first_at < len(pieces) == second_at  # the first went out before the reply ended


def test_a_stream_cut_by_max_tokens_after_a_call_keeps_the_rest(tmp_path: Path) -> None:
    """Two hermes calls, the second cut short by max_tokens: the first call went out whole,
    and the rest of the reply follows as content (it was dropped), as in the answer not
    streamed: the whole call, the rest as content, finish_reason length."""
    cut = TWO[:len(ONE) + 30]
    pieces = tuple(cut)
    _, deltas, answer = stream_and_answer(tmp_path, QWEN25, pieces,
                                          {**body_of([QUESTION]), "max_tokens": len(pieces)})
    calls = [c for d in deltas for c in d.get("tool_calls") or []]
    text = "".join(d.get("content") or "" for d in deltas)
    assert [c["function"]["name"] for c in calls] == ["get_weather"]
    assert text == cut[len(ONE):] and deltas[-1]["finish_reason"] == "length"
    message = answer["choices"][0]["message"]
    assert [c["function"] for c in message["tool_calls"]] == [c["function"] for c in calls]
    assert message["content"] == text and answer["choices"][0]["finish_reason"] == "length"
