"""Gossipsub for adverts and revocations, hardened against py-libp2p 0.8.1's failure modes.

See ``shared/LIBP2P-NOTES.md``: malformed bytes on the gossipsub stream and a raising validator
each crash the whole host, so the pubsub stream handler is re-registered wrapped, and every
validator is wrapped to turn any exception into a rejection. Only ``/meshsub/1.1.0`` and
``1.0.0`` are offered (1.2's IDONTWANT doubled CPU for small messages), spam protection is off on
our topics (the publisher's own adverts count against it), and the heartbeat is 1 s rather than
the library's 120 s so meshes form promptly.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import trio
from libp2p.peer.id import ID
from libp2p.pubsub.gossipsub import PROTOCOL_ID, PROTOCOL_ID_V11, GossipSub
from libp2p.pubsub.pubsub import Pubsub
from libp2p.tools.anyio_service import background_trio_service

log = logging.getLogger(__name__)

# validator(author_peer_id_base58, data) -> True to accept. Must not raise; we guard anyway.
Validator = Callable[[str, bytes], bool]


class Gossip:
    """A started gossipsub instance; use ``open_gossip`` to get one."""

    def __init__(self, pubsub: Pubsub, router: GossipSub) -> None:
        self.pubsub = pubsub
        self.router = router
        self.stats = {"handler_errors": 0, "validator_errors": 0, "rejected": 0, "published": 0}

    def set_validator(self, topic: str, validator: Validator) -> None:
        def guarded(forwarder: ID, msg: Any) -> bool:
            try:
                author = ID(msg.from_id).to_base58()
                ok = bool(validator(author, bytes(msg.data)))
            except Exception:
                self.stats["validator_errors"] += 1
                log.warning("gossip validator raised topic=%s", topic, exc_info=True)
                ok = False
            if not ok:
                self.stats["rejected"] += 1
            return ok

        self.pubsub.set_topic_validator(topic, guarded, False)

    async def subscribe(self, topic: str) -> Any:
        return await self.pubsub.subscribe(topic)

    async def publish(self, topic: str, data: bytes) -> None:
        await self.pubsub.publish(topic, data)
        self.stats["published"] += 1

    def mesh_size(self, topic: str) -> int:
        return len(self.router.mesh.get(topic, ()))

    def _guard_stream_handler(self) -> None:
        inner = self.pubsub.stream_handler

        async def guarded(stream: Any) -> None:
            try:
                await inner(stream)
            except Exception as e:
                self.stats["handler_errors"] += 1
                peer = getattr(getattr(stream, "muxed_conn", None), "peer_id", None)
                log.warning("gossip stream dropped peer=%s error=%s", peer, type(e).__name__)
                with trio.move_on_after(1):
                    try:
                        await stream.reset()
                    except Exception:
                        pass

        for proto in self.router.get_protocols():
            self.pubsub.host.set_stream_handler(proto, guarded)

    def _guard_push_msg(self) -> None:
        """pubsub runs ``push_msg`` for every received message as a task of its service: an
        exception there (py-libp2p's signature check raises DecodeError on a garbage ``key``
        field) stops the service and with it the host. Drop such a message instead."""
        inner = self.pubsub.push_msg
        my_id = self.pubsub.my_id

        async def guarded(forwarder: ID, msg: Any) -> None:
            if forwarder == my_id:
                await inner(forwarder, msg)  # our own publish: let the caller see its errors
                return
            try:
                await inner(forwarder, msg)
            except Exception as e:
                self.stats["handler_errors"] += 1
                log.warning("gossip message dropped peer=%s error=%s", forwarder, type(e).__name__)

        self.pubsub.push_msg = guarded  # type: ignore[method-assign,assignment]


@asynccontextmanager
async def open_gossip(
    host: Any,
    *,
    degree: int = 4,
    heartbeat_interval_s: float = 1.0,
) -> AsyncIterator[Gossip]:
    router = GossipSub(
        [PROTOCOL_ID_V11, PROTOCOL_ID],
        degree=degree,
        degree_low=max(2, degree - 1),
        degree_high=degree + 2,
        heartbeat_interval=max(1, round(heartbeat_interval_s)),
        heartbeat_initial_delay=0.1,
        spam_protection_enabled=False,
        eclipse_protection_enabled=False,
    )
    pubsub = Pubsub(host, router, strict_signing=True)
    gossip = Gossip(pubsub, router)
    gossip._guard_stream_handler()
    gossip._guard_push_msg()
    async with AsyncExitStack() as stack:
        await stack.enter_async_context(background_trio_service(pubsub))
        await stack.enter_async_context(background_trio_service(router))
        await pubsub.wait_until_ready()
        yield gossip
