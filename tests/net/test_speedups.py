"""py-libp2p CPU fixes (meshd/net/speedups.py) between two REAL hosts on 127.0.0.1 (Noise + yamux).

The library is patched process-wide, so each test puts the original attributes back afterwards
(``monkeypatch`` records them before ``install()`` replaces them).
"""

from __future__ import annotations

from typing import Any

import pytest
import trio
from libp2p.custom_types import TProtocol
from libp2p.stream_muxer.yamux.yamux import YamuxStream
from libp2p.tools.anyio_service import Service, background_trio_service
from libp2p.tools.anyio_service.trio_manager import TrioManager
from libp2p.tools.anyio_service.trio_tasks import FunctionTask
from libp2p_pair import pair

from meshd.net import speedups

PROTO = TProtocol("/meshd-test/sink/1")
FRAME = b"x" * 200  # about an advert or a token batch
DEADLINE_S = 20.0


@pytest.fixture
def restore_library(monkeypatch: pytest.MonkeyPatch) -> None:
    for cls, name in ((YamuxStream, "_auto_tune_and_send_window_update"),
                      (TrioManager, "_find_parent_task"), (FunctionTask, "trio_task")):
        monkeypatch.setattr(cls, name, cls.__dict__[name])



async def send_and_count_updates(n_frames: int, frame: bytes, monkeypatch: pytest.MonkeyPatch) -> tuple[int, int]:
    """A writes ``n_frames`` frames to B on one stream; returns (bytes B read, WINDOW_UPDATE
    frames B sent)."""
    updates = [0]
    original = YamuxStream.send_window_update

    async def counting(self: Any, increment: int, skip_lock: bool = False) -> None:
        updates[0] += 1
        await original(self, increment, skip_lock)

    monkeypatch.setattr(YamuxStream, "send_window_update", counting)
    total = n_frames * len(frame)
    got = [0]
    done = trio.Event()

    async with pair() as (a, b):
        async def sink(stream: Any) -> None:
            while got[0] < total:
                data = await stream.read(1 << 16)
                if not data:
                    break
                got[0] += len(data)
            done.set()

        b.set_stream_handler(PROTO, sink)
        with trio.fail_after(DEADLINE_S):
            stream = await a.new_stream(b.get_id(), [PROTO])
            for _ in range(n_frames):
                await stream.write(frame)
            await done.wait()
            await stream.close()
    return got[0], updates[0]


def test_small_frames_cost_no_window_update_each(restore_library: None,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    got, before = trio.run(send_and_count_updates, 100, FRAME, monkeypatch)
    assert got == 100 * len(FRAME)
    assert before >= 50, before  # the library's own behaviour: about one update per read

    assert speedups.install()
    got, after = trio.run(send_and_count_updates, 100, FRAME, monkeypatch)
    assert got == 100 * len(FRAME) and after == 0, after  # 20 KB read: no credit owed yet


def test_a_transfer_far_beyond_the_window_still_flows(restore_library: None,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    assert speedups.install()
    chunk = b"y" * 60_000
    got, updates = trio.run(send_and_count_updates, 40, chunk, monkeypatch)  # 2.4 MB, window 256 KiB
    assert got == 40 * len(chunk)
    assert 1 <= updates <= 40, updates  # credit flows, in batches


class _Tree(Service):
    def __init__(self) -> None:
        self.parent_seen: list[Any] = []
        self.started = trio.Event()

    async def run(self) -> None:
        self.manager.run_task(self._parent)
        await self.started.wait()
        await trio.sleep_forever()

    async def _parent(self) -> None:
        self.manager.run_task(self._child)  # spawned from a service task: must be its child
        self.started.set()
        await trio.sleep_forever()

    async def _child(self) -> None:
        await trio.sleep_forever()


def test_service_tasks_keep_their_parents(restore_library: None) -> None:
    assert speedups.install()
    assert speedups.install()  # idempotent

    async def main() -> tuple[int, int]:
        svc = _Tree()
        async with background_trio_service(svc) as api:
            manager: Any = api
            with trio.fail_after(DEADLINE_S):
                await svc.started.wait()
            # a task spawned from outside any service task (as pubsub does from a stream
            # handler) becomes a root task
            manager.run_task(trio.sleep_forever)
            await trio.sleep(0)
            roots = manager._root_tasks
            children = sum(len(t.children) for t in roots)
            n_roots = len(roots)
            manager.cancel()
        return n_roots, children

    n_roots, children = trio.run(main)
    assert children >= 1, "the child of a service task lost its parent"
    assert n_roots >= 2
