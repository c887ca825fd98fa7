"""Continuous batching through the real serving path: a default-config node (the embedded
``max_concurrency``) decodes 8 API streams in one batch, each stream's text is what it is alone,
and the node's advert tells its peers its batch capacity and measured batch speeds."""

from __future__ import annotations

import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import openai
import pytest

from meshd.testnet.drive import wait_for
from meshd.testnet.launcher import NodeSpec, down, up

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("batch-mesh")
    # n1 serves the shipped model with the default config; n2 serves nothing, so every request
    # entering at n2 is served by n1
    index = up(root / "net", [NodeSpec(name="n1"), NodeSpec(name="n2", models=[])],
               advert_interval_s=1.0)
    try:
        index["key"] = Path(index["api_key_file"]).read_text().strip()
        yield index
    finally:
        down(root / "net")


def _ask(n: dict[str, Any], what: str) -> dict[str, Any]:
    import trio

    from meshd.control.client import call
    from meshd.core.messages import MessageType

    out: dict[str, Any] = trio.run(call, n["socket"], MessageType[what], {})
    return out


def _status(n: dict[str, Any]) -> dict[str, Any]:
    return dict(_ask(n, "STATUS_REQ")["data"])


def _peers(n: dict[str, Any]) -> list[dict[str, Any]]:
    return list(_ask(n, "PEERS_REQ")["peers"])


def _complete(url: str, key: str, prompt: str) -> str:
    c = openai.OpenAI(base_url=url, api_key=key, max_retries=0, timeout=60)
    r = c.completions.create(model="tiny-en", prompt=prompt, max_tokens=40, temperature=0)
    return str(r.choices[0].text)


def test_eight_api_streams_decode_in_one_batch_as_if_alone(mesh: dict[str, Any]) -> None:
    n1, n2 = mesh["nodes"]
    url, key = n2["api_url"], mesh["key"]
    prompts = [f"And it came to pass that the {w}" for w in
               ("king", "people", "priest", "men", "city", "son", "LORD", "land")]
    wait_for(lambda: any(m["name"] == "tiny-en" for p in _peers(n2) for m in p["models"]), 60,
             lambda: f"n2 to hear n1's advert (n2's peers: {_peers(n2)})")
    alone = {p: _complete(url, key, p) for p in prompts[:2]}
    with ThreadPoolExecutor(len(prompts)) as pool:
        together = dict(zip(prompts, pool.map(lambda p: _complete(url, key, p), prompts),
                            strict=True))
    for p, text in alone.items():
        assert together[p] == text and text

    def idle() -> dict[str, Any] | None:  # the answers kept for the next turns, too
        model = next(m for m in _status(n1)["models"] if m["model"] == "tiny-en")
        b = model["batch"]
        return model if b["running"] == 0 and b["answers_waiting"] == 0 else None

    model = wait_for(idle, 30, "n1's batch to finish the streams and keep their answers")
    assert model["max_concurrency"] >= 8  # the embedded default admits 8 streams
    batch = model["batch"]
    assert batch["max_batch_seen"] >= 4, batch  # they decoded together
    assert batch["decode_runs"] < batch["tokens"]
    assert batch["answers_kept"] >= 8  # [engine] keep_answers is on by default
    assert batch["kv_bytes"] == 0  # every row freed

    def advertised() -> dict[str, Any] | None:
        for p in _peers(n2):
            for m in p["models"]:
                if m["name"] == "tiny-en" and m.get("batch"):
                    return dict(m)
        return None

    m = wait_for(advertised, 30, "n1's advert to carry its batch capacity")
    assert m["batch"] >= 8
    assert len(m["batch_tps"]) >= 4 and m["batch_tps"][0] > 0  # measured at 1, 2, 4, 8


def test_a_node_with_batching_off_serves_each_request_in_its_own_loop(
        mesh: dict[str, Any], tmp_path: Path) -> None:
    """``[engine] batching = false``: no batch scheduler runs, and a request is served by the
    one-sequence loop with the same tokens as the batching node gives."""
    fields = {"prompt": "And it came to pass", "max_tokens": 12, "temperature": 0.0,
              "cache": False}
    got, model = _serve_on_a_node_of_its_own(tmp_path, {"batching": False}, fields)
    assert got["served"] and got["ids"]
    assert model["served"] == 1 and "batch" not in model  # served, and no scheduler ran
    assert got["ids"] == _stream(mesh["nodes"][0], fields)["ids"]


def _stream(node: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    import trio

    from meshd.testnet.drive import stream

    return dict(trio.run(stream, node["socket"], {**fields, "rid": os.urandom(6).hex()}))


def _serve_on_a_node_of_its_own(tmp_path: Path, engine: dict[str, Any], fields: dict[str, Any]
                                ) -> tuple[dict[str, Any], dict[str, Any]]:
    """Start one daemon with these ``[engine]`` keys, serve ``fields`` on it, and return the
    answer and the status of its tiny-en model, taken before it stops."""
    index = up(tmp_path / "net", [NodeSpec(name="solo", extra={"engine": engine})],
               advert_interval_s=1.0)
    try:
        solo = index["nodes"][0]
        got = _stream(solo, fields)
        model = next(m for m in _status(solo)["models"] if m["model"] == "tiny-en")
    finally:
        down(tmp_path / "net")
    return got, model


def test_fused_prefill_can_be_turned_off_and_gives_the_same_tokens(
        mesh: dict[str, Any], tmp_path: Path) -> None:
    """``[engine] fused_prefill = false`` (memory-short boxes): the batch scheduler runs without
    the fused graph, and a request gets the same tokens as on a node with it on."""
    fields = {"prompt": "In the beginning", "max_tokens": 10, "temperature": 0.0, "cache": False}
    got, model = _serve_on_a_node_of_its_own(tmp_path, {"fused_prefill": False}, fields)
    assert got["served"] and model["batch"]["fused"] is False
    assert model["batch"]["fused_runs"] == 0
    on = next(m for m in _status(mesh["nodes"][0])["models"] if m["model"] == "tiny-en")
    assert on["batch"]["fused"] is True
    assert got["ids"] == _stream(mesh["nodes"][0], fields)["ids"]
