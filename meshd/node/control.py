"""The node's answers on the control socket: submit, status, peers, explain, revocations.

A SUBMIT is checked once (``meshd.core.request.parse_submit``) and run through the entry chain
(``meshd.node.entry``), exactly as an HTTP API request is; its events become ROUTE and TOKENS
frames, its answer a DONE frame, its refusal an ERROR frame with the code. A cached answer is
whole at once: its ROUTE, TOKENS and DONE leave in one write (each write wakes the client, whose
turn on a small box's cores the daemon then waits out).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from meshd.core.messages import MessageType
from meshd.core.request import parse_submit
from meshd.core.wire import Message, frame
from meshd.errors import ErrorCode, RemoteError
from meshd.net.framed import FramedStream
from meshd.node.edge_cache import EdgeCache
from meshd.node.entry import EntryChain
from meshd.node.revocations import Revocations
from meshd.store.protocol import Reader


class ControlService:
    """Answers one control-socket request (``meshd.control.server.ControlServer`` calls it):
    SUBMIT through the entry chain, revocations to the revocations service, the semantic cache's
    stats and clearing to the cache, status and peers from the node's readers, explanations from
    the store."""

    def __init__(self, entry: EntryChain, revocations: Revocations, edge_cache: EdgeCache, *,
                 node_name: str, peer_id: str, status: Callable[[], dict[str, Any]],
                 peers: Callable[[], list[dict[str, Any]]], store: Reader | None = None) -> None:
        self.entry = entry
        self.revocations = revocations
        self.edge_cache = edge_cache
        self.node_name = node_name
        self.peer_id = peer_id
        self.status = status
        self.peers = peers
        self.store = store

    async def handle_control(self, msg: Message, out: FramedStream) -> None:
        t = msg["t"]
        if t == MessageType.SUBMIT:
            await self.submit(msg, out)
        elif t == MessageType.STATUS_REQ:
            await out.send(MessageType.STATUS, {"data": self.status()})
        elif t == MessageType.PEERS_REQ:
            await out.send(MessageType.PEERS, {"peers": self.peers()})
        elif t == MessageType.EXPLAIN_REQ:
            record = await self.store.explain(msg["rid"]) if self.store is not None else None
            await out.send(MessageType.EXPLAIN, {"record": flatten_explain(record)})
        elif t == MessageType.PUSH_REVOCATION:
            gone = await self.revocations.apply(msg["crl"], gossip=True)
            rl = self.revocations.attestor.revocation_list
            await out.send(
                MessageType.OK,
                {"data": {"version": rl.version if rl else 0, "disconnected": gone}},
            )
        elif t == MessageType.CACHE_REQ:
            await out.send(MessageType.OK, {"data": await self.cache(
                msg["op"], msg.get("rid"), msg.get("verdict"))})
        else:
            raise RemoteError(f"message {t} is not a request", ErrorCode.UNSUPPORTED)

    async def cache(self, op: str, rid: str | None = None, verdict: str | None = None
                    ) -> dict[str, Any]:
        """``meshd cache stats|clear|feedback``."""
        cache = self.edge_cache
        if op == "clear":
            return {"cleared": await cache.clear(), **cache.statistics()}
        if op == "stats":
            return cache.statistics()
        if op == "feedback":
            if not rid or not verdict:
                raise RemoteError("cache feedback needs rid and verdict", ErrorCode.MALFORMED)
            return await cache.feedback(rid, verdict)
        raise RemoteError(f"cache op must be stats, clear or feedback, not {op!r}",
                          ErrorCode.MALFORMED)

    async def submit(self, msg: Message, out: FramedStream) -> None:
        chain = self.entry
        req = parse_submit(msg, chain.new_request_id)
        rid = req.request_id

        held: list[bytes] = []  # a cached answer's frames, sent with its DONE

        async def emit(kind: str, payload: dict[str, Any]) -> None:
            if kind == "route":
                data = frame(MessageType.ROUTE, {"rid": rid, **payload})
            else:
                data = frame(MessageType.TOKENS, {
                    "rid": rid, "ids": payload["ids"], "text": payload["text"]})
            if held or (kind == "route" and payload.get("cached")):
                held.append(data)
            else:
                await out.send_raw(data)

        answer = await chain.submit(req, emit)
        await out.send_raw(b"".join(held) + frame(MessageType.DONE, {"rid": rid, "stats": answer}))


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
