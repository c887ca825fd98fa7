"""The CA folder on disk: its key pair, the next serial, the log of issued certificates and the
revocation list in force (layout in ``meshd.net.identity`` and ``keys/README.md``)::

    <ca dir>/ca.key       the CA's Ed25519 private key, mode 0600
    <ca dir>/ca.pub       its public key
    <ca dir>/serial       the next serial to issue
    <ca dir>/issued.tsv   serial, name, peer id, not_before, not_after: one line per certificate
    <ca dir>/revoked.crl  the CA-signed revocation list

Every problem with a file is a ``KeyFileError`` naming it.
"""

from __future__ import annotations

from collections.abc import Set
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from meshd.core.cert import MAX_SERIAL
from meshd.core.crl import RevocationList
from meshd.errors import KeyFileError
from meshd.net import identity as ident

MAX_ISSUED_LOG_BYTES = 64 << 20


@dataclass(frozen=True)
class IssuedEntry:
    """One line of the CA's log of issued certificates."""

    serial: int
    name: str
    peer_id: str
    not_before: int
    not_after: int

    def state(self, revoked: Set[int], now: float) -> str:
        """``revoked``, ``expired`` or ``valid``."""
        if self.serial in revoked:
            return "revoked"
        if now >= self.not_after:
            return "expired"
        return "valid"


def has_ca(ca_dir: Path) -> bool:
    return (ca_dir / ident.CA_KEY_FILE).exists()


def load_ca_key(ca_dir: Path) -> Ed25519PrivateKey:
    """The CA's private key; a missing one is a ``KeyFileError`` that says how to create it."""
    if not has_ca(ca_dir):
        raise KeyFileError(
            f"{ca_dir / ident.CA_KEY_FILE}: no CA here; create one with `meshd keys init-ca "
            f"--dir {ca_dir}`"
        )
    return ident.load_ca_key(ca_dir / ident.CA_KEY_FILE)


def load_ca_public_key(ca_dir: Path) -> bytes:
    """The CA's public key (raw 32 bytes), from ``ca.pub``."""
    return ident.load_ca_public_key(ca_dir / ident.CA_PUBLIC_KEY_FILE)


def next_serial(ca_dir: Path) -> int:
    """The serial the next certificate gets (1 for a CA that issued none)."""
    path = ca_dir / ident.SERIAL_FILE
    if not path.exists():
        return 1
    text = ident.read_file(path, max_bytes=64).decode("ascii", "replace").strip()
    if not text.isdigit() or not 1 <= int(text) <= MAX_SERIAL:
        raise KeyFileError(f"{path}: not a serial number ({text[:20]!r})")
    return int(text)


def save_next_serial(ca_dir: Path, serial: int) -> None:
    ident.write_file(ca_dir / ident.SERIAL_FILE, f"{serial}\n".encode(), mode=0o600,
                     overwrite=True)


def revocation_file(ca_dir: Path) -> Path:
    """Where the CA keeps its revocation list (it may not exist yet)."""
    return ca_dir / ident.REVOCATION_FILE


def revocation_list(ca_dir: Path, ca_public_key: bytes | None = None) -> RevocationList | None:
    """The CA's revocation list, checked against its key (read from ``ca.pub`` unless given);
    None when it has none."""
    if ca_public_key is None:
        ca_public_key = load_ca_public_key(ca_dir)
    path = revocation_file(ca_dir)
    if not path.exists():
        return None
    return ident.load_revocation_list(path, ca_public_key=ca_public_key)[0]


def revoked_serials(ca_dir: Path, ca_public_key: bytes | None = None) -> frozenset[int]:
    """The serials the CA's revocation list holds (none without a list)."""
    rl = revocation_list(ca_dir, ca_public_key)
    return rl.serials if rl else frozenset()


def issued(ca_dir: Path) -> list[IssuedEntry]:
    """The certificates this CA issued, in order, from its log. A damaged line is skipped: the
    certificates themselves are what count."""
    path = ca_dir / ident.ISSUED_LOG_FILE
    if not path.exists():
        return []
    entries = []
    text = ident.read_file(path, max_bytes=MAX_ISSUED_LOG_BYTES).decode("utf-8", "replace")
    for line in text.splitlines():
        parts = line.split("\t")
        if len(parts) != 5 or not all(p.isdigit() for p in (parts[0], parts[3], parts[4])):
            continue
        entries.append(
            IssuedEntry(
                serial=int(parts[0]),
                name=parts[1],
                peer_id=parts[2],
                not_before=int(parts[3]),
                not_after=int(parts[4]),
            )
        )
    return entries


def record_issued(ca_dir: Path, entry: IssuedEntry) -> None:
    """Append one line to the CA's log of issued certificates."""
    log = ca_dir / ident.ISSUED_LOG_FILE
    try:
        with open(log, "a", encoding="ascii") as f:
            f.write(f"{entry.serial}\t{entry.name}\t{entry.peer_id}\t{entry.not_before}\t"
                    f"{entry.not_after}\n")
    except OSError as err:
        raise KeyFileError(f"{log}: cannot append: {err.strerror}") from None
