"""Coalesce a stream of tokens into frames: the first at once, then at most one per interval.

A libp2p stream carries ~1,200 frames/s in py-libp2p, so one frame per token caps a hop near
that rate; batching every ``interval_s`` lets one hop stream many thousands of tokens per second
while adding at most ``interval_s`` of delay to any token.

Written as a pump with a sink callback rather than an async generator, because a trio nursery
must not span a ``yield``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

import trio

T = TypeVar("T")


async def pump_coalesced(
    source: AsyncIterator[T], interval_s: float, sink: Callable[[list[T]], Awaitable[None]]
) -> None:
    """Feed ``source`` to ``sink`` in batches. Errors of ``source`` propagate after the flush."""
    send, recv = trio.open_memory_channel[T](1 << 14)
    error: list[BaseException] = []

    async def produce() -> None:
        async with send:
            try:
                async for item in source:
                    await send.send(item)
            except Exception as e:
                error.append(e)
            finally:
                # Close an abandoned async generator here, in the task that iterated it: left
                # to the garbage collector, its cleanup (the runner releasing its model slot)
                # runs in another task and fails, and the slot is lost for good.
                aclose = getattr(source, "aclose", None)
                if aclose is not None:
                    with trio.CancelScope(shield=True):
                        await aclose()

    async def consume() -> None:
        last = -1e9
        async with recv:
            while True:
                try:
                    first = await recv.receive()
                except trio.EndOfChannel:
                    return
                wait = last + interval_s - trio.current_time()
                if wait > 0:
                    await trio.sleep(wait)
                batch = [first]
                while True:
                    try:
                        batch.append(recv.receive_nowait())
                    except (trio.WouldBlock, trio.EndOfChannel):
                        break
                last = trio.current_time()
                await sink(batch)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(produce)
        nursery.start_soon(consume)
    if error:
        raise error[0]
