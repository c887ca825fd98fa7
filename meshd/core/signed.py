"""What certificates and revocation lists share: the CA-signed envelope, the CA key id, and the
one check that the mesh CA signed something (pure, no I/O).

Wire form of every CA-signed thing (see ``keys/README.md``)::

    msgpack array [kind: str, format: int, body: bin, signature: bin(64)]

``body`` is the canonical msgpack encoding of the thing's fields (each module says which), and
``signature`` is Ed25519 by the CA over ``domain tag || body``. The domain tag differs per kind,
so a signature over one kind is never valid for another. Decoding caps the input size, and every
string, bin and array length, before anything is unpacked.

A refusal to attest is an ``AttestationRejected`` whose ``reason`` is one of ``REASONS``.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Any, Final

import msgpack
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from meshd.errors import AttestationError

# The kinds of CA-signed envelope, as written in its first field. Append only.
CERT_KIND: Final = "meshd.cert"
CRL_KIND: Final = "meshd.crl"
KINDS: Final = (CERT_KIND, CRL_KIND)
MAX_SIGNED_BYTES: Final = 256 * 1024  # the largest CA-signed thing (a revocation list)

MAX_SERIAL: Final = (1 << 63) - 1
MAX_TIME: Final = (1 << 63) - 1
KEY_ID_RE: Final = re.compile(r"[0-9a-f]{16}")

# Reason codes of a failed attestation, as logged and counted. Append only.
NO_CERTIFICATE: Final = "no_certificate"
WRONG_CA: Final = "wrong_ca"
PEER_ID_MISMATCH: Final = "peer_id_mismatch"
EXPIRED: Final = "expired"
NOT_YET_VALID: Final = "not_yet_valid"
REVOKED: Final = "revoked"
MALFORMED: Final = "malformed"
REASONS: Final = (
    NO_CERTIFICATE,
    WRONG_CA,
    PEER_ID_MISMATCH,
    EXPIRED,
    NOT_YET_VALID,
    REVOKED,
    MALFORMED,
)


class AttestationRejected(AttestationError):
    """A certificate was refused; ``reason`` is one of ``REASONS``."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True, slots=True)
class Envelope:
    """How one kind of CA-signed thing is wrapped, signed, and told apart when it is refused.

    ``other_ca`` and ``bad_signature`` are the ``wrong_ca`` details, formatted with ``claimed``
    (the key id the thing names) and ``ours`` (this mesh's CA key id).
    """

    kind: str
    format: int
    domain: bytes
    max_bytes: int
    other_ca: str
    bad_signature: str


# --------------------------------------------------------------------------- key helpers


def ca_key_id(ca_public_key: bytes) -> str:
    """The 16-hex-digit id of a CA public key (raw 32 bytes): first 8 bytes of its SHA-256."""
    return hashlib.sha256(ca_public_key).digest()[:8].hex()


def public_key_bytes(private_key: Ed25519PrivateKey) -> bytes:
    """Raw 32-byte public key of a ``cryptography`` Ed25519 private key."""
    return private_key.public_key().public_bytes_raw()


def is_int(value: object) -> bool:
    """An int and not a bool (msgpack and dataclasses would both accept True as 1)."""
    return type(value) is int


# --------------------------------------------------------------------------- encoding


def pack(obj: Any) -> bytes:
    packed = msgpack.packb(obj, use_bin_type=True)
    assert isinstance(packed, bytes)
    return packed


def unpack_limited(data: bytes, max_bytes: int, max_items: int) -> Any:
    """Unpack msgpack with a cap on the input and on every length inside it."""
    if len(data) > max_bytes:
        raise ValueError(f"{len(data)} bytes is over the limit of {max_bytes}")
    return msgpack.unpackb(
        data,
        raw=False,
        use_list=True,
        strict_map_key=True,
        max_str_len=max_bytes,
        max_bin_len=max_bytes,
        max_array_len=max_items,
        max_map_len=16,
        max_ext_len=0,
    )


def seal(envelope: Envelope, body: bytes, ca_private_key: Ed25519PrivateKey) -> bytes:
    """Sign ``body`` with the CA key under the envelope's domain tag; return the wire form."""
    signature = ca_private_key.sign(envelope.domain + body)
    return pack([envelope.kind, envelope.format, body, signature])


def open_envelope(envelope: Envelope, data: object) -> tuple[bytes, bytes]:
    """The ``(body, signature)`` of an envelope of this kind. Raises ValueError (or msgpack's
    own errors) on anything else; the signature is not checked here."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise ValueError("expected bytes")
    outer = unpack_limited(bytes(data), envelope.max_bytes, 4)
    if not isinstance(outer, list) or len(outer) != 4:
        raise ValueError("envelope is not a 4-element array")
    kind, fmt = envelope.kind, envelope.format
    got_kind, got_format, body, signature = outer
    if got_kind != kind:
        raise ValueError(f"not a {kind} (kind {str(got_kind)[:32]!r})")
    if not is_int(got_format) or got_format != fmt:
        raise ValueError(f"unsupported {kind} format {str(got_format)[:16]!r}")
    if not isinstance(body, bytes) or not isinstance(signature, bytes) or len(signature) != 64:
        raise ValueError("body or signature has the wrong type or length")
    return body, signature


def detect_kind(data: bytes) -> str | None:
    """``CERT_KIND``, ``CRL_KIND`` or None: what a blob of bytes claims to be (for display)."""
    try:
        outer = unpack_limited(data, MAX_SIGNED_BYTES, 4)
    except Exception:
        return None
    if isinstance(outer, list) and outer and outer[0] in KINDS:
        return str(outer[0])
    return None


# --------------------------------------------------------------------------- the CA check


def check_ca_signature(
    envelope: Envelope,
    body: bytes,
    signature: bytes,
    *,
    claimed_key_id: str,
    ca_public_key: bytes,
) -> None:
    """The one check that this mesh's CA signed ``body``: the key id the thing names is our CA's,
    and the Ed25519 signature over ``domain tag || body`` verifies under our CA's public key.
    Raises ``AttestationRejected`` with reason ``wrong_ca`` otherwise."""
    ours = ca_key_id(ca_public_key)
    if claimed_key_id != ours:
        raise AttestationRejected(
            WRONG_CA, envelope.other_ca.format(claimed=claimed_key_id, ours=ours)
        )
    try:
        Ed25519PublicKey.from_public_bytes(ca_public_key).verify(signature, envelope.domain + body)
    except InvalidSignature:
        raise AttestationRejected(
            WRONG_CA, envelope.bad_signature.format(claimed=claimed_key_id, ours=ours)
        ) from None
