"""Peer attestation as a libp2p security transport: Noise, then certificates, then the muxer.

``AttestedNoiseTransport`` runs libp2p's Noise XX handshake and then, inside the encrypted
channel and before the muxer is negotiated, both sides exchange their CA-signed certificates:

    each side:  send  CERT frame (our certificate)
                recv  CERT frame, verify it against the peer ID that Noise authenticated
                send  VERDICT frame ("ok" or our reason code)
                recv  VERDICT frame; proceed only if it is "ok"

A frame is ``magic "MDA1" | kind u8 | length u32 big-endian | payload`` with a hard cap on the
length. A peer that fails never reaches the muxer, pubsub or any meshd protocol: the transport
closes the connection, logs ``peer rejected`` with key=value fields and counts the reason.

``Attestor`` is the synchronous decision object (no I/O, the time is passed in): it holds the CA
public key and the revocation set in force, checks certificates, remembers the certificate of
every attested peer and answers, when serials are revoked, which connected peers to cut off.
The transport is registered under the Noise protocol id (``/noise``) so that a stock libp2p
peer completes Noise and is then refused with a precise reason (``no_certificate``) instead of
failing an opaque negotiation.
"""

from __future__ import annotations

import contextlib
import logging
import struct
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import trio
from libp2p import new_host
from libp2p.abc import (
    IHost,
    INetConn,
    INetStream,
    INetwork,
    INotifee,
    IRawConnection,
    ISecureConn,
    ISecureTransport,
)
from libp2p.crypto.keys import KeyPair
from libp2p.crypto.x25519 import create_new_key_pair as create_x25519_key_pair
from libp2p.custom_types import TProtocol
from libp2p.network.config import ConnectionConfig, RetryConfig
from libp2p.peer.id import ID
from libp2p.security.exceptions import HandshakeFailure
from libp2p.security.noise.transport import PROTOCOL_ID as NOISE_PROTOCOL_ID
from libp2p.security.noise.transport import Transport as NoiseTransport
from libp2p.stream_muxer.yamux.yamux import PROTOCOL_ID as YAMUX_PROTOCOL_ID
from libp2p.stream_muxer.yamux.yamux import Yamux
from multiaddr import Multiaddr

from meshd.core import audit as audit_kinds
from meshd.core.audit import AuditSink
from meshd.core.cert import (
    DEFAULT_CLOCK_SKEW_S,
    MALFORMED,
    MAX_CERTIFICATE_BYTES,
    NO_CERTIFICATE,
    REASONS,
    REVOKED,
    AttestationRejected,
    Certificate,
    check_certificate,
    verify_signature,
)
from meshd.core.crl import RevocationList, verify_revocation_list
from meshd.net.identity import NodeIdentity

logger = logging.getLogger(__name__)

ATTEST_PROTOCOL_ID = TProtocol(NOISE_PROTOCOL_ID)
FRAME_MAGIC = b"MDA1"
FRAME_CERT = 1
FRAME_VERDICT = 2
_HEADER = struct.Struct("!4sBI")
MAX_VERDICT_BYTES = 32
VERDICT_OK = "ok"
DEFAULT_HANDSHAKE_TIMEOUT_S = 5.0

# Reasons the transport adds to those of meshd.core.cert.REASONS. Append only.
TIMEOUT = "timeout"  # the handshake (Noise and certificates) ran past its deadline
NOISE_FAILED = "noise_failed"  # the Noise handshake itself failed
CONNECTION_LOST = "connection_lost"  # the peer went away after sending its certificate
REJECTED_BY_PEER = "rejected_by_peer"  # the peer refused our certificate
TRANSPORT_REASONS = (TIMEOUT, NOISE_FAILED, CONNECTION_LOST, REJECTED_BY_PEER)
ALL_REASONS = REASONS + TRANSPORT_REASONS


