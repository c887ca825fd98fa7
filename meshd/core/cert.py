"""Mesh certificates: encoding, signing and verification (pure, no I/O).

A *certificate* binds a node's libp2p identity (its peer ID and Ed25519 public key) to a node
name, roles, labels and a validity window, signed by the mesh CA. Its wire form is the CA-signed
envelope of ``meshd.core.signed`` with kind ``meshd.cert`` (see ``keys/README.md``).

The body is the canonical msgpack encoding of the fields (a fixed-order array, roles sorted,
labels as a sorted list of pairs, no floats, minimal integer widths as msgpack writes them). A
decoder re-encodes what it read and rejects the input unless the bytes are identical, so each
certificate has one encoding.

Every decoder caps the input size before unpacking and raises only ``AttestationError`` on any
input. Times are passed in as unix seconds; nothing here reads the clock. Revocation lists are
in ``meshd.core.crl``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Final

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from meshd.core.signed import (
    CERT_KIND,
    EXPIRED,
    KEY_ID_RE,
    MALFORMED,
    MAX_SERIAL,
    MAX_TIME,
    NO_CERTIFICATE,
    NOT_YET_VALID,
    PEER_ID_MISMATCH,
    REASONS,
    REVOKED,
    WRONG_CA,
    AttestationRejected,
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
from meshd.errors import AttestationError

# Callers import the attestation vocabulary from here, where the certificate is.
__all__ = [
    "CERT_DOMAIN",
    "CERT_FORMAT",
    "CERT_KIND",
    "CERT_VERSION",
    "DEFAULT_CLOCK_SKEW_S",
    "EXPIRED",
    "MALFORMED",
    "MAX_CERTIFICATE_BYTES",
    "MAX_LABELS",
    "MAX_LABEL_VALUE_CHARS",
    "MAX_ROLES",
    "MAX_SERIAL",
    "MAX_TIME",
    "NOT_YET_VALID",
    "NO_CERTIFICATE",
    "PEER_ID_MISMATCH",
    "REASONS",
    "REVOKED",
    "WRONG_CA",
    "AttestationRejected",
    "Certificate",
    "ca_key_id",
    "certificate_body",
    "check_certificate",
    "decode_certificate",
    "issue_certificate",
    "peer_id_of",
    "public_key_bytes",
    "sign_certificate",
    "verify_certificate",
    "verify_signature",
]

CERT_FORMAT: Final = 1
CERT_VERSION: Final = 1
CERT_DOMAIN: Final = b"meshd certificate v1\x00"

MAX_CERTIFICATE_BYTES: Final = 4096
MAX_ROLES: Final = 16
MAX_LABELS: Final = 32
MAX_LABEL_VALUE_CHARS: Final = 256
DEFAULT_CLOCK_SKEW_S: Final = 60

CERT_ENVELOPE: Final = Envelope(
    kind=CERT_KIND,
    format=CERT_FORMAT,
    domain=CERT_DOMAIN,
    max_bytes=MAX_CERTIFICATE_BYTES,
    other_ca="issued by CA {claimed}, this mesh's CA is {ours}",
    bad_signature="signature does not verify under CA {ours}",
)

_NAME_RE: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_ROLE_RE: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,31}")
_LABEL_KEY_RE: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,62}")
_B58_ALPHABET: Final = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"
_PEER_ID_RE: Final = re.compile(f"[{_B58_ALPHABET}]{{1,128}}")
# Protobuf PublicKey{Type: Ed25519, Data: 32 bytes} inside an identity multihash: how libp2p
# derives the peer ID of an Ed25519 key (the key is inlined, not hashed).
_ED25519_PEER_ID_PREFIX: Final = b"\x00\x24\x08\x01\x12\x20"


def _malformed(detail: str) -> AttestationRejected:
    return AttestationRejected(MALFORMED, detail)


# --------------------------------------------------------------------------- peer ID


def _b58encode(data: bytes) -> str:
    number = int.from_bytes(data, "big")
    out = []
    while number:
        number, rem = divmod(number, 58)
        out.append(_B58_ALPHABET[rem])
    pad = len(data) - len(data.lstrip(b"\x00"))
    return "1" * pad + "".join(reversed(out))


def peer_id_of(node_public_key: bytes) -> str:
    """The libp2p peer ID (base58) of an Ed25519 public key, as libp2p derives it."""
    if len(node_public_key) != 32:
        raise ValueError("an Ed25519 public key is 32 bytes")
    return _b58encode(_ED25519_PEER_ID_PREFIX + node_public_key)


# --------------------------------------------------------------------------- certificate


@dataclass(frozen=True, slots=True)
class Certificate:
    """The signed fields of a certificate. Construction validates every field."""

    serial: int
    name: str
    peer_id: str
    public_key: bytes
    not_before: int
    not_after: int
    ca_key_id: str
    roles: tuple[str, ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    version: int = CERT_VERSION

    def __post_init__(self) -> None:
        # Canonical forms: roles sorted and unique, labels a read-only sorted mapping.
        if not all(isinstance(role, str) for role in self.roles):
            raise ValueError("roles must be strings")
        object.__setattr__(self, "roles", tuple(sorted(set(self.roles))))
        if not isinstance(self.labels, Mapping) or not all(
            isinstance(key, str) for key in self.labels
        ):
            raise ValueError("labels must be a mapping of str to str")
        object.__setattr__(self, "labels", MappingProxyType(dict(sorted(self.labels.items()))))
        _check_fields(self)

    @property
    def region(self) -> str:
        return self.labels.get("region", "")

    def valid_at(self, now: float, *, clock_skew_s: int = DEFAULT_CLOCK_SKEW_S) -> bool:
        return self.not_before - clock_skew_s <= now < self.not_after


def _check_fields(cert: Certificate) -> None:
    if cert.version != CERT_VERSION or not is_int(cert.version):
        raise ValueError(f"unsupported certificate version {cert.version!r}")
    if not is_int(cert.serial) or not 1 <= cert.serial <= MAX_SERIAL:
        raise ValueError(f"serial must be an integer in 1..{MAX_SERIAL}")
    if not isinstance(cert.name, str) or not _NAME_RE.fullmatch(cert.name):
        raise ValueError(
            f"node name {cert.name!r} must be 1-64 characters of letters, digits, '.', '_', '-'"
        )
    if not isinstance(cert.peer_id, str) or not _PEER_ID_RE.fullmatch(cert.peer_id):
        raise ValueError("peer_id must be a base58 libp2p peer ID")
    if not isinstance(cert.public_key, bytes) or len(cert.public_key) != 32:
        raise ValueError("public_key must be 32 raw Ed25519 bytes")
    for name in ("not_before", "not_after"):
        value = getattr(cert, name)
        if not is_int(value) or not 0 <= value <= MAX_TIME:
            raise ValueError(f"{name} must be unix seconds (a non-negative integer)")
    if cert.not_before >= cert.not_after:
        raise ValueError("not_before must be earlier than not_after")
    if not isinstance(cert.ca_key_id, str) or not KEY_ID_RE.fullmatch(cert.ca_key_id):
        raise ValueError("ca_key_id must be 16 lowercase hex digits")
    if len(cert.roles) > MAX_ROLES:
        raise ValueError(f"at most {MAX_ROLES} roles")
    for role in cert.roles:
        if not isinstance(role, str) or not _ROLE_RE.fullmatch(role):
            raise ValueError(
                f"role {role!r} must be 1-32 characters of letters, digits, '.', '_', '-'"
            )
    if len(cert.labels) > MAX_LABELS:
        raise ValueError(f"at most {MAX_LABELS} labels")
    for key, value in cert.labels.items():
        if not isinstance(key, str) or not _LABEL_KEY_RE.fullmatch(key):
            raise ValueError(
                f"label key {key!r} must be 1-63 characters of letters, digits, '.', '_', '/', '-'"
            )
        if (
            not isinstance(value, str)
            or len(value) > MAX_LABEL_VALUE_CHARS
            or not value.isprintable()
        ):
            raise ValueError(
                f"label {key}: value must be printable text of at most "
                f"{MAX_LABEL_VALUE_CHARS} characters"
            )


def certificate_body(cert: Certificate) -> bytes:
    """The canonical encoding of a certificate's fields: the bytes the CA signs (after a tag)."""
    return pack(
        [
            cert.version,
            cert.serial,
            cert.name,
            cert.peer_id,
            cert.public_key,
            list(cert.roles),
            [[k, v] for k, v in cert.labels.items()],
            cert.not_before,
            cert.not_after,
            cert.ca_key_id,
        ]
    )


