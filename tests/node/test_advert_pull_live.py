"""Adverts pulled over a link when gossip stops bringing them, on real daemons.

Gossipsub can leave a node with an empty mesh for a whole prune back-off (60 s in py-libp2p):
then it hears nobody's adverts and nobody hears its own while every link is up, and the peers
expire from each other's tables (seen on the loaded regions testnet, docs/routing.md). A node
asks a linked peer for its advert directly once gossip has not brought one for
``pull_after_intervals`` advert intervals.

Three daemons on loopback. ``quiet`` advertises only every 40 s. ``puller`` and ``nopull``
expect an advert every second (a peer expires after 3 s of silence); ``puller`` pulls after 2 s,
``nopull`` has pulls turned off. So gossip alone cannot keep ``quiet`` in either table between
its adverts: ``puller`` must keep it through pulls, and ``nopull`` must lose it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from meshd.control.client import call
from meshd.core.messages import MessageType
from meshd.testnet.drive import peers_of, wait_for
from meshd.testnet.launcher import NodeSpec, down, up

pytestmark = pytest.mark.slow

FAST = {"advert_interval_s": 1.0, "expiry_intervals": 3.0}


@pytest.fixture(scope="module")
def mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    d: Path = tmp_path_factory.mktemp("pull")
    specs = [
        NodeSpec(name="quiet", models=[], extra={"gossip": {"advert_interval_s": 40.0}}),
        NodeSpec(name="puller", models=[], extra={"gossip": {**FAST, "pull_after_intervals": 2.0}}),
        NodeSpec(name="nopull", models=[], extra={"gossip": {**FAST, "pull_after_intervals": 0.0}}),
    ]
    index = up(d, specs, advert_interval_s=1.0)
    try:
        yield {n["name"]: n for n in index["nodes"]}
    finally:
        down(d)


def status(sock: str) -> dict[str, Any]:
    return dict(trio.run(call, sock, MessageType.STATUS_REQ, {})["data"])


def names(sock: str) -> set[str]:
    return {p["name"] for p in peers_of(sock)}


def test_a_peer_gossip_is_silent_about_stays_known_through_pulls(mesh: dict[str, Any]) -> None:
    puller, nopull = mesh["puller"]["socket"], mesh["nopull"]["socket"]
    wait_for(lambda: "quiet" in names(puller), 30, "puller to learn quiet")
    # without pulls quiet expires 3 s after its advert: nopull loses it well before the next one
    wait_for(lambda: "quiet" not in names(nopull), 30, "nopull to let silent quiet expire")
    assert status(nopull)["services"]["links"]["pulls"] == 0
    # meanwhile puller keeps quiet: each check below must see it, over several expiry periods
    start = status(puller)["services"]["links"]["pulls_answered"]
    seen: list[bool] = []

    def pulled_enough() -> bool:
        seen.append("quiet" in names(puller))
        return status(puller)["services"]["links"]["pulls_answered"] >= start + 4

    wait_for(pulled_enough, 30, "puller to pull quiet's advert four more times")
    assert all(seen), f"quiet left puller's table {seen.count(False)} of {len(seen)} checks"
    st = status(puller)["services"]
    assert st["node"]["adverts_pulled"] >= start + 4
    assert st["links"]["pull_bytes_in"] > 300 * st["links"]["pulls_answered"]  # whole adverts
    # quiet hears puller's gossip every second: it never needs to pull
    assert status(mesh["quiet"]["socket"])["services"]["links"]["pulls"] == 0
