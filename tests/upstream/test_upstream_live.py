"""Upstream models on real daemons: a mesh serves a model by forwarding to an OpenAI-compatible
server, here another meshd daemon's HTTP API (a real server process, started by the test).

The backend is a one-node testnet of its own (its own CA) serving a tiny Llama as ``tiny``. The
mesh: ``e1`` serves nothing, ``u1`` serves ``tiny-up`` through the backend, ``u2`` is configured
to serve it through a port where nothing listens (a dead upstream). Another meshd has neither
llama-server's ``/props`` nor a ``/tokenize``: ``u1`` serves in packed text. ``u2``'s server never
answers its probe, so ``u2`` never advertises ``tiny-up`` and requests entered at ``e1`` are
served by ``u1`` however the router orders them.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from meshd.testnet.drive import cli as meshd
from meshd.testnet.drive import wait_for
from meshd.testnet.launcher import NodeSpec, down, free_port, up

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engine"))

from hf_fixtures import CHAT_TEMPLATE, make_checkpoint  # noqa: E402

from meshd.engine import import_hf  # noqa: E402

pytestmark = pytest.mark.slow

HELLO = [{"role": "user", "content": "Once upon a time"}]


@pytest.fixture(scope="module")
def nets(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("upstream")
    make_checkpoint(root / "hf", layers=4, hidden=32, seed=7, chat_template=CHAT_TEMPLATE)
    import_hf(root / "hf", root / "model", stages=1, name="tiny")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MESHD_DEFAULT_MODEL", str(root / "model"))
        backend = up(root / "backend", [NodeSpec(name="b1")], advert_interval_s=1.0)
    try:
        b1 = backend["nodes"][0]
        up_model = {"name": "tiny-up", "upstream": b1["api_url"], "upstream_model": "tiny",
                    "upstream_key_file": backend["api_key_file"], "upstream_timeout_s": 10.0}
        dead = {**up_model, "upstream": f"http://127.0.0.1:{free_port()}/v1"}
        specs = [NodeSpec(name="e1", models=[]), NodeSpec(name="u1", models=[up_model]),
                 NodeSpec(name="u2", models=[dead])]
        mesh = up(root / "mesh", specs, advert_interval_s=1.0)
        try:
            yield {"backend": backend, "mesh": mesh,
                   "key": Path(mesh["api_key_file"]).read_text().strip(),
                   "backend_key": Path(backend["api_key_file"]).read_text().strip()}
        finally:
            down(root / "mesh")
    finally:
        down(root / "backend")


def node(index: dict[str, Any], name: str) -> dict[str, Any]:
    return next(n for n in index["nodes"] if n["name"] == name)


def client(url: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url, api_key=key, max_retries=0, timeout=60)


def test_the_upstream_model_is_advertised_across_the_mesh(nets: dict[str, Any]) -> None:
    e1 = node(nets["mesh"], "e1")
    wait_for(lambda: "tiny-up" in [m.id for m in client(e1["api_url"], nets["key"]).models.list()],
             30, "e1 to list tiny-up")


def test_a_chat_through_the_upstream_matches_the_backend(nets: dict[str, Any]) -> None:
    u1 = node(nets["mesh"], "u1")
    b1 = node(nets["backend"], "b1")
    via = client(u1["api_url"], nets["key"]).chat.completions.create(
        model="tiny-up", messages=HELLO, max_tokens=8, temperature=0,
        extra_body={"cache": False})
    direct = client(b1["api_url"], nets["backend_key"]).chat.completions.create(
        model="tiny", messages=HELLO, max_tokens=8, temperature=0,
        extra_body={"cache": False})
    assert via.choices[0].message.content == direct.choices[0].message.content
    assert via.choices[0].message.content
    streamed = "".join(ch.choices[0].delta.content or "" for ch in client(
        u1["api_url"], nets["key"]).chat.completions.create(
        model="tiny-up", messages=HELLO, max_tokens=8, temperature=0, stream=True,
        extra_body={"cache": False}) if ch.choices)
    assert streamed == direct.choices[0].message.content


def test_a_dead_upstream_is_not_advertised(nets: dict[str, Any]) -> None:
    e1, u2 = node(nets["mesh"], "e1"), node(nets["mesh"], "u2")
    wait_for(lambda: "tiny-up" in [m.id for m in client(e1["api_url"], nets["key"]).models.list()],
             30, "e1 to list tiny-up")
    c = client(e1["api_url"], nets["key"])
    b1 = node(nets["backend"], "b1")
    direct = client(b1["api_url"], nets["backend_key"]).completions.create(
        model="tiny", prompt="Once upon a time", max_tokens=6, temperature=0,
        extra_body={"cache": False}).choices[0].text
    for _ in range(4):  # round robin: every other request goes to u2 first
        raw = c.completions.with_raw_response.create(
            model="tiny-up", prompt="Once upon a time", max_tokens=6, temperature=0,
            extra_body={"strategy": "round_robin", "cache": False})  # no answer from e1's cache
        assert raw.headers["x-meshd-served-by"] == "u1"
        assert raw.parse().choices[0].text == direct
    ups = json.loads(meshd("status", "--socket", u2["socket"], "--json").stdout)["services"]["upstreams"]
    assert not ups["tiny-up"]["ready"] and "unreachable" in ups["tiny-up"]["probe_error"]
    assert ups["tiny-up"]["probe_failures"] >= 1 and ups["tiny-up"]["requests"] == 0
    u1_up = json.loads(meshd("status", "--socket", node(nets["mesh"], "u1")["socket"],
                             "--json").stdout)["services"]["upstreams"]["tiny-up"]
    assert (u1_up["ready"], u1_up["mode"], u1_up["server"]["kind"]) == (True, "text", "openai")
    # u1's adverts carry the upstream's measured speed, as for any model
    peers = json.loads(meshd("peers", "--socket", e1["socket"], "--json").stdout)
    u1_row = next(p for p in peers if p["name"] == "u1")
    assert any(m["name"] == "tiny-up" for m in u1_row["models"])
    assert not any(m["name"] == "tiny-up" for p in peers if p["name"] == "u2" for m in p["models"])
    wait_for(lambda: next(p for p in json.loads(meshd("peers", "--socket", e1["socket"], "--json").stdout)
                          if p["name"] == "u1")["decode_tps"] > 0, 15, "u1 to advertise a decode rate")
