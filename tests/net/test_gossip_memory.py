"""Gossip memory found by the soak (meshd/net/gossip.py): py-libp2p's router appends the time of
every message it publishes or forwards to ``recent_message_deliveries[topic]`` and never trims it
with adaptive gossip off; meshd's routers keep only the newest ``RECENT_DELIVERIES_MAX``."""

from __future__ import annotations

import pytest
import trio
from libp2p.peer.peerinfo import info_from_p2p_addr
from libp2p_pair import _host
from multiaddr import Multiaddr

from meshd.net import gossip as G
from meshd.testing.wait import wait_until

TOPIC = "meshd/test-memory/1"


def test_recent_times_keeps_the_newest(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(G, "RECENT_DELIVERIES_MAX", 3)
    times = G.RecentTimes()
    for t in range(10):
        times.append(float(t))
    assert times == [7.0, 8.0, 9.0]
    times[:] = [t for t in times if t > 7.0]  # the library's own trimming still works
    assert times == [8.0, 9.0]


def test_a_long_run_of_adverts_leaves_the_routers_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Real hosts and real gossipsub: 200 messages published by one node and received (and
    forwarded) by the other; without the bound each router held one float per message."""
    monkeypatch.setattr(G, "RECENT_DELIVERIES_MAX", 16)
    count = 200

    async def main() -> tuple[int, int, int]:
        received = 0
        a, b = _host(), _host()
        listen = [Multiaddr("/ip4/127.0.0.1/tcp/0")]
        async with a.run(listen), b.run(listen), G.open_gossip(a) as ga, G.open_gossip(b) as gb:
            await a.connect(info_from_p2p_addr(b.get_addrs()[0]))  # after gossip, as a node does
            await ga.subscribe(TOPIC)
            sub = await gb.subscribe(TOPIC)
            async with trio.open_nursery() as nursery:

                async def read() -> None:
                    nonlocal received
                    while True:
                        await sub.get()
                        received += 1

                nursery.start_soon(read)
                # gossipsub sends to b once it has b's subscription: publish until one arrives
                with trio.fail_after(30):
                    while not received:
                        await ga.publish(TOPIC, b"hello")
                        await trio.sleep(0.1)
                received = 0
                for i in range(1, count + 1):
                    await ga.publish(TOPIC, b"advert %d" % i)
                    if i % 10 == 0:  # a burst of hundreds is partly dropped on the way: pace it
                        await wait_until(lambda: received >= i, timeout_s=10)  # noqa: B023
                nursery.cancel_scope.cancel()
            return (len(ga.router.recent_message_deliveries[TOPIC]),
                    len(gb.router.recent_message_deliveries[TOPIC]), received)

    sent_side, received_side, received = trio.run(main)
    assert received >= 200
    assert sent_side <= 16
    assert received_side <= 16
