"""Regression found by the 12-node testnet: a stream error on a peer's request channel must end
that channel, not the whole node (trio's nursery wraps the reader's error in a group)."""

from __future__ import annotations

from typing import Any

import trio

from meshd.errors import PeerGoneError, ProtocolError
from meshd.net.channel import PeerChannel


class BrokenFramed:
    def __init__(self, error: Exception) -> None:
        self.error = error
        self.reset_called = False

    async def recv(self) -> Any:
        await trio.sleep(0.01)
        raise self.error

    async def send(self, *args: Any) -> None:
        return None

    async def reset(self) -> None:
        self.reset_called = True


def run_channel(error: Exception) -> tuple[PeerChannel, list[tuple[str, str]], BrokenFramed]:
    dead: list[tuple[str, str]] = []
    framed = BrokenFramed(error)

    async def main() -> PeerChannel:
        ch = PeerChannel("12D3KooWpeer", framed, ping_interval_s=1.0, stall_timeout_s=3.0,  # type: ignore[arg-type]
                         on_dead=lambda p, r: dead.append((p, r)))
        with trio.fail_after(5):
            await ch.run()
        return ch

    return trio.run(main), dead, framed


def test_a_stream_error_ends_the_channel_quietly() -> None:
    ch, dead, framed = run_channel(PeerGoneError("stream read failed: StreamError"))
    assert not ch.alive and dead == [("12D3KooWpeer", "stream read failed: StreamError")]
    assert framed.reset_called


def test_a_protocol_error_ends_the_channel_quietly() -> None:
    ch, dead, _ = run_channel(ProtocolError("garbage frame", "bad_frame"))
    assert not ch.alive and "garbage frame" in dead[0][1]
