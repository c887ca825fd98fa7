"""What the entry chain keys the cache on (meshd.node.entry.cache.cache_request), from the raw
request fields as a client sends them (``parse_submit``): a follow-up is answered from the cache
only in the very same conversation, and a request offering tools or a response schema only by
one offering the same. The store is real (SQLite in memory), with the fake embedder and a
verifier that would serve any two questions of the same words: what keeps the answers apart is
the key alone."""

from __future__ import annotations

import itertools
import re
from types import SimpleNamespace
from typing import Any

import pytest

from meshd.cache import Calibration, SemanticCache
from meshd.config import Config
from meshd.core.request import parse_submit
from meshd.node.entry.cache import cache_request
from meshd.node.entry.context import EntryContext
from meshd.testing.fake_embedder import FakeEmbedder

NODE: Any = SimpleNamespace(config=Config(), runner=SimpleNamespace(get=lambda model: None),
                            membership=SimpleNamespace(table=SimpleNamespace(live=lambda: [])))
_ids = itertools.count()


def same_words(cached: str, query: str) -> float:
    a, b = (set(re.findall(r"\w+", t.lower())) for t in (cached, query))
    return len(a & b) / len(a | b)


@pytest.fixture
def cache() -> SemanticCache:
    return SemanticCache(":memory:", FakeEmbedder(), verifier=same_words,
                         calibration=Calibration(0.5, 1000, (0.99,) * 4 + (0.9,)))


def creq(**fields: Any) -> Any:
    req = parse_submit({"model": "tiny", "temperature": 0.0, **fields}, lambda: f"r{next(_ids)}")
    ctx = EntryContext(req, None, lambda kind, payload: None)  # type: ignore[arg-type]
    ctx.model, ctx.max_tokens = "tiny", 16
    return cache_request(ctx, NODE, "default")


def chat(*turns: tuple[str, str], **fields: Any) -> Any:
    return creq(messages=[{"role": r, "content": c} for r, c in turns], **fields)


PYTHON = (("user", "Tell me about Python."), ("assistant", "Python is a programming language."),
          ("user", "How do I install it?"))
RUST = (("user", "Tell me about Rust."), ("assistant", "Rust is a programming language."),
        ("user", "How do I install it?"))


def test_a_follow_up_in_another_conversation_never_gets_this_ones_answer(
        cache: SemanticCache) -> None:
    python = chat(*PYTHON)
    assert python.follow_up and python.prompt == "How do I install it?"
    cache.insert(python, "pip comes with Python: download it from python.org.")
    assert cache.lookup(chat(*PYTHON)).kind == "exact"  # the very same conversation
    for other in (chat(*RUST),  # the same words after other turns
                  chat(("user", "How do I install it?")),  # no earlier turns at all
                  creq(prompt="How do I install it?"),
                  chat(("system", "Answer about Python."), ("user", "How do I install it?")),
                  chat(PYTHON[0], ("assistant", "Python is a snake."), PYTHON[2])):
        got = cache.lookup(other)
        assert not got.hit, (other, got)
    rust = chat(*RUST)
    cache.insert(rust, "Use rustup.")
    assert cache.lookup(chat(*RUST)).answer == "Use rustup."
    assert cache.lookup(chat(*PYTHON)).answer.startswith("pip")


def test_a_stand_alone_question_keys_on_its_system_prompt(cache: SemanticCache) -> None:
    brief = chat(("system", "Answer in one word."), ("user", "What is the capital of France?"))
    assert not brief.follow_up
    cache.insert(brief, "Paris.")
    again = chat(("system", "Answer in one word."), ("user", "What is the capital of France"))
    assert cache.lookup(again).kind == "semantic"  # same context: paraphrases may hit
    long = chat(("system", "Answer at length."), ("user", "What is the capital of France?"))
    assert not cache.lookup(long).hit
    assert not cache.lookup(chat(("user", "What is the capital of France?"))).hit


TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}]


