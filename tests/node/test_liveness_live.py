"""Liveness across real daemons, with adverts far apart so that only pings can find a stall.

Three daemons gossip an advert every 60 s (a peer would expire after 180 s), ping each peer every
2 s for RTT and give an unanswered ping 1.5 s. A SIGSTOPped daemon must leave both other tables
within seconds, found by its silence, and once it thaws it must be back without waiting for its
next advert (it redials its bootstrap peer and hands out a fresh advert).

Then, with the default ping settings (one RTT ping per peer every ~10 s), a server frozen in the
middle of a request must be found through the busy-peer rule (pinged after 1 s of silence,
stalled 3 s later) and the request finished elsewhere, token for token.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from meshd.control.client import call
from meshd.core.messages import MessageType
from meshd.testnet.drive import peers_of, stream, wait_for
from meshd.testnet.launcher import NodeSpec, down, up

pytestmark = pytest.mark.slow

ADVERT_INTERVAL_S = 60.0
GOSSIP = {"ping_interval_s": 2.0, "stall_timeout_s": 1.5}


@pytest.fixture(scope="module")
def mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    d = tmp_path_factory.mktemp("liveness")
    specs = [NodeSpec(name=f"n{i + 1}", models=[], extra={"gossip": dict(GOSSIP)}) for i in range(3)]
    index = up(d, specs, advert_interval_s=ADVERT_INTERVAL_S)
    try:
        yield {n["name"]: n for n in index["nodes"]}
    finally:
        down(d)


def links_stats(sock: str) -> dict[str, Any]:
    reply = trio.run(call, sock, MessageType.STATUS_REQ, {})
    return dict(reply["data"]["services"]["links"])


def names(sock: str) -> set[str]:
    return {p["name"] for p in peers_of(sock)}


def test_live_peers_with_sparse_pings_and_no_adverts_are_never_dropped(mesh: dict[str, Any]) -> None:
    n1 = mesh["n1"]["socket"]
    # several ping intervals pass with no advert at all: silence between pings is not a stall
    wait_for(lambda: links_stats(n1)["pings"] >= 8, 30, "n1 to ping its peers a few times")
    for node in mesh.values():
        assert names(node["socket"]) == set(mesh) - {node["name"]}
        assert links_stats(node["socket"])["stalls"] == 0


def test_a_frozen_peer_is_found_by_its_silence_and_comes_back_when_thawed(mesh: dict[str, Any]) -> None:
    victim = mesh["n3"]
    others = [mesh["n1"]["socket"], mesh["n2"]["socket"]]
    os.kill(victim["pid"], signal.SIGSTOP)
    try:
        # ping interval 2 s (+25% jitter) + 1.5 s unanswered: well under 10 s, far under the
        # 180 s an advert takes to expire
        wait_for(lambda: all("n3" not in names(s) for s in others), 10, "n1 and n2 to drop frozen n3")
        assert all(links_stats(s)["stalls"] >= 1 for s in others)
    finally:
        os.kill(victim["pid"], signal.SIGCONT)
    # n3 redials its bootstrap peer within 5 s and hands out a fresh advert: back well before
    # its next periodic advert (60 s)
    wait_for(lambda: all("n3" in names(s) for s in others), 25, "n3 back in both tables")
    wait_for(lambda: names(victim["socket"]) == {"n1", "n2"}, 25, "n3 to see both peers again")


def test_status_reports_the_liveness_counters(mesh: dict[str, Any]) -> None:
    sock = mesh["n1"]["socket"]
    wait_for(lambda: links_stats(sock)["tracked"] == links_stats(sock)["channels"] == 2, 10,
             "n1 to track exactly its two live channels")
    assert {"pings", "stalls", "dials_yielded"} <= set(links_stats(sock))


# ---------------------------------------------------------------- a server frozen mid-request

CAPPED = {"path": "default", "max_decode_tokens_per_s": 25.0}  # a stream lasts ~1.6 s


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> Iterator[dict[str, Any]]:
    d = tmp_path_factory.mktemp("frozen-server")
    specs = [NodeSpec(name="entry", models=[]), NodeSpec(name="s1", models=[CAPPED]),
             NodeSpec(name="s2", models=[CAPPED])]
    index = up(d, specs, advert_interval_s=ADVERT_INTERVAL_S)
    try:
        yield {n["name"]: n for n in index["nodes"]}
    finally:
        for n in index["nodes"]:
            try:
                os.kill(n["pid"], signal.SIGCONT)
            except ProcessLookupError:
                pass
        down(d)


async def generate(sock: str, on_first: Any = None) -> dict[str, Any]:
    fields = {"rid": uuid.uuid4().hex[:16], "prompt": "the quick brown fox", "max_tokens": 40,
              "temperature": 0.0}
    return await stream(sock, fields, on_first)


def test_a_server_frozen_mid_request_is_found_fast_and_the_request_finishes_elsewhere(
        served: dict[str, Any]) -> None:
    entry = served["entry"]["socket"]
    reference = trio.run(generate, entry)
    frozen: list[tuple[str, float]] = []

    def freeze(name: str) -> None:
        os.kill(served[name]["pid"], signal.SIGSTOP)
        frozen.append((name, time.monotonic()))

    result = trio.run(generate, entry, freeze)
    name, t_freeze = frozen[0]
    assert result["ids"] == reference["ids"]
    assert result["served"][-1] != name
    # busy_ping_after_s 1 + stall_timeout_s 3 + the rest of the stream (~1.6 s) + slack for a
    # busy box; an idle-only ping (every ~10 s) could not get anywhere near this
    assert result["done_at"] - t_freeze < 9.0, result["done_at"] - t_freeze
