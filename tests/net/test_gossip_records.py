"""Gossip CPU fixes (meshd/net/gossip.py): signed peer records verified once per (peer, record),
our own record looked up once per ``RECORD_REUSE_S``, and reads on a gossip stream reported as
signs of life."""

from __future__ import annotations

from typing import Any

import libp2p.pubsub.gossipsub as gossipsub_mod
import libp2p.pubsub.pubsub as pubsub_mod
import pytest
import trio
from libp2p.peer.peerstore import env_to_send_in_RPC
from libp2p.pubsub.utils import maybe_consume_signed_record

from meshd.net import gossip as G


class Msg:
    def __init__(self, record: bytes | None) -> None:
        self.senderRecord = record or b""
        self._has = record is not None

    def HasField(self, name: str) -> bool:  # noqa: N802 - protobuf's name
        return name == "senderRecord" and self._has


class Host:
    pass


PA: Any = "peer-a"  # stands in for a libp2p ID
PB: Any = "peer-b"
P: Any = "p"


@pytest.fixture
def verify_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, bytes]]:
    calls: list[tuple[Any, bytes]] = []

    def fake_verify(msg: Any, host: Any, peer_id: Any) -> bool:
        calls.append((peer_id, msg.senderRecord))
        return bool(msg.senderRecord != b"forged")

    monkeypatch.setattr(G, "_verify_record", fake_verify)
    return calls


def test_the_same_record_from_the_same_peer_is_verified_once(verify_calls: list[Any]) -> None:
    host = Host()
    for _ in range(5):
        assert G._consume_record_once(Msg(b"rec-a"), host, PA)
    assert G._consume_record_once(Msg(b"rec-a"), host, PB)  # another peer: checked
    assert G._consume_record_once(Msg(b"rec-a2"), host, PA)  # a new record: checked
    assert G._consume_record_once(Msg(None), host, PA)  # no record: nothing to check
    assert len(verify_calls) == 3


def test_a_bad_record_is_never_remembered(verify_calls: list[Any]) -> None:
    host = Host()
    for _ in range(3):
        assert not G._consume_record_once(Msg(b"forged"), host, PA)
    assert len(verify_calls) == 3


def test_each_host_has_its_own_memory(verify_calls: list[Any]) -> None:
    a, b = Host(), Host()
    G._consume_record_once(Msg(b"rec"), a, P)
    G._consume_record_once(Msg(b"rec"), b, P)
    assert len(verify_calls) == 2


def test_our_own_record_is_rebuilt_at_most_once_per_period(monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[Any] = []
    now = [1000.0]

    def fake_own(host: Any) -> tuple[bytes, bool]:
        built.append(host)
        return b"env%d" % len(built), True

    monkeypatch.setattr(G, "_own_record", fake_own)
    monkeypatch.setattr(G, "_clock", lambda: now[0])
    host = Host()
    assert G._own_record_reused(host) == (b"env1", True)
    for _ in range(10):
        assert G._own_record_reused(host) == (b"env1", False)
    now[0] += G.RECORD_REUSE_S
    assert G._own_record_reused(host) == (b"env2", True)
    assert len(built) == 2


def test_install_replaces_the_names_pubsub_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    for mod in (pubsub_mod, gossipsub_mod):
        monkeypatch.setattr(mod, "maybe_consume_signed_record", maybe_consume_signed_record)
        monkeypatch.setattr(mod, "env_to_send_in_RPC", env_to_send_in_RPC)
    G._install_record_cache()
    G._install_record_cache()  # idempotent
    for mod in (pubsub_mod, gossipsub_mod):
        assert mod.maybe_consume_signed_record is G._consume_record_once
        assert mod.env_to_send_in_RPC is G._own_record_reused


class Conn:
    class PeerId:
        def to_base58(self) -> str:
            return "12D3KooWpeer"

    peer_id = PeerId()


class Stream:
    muxed_conn = Conn()

    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks

    async def read(self, n: int | None = None) -> bytes:
        return self.chunks.pop(0) if self.chunks else b""


def test_reads_on_a_gossip_stream_are_signs_of_life() -> None:
    g = G.Gossip(pubsub=None, router=None)  # type: ignore[arg-type]
    heard: list[str] = []
    g.on_heard = heard.append
    stream = Stream([b"\x05", b"hello"])
    g._watch(stream)

    async def main() -> list[bytes]:
        return [await stream.read(1), await stream.read(5), await stream.read(1)]

    assert trio.run(main) == [b"\x05", b"hello", b""]
    assert heard == ["12D3KooWpeer", "12D3KooWpeer"]  # the end of the stream is not life