def sign_certificate(cert: Certificate, ca_private_key: Ed25519PrivateKey) -> bytes:
    """Sign ``cert`` with the CA key and return its wire form."""
    if cert.ca_key_id != ca_key_id(public_key_bytes(ca_private_key)):
        raise ValueError("certificate ca_key_id does not name this CA key")
    if peer_id_of(cert.public_key) != cert.peer_id:
        raise ValueError("certificate peer_id is not the peer ID of its public key")
    return seal(CERT_ENVELOPE, certificate_body(cert), ca_private_key)


def issue_certificate(
    *,
    ca_private_key: Ed25519PrivateKey,
    serial: int,
    name: str,
    node_public_key: bytes,
    not_before: int,
    not_after: int,
    roles: Iterable[str] = (),
    labels: Mapping[str, str] | None = None,
) -> bytes:
    """Build and sign a certificate for the node whose Ed25519 public key is given."""
    cert = Certificate(
        serial=serial,
        name=name,
        peer_id=peer_id_of(node_public_key),
        public_key=node_public_key,
        not_before=not_before,
        not_after=not_after,
        ca_key_id=ca_key_id(public_key_bytes(ca_private_key)),
        roles=tuple(roles),
        labels=dict(labels or {}),
    )
    return sign_certificate(cert, ca_private_key)


