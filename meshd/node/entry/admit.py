"""Entry step "admit": the request enters this node's set of requests in flight, or is refused.

A request id already in flight here is refused at once (``duplicate_request``): the journal and
the events of the first one must not mix with a second one's. An admitted request leaves the
set when the chain is done with it, however it ended (``EntryChain.submit``); one refused here
is neither recorded nor counted as failed (the ``record`` step skips it): it never began.
"""

from __future__ import annotations

from meshd.errors import ErrorCode, RemoteError
from meshd.node.entry.context import EntryContext


def admit(ctx: EntryContext, in_flight: set[str], stats: dict[str, int]) -> None:
    rid = ctx.req.request_id
    if rid in in_flight:
        stats["duplicate_ids"] += 1
        raise RemoteError(f"request id {rid!r} is already in flight at this node; use a new id",
                          ErrorCode.DUPLICATE_REQUEST)
    in_flight.add(rid)
    ctx.admitted = True
