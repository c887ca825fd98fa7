"""Certificate and revocation list encoding and verification: every rejection reason."""

from __future__ import annotations

import msgpack
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from keys_helpers import NOW, new_ca

from meshd.core import cert as C
from meshd.core import crl as R
from meshd.core import signed as S
from meshd.errors import AttestationError, ProtocolError


def _node_key() -> bytes:
    return C.public_key_bytes(Ed25519PrivateKey.generate())


def _issue(ca_key: Ed25519PrivateKey, node_key: bytes, **over: object) -> bytes:
    args: dict[str, object] = {
        "ca_private_key": ca_key,
        "serial": 7,
        "name": "gw-eu-1",
        "node_public_key": node_key,
        "not_before": NOW - 100,
        "not_after": NOW + 100,
        "roles": ("worker", "gateway", "worker"),
        "labels": {"region": "eu-west", "residency": "eu"},
    }
    args.update(over)
    return C.issue_certificate(**args)  # type: ignore[arg-type]


def _verify(data: bytes | None, ca_pub: bytes, peer: str, **over: object) -> C.Certificate:
    kwargs: dict[str, object] = {"ca_public_key": ca_pub, "remote_peer_id": peer, "now": NOW}
    kwargs.update(over)
    return C.verify_certificate(data, **kwargs)  # type: ignore[arg-type]


def test_peer_id_matches_libp2p() -> None:
    from libp2p.crypto.ed25519 import Ed25519PublicKey
    from libp2p.peer.id import ID

    for _ in range(20):
        raw = _node_key()
        assert C.peer_id_of(raw) == ID.from_pubkey(Ed25519PublicKey.from_bytes(raw)).to_base58()


def test_round_trip_and_canonical_fields() -> None:
    ca = new_ca()
    node = _node_key()
    data = _issue(ca.private_key, node)
    cert = _verify(data, ca.public_key, C.peer_id_of(node))
    assert cert.name == "gw-eu-1"
    assert cert.serial == 7
    assert cert.public_key == node
    assert cert.roles == ("gateway", "worker")  # sorted, unique
    assert dict(cert.labels) == {"region": "eu-west", "residency": "eu"}
    assert cert.region == "eu-west"
    assert cert.ca_key_id == C.ca_key_id(ca.public_key)
    assert C.decode_certificate(data) == cert
    # Same fields, same bytes: the encoding is deterministic.
    assert _issue(ca.private_key, node) == data
    assert len(data) < C.MAX_CERTIFICATE_BYTES


@pytest.mark.parametrize(
    ("case", "reason"),
    [
        ("absent", C.NO_CERTIFICATE),
        ("empty", C.NO_CERTIFICATE),
        ("garbage", C.MALFORMED),
        ("other_ca", C.WRONG_CA),
        ("forged_key_id", C.WRONG_CA),
        ("tampered", C.WRONG_CA),
        ("other_peer", C.PEER_ID_MISMATCH),
        ("expired", C.EXPIRED),
        ("at_not_after", C.EXPIRED),
        ("not_yet_valid", C.NOT_YET_VALID),
        ("revoked", C.REVOKED),
        ("oversized", C.MALFORMED),
        ("crl_as_cert", C.MALFORMED),
    ],
)
def test_every_rejection_reason(case: str, reason: str) -> None:
    ca = new_ca()
    node = _node_key()
    peer = C.peer_id_of(node)
    data: bytes | None = _issue(ca.private_key, node)
    over: dict[str, object] = {}
    if case == "absent":
        data = None
    elif case == "empty":
        data = b""
    elif case == "garbage":
        data = b"\x93MSH not msgpack at all"
    elif case == "other_ca":
        data = _issue(new_ca().private_key, node)
    elif case in ("forged_key_id", "tampered"):
        outer = msgpack.unpackb(data)
        body = msgpack.unpackb(outer[2])
        if case == "forged_key_id":  # another CA signs a certificate naming our CA's key id
            other = new_ca()
            body[9] = C.ca_key_id(ca.public_key)
            new_body = msgpack.packb(body, use_bin_type=True)
            outer[2], outer[3] = new_body, other.private_key.sign(C.CERT_DOMAIN + new_body)
        else:  # our CA's certificate with an extra role slipped in
            body[5] = ["admin", "gateway", "worker"]
            outer[2] = msgpack.packb(body, use_bin_type=True)
        data = msgpack.packb(outer, use_bin_type=True)
    elif case == "other_peer":
        over["remote_peer_id"] = C.peer_id_of(_node_key())
    elif case == "expired":
        over["now"] = NOW + 101
    elif case == "at_not_after":
        over["now"] = NOW + 100
    elif case == "not_yet_valid":
        over["now"] = NOW - 100 - C.DEFAULT_CLOCK_SKEW_S - 1
    elif case == "revoked":
        over["revoked"] = {1, 7}
    elif case == "oversized":
        assert data is not None
        data = data + b"\x00" * C.MAX_CERTIFICATE_BYTES
    elif case == "crl_as_cert":
        rl = R.RevocationList(version=1, issued_at=NOW, ca_key_id=C.ca_key_id(ca.public_key))
        data = R.sign_revocation_list(rl, ca.private_key)
    with pytest.raises(AttestationError) as info:
        _verify(data, ca.public_key, peer, **over)
    assert isinstance(info.value, C.AttestationRejected)
    assert info.value.reason == reason
    assert info.value.code == "unattested"
    assert reason in str(info.value)


