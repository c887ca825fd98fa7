"""Links re-open pubsub's stream to a connected bootstrap peer that has none (or to any
connected peer while none has one) (py-libp2p gives up on a
stream open that fails with anything but a SwarmException, and the peer then stays connected
but outside gossip for good: 40 daemons starting at once on 2 cores left 3 of them isolated).
Pure loop logic over fakes of the host and the gossip; the real path runs in every live test."""

from __future__ import annotations

from typing import Any

import trio
import trio.testing
from libp2p.peer.id import ID

from meshd.config import Config
from meshd.core.peertable import PeerTable
from meshd.node.links import BOOTSTRAP_KEEP_S, Links

A = ID.from_base58("12D3KooWS5cpGocpTeJTSZVwJKgojxuv2Xh83f6hJ9oG7v1THjtE")
B = ID.from_base58("12D3KooWSGsyqvJnYaWtUDDYSvw2xqHQuZLQCy14CREWvk3tKyYS")


class _Net:
    def __init__(self) -> None:
        self.connections: dict[ID, list[Any]] = {A: [object()], B: [object()]}


class _Host:
    def __init__(self) -> None:
        self.net = _Net()

    def get_network(self) -> _Net:
        return self.net


class _Gossip:
    def __init__(self, registered: set[ID], *, fix: bool = True) -> None:
        self.registered = registered
        self.reopened: list[ID] = []
        self.fix = fix

    def has_stream(self, peer_id: ID) -> bool:
        return peer_id in self.registered

    async def reopen_stream(self, peer_id: ID) -> None:
        self.reopened.append(peer_id)
        if self.fix:
            self.registered.add(peer_id)


class _Membership:
    peer_id = "self"
    revoked_peer_ids: set[str] = set()

    def __init__(self) -> None:
        self.table = PeerTable("self", 15.0)
        self.joined = trio.Event()

    def pulls_due(self, now: float, linked: Any) -> list[str]:
        return []


def _links(gossip: _Gossip, bootstrap: set[ID] | None = None) -> Links:
    links = Links(_Host(), Config(), _Membership())  # type: ignore[arg-type]
    links.gossip = gossip
    links._bootstrap_ids = {B} if bootstrap is None else bootstrap
    return links


def test_a_connected_peer_without_a_stream_gets_it_reopened_once_after_two_checks() -> None:
    gossip = _Gossip({A})

    async def main() -> None:
        links = _links(gossip)
        async with trio.open_nursery() as nursery:
            await nursery.start(links.run)
            await trio.sleep(BOOTSTRAP_KEEP_S * 1.5)
            assert gossip.reopened == []  # one check: it may still be registering
            await trio.sleep(BOOTSTRAP_KEEP_S)
            assert gossip.reopened == [B]
            await trio.sleep(BOOTSTRAP_KEEP_S * 4)
            assert gossip.reopened == [B]  # registered now: left alone
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_a_peer_whose_reopen_fails_is_tried_again_and_a_gone_peer_is_forgotten() -> None:
    gossip = _Gossip({A}, fix=False)

    async def main() -> None:
        links = _links(gossip)
        async with trio.open_nursery() as nursery:
            await nursery.start(links.run)
            await trio.sleep(BOOTSTRAP_KEEP_S * 4.5)
            assert gossip.reopened.count(B) >= 2 and A not in gossip.reopened
            del links.host.net.connections[B]
            n = len(gossip.reopened)
            await trio.sleep(BOOTSTRAP_KEEP_S * 3)
            assert len(gossip.reopened) == n and links._no_stream == {}
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_other_peers_are_left_to_pubsub_while_some_stream_exists_but_not_when_none_does() -> None:
    async def main(gossip: _Gossip) -> None:
        links = _links(gossip, bootstrap=set())
        async with trio.open_nursery() as nursery:
            await nursery.start(links.run)
            await trio.sleep(BOOTSTRAP_KEEP_S * 2.5)
            nursery.cancel_scope.cancel()

    some = _Gossip({A})
    trio.run(main, some, clock=trio.testing.MockClock(autojump_threshold=0))
    assert some.reopened == []
    none = _Gossip(set())
    trio.run(main, none, clock=trio.testing.MockClock(autojump_threshold=0))
    assert sorted(map(str, none.reopened)) == sorted(map(str, [A, B]))