class AttestationFailure(HandshakeFailure):
    """Raised to libp2p's upgrader (which expects a ``HandshakeFailure``); ``reason`` is one of
    ``ALL_REASONS``."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"attestation failed: {reason}: {detail}")
        self.reason = reason
        self.detail = detail


def _peer_key(peer_id: ID | str) -> str:
    return peer_id if isinstance(peer_id, str) else peer_id.to_base58()


class Attestor:
    """Attestation decisions and state for one node. Synchronous; no I/O; time passed in.

    ``revoke``/``apply_revocation_list`` return the peers that are now revoked and must be
    disconnected; they are forgotten at once, so ``certificate_of`` answers None for them (a
    gossip validator that admits only attested authors then rejects them immediately).

    ``audit`` (settable later, as the daemon does) is told of every refused handshake, every
    revocation list put in force and every peer cut off by one (``meshd.core.audit`` kinds); it
    must not block, and an exception it raises is logged, never passed on.
    """

    def __init__(
        self,
        ca_public_key: bytes,
        *,
        revocation_list: RevocationList | None = None,
        clock_skew_s: int = DEFAULT_CLOCK_SKEW_S,
        audit: AuditSink | None = None,
    ) -> None:
        self.ca_public_key = ca_public_key
        self.clock_skew_s = clock_skew_s
        self.audit = audit
        self._revocation_list: RevocationList | None = None
        self._revoked: set[int] = set()
        self._peers: dict[str, Certificate] = {}
        self._attested = 0
        self._rejected: Counter[str] = Counter()
        self._disconnected_revoked = 0
        if revocation_list is not None:
            self.apply_revocation_list(revocation_list)

    # -- checks ------------------------------------------------------------------------

    def check(self, cert_bytes: bytes | None, remote_peer_id: ID | str, now: float) -> Certificate:
        """Verify a peer's certificate; raise ``AttestationRejected`` with the reason."""
        cert = verify_signature(cert_bytes, ca_public_key=self.ca_public_key)
        return check_certificate(
            cert,
            remote_peer_id=_peer_key(remote_peer_id),
            now=now,
            revoked=self._revoked,
            clock_skew_s=self.clock_skew_s,
        )

    def admit(self, peer_id: ID | str, cert: Certificate) -> None:
        """Record an attested connection. Re-checks revocation: a revocation that arrived while
        the handshake was in flight must win. Raises ``AttestationRejected``."""
        if cert.serial in self._revoked:
            raise AttestationRejected(REVOKED, f"serial {cert.serial} was revoked during handshake")
        self._peers[_peer_key(peer_id)] = cert
        self._attested += 1

    def record_rejection(
        self, reason: str, *, peer_id: str = "", detail: Mapping[str, Any] | None = None
    ) -> None:
        self._rejected[reason] += 1
        self._audit(audit_kinds.ATTESTATION_FAILED, peer_id, reason, detail or {})

    def _audit(self, kind: str, peer_id: str, reason: str, detail: Mapping[str, Any]) -> None:
        if self.audit is None:
            return
        try:
            self.audit(kind, peer_id, reason, detail)
        except Exception:  # the audit trail must never cost us an attestation decision
            logger.exception("audit record failed kind=%s", kind)

    def forget(self, peer_id: ID | str) -> None:
        """The peer has no connection left."""
        self._peers.pop(_peer_key(peer_id), None)

    # -- queries -----------------------------------------------------------------------

    def certificate_of(self, peer_id: ID | str) -> Certificate | None:
        """The certificate of a currently attested peer, or None."""
        return self._peers.get(_peer_key(peer_id))

    def attested_peers(self) -> dict[str, Certificate]:
        """Base58 peer ID -> certificate of every attested, connected peer."""
        return dict(self._peers)

    @property
    def revoked(self) -> frozenset[int]:
        return frozenset(self._revoked)

    @property
    def revocation_list(self) -> RevocationList | None:
        return self._revocation_list

    # -- revocation --------------------------------------------------------------------

    def revoke(self, serials: Iterable[int]) -> list[ID]:
        """Add serials to the revoked set; return the connected peers to disconnect now."""
        self._revoked.update(serials)
        doomed = sorted(pid for pid, cert in self._peers.items() if cert.serial in self._revoked)
        for pid in doomed:
            cert = self._peers.pop(pid)
            self._audit(audit_kinds.REVOKED, pid, "serial revoked",
                        {"serial": cert.serial, "name": cert.name})
        self._disconnected_revoked += len(doomed)
        return [ID.from_base58(pid) for pid in doomed]

    def expire(self, now: float) -> list[ID]:
        """Peers whose certificate ran out while connected: forgotten; disconnect them.

        Call it now and then (say, on each advert tick); certificates are checked at connect
        time, and a long-lived connection can outlive its certificate.
        """
        doomed = sorted(pid for pid, cert in self._peers.items() if now >= cert.not_after)
        for pid in doomed:
            del self._peers[pid]
        return [ID.from_base58(pid) for pid in doomed]

    def apply_revocation_list(self, revocation_list: RevocationList) -> list[ID]:
        """Put a (verified) revocation list in force if it is newer than the one in force.

        Returns the connected peers to disconnect (empty when the list is not newer). A newer
        list replaces the set (it is the CA's complete list, never a delta).
        """
        if not revocation_list.supersedes(self._revocation_list):
            return []
        self._revocation_list = revocation_list
        self._revoked = set(revocation_list.serials)
        self._audit(audit_kinds.REVOCATION_LIST, "", f"version {revocation_list.version} in force",
                    {"version": revocation_list.version, "issued_at": revocation_list.issued_at,
                     "serials": sorted(revocation_list.serials)})
        return self.revoke(())

    def offer_revocation_list(self, data: bytes) -> list[ID]:
        """Verify an encoded revocation list (from gossip or a file) and apply it.

        Raises ``ProtocolError`` (malformed) or ``AttestationRejected`` (not this CA's).
        """
        return self.apply_revocation_list(
            verify_revocation_list(data, ca_public_key=self.ca_public_key)
        )

    def statistics(self) -> dict[str, Any]:
        return {
            "attested_total": self._attested,
            "attested_peers": len(self._peers),
            "rejected_total": sum(self._rejected.values()),
            "rejected_by_reason": {reason: self._rejected[reason] for reason in ALL_REASONS},
            "disconnected_revoked": self._disconnected_revoked,
            "revocation_version": self._revocation_list.version if self._revocation_list else 0,
            "revoked_serials": len(self._revoked),
        }


