"""``parse_submit`` and ``token_budget``: every request checked once at the entry node, with the
engine's own rules (issue 13, defects 2-4)."""

from __future__ import annotations

import math
from typing import Any

import pytest

from meshd.core.budget import token_budget
from meshd.core.request import DEFAULT_MAX_TOKENS, MAX_MAX_TOKENS, parse_submit
from meshd.errors import ContextLengthError, ErrorCode, ProtocolError


def parse(**fields: Any) -> Any:
    return parse_submit({"prompt": "hello", **fields}, lambda: "new-id")


@pytest.mark.parametrize(("fields", "says"), [
    ({"seed": -1}, "seed=-1"),
    ({"seed": 2**64}, "seed="),
    ({"temperature": math.nan}, "temperature=nan"),
    ({"temperature": math.inf}, "temperature=inf"),
    ({"temperature": -0.5}, "temperature=-0.5"),
    ({"top_k": -5}, "top_k=-5"),
    ({"top_p": 0}, "top_p=0"),
    ({"top_p": 1.5}, "top_p=1.5"),
    ({"repetition_penalty": 0}, "repetition_penalty=0"),
    ({"max_tokens": 0}, "max_tokens=0"),
    ({"max_tokens": -3}, "max_tokens=-3"),
    ({"max_tokens": True}, "max_tokens=True"),
    ({"strategy": "fastest"}, "strategy must be one of"),
    ({"pipeline": "sometimes"}, "pipeline must be one of"),
    ({"prompt": ""}, "prompt must be a non-empty string"),
    ({"prompt": "  \n\t "}, "prompt must be a non-empty string"),
    ({"rid": "x" * 500_000}, "rid is 500000 characters"),
    ({"rid": ""}, "rid must be a non-empty string"),
    ({"client": "c" * 200}, "client is 200 characters"),
    ({"model": "m\n"}, "model must not contain control characters"),
    ({"stop": [""]}, "stop must be a list of non-empty strings"),
    ({"stop": ["x"] * 9}, "stop must be a list of at most 8"),
    ({"cache": "yes"}, "cache must be true or false"),
])
def test_bad_values_are_malformed_and_named(fields: dict[str, Any], says: str) -> None:
    with pytest.raises(ProtocolError) as err:
        parse(**fields)
    assert err.value.code == ErrorCode.MALFORMED
    assert says in str(err.value)


def test_good_values_pass_and_a_missing_id_gets_a_new_one() -> None:
    r = parse(temperature=0, seed=7, top_k=0, top_p=1, stop="END", max_tokens=5)
    assert r.request_id == "new-id"
    assert r.sampling.greedy and r.sampling.seed == 7 and r.sampling.stop == ("END",)
    assert r.max_tokens == 5 and r.client == "local"
    assert r.sampling.fields() == {"temperature": 0.0, "top_k": 0, "top_p": 1.0, "seed": 7,
                                   "stop": ["END"]}


def test_messages_replace_the_prompt() -> None:
    r = parse_submit({"messages": [{"role": "user", "content": "hi"}]}, lambda: "i")
    assert r.prompt is None and r.messages == ({"role": "user", "content": "hi"},)
    with pytest.raises(ProtocolError, match="role"):
        parse_submit({"messages": [{"role": "robot", "content": "hi"}]}, lambda: "i")
    with pytest.raises(ProtocolError, match="either prompt or messages"):
        parse_submit({"prompt": "a", "messages": [{"role": "user", "content": "b"}]}, lambda: "i")


def test_the_engine_applies_the_same_rule() -> None:
    from meshd.engine.sampling import GenerationConfig
    from meshd.errors import ConfigError

    with pytest.raises(ConfigError, match="seed=-1"):
        GenerationConfig(seed=-1)
    with pytest.raises(ConfigError, match="temperature=nan"):
        GenerationConfig(temperature=math.nan)


