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
    (chat(n=2), "n"),
    (chat(logprobs=True), "logprobs"),
    (chat(top_logprobs=2), "top_logprobs"),
    (chat(tools=[{"type": "function"}]), "tools"),
    (chat(tool_choice="auto"), "tool_choice"),
    (chat(functions=[]), "functions"),
    (chat(response_format={"type": "json_object"}), "response_format"),
    (chat(logit_bias={"50256": -100}), "logit_bias"),
    (chat(presence_penalty=0.5), "presence_penalty"),
    (chat(frequency_penalty=-1), "frequency_penalty"),
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
    ({"model": "m", "prompt": "a", "logprobs": 2}, "logprobs"),
    ({"model": "m", "prompt": "a", "suffix": "z"}, "suffix"),
    ({"model": "m", "prompt": "a", "messages": MSG}, "messages"),
])
def test_completion_fields_meshd_cannot_honour(body: dict[str, Any], param: str) -> None:
    with pytest.raises(ApiError) as e:
        completion_call(body)
    assert (e.value.status, e.value.param) == (400, param)
