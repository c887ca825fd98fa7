"""The control socket's AUDIT_REQ: the node's audit trail, newest first (``meshd audit``)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from meshd.core.messages import MessageType
from meshd.core.wire import Message
from meshd.net.framed import FramedStream
from meshd.store.protocol import Reader

DEFAULT_EVENTS = 50
MAX_EVENTS = 1000  # one OK frame stays well under the control socket's 1 MiB cap

Answer = Callable[[Message, FramedStream], Awaitable[None]]


def audit_requests(store: Reader | None) -> dict[int, Answer]:
    """The control requests this module answers, for ``ControlServer(extra=...)``."""

    async def answer(msg: Message, out: FramedStream) -> None:
        n = min(max(int(msg.get("n") or DEFAULT_EVENTS), 0), MAX_EVENTS)
        kind = msg.get("kind") or None
        events = await store.recent_audit(n, kind) if store is not None else []
        for e in events:
            detail = str(e.get("detail"))
            if len(detail) > 512:  # a revocation list can name many serials
                e["detail"] = {"truncated": detail[:512]}
        await out.send(MessageType.OK, {"data": {"events": events}})

    return {int(MessageType.AUDIT_REQ): answer}
