"""OpenAI request bodies to SUBMIT fields: what is passed on, what is refused and why."""

from __future__ import annotations

from typing import Any

import pytest

from meshd.api.errors import ApiError
from meshd.api.shapes import chat_call, completion_call
from meshd.core.request import parse_submit

MSG = [{"role": "user", "content": "hi"}]


def chat(**kw: Any) -> dict[str, Any]:
    return {"model": "tiny", "messages": MSG, **kw}


def test_a_plain_chat_becomes_submit_fields_parse_submit_accepts() -> None:
    call = chat_call(chat(max_tokens=5, temperature=0, top_p=0.9, seed=3, stop="\n"))
    assert call.kind == "chat" and not call.stream
    assert call.fields == {"model": "tiny", "origin": "http", "messages": MSG, "max_tokens": 5,
                           "temperature": 0, "top_p": 0.9, "seed": 3, "stop": ["\n"]}
    req = parse_submit({**call.fields, "client": "alice"}, lambda: "r1")
    assert req.messages == tuple(MSG) and req.client == "alice" and req.origin == "http"
    assert req.sampling.stop == ("\n",) and req.max_tokens == 5


@pytest.mark.parametrize(("body", "param"), [
    (chat(n=9), "n"),
    (chat(functions=[]), "functions"),
    (chat(tools=[{"type": "web_search"}]), "tools[0].type"),
    (chat(store=True), "store"),
    (chat(modalities=["text", "audio"]), "modalities"),
    (chat(stream=True, stream_options={"include_obfuscation": True}), "stream_options.include_obfuscation"),
    (chat(messages=[{"role": "user", "content": "x", "name": "bob"}]), "messages[0].name"),
    (chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]),
     "messages[0].content[0]"),
])
def test_a_field_meshd_cannot_honour_is_a_400_naming_it(body: dict[str, Any], param: str) -> None:
    with pytest.raises(ApiError) as e:
        chat_call(body)
    assert e.value.status == 400 and e.value.param == param
    assert e.value.code == "unsupported_parameter"
    assert param in e.value.message


@pytest.mark.parametrize("body", [
    chat(n=1), chat(logprobs=False), chat(presence_penalty=0), chat(frequency_penalty=0.0),
    chat(tool_choice="none"),
    chat(logit_bias={}), chat(response_format={"type": "text"}), chat(user="u-1"), chat(store=False),
    chat(n=None, logprobs=None, stop=None, max_tokens=None),
])
def test_openais_neutral_values_are_accepted(body: dict[str, Any]) -> None:
    assert chat_call(body).fields["messages"] == MSG


