"""What the web console reads of a node (meshd/node/console.py), in process: this node's own row,
its peers, a peer that left the table stays as departed, a revoked one is named; and the rows of
`meshd peers` carry each model's tier and weight format, the slots and the coordinate."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "keys"))

from keys_helpers import new_ca  # noqa: E402

from meshd.api.console.atlas import mesh_map  # noqa: E402
from meshd.config import Config  # noqa: E402
from meshd.net.attest import Attestor  # noqa: E402
from meshd.node.console import ConsoleFacts  # noqa: E402
from meshd.node.membership import Membership, weight_format  # noqa: E402
from meshd.node.node import Node  # noqa: E402
from meshd.node.runner import Runner  # noqa: E402
from meshd.node.stages import StageServer  # noqa: E402


def membership(ca: object, name: str) -> Membership:
    identity = ca.issue(name)  # type: ignore[attr-defined]
    runner = Runner()
    return Membership(Config(), identity, Attestor(identity.ca_public_key), runner,
                      StageServer(runner, name))


def test_departed_and_revoked_peers_stay_on_the_map() -> None:
    async def main() -> None:
        ca = new_ca()
        node = Node(Config(), ca.issue("me"), Runner())
        facts = ConsoleFacts(node)
        left, cut = membership(ca, "left"), membership(ca, "cut")
        assert node.membership.accept_synced([left.sign_advert(), cut.sign_advert()]) == 2
        rows = facts.mesh()
        assert rows.local["name"] == "me" and rows.local["known_by"] == "self"
        assert rows.local["coord"]["vec"] and rows.local["slots"] == 1
        assert sorted(p["name"] for p in rows.peers) == ["cut", "left"] and rows.departed == []

        node.membership.drop_peer(left.peer_id)  # its connection was lost
        node.membership.expel([cut.peer_id])  # a revocation list cut it off
        rows = facts.mesh()
        assert rows.peers == []
        assert sorted(p["name"] for p in rows.departed) == ["cut", "left"]
        assert all(p["silent_s"] >= 0 for p in rows.departed)
        assert rows.revoked == {cut.peer_id}
        states = {n["name"]: n["state"] for n in mesh_map(rows)["nodes"]}
        assert states == {"me": "self", "left": "silent", "cut": "revoked"}

        assert facts.identity()["certificate"]["name"] == "me"
        assert await facts.explain("nope") is None and await facts.audit(5) == []  # no store

    trio.run(main)


def test_memory_of_peers_is_bounded() -> None:
    async def main() -> None:
        ca = new_ca()
        node = Node(Config(), ca.issue("me"), Runner())
        facts = ConsoleFacts(node, max_remembered=2)
        peers = [membership(ca, f"p{i}") for i in range(3)]
        node.membership.accept_synced([p.sign_advert() for p in peers])
        assert len(facts.heard) == 2

    trio.run(main)


def test_the_weight_format_of_a_local_model_is_read_through_its_adapter() -> None:
    loaded = SimpleNamespace(manifest=SimpleNamespace(dtype="int4"))
    assert weight_format(SimpleNamespace(model=loaded)) == "int4"  # EngineModel(model)
    assert weight_format(loaded) == "int4"
    assert weight_format(SimpleNamespace(base_url="http://127.0.0.1:1/v1")) == "upstream"
    assert weight_format(object()) == ""
