"""Ollama requests to SUBMIT fields and answers to Ollama's shapes (meshd.api.ollama): pure
tables. The endpoints on a fake node are tests/api/test_ollama_app.py; the official client
against real daemons is tests/api/test_ollama_live.py."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest

from meshd.api.errors import ApiError
from meshd.api.ollama import replies, shapes
from meshd.core.request import parse_submit
from meshd.node.model_facts import parameter_count

USER = [{"role": "user", "content": "hello"}]


def refused(fn: Any, body: Any) -> ApiError:
    with pytest.raises(ApiError) as e:
        fn(body)
    assert e.value.status == 400
    return e.value


@pytest.mark.parametrize(("options", "fields"), [
    (None, {}),
    ({}, {}),
    ({"temperature": 0}, {"temperature": 0}),
    ({"top_k": 5, "top_p": 0.5, "seed": 7}, {"top_k": 5, "top_p": 0.5, "seed": 7}),
    ({"repeat_penalty": 1.0}, {"repetition_penalty": 1.0}),
    ({"num_predict": 12}, {"max_tokens": 12}),
    ({"stop": ["\n", "###"]}, {"stop": ["\n", "###"]}),
    ({"stop": "END"}, {"stop": ["END"]}),
    ({"temperature": None}, {}),  # null is unset
    # neutral values of what meshd's sampler lacks: accepted, nothing to map
    ({"presence_penalty": 0, "frequency_penalty": 0.0, "mirostat": 0, "mirostat_tau": 5.0,
      "mirostat_eta": 0.1, "min_p": 0, "typical_p": 1.0, "tfs_z": 1, "repeat_last_n": -1,
      "penalize_newline": True}, {}),
])
def test_options_that_map(options: Any, fields: dict[str, Any]) -> None:
    assert shapes.options_fields(options).fields == fields


def test_runtime_and_unknown_options_are_ignored_and_said() -> None:
    o = shapes.options_fields({"num_thread": 4, "num_gpu": 99, "use_mmap": True,
                               "num_keep": 5, "temprature": 0.2, "temperature": 0.1})
    assert o.fields == {"temperature": 0.1}
    assert o.ignored == ("num_gpu", "num_keep", "num_thread", "use_mmap")
    assert o.unknown == ("temprature",)


def test_num_ctx_is_kept_for_the_handlers_check() -> None:
    assert shapes.options_fields({"num_ctx": 2048}).num_ctx == 2048
    shapes.check_num_ctx(256, "tiny", 256)
    shapes.check_num_ctx(100, "tiny", 256)  # a smaller window: accepted
    shapes.check_num_ctx(4096, "tiny", None)  # context not known here: the entry checks
    with pytest.raises(ApiError) as e:
        shapes.check_num_ctx(4096, "tiny", 256)
    assert e.value.message.startswith("options.num_ctx: 4096 is more than model tiny's context "
                                       "of 256 tokens")


@pytest.mark.parametrize(("options", "starts"), [
    ("hot", "options must be an object"),
    ({"presence_penalty": 0.5}, "options.presence_penalty: 0.5 is not supported"),
    ({"frequency_penalty": 1}, "options.frequency_penalty: 1 is not supported"),
    ({"mirostat": 2}, "options.mirostat: 2 is not supported"),
    ({"min_p": 0.05}, "options.min_p: 0.05"),
    ({"typical_p": 0.7}, "options.typical_p: 0.7"),
    ({"tfs_z": 0.9}, "options.tfs_z: 0.9"),
    ({"repeat_last_n": 64}, "options.repeat_last_n: 64"),
    ({"penalize_newline": False}, "options.penalize_newline: False"),
    ({"num_predict": -1}, "options.num_predict: -1 (until the context is full)"),
    ({"num_predict": -2}, "options.num_predict: -2"),
    ({"num_predict": 1.5}, "options.num_predict must be an integer"),
    ({"top_k": "40"}, "options.top_k must be an integer"),
    ({"temperature": "hot"}, "options.temperature must be a number"),
    ({"temperature": True}, "options.temperature must be a number"),
    ({"stop": 3}, "options.stop must be a list"),
    ({"num_ctx": 0}, "options.num_ctx must be an integer >= 1"),
])
def test_options_refused_naming_the_option(options: Any, starts: str) -> None:
    with pytest.raises(ApiError) as e:
        shapes.options_fields(options)
    assert e.value.status == 400 and e.value.message.startswith(starts), e.value.message


def test_chat_maps_to_submit_fields_and_parses() -> None:
    call = shapes.chat_call({"model": "tiny", "messages": [
        {"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello", "thinking": "hmm"}],
        "options": {"temperature": 0, "num_predict": 5}, "stream": False, "keep_alive": "5m",
        "tools": [], "format": "", "cache": False})
    assert call.kind == "chat" and call.model == "tiny" and not call.stream and not call.load_only
    assert call.fields == {"messages": [{"role": "system", "content": "be brief"},
                                        {"role": "user", "content": "hi"},
                                        {"role": "assistant", "content": "hello"}],
                           "temperature": 0, "max_tokens": 5, "origin": "http", "cache": False}
    req = parse_submit({**call.fields, "model": call.model, "client": "alice"}, lambda: "r1")
    assert req.max_tokens == 5 and req.sampling.temperature == 0 and req.origin == "http"
    assert req.messages is not None and len(req.messages) == 3 and req.client == "alice"


def test_streaming_is_ollamas_default() -> None:
    assert shapes.chat_call({"model": "m", "messages": USER}).stream
    assert shapes.generate_call({"model": "m", "prompt": "x", "stream": None}).stream
    assert not shapes.generate_call({"model": "m", "prompt": "x", "stream": False}).stream


@pytest.mark.parametrize(("body", "starts"), [
    ([], "the request body must be a JSON object"),
    ({"messages": USER}, "model is required"),
    ({"model": "m", "messages": USER, "stream": "yes"}, "stream must be true or false"),
    ({"model": "m", "messages": USER, "format": "json"}, "format: structured output"),
    ({"model": "m", "messages": USER, "format": {"type": "object"}}, "format: structured output"),
    ({"model": "m", "messages": USER, "tools": [{"type": "function"}]}, "tools: tools are not"),
    ({"model": "m", "messages": USER, "think": True}, "think:"),
    ({"model": "m", "messages": USER, "logprobs": True}, "logprobs:"),
    ({"model": "m", "messages": USER, "top_logprobs": 3}, "top_logprobs:"),
    ({"model": "m", "messages": "hi"}, "messages must be a list"),
    ({"model": "m", "messages": ["hi"]}, "messages[0] must be an object"),
    ({"model": "m", "messages": [{"role": "user", "content": "x", "images": ["aGk="]}]},
     "messages[0].images: images are not supported: meshd's models read text only"),
    ({"model": "m", "messages": [{"role": "assistant", "content": "",
                                  "tool_calls": [{"function": {"name": "f"}}]}]},
     "messages[0].tool_calls:"),
    ({"model": "m", "messages": [{"content": "x"}]}, "messages[0].role is required"),
    ({"model": "m", "messages": [{"role": "user", "content": 3}]},
     "messages[0].content must be a string"),
])
def test_chat_refusals_name_the_field(body: Any, starts: str) -> None:
    err = refused(shapes.chat_call, body)
    assert err.message.startswith(starts), err.message


def test_generate_renders_like_ollama() -> None:
    plain = shapes.generate_call({"model": "m", "prompt": "Why?", "suffix": "", "system": "",
                                  "template": "", "raw": False, "format": "", "images": None})
    assert plain.fields == {"prompt": "Why?", "chat": True, "origin": "http"}
    system = shapes.generate_call({"model": "m", "prompt": "Why?", "system": "Be terse."})
    assert system.fields["messages"] == [{"role": "system", "content": "Be terse."},
                                         {"role": "user", "content": "Why?"}]
    raw = shapes.generate_call({"model": "m", "prompt": "<s>Why?", "raw": True})
    assert raw.fields == {"prompt": "<s>Why?", "origin": "http"}


def test_no_prompt_is_a_load_request() -> None:
    assert shapes.generate_call({"model": "m"}).load_only
    assert shapes.generate_call({"model": "m", "prompt": ""}).load_only
    assert shapes.chat_call({"model": "m", "messages": []}).load_only
    assert not shapes.chat_call({"model": "m", "messages": USER}).load_only


@pytest.mark.parametrize(("body", "starts"), [
    ({"model": "m", "prompt": "x", "images": ["aGk="]}, "images: images are not supported"),
    ({"model": "m", "prompt": "x", "suffix": "return x"}, "suffix: fill-in-the-middle"),
    ({"model": "m", "prompt": "x", "template": "{{ .Prompt }}"}, "template: meshd renders"),
    ({"model": "m", "prompt": "x", "context": [1, 2, 3]}, "context: meshd does not continue"),
    ({"model": "m", "prompt": "x", "width": 512}, "width: image generation"),
    ({"model": "m", "prompt": "x", "raw": "yes"}, "raw must be true or false"),
    ({"model": "m", "prompt": 3}, "prompt must be a string"),
    ({"model": "m", "prompt": "x", "raw": True, "system": "s"}, "system needs the model's"),
    ({"model": "m", "prompt": "x", "format": "json"}, "format: structured output"),
])
def test_generate_refusals_name_the_field(body: Any, starts: str) -> None:
    err = refused(shapes.generate_call, body)
    assert err.message.startswith(starts), err.message


def test_model_names_with_ollamas_default_tag() -> None:
    served = {"tiny", "qwen:7b"}
    assert shapes.resolve_model("tiny", served) == "tiny"
    assert shapes.resolve_model("tiny:latest", served) == "tiny"
    assert shapes.resolve_model("qwen:7b", served) == "qwen:7b"
    assert shapes.resolve_model("qwen:latest", served) == "qwen:latest"  # not served: 404 later
    assert shapes.resolve_model("tiny:q4", served) == "tiny:q4"
    assert shapes.embed_model_matches("all-minilm-l6-v2:latest", "all-minilm-l6-v2")
    assert not shapes.embed_model_matches("nomic-embed-text", "all-minilm-l6-v2")


def test_embed_requests() -> None:
    assert shapes.embed_input({"model": "e", "input": "one"}) == ("e", ["one"])
    assert shapes.embed_input({"model": "e", "input": ["a", "b"], "truncate": True,
                               "keep_alive": 0, "options": {"num_thread": 2}}) == ("e", ["a", "b"])
    assert shapes.embeddings_input({"model": "e", "prompt": "p"}) == ("e", "p")
    for body, starts in (({"input": "x"}, "model is required"),
                         ({"model": "e", "input": []}, "input must be"),
                         ({"model": "e", "input": ["a", ""]}, "input must be"),
                         ({"model": "e", "input": "x", "truncate": False}, "truncate: false"),
                         ({"model": "e", "input": "x", "dimensions": 64}, "dimensions:")):
        assert refused(shapes.embed_input, body).message.startswith(starts)
    assert refused(shapes.embeddings_input, {"model": "e"}).message.startswith("prompt must be")
    assert shapes.show_name({"model": "tiny"}) == shapes.show_name({"name": "tiny"}) == "tiny"


# ----------------------------------------------------------------------------- replies


def test_created_at_is_rfc3339_utc_with_microseconds() -> None:
    assert replies.created_at(1_700_000_000_123_456_789) == "2023-11-14T22:13:20.123456Z"
    assert replies.created_at(0) == "1970-01-01T00:00:00.000000Z"


@pytest.mark.parametrize(("timings", "durations"), [
    (replies.Timings(1_000, 4_000, 10_000),
     {"total_duration": 9_000, "prompt_eval_duration": 3_000, "eval_duration": 6_000}),
    (replies.Timings(1_000, None, 10_000),  # no text came: all of it was before any
     {"total_duration": 9_000, "prompt_eval_duration": 9_000, "eval_duration": 0}),
])
def test_durations_from_timings(timings: replies.Timings, durations: dict[str, int]) -> None:
    assert timings.durations() == durations


def test_final_objects_carry_counts_and_durations() -> None:
    stats = {"text": "hi there", "prompt_tokens": 7, "completion_tokens": 2,
             "finish_reason": "length"}
    t = replies.Timings(0, 2_000_000, 5_000_000)
    chat = replies.final("chat", "tiny:latest", 0, stats, t, "hi there")
    assert chat == {"model": "tiny:latest", "created_at": "1970-01-01T00:00:00.000000Z",
                    "message": {"role": "assistant", "content": "hi there"}, "done": True,
                    "done_reason": "length", "total_duration": 5_000_000, "prompt_eval_count": 7,
                    "prompt_eval_duration": 2_000_000, "eval_count": 2, "eval_duration": 3_000_000}
    gen = replies.final("generate", "tiny", 0, {**stats, "finish_reason": None}, t, "")
    assert gen["response"] == "" and gen["done_reason"] == "stop" and "message" not in gen
    assert replies.piece("generate", "tiny", 0, "x") == {
        "model": "tiny", "created_at": "1970-01-01T00:00:00.000000Z", "response": "x",
        "done": False}
    assert replies.loaded("chat", "tiny", 0)["done_reason"] == "load"


def test_a_line_is_one_json_object_and_a_newline() -> None:
    data = replies.line(replies.piece("chat", "m", 0, "two\nlines \u00e9"))
    assert data.endswith(b"\n") and data.count(b"\n") == 1
    assert json.loads(data)["message"]["content"] == "two\nlines \u00e9"


def test_errors_say_num_predict_where_the_chain_says_max_tokens() -> None:
    err = ApiError(400, "the prompt is 9 tokens and max_tokens is 999: over the context")
    assert replies.error(err) == {"error": "the prompt is 9 tokens and num_predict is 999: "
                                           "over the context"}


@pytest.mark.parametrize(("n", "text"), [
    (900, "900"), (1_234, "1.2K"), (135_000_000, "135M"), (1_000_000, "1M"),
    (7_241_732_096, "7.2B"), (2_000_000_000_000, "2T"),
])
def test_human_counts(n: int, text: str) -> None:
    assert replies.human_count(n) == text


def test_tags_and_show_from_model_rows() -> None:
    rows = [{"id": "tiny", "nodes": 3, "context_length": 256, "format": "int4",
             "architecture": "llama", "parameters": 1_234_567, "size_bytes": 999,
             "digest": "ab" * 32, "layers": 4, "hidden_size": 32, "chat_template": "{{ x }}"},
            {"id": "far", "nodes": 1, "context_length": None, "format": "upstream"},
            {"id": "old", "nodes": 1, "context_length": 2048}]
    tags = replies.tags(rows, "2026-01-01T00:00:00.000000Z")["models"]
    assert [m["name"] for m in tags] == ["far", "old", "tiny"]
    tiny = tags[2]
    assert tiny["details"] == {"parent_model": "", "format": "meshd", "family": "llama",
                               "families": ["llama"], "parameter_size": "1.2M",
                               "quantization_level": "int4"}
    assert tiny["size"] == 999 and tiny["digest"] == "ab" * 32
    assert tiny["meshd"] == {"nodes": 3, "context_length": 256}
    assert tags[0]["details"]["format"] == "upstream" and tags[0]["details"]["quantization_level"] == ""
    assert tags[1]["details"]["format"] == "" and tags[1]["size"] == 0
    show = replies.show(rows[0], "t")
    assert show["template"] == "{{ x }}" and show["capabilities"] == ["completion"]
    assert show["model_info"] == {"general.architecture": "llama",
                                  "general.parameter_count": 1_234_567,
                                  "llama.context_length": 256, "llama.block_count": 4,
                                  "llama.embedding_length": 32, "meshd.nodes": 3}
    assert replies.show(rows[2], "t")["model_info"] == {"meshd.context_length": 2048,
                                                        "meshd.nodes": 1}


def _arch(**kw: Any) -> SimpleNamespace:
    base = dict(arch="llama", num_layers=2, hidden_size=8, intermediate_size=16, num_heads=2,
                num_kv_heads=1, head_dim=4, vocab_size=10, tie_word_embeddings=True,
                qkv_bias=False, o_bias=False, mlp_bias=False)
    return SimpleNamespace(**{**base, **kw})


@pytest.mark.parametrize(("kw", "count"), [
    # embed 80 + 2 layers x (attn 8*8+2*8*4+8*8=192, mlp 3*8*16=384, norms 16) + final norm 8
    ({}, 80 + 2 * (192 + 384 + 16) + 8),
    ({"tie_word_embeddings": False}, 80 + 2 * (192 + 384 + 16) + 8 + 80),
    ({"qkv_bias": True}, 80 + 2 * (192 + 16 + 384 + 16) + 8),  # q 8 + k 4 + v 4
    ({"sandwich_norm": True, "qk_norm": True}, 80 + 2 * (192 + 384 + 32 + 8) + 8),
])
def test_parameter_count(kw: dict[str, Any], count: int) -> None:
    assert parameter_count(_arch(**kw)) == count
