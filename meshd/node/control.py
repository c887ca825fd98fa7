"""The node's answers on the control socket: submit, status, peers, explain, revocations.

A SUBMIT is checked once (``meshd.core.request.parse_submit``) and run through the entry chain
(``meshd.node.entry``), exactly as an HTTP API request is; its events become ROUTE and TOKENS
frames, its answer a DONE frame, its refusal an ERROR frame with the code.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from meshd.core.messages import MessageType
from meshd.core.request import parse_submit
from meshd.core.wire import Message
from meshd.errors import ErrorCode, RemoteError
from meshd.net.framed import FramedStream

if TYPE_CHECKING:
    from meshd.node.node import Node


class ControlService:
    """Answers one control-socket request (``meshd.control.server.ControlServer`` calls it)."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.node_name = node.node_name
        self.peer_id = node.peer_id

    async def handle_control(self, msg: Message, out: FramedStream) -> None:
        node = self.node
        t = msg["t"]
        if t == MessageType.SUBMIT:
            await self.submit(msg, out)
        elif t == MessageType.STATUS_REQ:
            await out.send(MessageType.STATUS, {"data": node.status()})
        elif t == MessageType.PEERS_REQ:
            await out.send(MessageType.PEERS, {"peers": node.peers_listing()})
        elif t == MessageType.EXPLAIN_REQ:
            record = await node.store.explain(msg["rid"]) if node.store is not None else None
            await out.send(MessageType.EXPLAIN, {"record": flatten_explain(record)})
        elif t == MessageType.PUSH_REVOCATION:
            gone = await node.apply_revocation_bytes(msg["crl"], gossip=True)
            rl = node.attestor.revocation_list
            await out.send(
                MessageType.OK,
                {"data": {"version": rl.version if rl else 0, "disconnected": gone}},
            )
        elif t == MessageType.CACHE_REQ:
            await out.send(MessageType.OK, {"data": await self.cache(msg["op"])})
        else:
            raise RemoteError(f"message {t} is not a request", ErrorCode.UNSUPPORTED)

    async def cache(self, op: str) -> dict[str, Any]:
        """``meshd cache stats|clear``."""
        cache = self.node.edge_cache
        if op == "clear":
            return {"cleared": await cache.clear(), **cache.statistics()}
        if op == "stats":
            return cache.statistics()
        raise RemoteError(f"cache op must be stats or clear, not {op!r}", ErrorCode.MALFORMED)

    async def submit(self, msg: Message, out: FramedStream) -> None:
        chain = self.node.entry
        req = parse_submit(msg, chain.new_request_id)
        rid = req.request_id

        async def emit(kind: str, payload: dict[str, Any]) -> None:
            if kind == "route":
                await out.send(MessageType.ROUTE, {"rid": rid, **payload})
            else:
                await out.send(MessageType.TOKENS, {"rid": rid, "ids": payload["ids"],
                                                    "text": payload["text"]})

        answer = await chain.submit(req, emit)
        await out.send(MessageType.DONE, {"rid": rid, "stats": answer})


def flatten_explain(record: dict[str, Any] | None) -> dict[str, Any] | None:
    """The store's record with the decision's headline fields lifted to the top level."""
    if record is None:
        return None
    d = record.get("decision") or {}
    return {
        **record,
        "strategy": d.get("strategy"),
        "candidates": d.get("candidates") or [],
        "chosen": d.get("chosen"),
        "constraints": d.get("constraints"),
        "plan": d.get("plan"),
    }
