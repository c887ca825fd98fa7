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

from meshd.config import Config, parse_config  # noqa: E402
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


def test_a_linked_peer_that_gossip_stopped_bringing_is_pulled_once_per_period() -> None:
    """Gossip can fall silent while links stay up (an empty gossipsub mesh for a prune back-off):
    the peer is pulled over its link before it would expire, at most once per period, and its
    fresh advert keeps it in the table; a peer heard recently is never pulled."""
    async def main() -> None:
        me, peer, other = nodes("me", "peer", "other")
        assert me.accept_synced([peer.sign_advert(), other.sign_advert()]) == 2
        now = trio.current_time()
        linked = [peer.peer_id, other.peer_id]
        after = me.pull_after_s
        assert 0 < after < me.table.expiry_s  # pulled before it would expire
        assert me.pulls_due(now + after / 2, linked) == []  # heard recently: gossip works
        me.table.get(other.peer_id).heard_at = now + after  # type: ignore[union-attr]
        due = me.pulls_due(now + after + 0.1, linked)
        assert due == [peer.peer_id]
        assert me.pulls_due(now + after + 0.2, linked) == []  # once per period
        # the answer: the peer's advert signed now, checked and taken like gossip
        assert me.accept_probed(peer.peer_id, [peer.fresh_signed_advert()], pulled=True)
        assert me.stats["adverts_pulled"] == 1 and me.stats["adverts_probed"] == 0
        assert me.via[peer.peer_id] == "cell"
        assert me.table.expire(trio.current_time() + me.table.expiry_s / 2) == []
        # an answer signed by anyone but the peer asked is refused
        assert not me.accept_probed(peer.peer_id, [other.fresh_signed_advert()], pulled=True)
        # not linked: nothing to pull over
        assert me.pulls_due(now + 10 * after, []) == []

    run(main)


def test_pulls_can_be_turned_off() -> None:
    async def main() -> None:
        ca = new_ca()
        ids = [ca.issue(n) for n in ("me", "peer")]
        cfg = parse_config({"gossip": {"pull_after_intervals": 0}})
        runner = Runner()
        me = Membership(cfg, ids[0], Attestor(ids[0].ca_public_key), runner, StageServer(runner, "me"))
        peer = Membership(Config(), ids[1], Attestor(ids[1].ca_public_key), runner, StageServer(runner, "peer"))
        assert me.accept_synced([peer.sign_advert()]) == 1
        assert me.pulls_due(trio.current_time() + 3600, [peer.peer_id]) == []

    run(main)