def test_tools_and_a_response_schema_are_part_of_the_key(cache: SemanticCache) -> None:
    ask = ("user", "What's the weather in Paris?")
    with_tools = chat(ask, tools=TOOLS, tool_choice="auto")
    cache.insert(with_tools, '{"tool_call": "get_weather", "city": "Paris"}')
    assert cache.lookup(chat(ask, tools=TOOLS, tool_choice="auto")).kind == "exact"
    assert not cache.lookup(chat(ask)).hit  # offered no tools: the tool call is no answer
    other = [{**TOOLS[0], "function": {**TOOLS[0]["function"], "name": "get_forecast"}}]
    assert not cache.lookup(chat(ask, tools=other, tool_choice="auto")).hit
    assert not cache.lookup(chat(ask, tools=TOOLS, tool_choice="none")).hit
    schema = {"type": "json_schema", "json_schema": {"name": "w", "schema": {"type": "object"}}}
    cache.insert(creq(prompt="Weather in Paris?", response_format=schema), '{"t": 21}')
    assert cache.lookup(creq(prompt="Weather in Paris?", response_format=schema)).hit
    assert not cache.lookup(creq(prompt="Weather in Paris?")).hit
    assert not cache.lookup(creq(prompt="Weather in Paris?", format="json")).hit
    plain = creq(prompt="Weather in Paris?", response_format={"type": "text"})
    assert plain.context == creq(prompt="Weather in Paris?").context  # plain text is no shape


def test_a_grammar_and_the_penalties_are_keyed_and_choices_or_logprobs_skip(
        cache: SemanticCache) -> None:
    from meshd.cache.keys import admit

    grammar = '{ "grammars": [{ "json_schema": {"type":"object"} }] }'
    shaped = creq(prompt="Weather in Paris?", grammar=grammar)
    cache.insert(shaped, '{"t": 21}')
    assert cache.lookup(creq(prompt="Weather in Paris?", grammar=grammar)).kind == "exact"
    assert not cache.lookup(creq(prompt="Weather in Paris?")).hit  # no grammar: not its answer
    plain = creq(prompt="Weather in Paris?")
    cache.insert(plain, "Sunny, 21 C.")
    for other in (creq(prompt="Weather in Paris?", presence_penalty=1.0),
                  creq(prompt="Weather in Paris?", logit_bias=[[42, -100]])):
        assert admit(other).cacheable and not cache.lookup(other).hit  # other settings
    assert cache.lookup(creq(prompt="Weather in Paris?", presence_penalty=0.0)).kind == "exact"
    for n_or_lp in ({"n": 2}, {"logprobs": 2}):  # one cached choice, no log probabilities
        got = cache.lookup(creq(prompt="Weather in Paris?", **n_or_lp))
        assert got.kind == "skip" and not got.hit, (n_or_lp, got)


def test_what_the_http_api_sends_keys_on_the_tools_and_the_schema() -> None:
    """The API compiles ``tools`` and ``response_format`` into a grammar and renders the tools
    into the messages (meshd.api.shapes): what reaches the cache keys on both."""
    from meshd.api.shapes import chat_call
    from meshd.cache.keys import admit

    def via_api(**body: Any) -> Any:
        call = chat_call({"model": "tiny", "temperature": 0,
                          "messages": [{"role": "user", "content": "What's the weather in Paris?"}],
                          **body})
        return creq(**call.fields)

    plain = admit(via_api()).write
    tools = admit(via_api(tools=TOOLS)).write
    other = [{**TOOLS[0], "function": {**TOOLS[0]["function"], "name": "get_forecast"}}]
    schema = {"type": "json_schema", "json_schema": {"name": "w", "schema": {"type": "object"}}}
    shaped = admit(via_api(response_format=schema)).write
    assert len({plain, tools, admit(via_api(tools=other)).write, shaped,
                admit(via_api(tools=TOOLS, tool_choice="required")).write}) == 5
    assert admit(via_api(tools=TOOLS)).write == tools  # the same request: the same key
    assert not admit(via_api(n=2)).cacheable and not admit(via_api(logprobs=True)).cacheable


def test_the_request_sets_its_own_bound() -> None:
    assert creq(prompt="Hi").max_error == Config().cache.max_error == 0.01
    assert creq(prompt="Hi", cache_max_error=0).max_error == 0.0
    from meshd.errors import ProtocolError

    with pytest.raises(ProtocolError, match="cache_max_error"):
        creq(prompt="Hi", cache_max_error=1.5)