def _decode_certificate_body(body: bytes) -> Certificate:
    fields = unpack_limited(body, MAX_CERTIFICATE_BYTES, max(MAX_LABELS, MAX_ROLES, 10))
    if not isinstance(fields, list) or len(fields) != 10:
        raise ValueError("certificate body is not a 10-element array")
    version, serial, name, peer_id, public_key, roles, labels, nb, na, key_id = fields
    if not isinstance(roles, list) or not isinstance(labels, list):
        raise ValueError("roles and labels must be arrays")
    pairs: dict[str, str] = {}
    for pair in labels:
        if not isinstance(pair, list) or len(pair) != 2 or not isinstance(pair[0], str):
            raise ValueError("a label is not a [key, value] pair")
        if pair[0] in pairs:
            raise ValueError(f"label {pair[0]!r} appears twice")
        pairs[pair[0]] = pair[1]
    cert = Certificate(
        version=version,
        serial=serial,
        name=name,
        peer_id=peer_id,
        public_key=public_key,
        roles=tuple(roles),
        labels=pairs,
        not_before=nb,
        not_after=na,
        ca_key_id=key_id,
    )
    if certificate_body(cert) != body:
        raise ValueError("certificate body is not in canonical form")
    return cert


def _decode_signed_certificate(data: object) -> tuple[Certificate, bytes, bytes]:
    try:
        body, signature = open_envelope(CERT_ENVELOPE, data)
        return _decode_certificate_body(body), body, signature
    except AttestationError:
        raise
    except Exception as err:  # msgpack raises many types; any of them means malformed
        raise _malformed(f"certificate does not decode ({type(err).__name__}: {err})") from None


def decode_certificate(data: bytes) -> Certificate:
    """Decode a certificate WITHOUT checking its signature (for display). Raises only
    ``AttestationRejected`` with reason ``malformed``."""
    return _decode_signed_certificate(data)[0]


def verify_signature(cert_bytes: bytes | None, *, ca_public_key: bytes) -> Certificate:
    """Check only that ``cert_bytes`` is a well-formed certificate signed by this CA whose peer
    ID is that of its public key. Raises ``AttestationRejected``."""
    if not cert_bytes:
        raise AttestationRejected(NO_CERTIFICATE, "the peer presented no certificate")
    cert, body, signature = _decode_signed_certificate(cert_bytes)
    check_ca_signature(
        CERT_ENVELOPE, body, signature, claimed_key_id=cert.ca_key_id, ca_public_key=ca_public_key
    )
    if peer_id_of(cert.public_key) != cert.peer_id:
        raise _malformed("certificate peer_id is not the peer ID of its public key")
    return cert


def check_certificate(
    cert: Certificate,
    *,
    remote_peer_id: str,
    now: float,
    revoked: Iterable[int] | frozenset[int] = frozenset(),
    clock_skew_s: int = DEFAULT_CLOCK_SKEW_S,
) -> Certificate:
    """The checks after the signature: bound to ``remote_peer_id``, not revoked, in its window."""
    if cert.peer_id != remote_peer_id:
        raise AttestationRejected(
            PEER_ID_MISMATCH,
            f"certificate is for peer {cert.peer_id}, the channel authenticated {remote_peer_id}",
        )
    if cert.serial in revoked:
        raise AttestationRejected(REVOKED, f"serial {cert.serial} is revoked")
    if now < cert.not_before - clock_skew_s:
        raise AttestationRejected(NOT_YET_VALID, f"valid from {cert.not_before}, now is {int(now)}")
    if now >= cert.not_after:
        raise AttestationRejected(EXPIRED, f"expired at {cert.not_after}, now is {int(now)}")
    return cert


def verify_certificate(
    cert_bytes: bytes | None,
    *,
    ca_public_key: bytes,
    remote_peer_id: str,
    now: float,
    revoked: Iterable[int] | frozenset[int] = frozenset(),
    clock_skew_s: int = DEFAULT_CLOCK_SKEW_S,
) -> Certificate:
    """Check a peer's certificate; return it, or raise ``AttestationRejected``.

    Checks, in order: present; well formed; issued by this CA (key id and Ed25519 signature);
    its peer ID is that of its public key and equals ``remote_peer_id`` (the peer ID the secure
    channel authenticated); serial not in ``revoked``; ``now`` inside
    ``[not_before - clock_skew_s, not_after)``.
    """
    cert = verify_signature(cert_bytes, ca_public_key=ca_public_key)
    return check_certificate(
        cert, remote_peer_id=remote_peer_id, now=now, revoked=revoked, clock_skew_s=clock_skew_s
    )
