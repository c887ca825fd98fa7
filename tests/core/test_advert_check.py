"""The advert validator (``meshd.core.advert_check``): one table of envelopes and verdicts.

Keys and certificates are made here with ``meshd.core.cert`` alone (no libp2p), at a fixed time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from meshd.core.advert import Advert, signing_payload
from meshd.core.advert_check import (
    CERT_MEMO,
    AdvertChecker,
    Rejected,
    read_claim,
    seal,
)
from meshd.core.cert import issue_certificate, peer_id_of, public_key_bytes
from meshd.core.messages import MessageType
from meshd.core.wire import encode_message, pack

NOW = 1_750_000_000.0


@dataclass
class Author:
    key: Ed25519PrivateKey
    cert: bytes
    peer_id: str
    serial: int

    def advert(self, seq: int = 10, **kw: object) -> Advert:
        base: dict[str, object] = dict(peer_id=self.peer_id, name="claimed-name", seq=seq, ts=NOW,
                                       region="claimed-region", labels={"region": "claimed"})
        base.update(kw)
        return Advert(**base)  # type: ignore[arg-type]

    def envelope(self, seq: int = 10, **kw: object) -> bytes:
        return seal(self.advert(seq, **kw), self.key.sign, self.cert)


def make_author(ca: Ed25519PrivateKey, serial: int, name: str = "n1",
                not_after: int = int(NOW) + 3600) -> Author:
    key = Ed25519PrivateKey.generate()
    pub = public_key_bytes(key)
    cert = issue_certificate(ca_private_key=ca, serial=serial, name=name, node_public_key=pub,
                             not_before=int(NOW) - 60, not_after=not_after,
                             labels={"region": "eu-west", "tier": "gold"})
    return Author(key, cert, peer_id_of(pub), serial)


CA = Ed25519PrivateKey.generate()
OTHER_CA = Ed25519PrivateKey.generate()
LOCAL = make_author(CA, 1, "local")
ALICE = make_author(CA, 2, "alice")
BOB = make_author(CA, 3, "bob")
FOREIGN = make_author(OTHER_CA, 2, "mallory")
EXPIRED = make_author(CA, 4, "old", not_after=int(NOW) - 1)


def _bad_signature() -> bytes:
    adv = ALICE.advert()
    body = adv.encode()
    sig = BOB.key.sign(signing_payload(body))  # signed by another key than the certificate's
    return encode_message(MessageType.ADVERT, {"body": body, "sig": sig, "cert": ALICE.cert})


def _cert_of_another() -> bytes:
    adv = ALICE.advert()
    return seal(adv, ALICE.key.sign, BOB.cert)  # BOB's certificate on ALICE's gossip


def _garbage_body() -> bytes:
    body = pack({"v": 1, "peer_id": 7})
    return encode_message(MessageType.ADVERT, {"body": body, "sig": ALICE.key.sign(signing_payload(body)),
                                               "cert": ALICE.cert})


# (case, data, author, last_seq, revoked serials, expected reason or None for accepted)
CASES: list[tuple[str, Callable[[], bytes], Author, int, frozenset[int], str | None]] = [
    ("good advert", lambda: ALICE.envelope(), ALICE, -1, frozenset(), None),
    ("good advert above the last seq", lambda: ALICE.envelope(seq=11), ALICE, 10, frozenset(), None),
    ("not msgpack", lambda: b"\xc1\xc1garbage", ALICE, -1, frozenset(), "malformed"),
    ("another message type", lambda: encode_message(MessageType.PING, {"n": 1}), ALICE, -1,
     frozenset(), "malformed"),
    ("body fails the schema", _garbage_body, ALICE, -1, frozenset(), "malformed"),
    ("foreign CA", lambda: FOREIGN.envelope(), FOREIGN, -1, frozenset(), "unattested:wrong_ca"),
    ("certificate of another peer", _cert_of_another, ALICE, -1, frozenset(),
     "unattested:peer_id_mismatch"),
    ("expired certificate", lambda: EXPIRED.envelope(), EXPIRED, -1, frozenset(),
     "unattested:expired"),
    ("revoked", lambda: ALICE.envelope(), ALICE, -1, frozenset({ALICE.serial}),
     "unattested:revoked"),
    ("bad signature", _bad_signature, ALICE, -1, frozenset(), "bad_signature"),
    ("author mismatch", lambda: ALICE.envelope(peer_id=BOB.peer_id), ALICE, -1, frozenset(),
     "author_mismatch"),
    ("replay of the last seq", lambda: ALICE.envelope(seq=10), ALICE, 10, frozenset(), "replay"),
    ("replay of an older seq", lambda: ALICE.envelope(seq=3), ALICE, 10, frozenset(), "replay"),
    ("own advert echoed back is no replay", lambda: LOCAL.envelope(seq=3), LOCAL, 10, frozenset(),
     None),
]


@pytest.mark.parametrize("case, data, author, last_seq, revoked, expected", CASES,
                         ids=[c[0] for c in CASES])
def test_table(case: str, data: Callable[[], bytes], author: Author, last_seq: int,
               revoked: frozenset[int], expected: str | None) -> None:
    checker = AdvertChecker(LOCAL.peer_id, public_key_bytes(CA))
    out = checker.check(data(), author.peer_id, NOW, last_seq=last_seq, revoked=revoked)
    if expected is None:
        assert isinstance(out, Advert), out
        assert out.peer_id == author.peer_id
    else:
        assert isinstance(out, Rejected), out
        assert out.reason == expected


def test_labels_region_and_name_come_from_the_certificate() -> None:
    checker = AdvertChecker(LOCAL.peer_id, public_key_bytes(CA))
    out = checker.check(ALICE.envelope(), ALICE.peer_id, NOW)
    assert isinstance(out, Advert)
    assert out.labels == {"region": "eu-west", "tier": "gold"}
    assert out.region == "eu-west" and out.name == "alice"
    assert replace(out, labels={"region": "claimed"}, region="claimed-region",
                   name="claimed-name") == ALICE.advert()


def test_a_certificate_is_remembered_but_checked_against_the_time_and_revocations() -> None:
    checker = AdvertChecker(LOCAL.peer_id, public_key_bytes(CA))
    assert isinstance(checker.check(ALICE.envelope(seq=1), ALICE.peer_id, NOW), Advert)
    assert len(checker) == 1
    assert isinstance(checker.check(ALICE.envelope(seq=2), ALICE.peer_id, NOW), Advert)
    assert len(checker) == 1
    late = checker.check(ALICE.envelope(seq=3), ALICE.peer_id, NOW + 7200)
    assert isinstance(late, Rejected) and late.reason == "unattested:expired"
    gone = checker.check(ALICE.envelope(seq=4), ALICE.peer_id, NOW, revoked={ALICE.serial})
    assert isinstance(gone, Rejected) and gone.reason == "unattested:revoked"


def test_the_memo_is_bounded() -> None:
    checker = AdvertChecker(LOCAL.peer_id, public_key_bytes(CA), memo_size=2)
    for a in (ALICE, BOB, LOCAL):
        assert isinstance(checker.check(a.envelope(), a.peer_id, NOW), Advert)
        assert len(checker) <= 2
    assert CERT_MEMO >= 256


@pytest.mark.parametrize("data, reason", [
    (b"\x93", "malformed"),
    ("not bytes", "malformed"),
    (b"\x00" * 20_000, "malformed"),
])
def test_read_claim_rejects_what_is_no_envelope(data: object, reason: str) -> None:
    out = read_claim(data)
    assert isinstance(out, Rejected) and out.reason == reason


def test_read_claim_names_the_author_without_checking() -> None:
    out = read_claim(_bad_signature())
    assert isinstance(out, Advert) and out.peer_id == ALICE.peer_id and out.seq == 10
