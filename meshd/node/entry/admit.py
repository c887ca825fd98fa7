"""Entry step "admit": the request enters this node's set of requests in flight, or is refused.

Every request that reaches the chain is counted here as submitted. A request id already in
flight here is refused at once (``duplicate_request``): the journal and the events of the first
one must not mix with a second one's. An admitted request leaves the set in the ``record``
step, however it ended; one refused here is neither recorded nor counted as failed (``record``
skips it): it never began.
"""

from __future__ import annotations

from meshd.errors import ErrorCode, RemoteError
from meshd.node.entry.context import EntryContext, EntryNode


async def admit(ctx: EntryContext, node: EntryNode) -> None:
    state = node.entry_state
    state.stats["submitted"] += 1
    node.stats["requests_submitted"] += 1
    rid = ctx.req.request_id
    if rid in state.in_flight:
        state.stats["duplicate_ids"] += 1
        raise RemoteError(f"request id {rid!r} is already in flight at this node; use a new id",
                          ErrorCode.DUPLICATE_REQUEST)
    state.in_flight.add(rid)
    ctx.admitted = True
