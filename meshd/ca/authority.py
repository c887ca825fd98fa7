"""What the mesh CA does: create itself, issue node identities, revoke serials.

Each function works on a CA folder (``meshd.ca.folder``) and returns what it did; printing is the
caller's. The clock is read once per call, as unix seconds.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from meshd.ca import folder
from meshd.core.cert import (
    Certificate,
    ca_key_id,
    decode_certificate,
    issue_certificate,
    public_key_bytes,
)
from meshd.core.crl import MAX_REVOCATION_LIST_BYTES, RevocationList, sign_revocation_list
from meshd.errors import KeyFileError, LocalError
from meshd.net import identity as ident

DAY_S = 86400


@dataclass(frozen=True)
class NewCA:
    """A CA just created: its key id and the two files written."""

    directory: Path
    key_id: str
    key_path: Path
    public_key_path: Path


@dataclass(frozen=True)
class IssuedCert:
    """A node identity just issued: its certificate and the folder holding its files."""

    certificate: Certificate
    certificate_bytes: bytes
    out: Path  # node.key, node.cert, ca.pub (and revoked.crl when the CA has one)

    @property
    def peer_id(self) -> str:
        return self.certificate.peer_id

    @property
    def serial(self) -> int:
        return self.certificate.serial


@dataclass(frozen=True)
class Revocation:
    """A revocation just signed: the new list, where it was written, and the serials asked for
    (sorted, unique) with the node name each was issued to, where this CA's log knows it."""

    revocation_list: RevocationList
    path: Path
    serials: tuple[int, ...]
    names: Mapping[int, str]


def init_ca(ca_dir: Path) -> NewCA:
    """Create a CA in ``ca_dir``: ``ca.key`` (0600) and ``ca.pub``. Never replaces one."""
    key_path = ca_dir / ident.CA_KEY_FILE
    if key_path.exists():
        raise KeyFileError(f"{key_path}: a CA already exists here; refusing to replace it")
    ident.make_private_dir(ca_dir)
    private_key = Ed25519PrivateKey.generate()
    public_key = public_key_bytes(private_key)
    public_path = ca_dir / ident.CA_PUBLIC_KEY_FILE
    ident.save_ca_key(key_path, private_key)
    ident.save_ca_public_key(public_path, public_key, overwrite=True)
    return NewCA(ca_dir, ca_key_id(public_key), key_path, public_path)


def issue(
    ca_dir: Path,
    name: str,
    out_dir: Path | None = None,
    *,
    days: int,
    labels: Mapping[str, str] | Iterable[tuple[str, str]] = (),
    roles: Iterable[str] = (),
    force: bool = False,
) -> IssuedCert:
    """Issue a fresh node identity named ``name`` into ``out_dir`` (default
    ``ca_dir/nodes/NAME``): a new node key, a certificate with the CA's next serial valid for
    ``days`` from now, ``ca.pub``, and the CA's revocation list if it has one. The certificate
    is logged in the CA's ``issued.tsv``. An existing identity in ``out_dir`` is replaced only
    with ``force``; ``labels`` as pairs must not repeat a key."""
    ca_key = folder.load_ca_key(ca_dir)
    ca_public_key = public_key_bytes(ca_key)
    out = out_dir if out_dir is not None else ca_dir / "nodes" / name
    if (out / ident.NODE_KEY_FILE).exists() and not force:
        raise KeyFileError(
            f"{out / ident.NODE_KEY_FILE}: already exists; pass --force to replace that identity"
        )
    pairs = list(labels.items() if isinstance(labels, Mapping) else labels)
    label_map = dict(pairs)
    if len(label_map) != len(pairs):
        raise LocalError("a label key is given twice")
    serial = folder.next_serial(ca_dir)
    now = int(time.time())
    key_pair = ident.generate_node_key_pair()
    try:
        cert_bytes = issue_certificate(
            ca_private_key=ca_key,
            serial=serial,
            name=name,
            node_public_key=ident.node_public_key_bytes(key_pair),
            not_before=now,
            not_after=now + days * DAY_S,
            roles=roles,
            labels=label_map,
        )
    except ValueError as err:
        raise LocalError(f"cannot issue: {err}") from None
    folder.save_next_serial(ca_dir, serial + 1)
    ident.save_identity(out, key_pair, cert_bytes, ca_public_key, overwrite=force)
    crl_path = folder.revocation_file(ca_dir)
    if crl_path.exists():
        ident.save_revocation_list(
            out / ident.REVOCATION_FILE,
            ident.read_file(crl_path, max_bytes=MAX_REVOCATION_LIST_BYTES),
        )
    cert = decode_certificate(cert_bytes)
    folder.record_issued(
        ca_dir,
        folder.IssuedEntry(serial, name, cert.peer_id, cert.not_before, cert.not_after),
    )
    return IssuedCert(cert, cert_bytes, out)


def revoke(ca_dir: Path, serials: Iterable[int]) -> Revocation:
    """Add ``serials`` to the CA's revocation list and sign it with a version one higher."""
    asked = tuple(sorted(set(serials)))
    ca_key = folder.load_ca_key(ca_dir)
    ca_public_key = public_key_bytes(ca_key)
    current = folder.revocation_list(ca_dir, ca_public_key)
    rl = RevocationList(
        version=(current.version + 1) if current else 1,
        issued_at=int(time.time()),
        ca_key_id=ca_key_id(ca_public_key),
        serials=frozenset(set(current.serials if current else ()) | set(asked)),
    )
    path = folder.revocation_file(ca_dir)
    ident.save_revocation_list(path, sign_revocation_list(rl, ca_key))
    names = {entry.serial: entry.name for entry in folder.issued(ca_dir)}
    return Revocation(rl, path, asked, {s: names[s] for s in asked if s in names})
