"""How the control socket writes a request's frames: a model's answer streams frame by frame as
it comes; a cached answer, whole at once, leaves in one write with its DONE (each write wakes the
client, whose turn on a small box's cores the daemon then waits out)."""

from __future__ import annotations

from typing import Any

import trio

from meshd.core.messages import MessageType
from meshd.core.wire import MAX_CONTROL_FRAME, FrameDecoder, frame
from meshd.node.control import ControlService


class _Out:
    """The connection's writing side: what each write carried."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []

    async def send_raw(self, data: bytes) -> None:
        self.writes.append(data)

    async def send(self, mtype: MessageType, fields: dict[str, Any]) -> None:
        self.writes.append(frame(mtype, fields))


class _Chain:
    def __init__(self, events: list[tuple[str, dict[str, Any]]]) -> None:
        self.events = events

    def new_request_id(self) -> str:
        return "r1"

    async def submit(self, req: Any, emit: Any) -> dict[str, Any]:
        for kind, payload in self.events:
            await emit(kind, payload)
        return {"text": "hi", "request_id": req.request_id}


def _run(events: list[tuple[str, dict[str, Any]]]) -> list[list[int]]:
    out = _Out()
    service = ControlService(_Chain(events), None, None, node_name="n", peer_id="p",  # type: ignore[arg-type]
                             status=dict, peers=list)
    msg = {"t": int(MessageType.SUBMIT), "prompt": "hello"}
    trio.run(service.submit, msg, out)
    types = []
    for data in out.writes:
        decoder = FrameDecoder(MAX_CONTROL_FRAME)
        decoder.feed(data)
        types.append([int(m["t"]) for m in decoder.messages()])
    return types


def test_a_models_answer_streams_frame_by_frame() -> None:
    writes = _run([("route", {"served_by": "n", "route": ["n"]}),
                   ("tokens", {"ids": [1], "text": "h"}), ("tokens", {"ids": [2], "text": "i"})])
    assert writes == [[MessageType.ROUTE], [MessageType.TOKENS], [MessageType.TOKENS],
                      [MessageType.DONE]]


def test_a_cached_answer_leaves_in_one_write_with_its_done() -> None:
    writes = _run([("route", {"served_by": "n", "route": ["n"], "cached": True}),
                   ("tokens", {"ids": [1, 2], "text": "hi"})])
    assert writes == [[MessageType.ROUTE, MessageType.TOKENS, MessageType.DONE]]
