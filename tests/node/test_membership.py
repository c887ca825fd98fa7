"""The membership service and the node's wiring of it, in process (no network): the status JSON
keeps its keys, RTTs move the coordinate, a revocation expels peers for good."""

from __future__ import annotations

import sys
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "keys"))

from keys_helpers import new_ca  # noqa: E402

from meshd.config import Config  # noqa: E402
from meshd.net.attest import Attestor  # noqa: E402
from meshd.node.membership import Membership  # noqa: E402
from meshd.node.node import Node  # noqa: E402
from meshd.node.runner import Runner  # noqa: E402
from meshd.node.stages import StageServer  # noqa: E402

# what `meshd status --json` has carried under services.node (tests and the metrics read them)
NODE_COUNTERS = ["adverts_published", "adverts_accepted", "adverts_rejected", "adverts_replayed",
                 "adverts_timed", "adverts_synced", "adverts_probed", "adverts_pulled", "adverts_other_cell",
                 "requests_submitted", "requests_failed",
                 "requests_local", "requests_forwarded", "handler_errors"]
SERVICES = ["node", "advert_rejections", "gossip", "advert_delay_ms", "attestation", "links",
            "request_server", "stage_server", "placement", "entry", "cache", "tiers", "upstreams",
            "tokenizers", "rag", "telemetry", "cells"]
TOP = ["name", "peer_id", "region", "cell", "labels", "addrs", "uptime_s", "peers", "queue_depth",
       "in_flight", "models", "hardware", "strategy", "api_url", "coord", "services"]


def membership(ca: object, name: str) -> Membership:
    identity = ca.issue(name)  # type: ignore[attr-defined]
    runner = Runner()
    return Membership(Config(), identity, Attestor(identity.ca_public_key), runner,
                      StageServer(runner, name))


def test_status_keeps_its_keys_and_counts_adverts_under_node() -> None:
    async def main() -> None:
        ca = new_ca()
        node = Node(Config(), ca.issue("me"), Runner())
        peer = membership(ca, "peer")
        assert node.membership.accept_synced([peer.sign_advert(), b"junk"]) == 1
        st = node.status()
        assert list(st) == TOP
        assert list(st["services"]) == SERVICES
        assert list(st["services"]["node"]) == NODE_COUNTERS
        assert st["services"]["node"]["adverts_accepted"] == 1
        assert st["services"]["node"]["adverts_synced"] == 1
        assert st["services"]["node"]["adverts_rejected"] == 1
        assert st["services"]["advert_rejections"] == {"malformed": 1}
        assert st["services"]["advert_delay_ms"] == {"n": 0, "p50": None, "p99": None, "recent": []}
        assert st["peers"] == 1 and st["region"] == "eu-west" and st["cell"] is None  # cells off
        assert [p["name"] for p in node.peers_listing()] == ["peer"]
        assert node.ready_state() == (False, "starting")

    trio.run(main)


def test_rtt_samples_move_the_coordinate_with_the_floor_of_the_window() -> None:
    async def main() -> None:
        ca = new_ca()
        me, peer = membership(ca, "me"), membership(ca, "peer")
        assert me.accept_synced([peer.sign_advert()]) == 1
        before = me.coord
        for ms in (40.0, 9.0, 30.0):
            me.on_rtt(peer.peer_id, ms)
        entry = me.table.get(peer.peer_id)
        assert entry is not None and entry.rtt_ms == 9.0
        assert me.coord != before
        snap = me.snapshot()
        assert {n.peer_id for n in snap.nodes} == {me.peer_id, peer.peer_id}

    trio.run(main)


def test_expel_drops_the_revoked_and_a_sync_never_brings_them_back() -> None:
    async def main() -> None:
        ca = new_ca()
        me, peer = membership(ca, "me"), membership(ca, "peer")
        latest = peer.sign_advert()
        assert me.accept_synced([latest]) == 1
        me.expel([peer.peer_id])
        assert me.table.get(peer.peer_id) is None
        assert me.accept_synced([peer.sign_advert()]) == 0

    trio.run(main)
