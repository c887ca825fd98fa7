"""Attestation between REAL libp2p hosts on 127.0.0.1 (ephemeral ports, one trio run each).

Every rejection is tested in both directions: the bad peer dials us (inbound) and we dial it
(outbound); the good side's reason counter must show exactly one rejection of the right kind.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass

import pytest
import trio
from keys_helpers import CA, new_ca
from libp2p import new_host
from libp2p.abc import IHost, INetStream, IRawConnection, ISecureConn
from libp2p.crypto.keys import KeyPair
from libp2p.crypto.x25519 import create_new_key_pair as create_x25519_key_pair
from libp2p.custom_types import TProtocol
from libp2p.network.config import ConnectionConfig, RetryConfig
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo, info_from_p2p_addr
from libp2p.security.noise.transport import PROTOCOL_ID as NOISE_ID
from libp2p.security.noise.transport import Transport as NoiseTransport
from multiaddr import Multiaddr

from meshd.core import cert as C
from meshd.core import crl as R
from meshd.net import attest as A
from meshd.net.identity import NodeIdentity, generate_node_key_pair
from meshd.testing.wait import wait_until

LOCAL = [Multiaddr("/ip4/127.0.0.1/tcp/0")]
ECHO = TProtocol("/meshd-test/echo/1")
HOLD = TProtocol("/meshd-test/hold/1")
TEST_DEADLINE_S = 8.0


@dataclass
class Node:
    host: IHost
    attestor: A.Attestor | None = None

    @property
    def id(self) -> ID:
        return self.host.get_id()

    def info(self) -> PeerInfo:
        return info_from_p2p_addr(self.host.get_addrs()[0])

    def connected_to(self, other: Node) -> bool:
        return bool(self.host.get_network().get_connections(other.id))

    def rejected(self, reason: str) -> int:
        assert self.attestor is not None
        return int(self.attestor.statistics()["rejected_by_reason"][reason])


def attested(identity: NodeIdentity, *, revoked: set[int] | None = None) -> Node:
    attestor = A.Attestor(identity.ca_public_key)
    if revoked:
        attestor.revoke(revoked)
    host = A.make_host(identity, attestor, dial_retries=0, handshake_timeout_s=2.0)
    return Node(host, attestor)


def _no_retries(host: IHost) -> IHost:
    host.get_network().retry_config = RetryConfig(max_retries=0)  # type: ignore[attr-defined]
    return host


def plain_noise() -> Node:
    kp = generate_node_key_pair()
    noise = NoiseTransport(kp, noise_privkey=create_x25519_key_pair().private_key)
    cfg = ConnectionConfig(max_connections_per_peer=1)
    return Node(
        _no_retries(new_host(key_pair=kp, sec_opt={NOISE_ID: noise}, connection_config=cfg))
    )


def default_stack() -> Node:
    """py-libp2p's defaults: Noise, TLS, secio and plaintext offered."""
    cfg = ConnectionConfig(max_connections_per_peer=1)
    return Node(_no_retries(new_host(key_pair=generate_node_key_pair(), connection_config=cfg)))


@asynccontextmanager
async def running(*nodes: Node) -> AsyncIterator[None]:
    async with AsyncExitStack() as stack:
        for node in nodes:
            await stack.enter_async_context(node.host.run(LOCAL))
        yield
        # Close connections before the hosts stop (see A.disconnect_all).
        for node in nodes:
            await A.disconnect_all(node.host)
        await wait_until(lambda: all(not n.host.get_network().get_connections() for n in nodes))


def run(test: Callable[[], Awaitable[None]]) -> None:
    async def main() -> None:
        with trio.fail_after(TEST_DEADLINE_S):
            await test()

    trio.run(main)


async def echo_handler(stream: INetStream) -> None:
    try:
        data = await stream.read(64)
        await stream.write(data)
        await stream.close()
    except Exception:  # a handler that raises would crash the host (LIBP2P-NOTES)
        await stream.reset()


async def hold_handler(stream: INetStream) -> None:
    try:
        await stream.read(1)
    except Exception:
        await stream.reset()


async def echo(a: Node, b: Node, payload: bytes = b"ping") -> bytes:
    with trio.fail_after(3):
        stream = await a.host.new_stream(b.id, [ECHO])
        await stream.write(payload)
        reply = await stream.read(64)
        await stream.close()
    return bytes(reply)


# --------------------------------------------------------------------------- the good path


