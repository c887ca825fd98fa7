"""Failover and hard constraints across real daemons (routing issue's acceptance):

- the daemon serving a request is SIGKILLed mid-stream: the client still gets one complete
  stream, token for token identical to an undisturbed greedy run;
- every node that may serve a residency-tagged request is stopped: the request fails fast with a
  clear error and never runs anywhere else.

Four daemons on loopback. The entry node serves no model, so requests always leave it; the two
"eu" nodes are capped at 25 decode tokens/s (a production knob) so that a stream lasts long
enough to be cut in the middle; the "us" node serves the same model uncapped.
"""

from __future__ import annotations

import os
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from meshd.control.client import call
from meshd.core.messages import MessageType
from meshd.errors import RemoteError
from meshd.testing.wait import wait_for
from meshd.testnet.children import alive, reap
from meshd.testnet.drive import stream
from meshd.testnet.launcher import NodeSpec, down, up

pytestmark = pytest.mark.slow

CAPPED = {"path": "default", "max_decode_tokens_per_s": 25.0}
PROMPT = "the quick brown fox"
MAX_TOKENS = 40


@pytest.fixture(scope="module")
def mesh(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> Iterator[dict[str, Any]]:
    d = tmp_path_factory.mktemp("failover")
    specs = [
        NodeSpec(name="entry", region="us", models=[]),
        NodeSpec(name="eu1", region="eu", models=[CAPPED]),
        NodeSpec(name="eu2", region="eu", models=[CAPPED]),
        NodeSpec(name="us1", region="us"),
    ]
    index = up(d, specs, advert_interval_s=1.0)
    try:
        yield {n["name"]: n for n in index["nodes"]}
    finally:
        down(d)


def greedy(**extra: Any) -> dict[str, Any]:
    return {"rid": uuid.uuid4().hex[:16], "prompt": PROMPT, "max_tokens": MAX_TOKENS,
            "temperature": 0.0, **extra}


def requests_served(sock: str) -> int:
    reply = trio.run(call, sock, MessageType.STATUS_REQ, {})
    return int(reply["data"]["services"]["request_server"]["requests"])


def test_serving_daemon_killed_mid_stream_gives_identical_output(mesh: dict[str, Any]) -> None:
    entry = mesh["entry"]["socket"]
    # undisturbed reference, on the same eu nodes (residency keeps us1 out of it)
    reference = trio.run(stream, entry, greedy(residency="eu"))
    assert len(reference["ids"]) >= 8, "the reference run is too short to cut in the middle"

    killed: list[str] = []

    def kill(served_by: str) -> None:
        node = mesh[served_by]
        os.kill(node["pid"], signal.SIGKILL)
        killed.append(served_by)

    result = trio.run(stream, entry, greedy(residency="eu"), kill)
    reap(mesh[killed[0]]["pid"])
    assert killed and killed[0] in ("eu1", "eu2")
    assert result["ids"] == reference["ids"]
    assert result["stats"]["retries"] >= 1
    survivor = "eu2" if killed[0] == "eu1" else "eu1"
    assert result["served"][-1] == survivor
    assert result["stats"]["route"][-1] == survivor
    # the explanation records the retry after the kill
    rec = trio.run(call, entry, MessageType.EXPLAIN_REQ, {"rid": result["stats"]["request_id"]})
    assert rec["record"] is not None


def test_residency_request_fails_clearly_when_no_allowed_node_is_left(mesh: dict[str, Any]) -> None:
    entry = mesh["entry"]["socket"]
    for name in ("eu1", "eu2"):
        if alive(mesh[name]["pid"]):
            os.kill(mesh[name]["pid"], signal.SIGKILL)
            reap(mesh[name]["pid"])

    def eu_gone() -> bool:
        reply = trio.run(call, entry, MessageType.PEERS_REQ, {})
        return not any(p["region"] == "eu" for p in reply["peers"])

    wait_for(eu_gone, 20, "the killed eu nodes to leave the entry's peer table")
    before = requests_served(mesh["us1"]["socket"])
    with pytest.raises(RemoteError) as err:
        trio.run(stream, entry, greedy(residency="eu"))
    assert err.value.code == "no_route"
    assert "eu" in str(err.value)
    # it never ran elsewhere: the only live server did not see it
    assert requests_served(mesh["us1"]["socket"]) == before
    # and an unconstrained request still works
    assert trio.run(stream, entry, greedy())["served"] == ["us1"]
