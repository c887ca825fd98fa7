"""Helpers for the key and attestation tests: throwaway CAs and node identities.

Every key here is generated per test run; no private key is ever committed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from meshd.core.cert import issue_certificate, public_key_bytes
from meshd.net.identity import (
    NodeIdentity,
    generate_node_key_pair,
    make_identity,
    node_public_key_bytes,
)

NOW = 1_750_000_000  # a fixed "now" for the pure tests


@dataclass
class CA:
    private_key: Ed25519PrivateKey
    public_key: bytes
    next_serial: int = 1

    def issue(
        self,
        name: str,
        *,
        not_before: int | None = None,
        not_after: int | None = None,
        roles: tuple[str, ...] = ("worker",),
        labels: dict[str, str] | None = None,
    ) -> NodeIdentity:
        """A fresh node key and a certificate for it (window around the real clock)."""
        now = int(time.time())
        key_pair = generate_node_key_pair()
        serial = self.next_serial
        self.next_serial += 1
        cert = issue_certificate(
            ca_private_key=self.private_key,
            serial=serial,
            name=name,
            node_public_key=node_public_key_bytes(key_pair),
            not_before=now - 60 if not_before is None else not_before,
            not_after=now + 3600 if not_after is None else not_after,
            roles=roles,
            labels=labels or {"region": "eu-west"},
        )
        return make_identity(key_pair, cert, self.public_key)


def new_ca() -> CA:
    key = Ed25519PrivateKey.generate()
    return CA(key, public_key_bytes(key))
