"""Edge tokenization on real daemons (docs/edge-tokenization.md, issue 15).

Three daemons: ``srv`` serves the shipped model tiny-en; ``entry`` and ``plain`` serve nothing.
``entry`` fetches tiny-en's tokenizer from ``srv`` (prefetched as soon as it hears the advert),
tokenizes what enters it and forwards packed ids only; ``plain`` has ``edge_tokenize = false``
and forwards text, as every node without the model did before. What reaches ``srv`` is read
from its request server's counters; greedy output must be the engine's own, both ways. Every
wait is on a condition with a deadline.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
import trio

from meshd.control.client import call
from meshd.core.messages import MessageType
from meshd.engine import GenerationConfig, default_model_path, load_model
from meshd.errors import RemoteError
from meshd.testnet.drive import cli as meshd
from meshd.testnet.drive import stream, wait_for
from meshd.testnet.launcher import NodeSpec, down, up

pytestmark = pytest.mark.slow

MODEL = default_model_path()
PROMPTS = ["In the beginning God created", "And Moses spake unto the children of Israel, saying"]


@pytest.fixture(scope="module")
def mesh(tmp_path_factory: pytest.TempPathFactory, shipped_model: None) -> Iterator[dict[str, Any]]:
    d = tmp_path_factory.mktemp("edgetok")
    specs = [NodeSpec(name="srv", models=[{"path": "default"}]),
             NodeSpec(name="entry", models=[]),
             NodeSpec(name="plain", models=[], extra={"routing": {"edge_tokenize": False}})]
    index = up(d, specs, advert_interval_s=1.0)
    try:
        index["key"] = Path(index["api_key_file"]).read_text().strip()
        yield index
    finally:
        down(d)


@pytest.fixture(scope="module")
def engine() -> Any:
    return load_model(MODEL)


def node(mesh: dict[str, Any], name: str) -> dict[str, Any]:
    return next(n for n in mesh["nodes"] if n["name"] == name)


def services(mesh: dict[str, Any], name: str) -> dict[str, Any]:
    reply = trio.run(call, node(mesh, name)["socket"], MessageType.STATUS_REQ, {})
    return dict(reply["data"]["services"])


def served(mesh: dict[str, Any]) -> dict[str, int]:
    s = services(mesh, "srv")["request_server"]
    return {k: s[k] for k in ("requests", "prompts_packed", "prompts_ids", "prompts_text")}


def events(mesh: dict[str, Any], at: str, rid: str) -> list[dict[str, Any]]:
    rec = json.loads(meshd("explain", "--json", rid, "--socket", node(mesh, at)["socket"]).stdout)
    return list(rec["events"])


def submit(mesh: dict[str, Any], at: str, prompt: str, n: int = 16) -> dict[str, Any]:
    return trio.run(stream, node(mesh, at)["socket"],
                    {"prompt": prompt, "max_tokens": n, "temperature": 0.0})


def test_the_entry_prefetches_the_advertised_tokenizer(mesh: dict[str, Any], engine: Any) -> None:
    from meshd.node.daemon import EngineModel

    ident = EngineModel(engine).tokenizer_identity()
    wait_for(lambda: ident[:12] in services(mesh, "entry")["tokenizers"]["held"], 30,
             lambda: f"entry to hold tokenizer {ident[:12]}: {services(mesh, 'entry')['tokenizers']}")
    stats = services(mesh, "entry")["tokenizers"]
    assert stats["fetched"] == 1 and stats["hash_rejected"] == 0
    cached = Path(node(mesh, "entry")["dir"]) / "state" / "tokenizers" / f"{ident}.mtok"
    assert cached.is_file()
    assert services(mesh, "srv")["request_server"]["tokenizers_served"] >= 1
    # plain (edge_tokenize = false) fetches nothing
    assert services(mesh, "plain")["tokenizers"]["fetches"] == 0


@pytest.mark.parametrize("prompt", PROMPTS)
def test_ids_and_text_give_the_engines_own_output(mesh: dict[str, Any], engine: Any,
                                                  prompt: str) -> None:
    ref = [e.token_id for e in engine.generate_sync(prompt, GenerationConfig(max_tokens=16,
                                                                             temperature=0.0))]
    wait_for(lambda: services(mesh, "entry")["tokenizers"]["held"], 30, "the entry's tokenizer")
    before = served(mesh)
    edge = submit(mesh, "entry", prompt)
    mid = served(mesh)
    text = submit(mesh, "plain", prompt)
    after = served(mesh)
    assert edge["ids"] == ref and text["ids"] == ref
    assert edge["served"] == ["srv"] and text["served"] == ["srv"]
    # entry's REQ carried packed ids and no text; plain's carried the text
    assert mid["prompts_packed"] - before["prompts_packed"] == 1
    assert mid["prompts_text"] == before["prompts_text"] and mid["prompts_ids"] == before["prompts_ids"]
    assert after["prompts_text"] - mid["prompts_text"] == 1
    assert after["prompts_packed"] == mid["prompts_packed"]
    # the journals say so: exact prompt tokens at the entry, an estimate and why at plain
    got = {e["kind"]: e["payload"] for e in events(mesh, "entry", edge["stats"]["request_id"])}
    assert got["received"]["tokenized"] == "edge"
    assert got["received"]["prompt_tokens"] == len(engine.encode_prompt(prompt))
    assert "tokenizer_unavailable" not in got
    got = {e["kind"]: e["payload"] for e in events(mesh, "plain", text["stats"]["request_id"])}
    assert got["received"]["tokenized"] == "text"
    assert "edge_tokenize = false" in got["tokenizer_unavailable"]["reason"]


@pytest.mark.parametrize(("fields", "says"), [
    ({"prompt": "and the " * 400, "max_tokens": 4}, "and the model's context is 256"),
    ({"prompt": "In the beginning", "max_tokens": 300}, "is over the model's context of 256"),
])
def test_a_prompt_too_long_is_refused_at_an_entry_without_the_model(
        mesh: dict[str, Any], fields: dict[str, Any], says: str) -> None:
    wait_for(lambda: services(mesh, "entry")["tokenizers"]["held"], 30, "the entry's tokenizer")
    before = served(mesh)["requests"]
    with pytest.raises(RemoteError) as err:
        trio.run(stream, node(mesh, "entry")["socket"], fields)
    assert err.value.code == "context_length_exceeded"
    assert says in str(err.value) and "the prompt is " in str(err.value)
    assert served(mesh)["requests"] == before  # nothing was forwarded
    # the CLI says it in one line, exit 69
    proc = meshd("submit", "-n", str(fields["max_tokens"]), "--socket", node(mesh, "entry")["socket"],
                 fields["prompt"], check=False)
    assert proc.returncode == 69 and "context_length_exceeded" in proc.stderr + proc.stdout
    assert "Traceback" not in proc.stderr


def test_chat_messages_at_an_entry_without_the_model(mesh: dict[str, Any], engine: Any) -> None:
    wait_for(lambda: services(mesh, "entry")["tokenizers"]["held"], 30, "the entry's tokenizer")
    msgs = [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": "And God said"}]
    ids = engine.tokenizer.encode_chat(msgs)
    ref = "".join(e.text for e in engine.generate_sync(ids, GenerationConfig(max_tokens=12,
                                                                             temperature=0.0)))
    before = served(mesh)["prompts_packed"]
    out = openai.OpenAI(base_url=node(mesh, "entry")["api_url"], api_key=mesh["key"],
                        max_retries=0, timeout=60).chat.completions.create(
        model="tiny-en", messages=msgs, max_tokens=12, temperature=0.0)  # type: ignore[arg-type]
    assert out.choices[0].message.content == ref
    assert out.usage is not None and out.usage.prompt_tokens == len(ids)
    assert served(mesh)["prompts_packed"] == before + 1
    # without edge tokenization a node lacking the model cannot render chat messages
    with pytest.raises(openai.BadRequestError, match="edge_tokenize"):
        openai.OpenAI(base_url=node(mesh, "plain")["api_url"], api_key=mesh["key"],
                      max_retries=0, timeout=60).chat.completions.create(
            model="tiny-en", messages=msgs, max_tokens=4)  # type: ignore[arg-type]