@pytest.mark.parametrize(("body", "param"), [
    ({"messages": MSG}, "model"),
    (chat(messages=[]), "messages"),
    (chat(messages="hi"), "messages"),
    (chat(messages=[{"role": "user", "content": 3}]), "messages[0].content"),
    (chat(stream="yes"), "stream"),
    (chat(stream_options={"include_usage": True}), "stream_options"),
    (chat(temperature=2.5), "temperature"),
    (chat(max_tokens=4, max_completion_tokens=5), "max_completion_tokens"),
    (chat(n=0), "n"),
    (chat(top_logprobs=2), "top_logprobs"),
    (chat(logprobs=True, top_logprobs=21), "top_logprobs"),
    (chat(logit_bias={"x": 1}), "logit_bias"),
    (chat(logit_bias={"5": 101}), "logit_bias"),
    (chat(presence_penalty=3), "presence_penalty"),
    (chat(stop=["a", "b", "c", "d", "e"]), "stop"),
    (chat(tools=[{"type": "function"}]), "tools[0].function"),
    (chat(tool_choice="auto"), "tool_choice"),
    (chat(tools=[{"type": "function", "function": {"name": "f"}}],
          tool_choice={"type": "function", "function": {"name": "g"}}), "tool_choice"),
    (chat(response_format={"type": "xml"}), "response_format"),
    (chat(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object", "if": {"required": ["a"]}, "then": {}}}}),
     "response_format.json_schema.schema"),
    (chat(messages=[{"role": "tool", "content": "sunny"}]), "messages[0].tool_call_id"),
])
def test_a_bad_value_is_a_400_naming_the_field(body: Any, param: str) -> None:
    with pytest.raises(ApiError) as e:
        chat_call(body)
    assert (e.value.status, e.value.param) == (400, param)


def test_a_body_that_is_not_an_object_is_a_400() -> None:
    with pytest.raises(ApiError) as e:
        chat_call([1, 2])
    assert e.value.status == 400


def test_max_completion_tokens_and_the_legacy_max_tokens_mean_the_same() -> None:
    assert chat_call(chat(max_completion_tokens=7)).fields["max_tokens"] == 7
    assert chat_call(chat(max_completion_tokens=7)).params["max_tokens"] == "max_completion_tokens"
    assert chat_call(chat(max_tokens=7, max_completion_tokens=7)).fields["max_tokens"] == 7
    assert "max_tokens" not in chat_call(chat()).fields  # the chain's default, clamped to the model


def test_stream_options_include_usage() -> None:
    call = chat_call(chat(stream=True, stream_options={"include_usage": True}))
    assert call.stream and call.include_usage


def test_text_parts_are_joined() -> None:
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    call = chat_call(chat(messages=[{"role": "user", "content": parts}]))
    assert call.fields["messages"] == [{"role": "user", "content": "ab"}]


def test_extensions_pass_through() -> None:
    call = chat_call(chat(top_k=5, repetition_penalty=1.2, strategy="lwsq", pipeline="never"))
    assert {k: call.fields[k] for k in ("top_k", "repetition_penalty", "strategy", "pipeline")} == \
        {"top_k": 5, "repetition_penalty": 1.2, "strategy": "lwsq", "pipeline": "never"}


def test_a_completion_defaults_to_openais_16_tokens() -> None:
    call = completion_call({"model": "tiny", "prompt": "Once"})
    assert call.fields == {"model": "tiny", "origin": "http", "prompt": "Once", "max_tokens": 16}
    assert completion_call({"model": "tiny", "prompt": ["Once"]}).fields["prompt"] == "Once"


@pytest.mark.parametrize(("body", "param"), [
    ({"model": "m", "prompt": ["a", "b"]}, "prompt"),
    ({"model": "m", "prompt": [1, 2, 3]}, "prompt"),
    ({"model": "m", "prompt": "a", "echo": True}, "echo"),
    ({"model": "m", "prompt": "a", "best_of": 3}, "best_of"),
    ({"model": "m", "prompt": "a", "logprobs": 6}, "logprobs"),
    ({"model": "m", "prompt": "a", "n": 9}, "n"),
    ({"model": "m", "prompt": "a", "suffix": "z"}, "suffix"),
    ({"model": "m", "prompt": "a", "messages": MSG}, "messages"),
])
def test_completion_fields_meshd_cannot_honour(body: dict[str, Any], param: str) -> None:
    with pytest.raises(ApiError) as e:
        completion_call(body)
    assert (e.value.status, e.value.param) == (400, param)


def test_the_sampling_surface_becomes_submit_fields() -> None:
    call = chat_call(chat(n=3, logprobs=True, top_logprobs=4, presence_penalty=0.5,
                          frequency_penalty=-1, logit_bias={"50": -100, "7": 2.5}, seed=11))
    assert call.n == 3 and call.logprobs
    req = parse_submit({**call.fields, "client": "a"}, lambda: "r1")
    s = req.sampling
    assert (s.n, s.logprobs, s.presence_penalty, s.frequency_penalty, s.seed) == (3, 4, 0.5, -1.0, 11)
    assert s.logit_bias == ((50, -100.0), (7, 2.5))
    assert req.pipeline == "never"  # n choices share one node's batch
    assert s.shapes_output and parse_submit({"prompt": "x"}, lambda: "r").sampling.shapes_output is False
    comp = completion_call({"model": "m", "prompt": "a", "logprobs": 2, "n": 2, "best_of": 2})
    assert comp.fields["logprobs"] == 2 and comp.fields["n"] == 2 and comp.logprobs


def test_response_format_becomes_a_checked_grammar() -> None:
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    call = chat_call(chat(response_format={"type": "json_schema", "json_schema": {
        "name": "place", "schema": schema, "strict": True}}))
    assert call.structured and "json_schema" in call.fields["grammar"]
    assert parse_submit({**call.fields}, lambda: "r").sampling.grammar == call.fields["grammar"]
    assert "grammar" in chat_call(chat(response_format={"type": "json_object"})).fields
    assert "grammar" not in chat_call(chat(response_format={"type": "text"})).fields


def test_an_unsupported_schema_keyword_is_named() -> None:
    with pytest.raises(ApiError) as e:
        chat_call(chat(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {
            "type": "object", "if": {"required": ["a"]}, "then": {}}}}))
    assert e.value.status == 400 and "'if'" in e.value.message and "then" in e.value.message


WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather now",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                          "required": ["city"]}}}


def test_tools_render_in_the_generic_format() -> None:
    history = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"},
    ]
    call = chat_call(chat(messages=history, tools=[WEATHER], tool_choice="required"))
    assert call.tools is not None and call.tools.forced and "grammar" in call.fields
    msgs = call.fields["messages"]
    assert msgs[0]["role"] == "system" and msgs[0]["content"].startswith("Be brief.\n\n")
    assert "get_weather" in msgs[0]["content"] and '"tool_calls"' in msgs[0]["content"]
    assert msgs[2] == {"role": "assistant", "content": 'I called get_weather {"city":"Paris"}.'}
    assert msgs[3] == {"role": "user", "content": "get_weather returned: 18 C, sunny"}
    req = parse_submit({**call.fields}, lambda: "r")
    assert [m["role"] for m in req.messages] == ["system", "user", "assistant", "user"]
    none = chat_call(chat(tools=[WEATHER], tool_choice="none"))
    assert none.tools is None and "grammar" not in none.fields


def test_a_reply_in_the_generic_format_becomes_tool_calls() -> None:
    from meshd.api.tools import parse_reply

    reply = ('{"tool_calls":[{"name":"get_weather","arguments":{"city":"Paris"}},'
             '{"name":"get_weather","arguments":{"city":"Paris"}},'
             '{"name":"get_weather","arguments":{"city":"Oslo"}}]}')
    calls = parse_reply(reply, "r9")
    assert calls == [  # the repeated call once
        {"id": "call_r9_0_0", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
        {"id": "call_r9_0_1", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]
    assert parse_reply("It is sunny.", "r9") is None
    assert parse_reply('{"tool_calls":[{"name":"get_wea', "r9") is None  # cut by max_tokens
