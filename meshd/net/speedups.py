"""CPU fixes for py-libp2p 0.8.1 internals, installed once per daemon process before any host runs.

Measured with cProfile on a daemon in a mesh of 20 on loopback (benchmarks/bench_mesh.py):

* **Yamux credit**: ``YamuxStream._auto_tune_and_send_window_update`` sends a WINDOW_UPDATE
  frame after *every* read whose unread credit is below half the window (its "partial slack"
  branch, which ``PY_YAMUX_RELEASE_ON_READ=0`` does not reach). meshd's frames are small
  (adverts, pings, token batches), so that was one extra frame, Noise encryption and socket
  write back to the sender for every frame received, ~0.3-0.6 ms of CPU at each end. Here, while
  the credit owed is below the library's own threshold (half the target window), a read only
  leaves it owed; the library's method runs, unchanged, once it reaches the threshold, as
  go-yamux does. The sender's window (256 KiB at first) never runs dry while we keep reading.
* **Service task lookup**: the library's service manager finds the parent of every task it
  spawns by walking its whole task tree (``TrioManager._find_parent_task``), and pubsub spawns a
  task per received message from a stream handler that is not a service task at all, so the
  walk finds nothing, at a cost that grows with the number of peers (~9% of a daemon's CPU in a
  mesh of 20). Here the trio tasks of service tasks are indexed as they start, and the walk runs
  only for those; for any other task the answer is "no parent", as the walk would have found.

``install()`` is idempotent and leaves the library alone (with a warning) if it changed shape.
"""

from __future__ import annotations

import logging
import weakref
from typing import Any

log = logging.getLogger(__name__)

_MARK = "_meshd_speedup"


def install() -> bool:
    """Install both fixes; True if both are in place."""
    return _batch_yamux_credit() & _index_service_tasks()


def _batch_yamux_credit() -> bool:
    try:
        from libp2p.stream_muxer.yamux.yamux import YamuxStream
    except ImportError:  # pragma: no cover - the library moved
        return False
    original = YamuxStream.__dict__.get("_auto_tune_and_send_window_update")
    if original is None or not hasattr(YamuxStream, "_grow_threshold"):  # pragma: no cover
        log.warning("yamux credit batching not installed: py-libp2p changed")
        return False
    if getattr(original, _MARK, False):
        return True

    async def batched(self: Any, *, bytes_read: int = 0) -> None:
        if bytes_read > 0:
            buffered = len(self.conn.stream_buffers.get(self.stream_id, b""))
            owed = self.target_recv_window - (self.recv_window + buffered)
            threshold = self._grow_threshold()
            if threshold > 0 and owed < threshold and self._pending_recv_release + bytes_read < threshold:
                return  # owed credit is still small: the sender has at least half a window left
        await original(self, bytes_read=bytes_read)

    setattr(batched, _MARK, True)
    YamuxStream._auto_tune_and_send_window_update = batched  # type: ignore[method-assign]
    return True


def _index_service_tasks() -> bool:
    try:
        from libp2p.tools.anyio_service.trio_manager import TrioManager
        from libp2p.tools.anyio_service.trio_tasks import FunctionTask
    except ImportError:  # pragma: no cover - the library moved
        return False
    prop = FunctionTask.__dict__.get("trio_task")
    find = TrioManager.__dict__.get("_find_parent_task")
    if not isinstance(prop, property) or prop.fset is None or find is None:  # pragma: no cover
        log.warning("service task index not installed: py-libp2p changed")
        return False
    if getattr(find, _MARK, False):
        return True
    service_tasks: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()
    set_task = prop.fset

    def set_trio_task(self: Any, value: Any) -> None:
        set_task(self, value)
        service_tasks[value] = True

    def find_parent(self: Any, trio_task: Any) -> Any:
        if trio_task not in service_tasks:
            return None  # not the trio task of any service task: the walk would find nothing
        return find(self, trio_task)

    setattr(find_parent, _MARK, True)
    FunctionTask.trio_task = property(prop.fget, set_trio_task, prop.fdel, prop.__doc__)  # type: ignore[method-assign,assignment]
    TrioManager._find_parent_task = find_parent  # type: ignore[method-assign]
    return True
