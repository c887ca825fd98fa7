"""What a node learns of an upstream server from its answers, and the requests it sends it:
table tests of the pure parts (meshd.upstream.facts, meshd.upstream.llamacpp, meshd.core.modelid)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from meshd.core.modelid import of_manifest, short
from meshd.errors import PeerGoneError
from meshd.upstream import facts as F
from meshd.upstream import llamacpp

SHA = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
PROPS = {"default_generation_settings": {"n_ctx": 2048, "params": {}}, "total_slots": 2,
         "model_alias": "smol", "model_ftype": "Q4_1", "build_info": "b1-0c1e570",
         "model_path": "/models/SmolLM2-135M-Instruct.Q4_1.gguf", "chat_template": "{{x}}"}
MODELS = {"data": [{"id": "smol", "meta": {"n_vocab": 49152, "n_ctx": 2048, "n_params": 134515008,
                                           "size": 96576768, "ftype": "Q4_1"}}]}


def test_llama_server_facts() -> None:
    assert F.is_llama_cpp(PROPS) and not F.is_llama_cpp({"error": "x"}) and not F.is_llama_cpp([])
    f = F.llama_cpp_facts(PROPS, MODELS)
    assert (f.kind, f.context_length, f.slots, f.n_vocab, f.n_params, f.size_bytes, f.ftype) == (
        F.LLAMA_CPP, 2048, 2, 49152, 134515008, 96576768, "Q4_1")
    assert f.model_path.endswith(".gguf") and f.chat_template == "{{x}}" and f.build == "b1-0c1e570"
    # a /props without the models answer, or with odd types, still parses
    g = F.llama_cpp_facts({**PROPS, "total_slots": "2", "default_generation_settings": {}}, None)
    assert (g.context_length, g.slots, g.n_vocab) == (0, 0, 0)


def test_vllm_and_plain_facts() -> None:
    tok = {"count": 1, "max_model_len": 8192, "tokens": [9906]}
    assert F.is_vllm_tokenize(tok) and not F.is_vllm_tokenize({"tokens": [1]})
    models = {"data": [{"id": "llama", "root": "meta-llama/Llama-3.1-8B-Instruct"}]}
    f = F.vllm_facts(tok, models, "llama")
    assert (f.kind, f.context_length, f.model_ref) == (F.VLLM, 8192, "meta-llama/Llama-3.1-8B-Instruct")
    assert F.vllm_facts(tok, None, "llama").model_ref == "llama"
    assert F.openai_facts({"data": []}, "qwen2.5:7b") == F.ServerFacts(F.OPENAI, model_ref="qwen2.5:7b")


@pytest.mark.parametrize(("facts", "sha", "want"), [
    (F.llama_cpp_facts(PROPS, MODELS), SHA, f"gguf:{SHA[:32]}"),
    (F.llama_cpp_facts(PROPS, MODELS), "", "llama.cpp:SmolLM2-135M-Instruct.Q4_1.gguf:134515008:96576768:Q4_1"),
    (F.ServerFacts(F.VLLM, model_ref="org/m"), "", "hf:org/m"),
    (F.ServerFacts(F.OPENAI, model_ref="m"), "", "upstream:llama3@127.0.0.1:11434"),
])
def test_model_identity(facts: F.ServerFacts, sha: str, want: str) -> None:
    assert F.model_identity(facts, "http://127.0.0.1:11434/v1", "llama3", sha) == want


def test_a_native_import_and_llama_server_on_the_same_file_are_one_model() -> None:
    native = of_manifest({"gguf": "x.gguf", "gguf_sha256": SHA}, "ab" * 32)
    upstream = F.model_identity(F.llama_cpp_facts(PROPS, MODELS), "http://h/v1", "m", SHA)
    assert native == upstream == f"gguf:{SHA[:32]}"
    assert of_manifest({}, "ab" * 32) == "meshd:" + "ab" * 16
    assert of_manifest({"gguf_sha256": "not hex"}, "") == ""
    assert short(f"gguf:{SHA}") == "gguf:b179c9523d0e6a0f"


def test_server_tokenizer_identities_differ_by_model_and_from_real_ones() -> None:
    a, b = F.server_tokenizer_identity("gguf:" + SHA), F.server_tokenizer_identity("hf:org/m")
    assert a != b and len(a) == 64 and int(a, 16) >= 0


@pytest.mark.parametrize(("base", "root"), [
    ("http://h:8081/v1", "http://h:8081"), ("http://h:8081/v1/", "http://h:8081"),
    ("http://h:8081", "http://h:8081"), ("http://h/api/v1", "http://h/api"),
])
def test_root_url(base: str, root: str) -> None:
    assert F.root_url(base) == root


def test_the_completion_body_carries_meshd_sampling() -> None:
    cfg = SimpleNamespace(max_tokens=8, temperature=0.0, top_k=40, top_p=0.95,
                          repetition_penalty=1.1, seed=7, stop=("\n",))
    body = llamacpp.completion_body([1, 2, 3], cfg)
    assert body == {"prompt": [1, 2, 3], "n_predict": 8, "stream": True, "return_tokens": True,
                    "cache_prompt": True, "min_p": 0.0, "repeat_last_n": 11, "temperature": 0.0,
                    "top_k": 40, "top_p": 0.95, "repeat_penalty": 1.1, "seed": 7, "stop": ["\n"]}
    assert "seed" not in llamacpp.completion_body([1], SimpleNamespace(max_tokens=1, seed=None))


@pytest.mark.parametrize(("data", "want"), [
    ('{"content":" the","tokens":[279],"stop":false}', llamacpp.Chunk((279,), " the", False)),
    ('{"content":"","tokens":[],"stop":true,"stop_type":"eos","timings":{"prompt_ms":3.5,'
     '"predicted_per_second":80}}', llamacpp.Chunk((), "", True, "eos", 3.5, 80.0)),
])
def test_completion_events(data: str, want: llamacpp.Chunk) -> None:
    assert llamacpp.parse_event(data, "u") == want


@pytest.mark.parametrize(("data", "match"), [
    ("<html>", "not JSON"), ("[1]", "unexpected event"),
    ('{"error":{"message":"slot unavailable"}}', "failed mid-answer: slot unavailable"),
    ('{"content":"x","tokens":["a"],"stop":false}', "not llama-server's"),
    ('{"content":"x","tokens":[-1],"stop":false}', "not llama-server's"),
    ('{"content":"x","tokens":[1]}', "not llama-server's"),
])
def test_anything_else_is_a_dead_server(data: str, match: str) -> None:
    with pytest.raises(PeerGoneError, match=match):
        llamacpp.parse_event(data, "u")


@pytest.mark.parametrize(("answer", "ok"), [
    ({"tokens": [1, 2]}, True), ({"tokens": []}, True), ({"tokens": [True]}, False),
    ({"tokens": "12"}, False), ([1, 2], False), (None, False),
])
def test_token_lists(answer: Any, ok: bool) -> None:
    if ok:
        assert llamacpp.token_list(answer, "u") == answer["tokens"]
    else:
        with pytest.raises(PeerGoneError, match="/tokenize"):
            llamacpp.token_list(answer, "u")