# ----------------------------------------------------------------------------- framing


class _NotAFrame(Exception):
    pass


def encode_frame(kind: int, payload: bytes) -> bytes:
    return _HEADER.pack(FRAME_MAGIC, kind, len(payload)) + payload


async def _read_exactly(conn: ISecureConn, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = await conn.read(n - len(buf))
        if not chunk:
            raise EOFError(f"connection closed after {len(buf)} of {n} bytes")
        buf += chunk
    return bytes(buf)


async def _read_frame(conn: ISecureConn, kind: int, max_bytes: int) -> bytes:
    header = await _read_exactly(conn, _HEADER.size)
    magic, got_kind, length = _HEADER.unpack(header)
    if magic != FRAME_MAGIC:
        raise _NotAFrame("the peer does not speak meshd attestation")
    if got_kind != kind:
        raise AttestationRejected(MALFORMED, f"expected frame kind {kind}, got {got_kind}")
    if length > max_bytes:
        raise AttestationRejected(MALFORMED, f"frame of {length} bytes, limit {max_bytes}")
    return await _read_exactly(conn, length)


# ----------------------------------------------------------------------------- transport


class AttestedNoiseTransport(ISecureTransport):
    """Noise, then a mutual certificate exchange, as one libp2p security transport."""

    def __init__(
        self,
        key_pair: KeyPair,
        certificate_bytes: bytes,
        attestor: Attestor,
        *,
        handshake_timeout_s: float = DEFAULT_HANDSHAKE_TIMEOUT_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._noise = NoiseTransport(key_pair, noise_privkey=create_x25519_key_pair().private_key)
        self._certificate_bytes = certificate_bytes
        self.attestor = attestor
        self.handshake_timeout_s = handshake_timeout_s
        self._clock = clock

    def statistics(self) -> dict[str, Any]:
        return self.attestor.statistics()

    async def secure_inbound(self, conn: IRawConnection) -> ISecureConn:
        return await self._secure(conn, None)

    async def secure_outbound(self, conn: IRawConnection, peer_id: ID) -> ISecureConn:
        return await self._secure(conn, peer_id)

    async def _secure(self, conn: IRawConnection, expected: ID | None) -> ISecureConn:
        direction = "inbound" if expected is None else "outbound"
        secure: ISecureConn | None = None
        try:
            with trio.fail_after(self.handshake_timeout_s):
                try:
                    if expected is None:
                        secure = await self._noise.secure_inbound(conn)
                    else:
                        secure = await self._noise.secure_outbound(conn, expected)
                except Exception as err:
                    raise AttestationFailure(NOISE_FAILED, f"{type(err).__name__}: {err}") from err
                await self._exchange(secure)
        except trio.TooSlowError:
            failure = AttestationFailure(
                TIMEOUT, f"no attestation within {self.handshake_timeout_s} s"
            )
            await self._fail(failure, conn, secure, expected, direction)
            raise failure from None
        except AttestationFailure as failure:
            await self._fail(failure, conn, secure, expected, direction)
            raise
        assert secure is not None
        return secure

    async def _exchange(self, secure: ISecureConn) -> None:
        """The certificate exchange; raises AttestationFailure. Admits the peer on success."""
        remote = secure.get_remote_peer()
        stage = "certificate"
        try:
            await secure.write(encode_frame(FRAME_CERT, self._certificate_bytes))
            payload = await _read_frame(secure, FRAME_CERT, MAX_CERTIFICATE_BYTES)
            stage = "verdict"
            try:
                cert = self.attestor.check(payload, remote, self._clock())
            except AttestationRejected as rejected:
                # Tell the peer why (best effort), then fail; the caller closes the connection.
                with contextlib.suppress(Exception):
                    await secure.write(encode_frame(FRAME_VERDICT, rejected.reason.encode()))
                raise AttestationFailure(rejected.reason, rejected.detail) from None
            await secure.write(encode_frame(FRAME_VERDICT, VERDICT_OK.encode()))
            theirs = await _read_frame(secure, FRAME_VERDICT, MAX_VERDICT_BYTES)
        except AttestationFailure:
            raise
        except AttestationRejected as rejected:  # a malformed frame
            raise AttestationFailure(rejected.reason, rejected.detail) from None
        except _NotAFrame as err:
            raise AttestationFailure(NO_CERTIFICATE, str(err)) from None
        except Exception as err:  # I/O: closed, reset, broken
            if stage == "certificate":
                raise AttestationFailure(
                    NO_CERTIFICATE, f"closed before a certificate ({type(err).__name__}: {err})"
                ) from None
            raise AttestationFailure(CONNECTION_LOST, f"{type(err).__name__}: {err}") from None
        if theirs != VERDICT_OK.encode():
            reason = theirs.decode("ascii", "replace")
            raise AttestationFailure(
                REJECTED_BY_PEER, f"the peer refused our certificate: {reason}"
            )
        try:
            self.attestor.admit(remote, cert)
        except AttestationRejected as rejected:
            raise AttestationFailure(rejected.reason, rejected.detail) from None
        logger.info(
            "peer attested peer_id=%s name=%s serial=%d roles=%s",
            remote.to_base58(),
            cert.name,
            cert.serial,
            ",".join(cert.roles),
        )

    async def _fail(
        self,
        failure: AttestationFailure,
        conn: IRawConnection,
        secure: ISecureConn | None,
        expected: ID | None,
        direction: str,
    ) -> None:
        peer = secure.get_remote_peer() if secure is not None else expected
        address = None
        for source in (secure, conn):
            if source is not None and address is None:
                try:
                    address = source.get_remote_address()
                except Exception:
                    address = None
        where = f"{address[0]}:{address[1]}" if address else "-"
        peer_id = peer.to_base58() if peer is not None else ""
        self.attestor.record_rejection(
            failure.reason, peer_id=peer_id,
            detail={"direction": direction, "address": where, "detail": failure.detail},
        )
        logger.warning(
            "peer rejected reason=%s direction=%s peer_id=%s address=%s detail=%r",
            failure.reason,
            direction,
            peer_id or "-",
            where,
            failure.detail,
        )
        with trio.move_on_after(1.0) as scope:
            scope.shield = True
            for closable in (secure, conn):
                if closable is not None:
                    with contextlib.suppress(Exception):
                        await closable.close()


# ----------------------------------------------------------------------------- host


class _ForgetOnDisconnect(INotifee):
    """Drops a peer's certificate from the attestor once its last connection is gone."""

    def __init__(self, attestor: Attestor) -> None:
        self._attestor = attestor

    async def disconnected(self, network: INetwork, conn: INetConn) -> None:
        peer_id = conn.muxed_conn.peer_id
        if not network.get_connections(peer_id):
            self._attestor.forget(peer_id)

    async def connected(self, network: INetwork, conn: INetConn) -> None:
        return None

    async def opened_stream(self, network: INetwork, stream: INetStream) -> None:
        return None

    async def closed_stream(self, network: INetwork, stream: INetStream) -> None:
        return None

    async def listen(self, network: INetwork, multiaddr: Multiaddr) -> None:
        return None

    async def listen_close(self, network: INetwork, multiaddr: Multiaddr) -> None:
        return None


def security_options(
    identity: NodeIdentity,
    attestor: Attestor,
    *,
    handshake_timeout_s: float = DEFAULT_HANDSHAKE_TIMEOUT_S,
    clock: Callable[[], float] = time.time,
) -> dict[TProtocol, ISecureTransport]:
    """The ``sec_opt`` for ``libp2p.new_host``: ONLY the attested transport."""
    transport = AttestedNoiseTransport(
        identity.key_pair,
        identity.certificate_bytes,
        attestor,
        handshake_timeout_s=handshake_timeout_s,
        clock=clock,
    )
    return {ATTEST_PROTOCOL_ID: transport}


def make_host(
    identity: NodeIdentity,
    attestor: Attestor,
    *,
    connection_config: ConnectionConfig | None = None,
    handshake_timeout_s: float = DEFAULT_HANDSHAKE_TIMEOUT_S,
    clock: Callable[[], float] = time.time,
    dial_retries: int | None = None,
    **new_host_kwargs: Any,
) -> IHost:
    """A libp2p host that offers only attested Noise and only yamux.

    ``connection_config`` defaults to ``ConnectionConfig(max_connections_per_peer=1)`` (the
    library default of 3 makes every dial wait 250 ms). Extra keyword arguments go to
    ``libp2p.new_host`` (for example ``bootstrap=[...]``). Listen with
    ``async with host.run(listen_addrs): ...``.

    ``dial_retries`` replaces the swarm's retry count (library default 3, with 0.1/0.2/0.4 s
    backoff): a peer that fails attestation fails again, so the daemon, which redials on its
    own schedule, is better served by 0.
    """
    for forbidden in ("key_pair", "sec_opt", "muxer_opt", "muxer_preference"):
        if forbidden in new_host_kwargs:
            raise TypeError(f"make_host sets {forbidden} itself")
    host = new_host(
        key_pair=identity.key_pair,
        sec_opt=security_options(
            identity, attestor, handshake_timeout_s=handshake_timeout_s, clock=clock
        ),
        muxer_opt={TProtocol(YAMUX_PROTOCOL_ID): Yamux},
        connection_config=connection_config or ConnectionConfig(max_connections_per_peer=1),
        **new_host_kwargs,
    )
    network = host.get_network()
    network.register_notifee(_ForgetOnDisconnect(attestor))
    if dial_retries is not None:
        # Not a new_host() argument in 0.8.1; the Swarm reads it on every dial.
        network.retry_config = RetryConfig(max_retries=dial_retries)  # type: ignore[attr-defined]
    return host


async def disconnect_peers(host: IHost, peer_ids: Sequence[ID], *, timeout_s: float = 5.0) -> None:
    """Close every connection to each peer (after a revocation), within ``timeout_s``."""
    with trio.move_on_after(timeout_s):
        for peer_id in peer_ids:
            try:
                await host.disconnect(peer_id)
            except Exception as err:  # a peer already gone is not our failure
                logger.info("disconnect failed peer_id=%s error=%r", peer_id.to_base58(), err)
            else:
                logger.warning("revoked peer disconnected peer_id=%s", peer_id.to_base58())


async def disconnect_all(host: IHost, *, timeout_s: float = 2.0) -> None:
    """Close every connection of ``host``, concurrently, within ``timeout_s``.

    Call it before leaving ``host.run()``: py-libp2p 0.8.1 closes live connections on the way
    out inside an already cancelled scope, so a dialled socket is sometimes left to the garbage
    collector (a ``ResourceWarning``, an error under ``-W error``).
    """
    network = host.get_network()
    with trio.move_on_after(timeout_s):
        async with trio.open_nursery() as nursery:
            for peer_id in list(network.get_connections_map()):
                nursery.start_soon(_disconnect_quietly, host, peer_id)


async def _disconnect_quietly(host: IHost, peer_id: ID) -> None:
    with contextlib.suppress(Exception):
        await host.disconnect(peer_id)


async def apply_revocation(
    host: IHost, attestor: Attestor, data: bytes, *, timeout_s: float = 5.0
) -> list[ID]:
    """Verify and apply an encoded revocation list, then disconnect the peers it revokes.

    Raises ``ProtocolError``/``AttestationRejected`` for a list that is malformed or not this
    CA's (nothing changes then). Returns the disconnected peers.
    """
    doomed = attestor.offer_revocation_list(data)
    await disconnect_peers(host, doomed, timeout_s=timeout_s)
    return doomed
