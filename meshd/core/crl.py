"""Revocation lists: encoding, signing and verification (pure, no I/O).

A *revocation list* is a CA-signed, versioned set of revoked serials; a higher version replaces a
lower one. Its wire form is the CA-signed envelope of ``meshd.core.signed`` with kind
``meshd.crl`` and body ``[version, issued_at, ca_key_id, sorted serials]`` in canonical msgpack
(see ``keys/README.md``); a decoder re-encodes what it read and rejects the input unless the
bytes are identical.

The decoders cap the input size before unpacking and raise only ``ProtocolError`` on any input;
a list not signed by this CA is an ``AttestationRejected`` (``wrong_ca``), checked by the same
function that checks certificates.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from meshd.core.signed import (
    CRL_KIND,
    KEY_ID_RE,
    MAX_SERIAL,
    MAX_SIGNED_BYTES,
    MAX_TIME,
    Envelope,
    ca_key_id,
    check_ca_signature,
    is_int,
    open_envelope,
    pack,
    public_key_bytes,
    seal,
    unpack_limited,
)
from meshd.errors import ProtocolError

__all__ = [
    "CRL_DOMAIN",
    "CRL_FORMAT",
    "CRL_KIND",
    "MAX_REVOCATION_LIST_BYTES",
    "MAX_REVOKED_SERIALS",
    "RevocationList",
    "decode_revocation_list",
    "revocation_list_body",
    "sign_revocation_list",
    "verify_revocation_list",
]

CRL_FORMAT: Final = 1
CRL_DOMAIN: Final = b"meshd revocation list v1\x00"
MAX_REVOCATION_LIST_BYTES: Final = MAX_SIGNED_BYTES
MAX_REVOKED_SERIALS: Final = 16384

CRL_ENVELOPE: Final = Envelope(
    kind=CRL_KIND,
    format=CRL_FORMAT,
    domain=CRL_DOMAIN,
    max_bytes=MAX_REVOCATION_LIST_BYTES,
    other_ca="revocation list from CA {claimed}, this mesh's CA is {ours}",
    bad_signature="revocation list signature does not verify under CA {ours}",
)


@dataclass(frozen=True, slots=True)
class RevocationList:
    """A CA-signed set of revoked serials. A higher ``version`` replaces a lower one."""

    version: int
    issued_at: int
    ca_key_id: str
    serials: frozenset[int] = frozenset()

    def __post_init__(self) -> None:
        object.__setattr__(self, "serials", frozenset(self.serials))
        if not is_int(self.version) or not 1 <= self.version <= MAX_SERIAL:
            raise ValueError("revocation list version must be a positive integer")
        if not is_int(self.issued_at) or not 0 <= self.issued_at <= MAX_TIME:
            raise ValueError("issued_at must be unix seconds")
        if not isinstance(self.ca_key_id, str) or not KEY_ID_RE.fullmatch(self.ca_key_id):
            raise ValueError("ca_key_id must be 16 lowercase hex digits")
        if len(self.serials) > MAX_REVOKED_SERIALS:
            raise ValueError(f"at most {MAX_REVOKED_SERIALS} revoked serials")
        for serial in self.serials:
            if not is_int(serial) or not 1 <= serial <= MAX_SERIAL:
                raise ValueError(f"revoked serial {serial!r} is not in 1..{MAX_SERIAL}")

    def supersedes(self, other: RevocationList | None) -> bool:
        """True when this list should replace ``other`` (None: no list yet)."""
        return other is None or self.version > other.version


def revocation_list_body(rl: RevocationList) -> bytes:
    return pack([rl.version, rl.issued_at, rl.ca_key_id, sorted(rl.serials)])


def sign_revocation_list(rl: RevocationList, ca_private_key: Ed25519PrivateKey) -> bytes:
    if rl.ca_key_id != ca_key_id(public_key_bytes(ca_private_key)):
        raise ValueError("revocation list ca_key_id does not name this CA key")
    return seal(CRL_ENVELOPE, revocation_list_body(rl), ca_private_key)


def _decode_revocation_body(body: bytes) -> RevocationList:
    fields = unpack_limited(body, MAX_REVOCATION_LIST_BYTES, MAX_REVOKED_SERIALS)
    if not isinstance(fields, list) or len(fields) != 4 or not isinstance(fields[3], list):
        raise ValueError("revocation list body is not [version, issued_at, ca_key_id, serials]")
    if len(set(fields[3])) != len(fields[3]):
        raise ValueError("a serial appears twice")
    rl = RevocationList(
        version=fields[0], issued_at=fields[1], ca_key_id=fields[2], serials=frozenset(fields[3])
    )
    if revocation_list_body(rl) != body:
        raise ValueError("revocation list body is not in canonical form")
    return rl


def _decode_signed_revocation_list(data: object) -> tuple[RevocationList, bytes, bytes]:
    try:
        body, signature = open_envelope(CRL_ENVELOPE, data)
        return _decode_revocation_body(body), body, signature
    except Exception as err:
        raise ProtocolError(
            f"revocation list does not decode ({type(err).__name__}: {err})"
        ) from None


def decode_revocation_list(data: bytes) -> RevocationList:
    """Decode WITHOUT checking the signature (for display). Raises only ``ProtocolError``."""
    return _decode_signed_revocation_list(data)[0]


def verify_revocation_list(data: bytes, *, ca_public_key: bytes) -> RevocationList:
    """Decode a revocation list received from anywhere and check the CA signed it.

    Raises ``ProtocolError`` when malformed and ``AttestationRejected`` (``wrong_ca``) when not
    signed by this CA. Whether it is newer than the one in force is the caller's question
    (``RevocationList.supersedes``).
    """
    rl, body, signature = _decode_signed_revocation_list(data)
    check_ca_signature(
        CRL_ENVELOPE, body, signature, claimed_key_id=rl.ca_key_id, ca_public_key=ca_public_key
    )
    return rl
