"""The sampling surface end to end with the official ``openai`` client, on two real daemons.

n1 serves a tiny random Llama as ``tiny``; n2 serves it as ``tiny-far`` only, so a request for
``tiny-far`` entering at n1 is forwarded: the grammar, the choices, the penalties and the log
probabilities travel in the REQ and come back in TOKENS frames. A random model writes nonsense,
so these tests check shapes and guarantees (the JSON parses and validates, the tool call is
well-formed), not meaning: the real instruct model's are in test_structured_live.py.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import openai
import pytest
from pydantic import BaseModel, Field

from meshd.testnet.launcher import NodeSpec

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engine"))

from hf_fixtures import CHAT_TEMPLATE, make_checkpoint  # noqa: E402

from meshd.engine import import_hf  # noqa: E402

from .openai_client import api_mesh, client

pytestmark = pytest.mark.slow

FAR = "tiny-far"


@pytest.fixture(scope="module")
def mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("sampling-mesh")
    make_checkpoint(root / "hf", layers=2, hidden=32, seed=11, max_pos=1024,
                    chat_template=CHAT_TEMPLATE)  # room for the tools preamble
    import_hf(root / "hf", root / "model", stages=1, name="tiny")
    specs = [NodeSpec(name="n1", models=[{"path": "default"}]),
             NodeSpec(name="n2", models=[{"path": "default", "name": FAR}])]
    with api_mesh(root / "net", specs, FAR, default_model=root / "model") as index:
        yield index


@pytest.fixture()
def c(mesh: dict[str, Any]) -> openai.OpenAI:
    return client(mesh["nodes"][0]["api_url"], mesh["key"])


HELLO = [{"role": "user", "content": "Once upon a time"}]


class Pet(BaseModel):  # bounded fields: a random model would fill a free string to the cap
    name: Literal["Rex", "Tom"]
    legs: int = Field(ge=0, le=8)
    happy: bool


def test_models_list_auto_first(c: openai.OpenAI) -> None:
    listed = c.models.list().data
    assert listed[0].id == "auto" and {"tiny", FAR} <= {m.id for m in listed}


def test_parse_returns_a_pydantic_object_from_a_forwarded_request(c: openai.OpenAI) -> None:
    raw = c.chat.completions.with_raw_response.parse(
        model=FAR, messages=HELLO, response_format=Pet, max_tokens=80, temperature=0)
    assert raw.headers["x-meshd-served-by"] == "n2"  # forwarded: the grammar went with it
    r = raw.parse()
    assert isinstance(r.choices[0].message.parsed, Pet)
    json_object = c.chat.completions.create(model=FAR, messages=HELLO, max_tokens=40,
                                            temperature=0, response_format={"type": "json_object"})
    text = json_object.choices[0].message.content or ""
    assert text.startswith("{")


def test_bounded_schema_always_validates(c: openai.OpenAI) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    schema = {"type": "object", "properties": {
        "color": {"enum": ["red", "green", "blue"]}, "n": {"type": "integer", "minimum": 0,
                                                           "maximum": 9},
        "ok": {"type": "boolean"}}, "required": ["color", "n", "ok"], "additionalProperties": False}
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": True}}
    for seed in range(3):
        r = c.chat.completions.create(model=FAR, messages=HELLO, max_tokens=40, temperature=1.0,
                                      seed=seed, response_format=fmt)  # type: ignore[arg-type]
        jsonschema.validate(json.loads(r.choices[0].message.content or ""), schema)
        assert r.choices[0].finish_reason == "stop"


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city now",
    "parameters": {"type": "object", "properties": {"city": {"enum": ["Paris", "Oslo"]}},
                   "required": ["city"], "additionalProperties": False}}}


@pytest.mark.parametrize("stream", [False, True])
def test_a_required_tool_call_and_the_answer_to_it(c: openai.OpenAI, stream: bool) -> None:
    asked = [{"role": "user", "content": "What is the weather in Paris?"}]
    kw: dict[str, Any] = {"model": FAR, "max_tokens": 100, "temperature": 0, "tools": [WEATHER],
                          "tool_choice": "required", "parallel_tool_calls": False}
    if stream:
        chunks = list(c.chat.completions.create(messages=asked, stream=True, **kw))  # type: ignore[arg-type]
        deltas = [d for ch in chunks for d in (ch.choices[0].delta.tool_calls or []) if ch.choices]
        assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "tool_calls"
        call_id, name, args = deltas[0].id, deltas[0].function.name, deltas[0].function.arguments  # type: ignore[union-attr]
    else:
        raw = c.chat.completions.with_raw_response.create(messages=asked, **kw)  # type: ignore[arg-type]
        assert raw.headers["x-meshd-tool-format"] == "generic"
        r = raw.parse()
        assert r.choices[0].finish_reason == "tool_calls" and r.choices[0].message.content is None
        call = r.choices[0].message.tool_calls[0]  # type: ignore[index]
        call_id, name, args = call.id, call.function.name, call.function.arguments  # type: ignore[union-attr]
    assert name == "get_weather" and json.loads(args or "")["city"] in ("Paris", "Oslo")
    follow = [*asked, {"role": "assistant", "content": None, "tool_calls": [
        {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}]},
        {"role": "tool", "tool_call_id": call_id, "content": "18 C and sunny"}]
    r2 = c.chat.completions.create(model=FAR, messages=follow, max_tokens=8, temperature=0,  # type: ignore[arg-type]
                                   tools=[WEATHER], tool_choice="none")  # type: ignore[list-item]
    assert r2.choices[0].finish_reason in ("stop", "length") and r2.choices[0].message.content


def test_n_choices_with_logprobs_plain_and_streamed(c: openai.OpenAI) -> None:
    r = c.chat.completions.create(model=FAR, messages=HELLO, max_tokens=6, temperature=1.0,
                                  seed=5, n=3, logprobs=True, top_logprobs=2)
    assert [ch.index for ch in r.choices] == [0, 1, 2]
    assert len({ch.message.content for ch in r.choices}) > 1  # seeded apart
    for ch in r.choices:
        lp = ch.logprobs.content  # type: ignore[union-attr]
        assert len(lp) == 6 and all(t.logprob <= 0 and len(t.top_logprobs) == 2 for t in lp)
        assert "".join(t.token for t in lp)  # the tokens' own text
    assert r.usage is not None and r.usage.completion_tokens == 18
    chunks = list(c.chat.completions.create(model=FAR, messages=HELLO, max_tokens=6,
                                            temperature=1.0, seed=5, n=3, stream=True,
                                            stream_options={"include_usage": True}))
    texts: dict[int, str] = {}
    for ch in chunks:
        for choice in ch.choices:
            texts[choice.index] = texts.get(choice.index, "") + (choice.delta.content or "")
    assert texts == {ch.index: ch.message.content for ch in r.choices}  # same seed, same text
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 18


def test_completions_logprobs_penalties_bias_and_seed(c: openai.OpenAI) -> None:
    r = c.completions.create(model=FAR, prompt="Once upon a time", max_tokens=5, temperature=0,
                             logprobs=2)
    lp = r.choices[0].logprobs
    assert lp is not None and len(lp.tokens or []) == 5 and len(lp.top_logprobs or []) == 5
    assert "".join(lp.tokens or []) == r.choices[0].text
    a = c.completions.create(model=FAR, prompt="Once", max_tokens=8, temperature=0.9, seed=3,
                             presence_penalty=1.5, frequency_penalty=0.5)
    b = c.completions.create(model="tiny", prompt="Once", max_tokens=8, temperature=0.9, seed=3,
                             presence_penalty=1.5, frequency_penalty=0.5)
    assert a.choices[0].text == b.choices[0].text  # the same seed on another node
    biased = c.completions.create(model=FAR, prompt="Once", max_tokens=3, temperature=0,
                                  logit_bias={"42": 100})
    assert biased.choices[0].logprobs is None and biased.usage.completion_tokens == 3  # type: ignore[union-attr]


def test_an_unsupported_schema_is_a_400_naming_the_keyword(c: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model=FAR, messages=HELLO, response_format={  # type: ignore[arg-type]
            "type": "json_schema", "json_schema": {"name": "x", "schema": {
                "type": "object", "if": {"required": ["a"]}, "then": {}}}})
    assert "'if'" in str(e.value)