def test_good_pair_connects_and_opens_a_stream(ca: CA) -> None:
    a = attested(ca.issue("alpha", roles=("gateway",), labels={"region": "eu-west"}))
    b = attested(ca.issue("beta"))

    async def body() -> None:
        async with running(a, b):
            b.host.set_stream_handler(ECHO, echo_handler)
            started = time.perf_counter()
            with trio.fail_after(3):
                await a.host.connect(b.info())
            elapsed_ms = (time.perf_counter() - started) * 1000
            assert await echo(a, b) == b"ping"
            assert a.attestor and b.attestor
            cert_b = a.attestor.certificate_of(b.id)
            cert_a = b.attestor.certificate_of(a.id)
            assert cert_b is not None and cert_b.name == "beta"
            assert cert_a is not None and cert_a.name == "alpha"
            assert cert_a.roles == ("gateway",) and cert_a.region == "eu-west"
            for node in (a, b):
                stats = node.attestor.statistics() if node.attestor else {}
                assert stats["attested_total"] == 1
                assert stats["rejected_total"] == 0
            assert elapsed_ms < 1000  # measured ~10-25 ms; generous for a loaded CI box
            # A clean disconnect forgets the certificate (notifee), on both sides.
            await a.host.disconnect(b.id)
            await wait_until(lambda: a.attestor.certificate_of(b.id) is None)  # type: ignore[union-attr]
            await wait_until(lambda: b.attestor.certificate_of(a.id) is None)  # type: ignore[union-attr]

    run(body)


def test_only_attested_noise_and_yamux_are_offered(ca: CA) -> None:
    node = ca.issue("n")
    attestor = A.Attestor(ca.public_key)
    sec = A.security_options(node, attestor)
    assert list(sec) == [A.ATTEST_PROTOCOL_ID]
    assert isinstance(sec[A.ATTEST_PROTOCOL_ID], A.AttestedNoiseTransport)
    host = A.make_host(node, attestor)
    upgrader = host.get_network().upgrader  # type: ignore[attr-defined]
    assert list(upgrader.security_multistream.transports) == [A.ATTEST_PROTOCOL_ID]
    assert list(upgrader.muxer_multistream.transports) == ["/yamux/1.0.0"]
    assert host.get_network().connection_config.max_connections_per_peer == 1  # type: ignore[attr-defined]


# --------------------------------------------------------------------------- rejections

CASES = {
    # case: (reason counted by the good node, reason counted by the bad node if it attests)
    "plain_noise": (C.NO_CERTIFICATE, None),
    "default_stack": (C.NO_CERTIFICATE, None),
    "other_ca": (C.WRONG_CA, C.WRONG_CA),
    "stolen_certificate": (C.PEER_ID_MISMATCH, A.REJECTED_BY_PEER),
    "expired": (C.EXPIRED, A.REJECTED_BY_PEER),
    "not_yet_valid": (C.NOT_YET_VALID, A.REJECTED_BY_PEER),
    "revoked": (C.REVOKED, A.REJECTED_BY_PEER),
}


def make_bad(case: str, ca: CA, other_ca: CA) -> tuple[Node, set[int]]:
    """The bad node and the serials the good node has revoked."""
    now = int(time.time())
    if case == "plain_noise":
        return plain_noise(), set()
    if case == "default_stack":
        return default_stack(), set()
    if case == "other_ca":
        return attested(other_ca.issue("foreign")), set()
    if case == "stolen_certificate":
        victim = ca.issue("victim")
        thief_key: KeyPair = generate_node_key_pair()
        # The thief replays the victim's certificate with its own key (bypassing make_identity,
        # which refuses exactly this).
        thief = NodeIdentity(
            key_pair=thief_key,
            peer_id=ID.from_pubkey(thief_key.public_key),
            certificate=victim.certificate,
            certificate_bytes=victim.certificate_bytes,
            ca_public_key=ca.public_key,
        )
        return attested(thief), set()
    if case == "expired":
        return attested(ca.issue("old", not_before=now - 7200, not_after=now - 3600)), set()
    if case == "not_yet_valid":
        return attested(ca.issue("early", not_before=now + 3600, not_after=now + 7200)), set()
    if case == "revoked":
        bad = ca.issue("revoked")
        return attested(bad), {bad.certificate.serial}
    raise AssertionError(case)