@pytest.mark.parametrize(("prompt", "asked", "context", "want", "note"), [
    (10, None, None, DEFAULT_MAX_TOKENS, False),
    (10, None, 256, DEFAULT_MAX_TOKENS, False),
    (250, None, 256, 6, False),  # the default is cut to what the context leaves
    (10, 100, 256, 100, False),
    (10, 10**9, None, MAX_MAX_TOKENS, True),  # clamped, and the note says so
    (10, 246, 256, 246, False),  # exactly fits
])
def test_token_budget(prompt: int, asked: int | None, context: int | None, want: int, note: bool) -> None:
    got, why = token_budget(prompt, asked, context)
    assert got == want
    assert (why is not None) == note
    if note:
        assert str(asked) in why and str(MAX_MAX_TOKENS) in why


@pytest.mark.parametrize(("asked", "says"), [
    (247, "the prompt is 10 tokens and max_tokens is 247: 257 is over the model's context of 256 "
          "tokens; ask for at most 246"),
    # what the client sent, and the clamp it never saw (the refused request gets no note)
    (10**9, f"the prompt is 10 tokens and max_tokens is 1000000000 (clamped to {MAX_MAX_TOKENS}, "
            f"the most one request may ask for): {10 + MAX_MAX_TOKENS} is over the model's context "
            "of 256 tokens; ask for at most 246"),
])
def test_a_refusal_quotes_max_tokens_as_sent(asked: int, says: str) -> None:
    with pytest.raises(ContextLengthError) as err:
        token_budget(10, asked, 256)
    assert str(err.value) == says
    assert err.value.max_tokens == asked


@pytest.mark.parametrize(("prompt", "asked", "context"), [
    (10, 247, 256),  # one over
    (10, 10**9, 256),  # clamped to 4,096, still over: refused, never a false "kv cache full"
    (300, None, 256),  # the prompt alone does not fit
    (256, 1, 256),
])
def test_over_the_context_is_refused_with_both_numbers(prompt: int, asked: int | None, context: int) -> None:
    with pytest.raises(ContextLengthError) as err:
        token_budget(prompt, asked, context)
    assert err.value.code == ErrorCode.CONTEXT_LENGTH_EXCEEDED
    assert str(prompt) in str(err.value) and str(context) in str(err.value)


CALL = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": {"x": 1}}}
TOOL = {"type": "function", "function": {"name": "f"}}


@pytest.mark.parametrize(("fields", "problem"), [
    ({"prompt": "hi", "tools": [TOOL]}, "tools need chat messages"),
    ({"messages": [{"role": "user", "content": "hi"}], "tools": []}, "tools must be"),
    ({"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function"}]},
     "tools must be"),
    ({"messages": [{"role": "user", "content": "hi", "tool_calls": [CALL]}]},
     "messages[0].tool_calls"),
    ({"messages": [{"role": "assistant", "content": "", "tool_calls": [{"id": "c"}]},
                   {"role": "user", "content": "hi"}]}, "messages[0].tool_calls"),
    ({"messages": [{"role": "tool", "content": "18", "tool_call_id": 7}]},
     "messages[0].tool_call_id"),
])
def test_tools_and_tool_messages_are_checked(fields: dict[str, Any], problem: str) -> None:
    with pytest.raises(ProtocolError) as e:
        parse_submit(fields, lambda: "r")
    assert problem in str(e.value)


def test_tool_messages_keep_what_a_chat_template_renders() -> None:
    msgs = [{"role": "user", "content": "hi", "extra": 1},
            {"role": "assistant", "content": "", "tool_calls": [CALL]},
            {"role": "tool", "content": "18", "tool_call_id": "c1", "name": "f"}]
    req = parse_submit({"messages": msgs, "tools": [TOOL]}, lambda: "r")
    assert req.messages == ({"role": "user", "content": "hi"},
                            {"role": "assistant", "content": "", "tool_calls": [CALL]},
                            {"role": "tool", "content": "18", "tool_call_id": "c1", "name": "f"})
    assert req.tools == (TOOL,)
