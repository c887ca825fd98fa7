"""Acceptance of Ollama's API: the official ``ollama`` client against a real 3-daemon testnet.

Every node serves a tiny random Llama with a chat template as ``tiny`` (decoding capped at 40
tokens/s, so a long request stays in flight long enough to hit a quota); n3 also serves it as
``tiny-solo``, so a request for that model entering n1 is forwarded to n3. n2 runs the semantic
cache, whose embedding model answers ``/api/embed``; n1 gives client ``alice`` a quota of one
request in flight.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import ollama
import pytest

from meshd.testnet.drive import cli as meshd
from meshd.testnet.drive import wait_for
from meshd.testnet.launcher import NodeSpec, down, up

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engine"))

from hf_fixtures import CHAT_TEMPLATE, make_checkpoint  # noqa: E402

from meshd.engine import import_hf  # noqa: E402
from meshd.engine.manifest import read_manifest  # noqa: E402
from meshd.node.model_facts import parameter_count  # noqa: E402

pytestmark = pytest.mark.slow

CAPPED = {"path": "default", "max_decode_tokens_per_s": 40.0, "max_concurrency": 4}
SOLO = {**CAPPED, "name": "tiny-solo"}
HELLO = [{"role": "user", "content": "Once upon a time"}]
GREEDY = {"temperature": 0, "num_predict": 8}


@pytest.fixture(scope="module")
def mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("ollama-mesh")
    make_checkpoint(root / "hf", layers=4, hidden=32, seed=7, chat_template=CHAT_TEMPLATE)
    import_hf(root / "hf", root / "model", stages=1, name="tiny")
    specs = [NodeSpec(name="n1", models=[CAPPED], extra={"routing": {"quotas": {"alice": 1}}}),
             NodeSpec(name="n2", models=[CAPPED], extra={"cache": {"enabled": True}}),
             NodeSpec(name="n3", models=[CAPPED, SOLO])]
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MESHD_DEFAULT_MODEL", str(root / "model"))
        index = up(root / "net", specs, advert_interval_s=1.0)
    try:
        index["key"] = Path(index["api_key_file"]).read_text().strip()
        index["alice"] = meshd("keys", "api-key", "create", "alice", "--file",
                               str(root / "net" / "api-keys")).stdout.strip()
        index["manifest"] = read_manifest(root / "model")
        for n in index["nodes"]:
            wait_for(partial(lists_both, n, index["key"]), 30,
                     f"{n['name']} to list every model of the mesh")
        yield index
    finally:
        down(root / "net")


def root(n: dict[str, Any]) -> str:
    return str(n["api_url"]).removesuffix("/v1")


def client(n: dict[str, Any], key: str, seen: list[httpx.Response] | None = None) -> ollama.Client:
    """The official client for node ``n``; ``seen`` collects its responses (for the headers the
    client does not show)."""
    hooks = {"response": [seen.append]} if seen is not None else {}
    return ollama.Client(host=root(n), headers={"Authorization": f"Bearer {key}"}, timeout=60,
                         event_hooks=hooks)


def names(n: dict[str, Any], key: str) -> set[str]:
    try:
        return {str(m.model) for m in client(n, key).list().models}
    except (ollama.ResponseError, httpx.HTTPError):
        return set()


def lists_both(n: dict[str, Any], key: str) -> bool:
    return {"tiny", "tiny-solo"} <= names(n, key)


def node(mesh: dict[str, Any], name: str) -> dict[str, Any]:
    return next(n for n in mesh["nodes"] if n["name"] == name)


def test_every_node_lists_every_model_of_the_mesh(mesh: dict[str, Any]) -> None:
    manifest = mesh["manifest"]
    for n in mesh["nodes"]:
        listed = {m.model: m for m in client(n, mesh["key"]).list().models}
        assert {"tiny", "tiny-solo"} <= set(listed)
        tiny = listed["tiny"]
        assert tiny.details is not None and tiny.details.quantization_level == "fp32"
        assert tiny.details.family == "llama" and tiny.details.format == "meshd"
        assert tiny.digest == manifest.content_hash and tiny.size == manifest.weights_bytes


def test_show_says_what_the_model_is(mesh: dict[str, Any]) -> None:
    manifest = mesh["manifest"]
    shown = client(node(mesh, "n1"), mesh["key"]).show("tiny:latest")
    assert shown.template == CHAT_TEMPLATE
    assert shown.modelinfo is not None
    assert shown.modelinfo["general.architecture"] == "llama"
    assert shown.modelinfo["general.parameter_count"] == parameter_count(manifest.arch)
    assert shown.modelinfo["llama.context_length"] == manifest.arch.max_position_embeddings
    assert shown.modelinfo["llama.block_count"] == 4
    # a model only a peer serves: what its adverts say
    solo = client(node(mesh, "n1"), mesh["key"]).show("tiny-solo")
    assert solo.details is not None and solo.details.quantization_level == "fp32"
    assert solo.modelinfo is not None and solo.modelinfo["meshd.context_length"] == 256
    assert solo.modelinfo["meshd.nodes"] == 1


def test_version(mesh: dict[str, Any]) -> None:
    from meshd import __version__

    r = httpx.get(root(node(mesh, "n2")) + "/api/version",
                  headers={"authorization": f"Bearer {mesh['key']}"}, timeout=30)
    assert r.json() == {"version": __version__}


def test_a_chat_and_its_timings(mesh: dict[str, Any]) -> None:
    n1 = node(mesh, "n1")
    seen: list[httpx.Response] = []
    r = client(n1, mesh["key"], seen).chat(model="tiny", messages=HELLO, options=GREEDY)
    assert r.done and r.done_reason in ("stop", "length") and r.model == "tiny"
    assert r.message.role == "assistant" and r.message.content
    assert r.eval_count and r.prompt_eval_count and r.prompt_eval_count > 4  # the template's
    assert r.total_duration and r.prompt_eval_duration and r.eval_duration is not None
    assert r.total_duration == r.prompt_eval_duration + r.eval_duration
    # 40 tokens/s: decoding the answer takes about (eval_count - 1) / 40 s
    assert r.eval_duration >= max(0, r.eval_count - 3) / 40 * 1e9 * 0.8
    rid = seen[-1].headers["x-request-id"]
    assert seen[-1].headers["x-meshd-served-by"] in {"n1", "n2", "n3"}
    explained = json.loads(meshd("explain", rid, "--socket", n1["socket"], "--json").stdout)
    assert explained  # the same audit record as a `meshd submit` or an OpenAI request


def test_a_streamed_chat_says_what_the_plain_one_says(mesh: dict[str, Any]) -> None:
    c = client(node(mesh, "n3"), mesh["key"])
    parts = list(c.chat(model="tiny", messages=HELLO, options=GREEDY, stream=True))
    assert [p.done for p in parts][-1] is True and not any(p.done for p in parts[:-1])
    last = parts[-1]
    assert last.done_reason in ("stop", "length") and last.eval_count
    text = "".join(p.message.content or "" for p in parts)
    assert text == c.chat(model="tiny", messages=HELLO, options=GREEDY).message.content


def test_generate_plain_and_streamed(mesh: dict[str, Any]) -> None:
    c = client(node(mesh, "n1"), mesh["key"])
    plain = c.generate(model="tiny", prompt="Once upon a time", options=GREEDY)
    assert plain.done and plain.response and plain.eval_count
    streamed = list(c.generate(model="tiny", prompt="Once upon a time", options=GREEDY,
                               stream=True))
    assert "".join(p.response or "" for p in streamed) == plain.response
    assert streamed[-1].done and streamed[-1].eval_count == plain.eval_count
    # generate without raw is the prompt as one user message, as a chat of that message is
    chat = c.chat(model="tiny", messages=[{"role": "user", "content": "Once upon a time"}],
                  options=GREEDY)
    assert chat.message.content == plain.response


def test_a_request_entering_a_node_without_the_model_is_forwarded(mesh: dict[str, Any]) -> None:
    seen: list[httpx.Response] = []
    c = client(node(mesh, "n1"), mesh["key"], seen)
    parts = list(c.generate(model="tiny-solo", prompt="Once upon a time", stream=True,
                            options={"num_predict": 4}))
    assert seen[-1].headers["x-meshd-served-by"] == "n3"
    assert seen[-1].headers["x-meshd-route"].split(",")[-1] == "n3"
    assert parts[-1].done and "".join(p.response or "" for p in parts)
    r = c.generate(model="tiny-solo:latest", prompt="Once upon a time", options={"num_predict": 4})
    assert seen[-1].headers["x-meshd-served-by"] == "n3" and r.response


def test_embed_with_the_nodes_embedding_model(mesh: dict[str, Any]) -> None:
    c = client(node(mesh, "n2"), mesh["key"])
    r = c.embed(model="all-minilm-l6-v2", input=["How do I reset my password?",
                                                  "I forgot my password"])
    assert len(r.embeddings) == 2 and len(r.embeddings[0]) == 384
    assert all(abs(math.sqrt(sum(x * x for x in v)) - 1) < 1e-3 for v in r.embeddings)
    assert r.prompt_eval_count and r.total_duration
    with pytest.raises(ollama.ResponseError) as e:  # n1 runs no semantic cache: no model
        client(node(mesh, "n1"), mesh["key"]).embed(model="all-minilm-l6-v2", input="x")
    assert e.value.status_code == 400


def test_errors_the_client_raises(mesh: dict[str, Any]) -> None:
    c = client(node(mesh, "n1"), mesh["key"])
    with pytest.raises(ollama.ResponseError) as e:
        c.chat(model="no-such-model", messages=HELLO)
    assert e.value.status_code == 404 and "no-such-model" in e.value.error
    with pytest.raises(ollama.ResponseError) as e:
        c.chat(model="tiny", messages=HELLO, format="json")
    assert e.value.status_code == 400 and e.value.error.startswith("format:")
    with pytest.raises(ollama.ResponseError) as e:
        c.generate(model="tiny", prompt="x", options={"num_ctx": 100_000})
    assert e.value.status_code == 400 and "context of 256 tokens" in e.value.error
    with pytest.raises(ollama.ResponseError) as e:
        client(node(mesh, "n1"), "meshd-not-a-key").list()
    assert e.value.status_code == 401


def test_a_client_over_its_quota_gets_429(mesh: dict[str, Any]) -> None:
    n1 = node(mesh, "n1")
    c = client(n1, mesh["alice"])
    stream = c.chat(model="tiny", messages=HELLO, stream=True, options={"num_predict": 200})
    try:
        next(iter(stream))  # alice's first request is in flight
        with pytest.raises(ollama.ResponseError) as e:
            c.chat(model="tiny", messages=HELLO, options={"num_predict": 2})
        assert e.value.status_code == 429 and "quota" in e.value.error
        other = client(n1, mesh["key"]).chat(model="tiny", messages=HELLO,
                                              options={"num_predict": 2})
        assert other.done  # another client is not held back
    finally:
        stream.close()  # type: ignore[attr-defined]