def test_clock_skew_allows_a_slightly_early_clock() -> None:
    ca = new_ca()
    node = _node_key()
    data = _issue(ca.private_key, node)
    start = NOW - 100
    _verify(data, ca.public_key, C.peer_id_of(node), now=start - C.DEFAULT_CLOCK_SKEW_S)
    with pytest.raises(C.AttestationRejected, match="not_yet_valid"):
        _verify(data, ca.public_key, C.peer_id_of(node), now=start - 1, clock_skew_s=0)


def test_non_canonical_encodings_are_malformed() -> None:
    ca = new_ca()
    node = _node_key()
    data = _issue(ca.private_key, node)
    outer = msgpack.unpackb(data)
    body = msgpack.unpackb(outer[2])
    body[5] = list(reversed(body[5]))  # roles out of order, correctly signed
    new_body = msgpack.packb(body, use_bin_type=True)
    outer[2], outer[3] = new_body, ca.private_key.sign(C.CERT_DOMAIN + new_body)
    with pytest.raises(C.AttestationRejected) as info:
        _verify(msgpack.packb(outer, use_bin_type=True), ca.public_key, C.peer_id_of(node))
    assert info.value.reason == C.MALFORMED


def test_inconsistent_peer_id_signed_by_the_ca_is_malformed() -> None:
    ca = new_ca()
    node = _node_key()
    outer = msgpack.unpackb(_issue(ca.private_key, node))
    body = msgpack.unpackb(outer[2])
    body[3] = C.peer_id_of(_node_key())  # peer id of another key
    new_body = msgpack.packb(body, use_bin_type=True)
    outer[2], outer[3] = new_body, ca.private_key.sign(C.CERT_DOMAIN + new_body)
    with pytest.raises(C.AttestationRejected) as info:
        _verify(msgpack.packb(outer, use_bin_type=True), ca.public_key, body[3])
    assert info.value.reason == C.MALFORMED


@pytest.mark.parametrize(
    "over",
    [
        {"name": "bad name"},
        {"name": ""},
        {"serial": 0},
        {"serial": True},
        {"not_before": NOW, "not_after": NOW},
        {"roles": ("ok", "not ok")},
        {"labels": {"region": "eu\nwest"}},
        {"labels": {"": "x"}},
        {"labels": {f"k{i}": "v" for i in range(C.MAX_LABELS + 1)}},
        {"labels": {"region": "x" * (C.MAX_LABEL_VALUE_CHARS + 1)}},
        {"roles": tuple(f"r{i}" for i in range(C.MAX_ROLES + 1))},
    ],
)
def test_issue_refuses_bad_fields(over: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        _issue(new_ca().private_key, _node_key(), **over)


def test_sign_refuses_a_foreign_key_id() -> None:
    ca, other = new_ca(), new_ca()
    node = _node_key()
    cert = C.Certificate(
        serial=1,
        name="n",
        peer_id=C.peer_id_of(node),
        public_key=node,
        not_before=0,
        not_after=1,
        ca_key_id=C.ca_key_id(other.public_key),
    )
    with pytest.raises(ValueError, match="ca_key_id"):
        C.sign_certificate(cert, ca.private_key)


# --------------------------------------------------------------------------- revocation lists


def _crl(ca: object, version: int, serials: set[int]) -> bytes:
    rl = R.RevocationList(
        version=version,
        issued_at=NOW,
        ca_key_id=C.ca_key_id(ca.public_key),  # type: ignore[attr-defined]
        serials=frozenset(serials),
    )
    return R.sign_revocation_list(rl, ca.private_key)  # type: ignore[attr-defined]


def test_revocation_list_round_trip_and_supersedes() -> None:
    ca = new_ca()
    v1 = R.verify_revocation_list(_crl(ca, 1, {3, 1}), ca_public_key=ca.public_key)
    v2 = R.verify_revocation_list(_crl(ca, 2, {3, 1, 9}), ca_public_key=ca.public_key)
    assert v1.serials == {1, 3}
    assert v2.supersedes(v1)
    assert not v1.supersedes(v2)
    assert not v1.supersedes(v1)
    assert v1.supersedes(None)
    assert R.decode_revocation_list(_crl(ca, 2, {9})).serials == {9}
    assert S.detect_kind(_crl(ca, 1, set())) == R.CRL_KIND


def test_revocation_list_rejections() -> None:
    ca, other = new_ca(), new_ca()
    with pytest.raises(C.AttestationRejected) as info:
        R.verify_revocation_list(_crl(other, 5, {1}), ca_public_key=ca.public_key)
    assert info.value.reason == C.WRONG_CA
    outer = msgpack.unpackb(_crl(ca, 5, {1}))
    body = msgpack.unpackb(outer[2])
    body[3] = []  # un-revoke everything, keep the CA's signature
    outer[2] = msgpack.packb(body, use_bin_type=True)
    with pytest.raises(C.AttestationRejected) as info:
        R.verify_revocation_list(msgpack.packb(outer), ca_public_key=ca.public_key)
    assert info.value.reason == C.WRONG_CA
    for bad in (b"", b"\xc1", b"x" * (R.MAX_REVOCATION_LIST_BYTES + 1)):
        with pytest.raises(ProtocolError):
            R.verify_revocation_list(bad, ca_public_key=ca.public_key)
    cert = _issue(ca.private_key, _node_key())
    with pytest.raises(ProtocolError):  # a certificate is not a revocation list
        R.verify_revocation_list(cert, ca_public_key=ca.public_key)
