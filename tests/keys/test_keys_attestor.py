"""The Attestor's decisions without any network: admission, revocation, statistics."""

from __future__ import annotations

import time

import pytest
from keys_helpers import CA, NOW

from meshd.core import cert as C
from meshd.core import crl as R
from meshd.errors import ProtocolError
from meshd.net import attest as A


def _crl(ca: CA, version: int, serials: set[int]) -> bytes:
    rl = R.RevocationList(
        version=version,
        issued_at=NOW,
        ca_key_id=C.ca_key_id(ca.public_key),
        serials=frozenset(serials),
    )
    return R.sign_revocation_list(rl, ca.private_key)


def test_check_admit_and_revoke(ca: CA) -> None:
    attestor = A.Attestor(ca.public_key)
    nodes = [ca.issue(f"n{i}") for i in range(3)]
    now = time.time()
    for node in nodes:
        cert = attestor.check(node.certificate_bytes, node.peer_id, now)
        attestor.admit(node.peer_id, cert)
    assert set(attestor.attested_peers()) == {n.peer_id.to_base58() for n in nodes}
    assert attestor.certificate_of(nodes[1].peer_id.to_base58()) == nodes[1].certificate

    doomed = attestor.revoke([nodes[1].certificate.serial, 999])
    assert doomed == [nodes[1].peer_id]
    assert attestor.certificate_of(nodes[1].peer_id) is None
    assert attestor.revoke([nodes[1].certificate.serial]) == []  # already cut off
    with pytest.raises(C.AttestationRejected) as info:
        attestor.check(nodes[1].certificate_bytes, nodes[1].peer_id, now)
    assert info.value.reason == C.REVOKED

    stats = attestor.statistics()
    assert stats["attested_total"] == 3
    assert stats["attested_peers"] == 2
    assert stats["disconnected_revoked"] == 1
    assert stats["revoked_serials"] == 2
    assert set(stats["rejected_by_reason"]) == set(A.ALL_REASONS)

    attestor.forget(nodes[0].peer_id)
    assert attestor.certificate_of(nodes[0].peer_id) is None


def test_expire_cuts_off_certificates_that_ran_out(ca: CA) -> None:
    attestor = A.Attestor(ca.public_key)
    now = int(time.time())
    short = ca.issue("short", not_before=now - 10, not_after=now + 10)
    long = ca.issue("long", not_before=now - 10, not_after=now + 1000)
    for node in (short, long):
        attestor.admit(node.peer_id, attestor.check(node.certificate_bytes, node.peer_id, now))
    assert attestor.expire(now + 9) == []
    assert attestor.expire(now + 10) == [short.peer_id]
    assert attestor.certificate_of(short.peer_id) is None
    assert attestor.certificate_of(long.peer_id) is not None


def test_revocation_during_handshake_wins(ca: CA) -> None:
    attestor = A.Attestor(ca.public_key)
    node = ca.issue("n")
    cert = attestor.check(node.certificate_bytes, node.peer_id, time.time())
    attestor.revoke([node.certificate.serial])  # arrives while the verdicts are exchanged
    with pytest.raises(C.AttestationRejected) as info:
        attestor.admit(node.peer_id, cert)
    assert info.value.reason == C.REVOKED
    assert attestor.certificate_of(node.peer_id) is None


def test_revocation_lists_apply_newest_only(ca: CA, make_ca: object) -> None:
    attestor = A.Attestor(ca.public_key)
    a, b = ca.issue("a"), ca.issue("b")
    for node in (a, b):
        attestor.admit(
            node.peer_id, attestor.check(node.certificate_bytes, node.peer_id, time.time())
        )
    sa, sb = a.certificate.serial, b.certificate.serial
    assert attestor.offer_revocation_list(_crl(ca, 2, {sa})) == [a.peer_id]
    assert attestor.offer_revocation_list(_crl(ca, 1, {sb})) == []  # older: ignored
    assert attestor.revoked == {sa}
    assert attestor.offer_revocation_list(_crl(ca, 3, {sb})) == [b.peer_id]
    assert attestor.revoked == {sb}  # a newer list replaces, it is never a delta
    assert attestor.statistics()["revocation_version"] == 3
    other = make_ca()  # type: ignore[operator]
    with pytest.raises(C.AttestationRejected):
        attestor.offer_revocation_list(_crl(other, 9, set()))
    with pytest.raises(ProtocolError):
        attestor.offer_revocation_list(b"\x00garbage")
    assert attestor.statistics()["revocation_version"] == 3
