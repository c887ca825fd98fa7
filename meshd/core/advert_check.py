"""The advert validator: a gossiped (or synced) ``ADVERT`` envelope in, a trusted advert or the
reason to reject it out. Pure: no I/O, no clock (the time is passed in).

The checks, in order, each with the reason it rejects with:

==============================  ===========================================================
``malformed``                    the envelope or the advert body does not decode
``unattested:<reason>``          the certificate is not this CA's, not the author's, revoked,
                                 or outside its validity window (``meshd.core.cert``)
``bad_signature``                the body is not signed by the certificate's key
``author_mismatch``              the advert names another peer than the gossip author
``replay``                       its ``seq`` is not above the author's last one
==============================  ===========================================================

An accepted advert carries the labels, region and name of the certificate, never the advert's
own claims. The CA signature of a certificate is checked once and remembered (every advert
carries its author's certificate, and the check costs ~1 ms); binding to the author, revocation
and the validity window are checked every time.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, fields
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from meshd.core.advert import Advert, decode_advert, signing_payload
from meshd.core.cert import (
    DEFAULT_CLOCK_SKEW_S,
    Certificate,
    check_certificate,
    verify_signature,
)
from meshd.core.messages import MessageType
from meshd.core.wire import MAX_ADVERT_BYTES, decode_message, encode_message
from meshd.errors import MeshdError, ProtocolError

MAX_ENVELOPE_BYTES = MAX_ADVERT_BYTES + 2048  # the body plus its signature and certificate
CERT_MEMO = 1024  # certificates whose CA signature was checked
_ADVERT_ONLY = frozenset({int(MessageType.ADVERT)})

MALFORMED = "malformed"
BAD_SIGNATURE = "bad_signature"
AUTHOR_MISMATCH = "author_mismatch"
REPLAY = "replay"


@dataclass(frozen=True, slots=True)
class Rejected:
    """Why an advert was refused: ``reason`` is the counter's name, ``detail`` says more."""

    reason: str
    detail: str = ""


def seal(advert: Advert, sign: Callable[[bytes], bytes], cert_bytes: bytes) -> bytes:
    """The ``ADVERT`` envelope of ``advert``: its body signed with ``sign`` (the author's
    identity key), and the author's certificate."""
    body = advert.encode()
    return encode_message(MessageType.ADVERT,
                          {"body": body, "sig": sign(signing_payload(body)), "cert": cert_bytes})


def read_claim(data: object) -> Advert | Rejected:
    """The advert an envelope claims to carry, checking nothing but its shape (a synced advert
    names its author only inside: ``check`` then verifies it)."""
    if not isinstance(data, bytes) or len(data) > MAX_ENVELOPE_BYTES:
        return Rejected(MALFORMED, "not an advert envelope")
    try:
        return decode_advert(decode_message(data, MAX_ENVELOPE_BYTES, _ADVERT_ONLY)["body"])
    except ProtocolError as e:
        return Rejected(MALFORMED, str(e))


class AdvertChecker:
    """Checks signed adverts against this mesh's CA; holds the memo of checked certificates."""

    def __init__(self, local_peer_id: str, ca_public_key: bytes, *,
                 clock_skew_s: int = DEFAULT_CLOCK_SKEW_S, memo_size: int = CERT_MEMO) -> None:
        self.local_peer_id = local_peer_id
        self.ca_public_key = ca_public_key
        self.clock_skew_s = clock_skew_s
        self.memo_size = memo_size
        self._memo: dict[bytes, Certificate] = {}

    def check(self, data: bytes, author: str, now: float, *, last_seq: int = -1,
              revoked: Collection[int] = frozenset()) -> Advert | Rejected:
        """``data`` gossiped by ``author`` at wall-clock time ``now``; ``last_seq``: the author's
        last accepted sequence number (-1: none); ``revoked``: the revoked serials."""
        opened = self.open_envelope(data, author, now, _ADVERT_ONLY, MAX_ENVELOPE_BYTES,
                                    signing_payload, revoked)
        if isinstance(opened, Rejected):
            return opened
        msg, cert = opened
        try:
            adv = decode_advert(msg["body"])
        except ProtocolError as e:
            return Rejected(MALFORMED, str(e))
        if adv.peer_id != author:
            return Rejected(AUTHOR_MISMATCH)
        if author != self.local_peer_id and adv.seq <= last_seq:
            return Rejected(REPLAY, f"seq {adv.seq} is not above {last_seq}")
        return Advert(**{**_fields(adv), "labels": dict(cert.labels),
                         "region": cert.labels.get("region", ""), "name": cert.name})

    def open_envelope(self, data: bytes, author: str, now: float, types: frozenset[int],
                      max_bytes: int, payload: Callable[[bytes], bytes],
                      revoked: Collection[int] = frozenset(),
                      ) -> tuple[dict[str, Any], Certificate] | Rejected:
        """The checks every signed gossip envelope ``{body, sig, cert}`` passes (adverts, cell
        summaries): at most ``max_bytes``, it decodes as one of ``types``; its certificate is this CA's, the author's and
        not revoked; the signature holds over ``payload(body)``. The message and the checked
        certificate, or why not."""
        try:
            msg = decode_message(data, max_bytes, types)
        except ProtocolError as e:
            return Rejected(MALFORMED, str(e))
        try:
            cert = self.certificate(msg["cert"], author, now, revoked)
        except MeshdError as e:
            return Rejected(f"unattested:{getattr(e, 'reason', 'certificate')}", str(e))
        try:
            Ed25519PublicKey.from_public_bytes(cert.public_key).verify(msg["sig"], payload(msg["body"]))
        except (InvalidSignature, ValueError):
            return Rejected(BAD_SIGNATURE)
        return dict(msg), cert

    def certificate(self, cert_bytes: Any, author: str, now: float,
                    revoked: Collection[int] = frozenset()) -> Certificate:
        """The author's certificate, checked; raises ``AttestationRejected`` (or
        ``ProtocolError``) when it does not hold."""
        cert = self._memo.get(cert_bytes) if isinstance(cert_bytes, bytes) else None
        if cert is None:
            cert = verify_signature(cert_bytes, ca_public_key=self.ca_public_key)
            if len(self._memo) >= self.memo_size:
                self._memo.clear()
            self._memo[bytes(cert_bytes)] = cert
        return check_certificate(cert, remote_peer_id=author, now=now, revoked=revoked,
                                 clock_skew_s=self.clock_skew_s)

    def __len__(self) -> int:
        """Certificates remembered."""
        return len(self._memo)


def _fields(adv: Advert) -> dict[str, Any]:
    return {f.name: getattr(adv, f.name) for f in fields(adv)}
