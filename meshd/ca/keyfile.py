"""What a key file holds, for display and for handing a revocation list on: a certificate, a
revocation list, a CA public key or a private key (its public half only, never the secret)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from meshd.core.cert import (
    CERT_KIND,
    AttestationRejected,
    ca_key_id,
    check_certificate,
    decode_certificate,
    peer_id_of,
    verify_signature,
)
from meshd.core.crl import (
    CRL_KIND,
    MAX_REVOCATION_LIST_BYTES,
    RevocationList,
    decode_revocation_list,
    verify_revocation_list,
)
from meshd.core.signed import detect_kind
from meshd.errors import LocalError, MeshdError
from meshd.net import identity as ident


def utc_text(ts: float) -> str:
    """Unix seconds as ``2026-01-31 12:00:00 UTC``."""
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ts))


def describe(path: Path, ca_path: Path | None = None) -> dict[str, Any]:
    """The fields of the key file at ``path``, as display text, ``kind`` first. Signatures are
    checked under ``ca_path`` (default: a ``ca.pub`` beside the file) when that file exists."""
    if ca_path is None:
        ca_path = path.parent / ident.CA_PUBLIC_KEY_FILE
    ca_public_key = ident.load_ca_public_key(ca_path) if ca_path.exists() else None
    head = ident.read_file(path, max_bytes=MAX_REVOCATION_LIST_BYTES, private=False)
    kind = detect_kind(head)
    if kind == CERT_KIND:
        return _certificate(head, ca_public_key, ca_path)
    if kind == CRL_KIND:
        return _revocation_list(head, ca_public_key, ca_path)
    if b"PRIVATE KEY" in head:
        return _private_key(path)
    if b"PUBLIC KEY" in head:
        public_key = ident.load_ca_public_key(path)
        return {
            "kind": "public key",
            "key_id": ca_key_id(public_key),
            "public_key": public_key.hex(),
        }
    raise LocalError(f"{path}: not a meshd certificate, revocation list or key file")


def read_revocation_list(path: Path) -> tuple[RevocationList, bytes]:
    """A revocation list file, decoded, and its bytes unchanged (to hand to a daemon, which
    checks the CA signature itself). Raises ``LocalError`` naming the file."""
    if not path.exists():
        raise LocalError(
            f"{path}: no revocation list there; create one with `meshd keys revoke SERIAL`"
        )
    data = ident.read_file(path, max_bytes=MAX_REVOCATION_LIST_BYTES, private=False)
    try:
        if detect_kind(data) != CRL_KIND:
            raise LocalError(f"{path}: not a revocation list (see `meshd keys show {path}`)")
        return decode_revocation_list(data), data
    except LocalError:
        raise
    except MeshdError as err:
        raise LocalError(f"{path}: not a usable revocation list: {err}") from None


def _signature_state(
    check: Callable[..., object], data: bytes, ca_public_key: bytes | None, ca_path: Path
) -> str:
    if ca_public_key is None:
        return "not checked (no ca.pub beside the file; pass --ca)"
    try:
        check(data, ca_public_key=ca_public_key)
    except MeshdError as err:
        return f"INVALID under {ca_path}: {err}"
    return f"valid (CA {ca_key_id(ca_public_key)}, {ca_path})"


def _certificate(data: bytes, ca_public_key: bytes | None, ca_path: Path) -> dict[str, Any]:
    try:
        cert = decode_certificate(data)
    except AttestationRejected as err:
        raise LocalError(f"not a usable certificate: {err}") from None
    try:
        check_certificate(cert, remote_peer_id=cert.peer_id, now=time.time(), clock_skew_s=0)
        state = "valid now"
    except AttestationRejected as err:
        state = err.reason.replace("_", " ")
    return {
        "kind": "certificate",
        "name": cert.name,
        "serial": cert.serial,
        "peer_id": cert.peer_id,
        "roles": list(cert.roles),
        "labels": dict(cert.labels),
        "not_before": utc_text(cert.not_before),
        "not_after": utc_text(cert.not_after),
        "state": state,
        "ca_key_id": cert.ca_key_id,
        "signature": _signature_state(verify_signature, data, ca_public_key, ca_path),
    }


def _revocation_list(data: bytes, ca_public_key: bytes | None, ca_path: Path) -> dict[str, Any]:
    try:
        rl = decode_revocation_list(data)
    except MeshdError as err:
        raise LocalError(f"not a usable revocation list: {err}") from None
    return {
        "kind": "revocation list",
        "version": rl.version,
        "issued_at": utc_text(rl.issued_at),
        "ca_key_id": rl.ca_key_id,
        "revoked": sorted(rl.serials),
        "signature": _signature_state(verify_revocation_list, data, ca_public_key, ca_path),
    }


def _private_key(path: Path) -> dict[str, Any]:
    key_pair = ident.load_node_key(path)  # refuses unsafe permissions like the daemon does
    public_key = ident.node_public_key_bytes(key_pair)
    return {
        "kind": "private key",
        "public_key": public_key.hex(),
        "peer_id": peer_id_of(public_key),
        "as_ca_key_id": ca_key_id(public_key),
        "permissions": "owner only (checked)",
    }
