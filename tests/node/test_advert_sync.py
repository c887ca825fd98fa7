"""How adverts that arrive by SYNC and by gossip meet, on in-process nodes (no network).

* An advert we took by SYNC first must still be forwarded when its gossip copy arrives (a
  validator that rejected it as a replay would stop it spreading past us), without being applied
  twice; an older advert is still a replay.
* A peer dropped because our link to it broke comes back when a live peer's SYNC vouches for its
  latest advert (a thawed node re-learns a mesh whose adverts did not change meanwhile); a peer
  that merely expired does not, and nothing older than the latest is ever taken.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "keys"))

from keys_helpers import new_ca  # noqa: E402

from meshd.config import Config  # noqa: E402
from meshd.net.attest import Attestor  # noqa: E402
from meshd.node.membership import Membership  # noqa: E402
from meshd.node.runner import Runner  # noqa: E402
from meshd.node.stages import StageServer  # noqa: E402


def nodes(*names: str) -> list[Membership]:
    """The membership service of one node per name, as the node builds it (no network)."""
    ca = new_ca()
    out = []
    for n in names:
        identity = ca.issue(n)
        runner = Runner()
        out.append(Membership(Config(), identity, Attestor(identity.ca_public_key), runner,
                              StageServer(runner, n)))
    return out


def run(fn: Any) -> Any:
    return trio.run(fn)


def test_a_synced_advert_is_forwarded_again_by_gossip_but_applied_once() -> None:
    async def main() -> None:
        me, peer = nodes("me", "peer")
        old = peer.sign_advert()
        latest = peer.sign_advert()
        assert me.accept_synced([latest]) == 1
        accepted = me.stats["adverts_accepted"]
        # the gossip copy of the same advert: forwarded (True), not applied again
        assert me.validate(peer.peer_id, latest)
        assert latest not in me._validated and me.stats["adverts_accepted"] == accepted
        # an older advert is a replay, by gossip and by SYNC alike
        assert not me.validate(peer.peer_id, old)
        assert me.accept_synced([old]) == 0
        assert me.table.get(peer.peer_id).advert.seq == peer.seq  # type: ignore[union-attr]

    run(main)


def test_a_peer_dropped_on_link_loss_comes_back_through_a_sync_of_its_latest_advert() -> None:
    async def main() -> None:
        me, peer = nodes("me", "peer")
        old = peer.sign_advert()
        latest = peer.sign_advert()
        assert me.accept_synced([old, latest]) >= 1
        assert me.drop_peer(peer.peer_id)
        assert me.table.get(peer.peer_id) is None
        # while dropped, neither the older advert nor a gossip copy of the latest brings it back
        assert me.accept_synced([old]) == 0
        assert me.validate(peer.peer_id, latest) is False
        assert me.table.get(peer.peer_id) is None
        # a live peer's SYNC hands over its latest advert: back, once
        assert me.accept_synced([latest]) == 1
        assert me.table.get(peer.peer_id) is not None
        assert me.accept_synced([latest]) == 0

    run(main)


def test_a_peer_that_expired_is_not_brought_back_by_the_same_advert() -> None:
    async def main() -> None:
        me, peer = nodes("me", "peer")
        latest = peer.sign_advert()
        assert me.accept_synced([latest]) == 1
        assert me.table.expire(trio.current_time() + 3600) == [peer.peer_id]
        assert me.accept_synced([latest]) == 0
        assert me.table.get(peer.peer_id) is None
        # its next advert does
        assert me.accept_synced([peer.sign_advert()]) == 1

    run(main)


def test_a_revoked_peers_held_advert_is_not_forwarded() -> None:
    async def main() -> None:
        me, peer = nodes("me", "peer")
        latest = peer.sign_advert()
        assert me.accept_synced([latest]) == 1
        me.attestor.revoke({peer.identity.certificate.serial})
        me.table.drop(peer.peer_id)  # what a revocation list in force does to the table
        assert me.validate(peer.peer_id, latest) is False

    run(main)