@pytest.mark.parametrize("direction", ["inbound", "outbound"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_rejected(case: str, direction: str, ca: CA) -> None:
    bad, revoked = make_bad(case, ca, new_ca())
    good_identity = ca.issue("good")
    good = attested(good_identity, revoked=revoked)
    good_reason, bad_reason = CASES[case]

    async def body() -> None:
        async with running(good, bad):
            good.host.set_stream_handler(ECHO, echo_handler)
            dialer, target = (bad, good) if direction == "inbound" else (good, bad)
            with pytest.raises(Exception), trio.fail_after(3):  # noqa: B017 (libp2p's own types)
                await dialer.host.connect(target.info())
            await wait_until(lambda: good.rejected(good_reason) == 1)
            if bad_reason is not None:
                await wait_until(lambda: bad.rejected(bad_reason) == 1)
            assert good.attestor is not None
            stats = good.attestor.statistics()
            assert stats["rejected_total"] == 1, stats
            assert stats["attested_total"] == 0
            assert good.attestor.certificate_of(bad.id) is None
            await wait_until(lambda: not good.connected_to(bad) and not bad.connected_to(good))

    run(body)


def test_silent_peer_times_out(ca: CA) -> None:
    """A peer that completes Noise and then says nothing is cut off at the deadline."""
    good_identity = ca.issue("good")
    attestor = A.Attestor(ca.public_key)
    good = Node(
        A.make_host(good_identity, attestor, dial_retries=0, handshake_timeout_s=0.3), attestor
    )

    class SilentNoise(NoiseTransport):
        async def secure_outbound(self, conn: IRawConnection, peer_id: ID) -> ISecureConn:
            await super().secure_outbound(conn, peer_id)
            await trio.sleep_forever()  # never send a certificate (cancelled by the test)
            raise AssertionError("unreachable")

    kp = generate_node_key_pair()
    silent = Node(
        _no_retries(
            new_host(
                key_pair=kp,
                sec_opt={
                    NOISE_ID: SilentNoise(kp, noise_privkey=create_x25519_key_pair().private_key)
                },
            )
        )
    )

    async def body() -> None:
        async with running(good, silent), trio.open_nursery() as nursery:

            async def dial() -> None:
                with pytest.raises(Exception):  # noqa: B017
                    await silent.host.connect(good.info())

            nursery.start_soon(dial)
            await wait_until(lambda: good.rejected(A.TIMEOUT) == 1)
            nursery.cancel_scope.cancel()
            assert not good.connected_to(silent)

    run(body)


# --------------------------------------------------------------------------- revocation live


@pytest.mark.parametrize("direction", ["inbound", "outbound"])
def test_revoked_while_connected_is_cut_off(direction: str, ca: CA) -> None:
    a = attested(ca.issue("a"))
    b_identity = ca.issue("b")
    b = attested(b_identity)
    c = attested(ca.issue("c"))
    crl = R.sign_revocation_list(
        R.RevocationList(
            version=1,
            issued_at=int(time.time()),
            ca_key_id=C.ca_key_id(ca.public_key),
            serials=frozenset({b_identity.certificate.serial}),
        ),
        ca.private_key,
    )

    async def body() -> None:
        async with running(a, b, c):
            a.host.set_stream_handler(ECHO, echo_handler)
            a.host.set_stream_handler(HOLD, hold_handler)
            if direction == "inbound":
                await b.host.connect(a.info())
            else:
                await a.host.connect(b.info())
            await c.host.connect(a.info())
            assert await echo(b, a) == b"ping"
            assert a.attestor is not None
            assert a.attestor.certificate_of(b.id) is not None
            with trio.fail_after(3):
                held = await b.host.new_stream(a.id, [HOLD])  # open across the revocation

            doomed = await A.apply_revocation(a.host, a.attestor, crl)
            assert doomed == [b.id]
            assert a.attestor.certificate_of(b.id) is None
            await wait_until(lambda: not a.connected_to(b) and not b.connected_to(a))
            with trio.fail_after(3):  # the open stream is dead: EOF or an error, never data
                try:
                    data = await held.read(1)
                except Exception:
                    data = b""
            assert data == b""
            assert a.connected_to(c) and a.attestor.certificate_of(c.id) is not None
            assert await echo(c, a) == b"ping"
            stats = a.attestor.statistics()
            assert stats["disconnected_revoked"] == 1
            assert stats["revocation_version"] == 1
            # The same list again changes nothing; an older one is ignored.
            assert a.attestor.offer_revocation_list(crl) == []

            # Coming back is refused, whoever dials.
            b.host.get_network().unblock_peer(a.id)  # type: ignore[attr-defined]
            a.host.get_network().unblock_peer(b.id)  # type: ignore[attr-defined]
            with pytest.raises(Exception), trio.fail_after(3):  # noqa: B017
                await b.host.connect(a.info())
            await wait_until(lambda: a.rejected(C.REVOKED) == 1)
            with pytest.raises(Exception), trio.fail_after(3):  # noqa: B017
                await a.host.connect(b.info())
            await wait_until(lambda: a.rejected(C.REVOKED) == 2)
            assert not a.connected_to(b)

    run(body)
