"""Tools through the model's own chat template on two real daemons, with the official ``openai``
client, for each family meshd knows: a tiny random Qwen2 whose tokenizer carries
Qwen2.5-Instruct's real chat template (hermes), and a tiny random Llama carrying Llama
3.2-Instruct's (llama3; tests/engine/chat_templates.py). n1 serves it as ``tools``, n2 as
``tools-far`` only, so a request for ``tools-far`` entering at n1 is rendered at n1 (with the
tokenizer the mesh advertises) and served by n2, the grammar of the template's call syntax
travelling in the REQ.

The prompt the daemon renders is checked against Hugging Face's rendering through its token
count (``usage.prompt_tokens``; the strings themselves byte for byte in test_tool_template.py).
A random model writes nonsense, so the calls' arguments are enums and these tests check the
shapes and the guarantees, not meaning.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from meshd.testnet.launcher import NodeSpec

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engine"))

from chat_templates import (  # noqa: E402
    FIRST_PROMPT,
    LLAMA32,
    LLAMA_FIRST_PROMPT,
    LLAMA_LOOP,
    LLAMA_LOOP_PROMPT,
    LOOP,
    LOOP_PROMPT,
    QUESTION,
    QWEN25,
    TIME,
    WEATHER,
    dated,
)
from hf_fixtures import make_checkpoint  # noqa: E402

from meshd.api.tool_template import template_messages  # noqa: E402
from meshd.engine import import_hf  # noqa: E402
from meshd.engine.manifest import TokenizerInfo  # noqa: E402
from meshd.engine.tokenizer import Tokenizer  # noqa: E402

from .openai_client import api_mesh, client

pytestmark = pytest.mark.slow

FAR = "tools-far"
# per family: the checkpoint's architecture and template, the prompts Hugging Face renders (the
# Llama fixture's BOS is the checkpoint's <s>), the loop (Llama's template: one call a message)
# and how the template writes the tool's result
FAMILIES: dict[str, dict[str, Any]] = {
    "hermes": {"arch": "qwen2", "template": QWEN25, "first": FIRST_PROMPT, "loop": LOOP,
               "loop_prompt": LOOP_PROMPT,
               "result": "<tool_response>\n18 °C and sunny\n</tool_response>"},
    "llama3": {"arch": "llama", "template": LLAMA32,
               "first": dated(LLAMA_FIRST_PROMPT).replace("<|begin_of_text|>", "<s>"),
               "loop": LLAMA_LOOP,
               "loop_prompt": dated(LLAMA_LOOP_PROMPT).replace("<|begin_of_text|>", "<s>"),
               "result": '<|start_header_id|>ipython<|end_header_id|>\n\n"18 °C and sunny"'
                         "<|eot_id|>"},
}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def mesh(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
         ) -> Iterator[dict[str, Any]]:
    family = FAMILIES[request.param]
    root = tmp_path_factory.mktemp(f"tool-template-mesh-{request.param}")
    make_checkpoint(root / "hf", arch=family["arch"], layers=2, hidden=32, seed=5, max_pos=2048,
                    chat_template=family["template"])
    import_hf(root / "hf", root / "model", stages=1, name="tools")
    specs = [NodeSpec(name="n1", models=[{"path": "default"}]),
             NodeSpec(name="n2", models=[{"path": "default", "name": FAR}])]
    with api_mesh(root / "net", specs, FAR, default_model=root / "model") as index:
        index["tokenizer"] = Tokenizer(root / "hf" / "tokenizer.json", TokenizerInfo(
            "tokenizer.json", "", 0, (1,), "<s>", "</s>", family["template"]))
        yield {**index, **family, "family": request.param}


@pytest.fixture()
def c(mesh: dict[str, Any]) -> openai.OpenAI:
    return client(mesh["nodes"][0]["api_url"], mesh["key"])


def tokens(mesh: dict[str, Any], text: str) -> int:
    return len(mesh["tokenizer"].encode(text, add_special_tokens=False))


KW: dict[str, Any] = {"model": FAR, "tools": [WEATHER, TIME], "temperature": 0,
                      "max_tokens": 128}  # near a token per byte: a small BPE


@pytest.mark.parametrize("stream", [False, True])
def test_a_two_turn_tool_loop_in_the_templates_own_syntax(
        mesh: dict[str, Any], c: openai.OpenAI, stream: bool) -> None:
    messages: list[dict[str, Any]] = [QUESTION]
    if stream:
        raw = c.chat.completions.with_raw_response.create(
            messages=messages, tool_choice="required", parallel_tool_calls=False, stream=True,
            stream_options={"include_usage": True}, **KW)
        chunks = list(raw.parse())
        calls = [d for ch in chunks if ch.choices for d in ch.choices[0].delta.tool_calls or []]
        finish = [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1]
        usage = chunks[-1].usage
        assert len(calls) == 1 and calls[0].index == 0
        call = {"id": calls[0].id, "type": "function",
                "function": {"name": calls[0].function.name,  # type: ignore[union-attr]
                             "arguments": calls[0].function.arguments}}  # type: ignore[union-attr]
    else:
        raw = c.chat.completions.with_raw_response.create(
            messages=messages, tool_choice="required", parallel_tool_calls=False, **KW)
        r = raw.parse()
        finish, usage = r.choices[0].finish_reason, r.usage
        assert r.choices[0].message.content is None
        tc = r.choices[0].message.tool_calls[0]  # type: ignore[index]
        call = {"id": tc.id, "type": "function",
                "function": {"name": tc.function.name, "arguments": tc.function.arguments}}
    assert raw.headers["x-meshd-tool-format"] == mesh["family"]
    assert raw.headers["x-meshd-served-by"] == "n2"  # forwarded: the grammar travelled
    assert finish == "tool_calls"
    args = json.loads(call["function"]["arguments"])
    assert (call["function"]["name"], args) in [("get_weather", {"city": "Paris"}),
                                                 ("get_weather", {"city": "Lyon"}),
                                                 ("get_time", {}), ("get_time", {"zone": "CET"}),
                                                 ("get_time", {"zone": "UTC"})]
    assert usage is not None and usage.prompt_tokens == tokens(mesh, mesh["first"])
    # the second turn: the call and its result rendered back in the template's markup
    messages = [QUESTION, {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": call["id"], "content": "18 °C and sunny"}]
    answer = c.chat.completions.create(messages=messages, tool_choice="auto", **KW)
    expected = mesh["tokenizer"].apply_chat_template(template_messages(messages),
                                                     tools=[WEATHER, TIME])
    assert mesh["result"] in expected
    assert answer.usage is not None and answer.usage.prompt_tokens == tokens(mesh, expected)
    choice = answer.choices[0]
    assert (choice.finish_reason, choice.message.content is None) in [
        ("tool_calls", True), ("stop", False), ("length", False)]


def test_the_loop_renders_as_hugging_face_renders_it(mesh: dict[str, Any],
                                                     c: openai.OpenAI) -> None:
    r = c.chat.completions.create(messages=mesh["loop"], tool_choice="auto", **KW)
    assert r.usage is not None and r.usage.prompt_tokens == tokens(mesh, mesh["loop_prompt"])
    none = c.chat.completions.with_raw_response.create(messages=mesh["loop"], tool_choice="none",
                                                       **KW)
    assert "x-meshd-tool-format" not in none.headers
    assert none.parse().choices[0].message.tool_calls is None
