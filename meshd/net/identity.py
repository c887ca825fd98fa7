"""A node's identity on disk: its libp2p Ed25519 key, its certificate and the mesh CA's key.

File layout (see ``keys/README.md``)::

    <node dir>/node.key     libp2p Ed25519 private key, PKCS#8 PEM, mode 0600
    <node dir>/node.cert    the CA-signed certificate (msgpack, meshd.core.cert)
    <node dir>/ca.pub       the mesh CA's public key, SubjectPublicKeyInfo PEM
    <node dir>/revoked.crl  optional: the newest CA-signed revocation list known at issue time

    <ca dir>/ca.key         the CA's Ed25519 private key, PKCS#8 PEM, mode 0600
    <ca dir>/ca.pub         its public key
    <ca dir>/serial         the next serial to issue
    <ca dir>/issued.tsv     one line per issued certificate
    <ca dir>/revoked.crl    the CA-signed revocation list

Private keys are written owner-only and a private key that group or others may read or write is
refused with a ``KeyFileError`` naming the file and the fix. Every problem with a local file is
a ``KeyFileError`` whose message names the file.
"""

from __future__ import annotations

import contextlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from libp2p.crypto.ed25519 import Ed25519PrivateKey as Libp2pEd25519PrivateKey
from libp2p.crypto.keys import KeyPair
from libp2p.peer.id import ID

from meshd.core.cert import (
    MAX_CERTIFICATE_BYTES,
    PEER_ID_MISMATCH,
    AttestationRejected,
    Certificate,
    check_certificate,
    verify_signature,
)
from meshd.core.crl import MAX_REVOCATION_LIST_BYTES, RevocationList, verify_revocation_list
from meshd.errors import KeyFileError, MeshdError

NODE_KEY_FILE = "node.key"
NODE_CERT_FILE = "node.cert"
CA_KEY_FILE = "ca.key"
CA_PUBLIC_KEY_FILE = "ca.pub"
REVOCATION_FILE = "revoked.crl"
SERIAL_FILE = "serial"
ISSUED_LOG_FILE = "issued.tsv"

MAX_KEY_FILE_BYTES = 4096
PRIVATE_FILE_MODE = 0o600
PRIVATE_DIR_MODE = 0o700
PUBLIC_FILE_MODE = 0o644


# --------------------------------------------------------------------------- files


def make_private_dir(directory: Path) -> None:
    """Create ``directory`` (and parents) owner-only if it does not exist."""
    try:
        directory.mkdir(mode=PRIVATE_DIR_MODE, parents=True, exist_ok=True)
    except OSError as err:
        raise KeyFileError(f"{directory}: cannot create directory: {err.strerror}") from None


def write_file(path: Path, data: bytes, *, mode: int, overwrite: bool = False) -> None:
    """Write ``data`` atomically (temp file, fsync, rename) with exactly ``mode``.

    Refuses to replace an existing file unless ``overwrite``: keys are not lost by accident.
    """
    if path.exists() and not overwrite:
        raise KeyFileError(f"{path}: already exists; refusing to overwrite it")
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, mode)
        try:
            os.fchmod(fd, mode)  # the umask may have removed bits; never adds any
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError as err:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise KeyFileError(f"{path}: cannot write: {err.strerror}") from None


def read_file(path: Path, *, max_bytes: int, private: bool = False) -> bytes:
    """Read a small file; for a private one, refuse it unless only its owner may access it."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        raise KeyFileError(f"{path}: no such file") from None
    except OSError as err:
        raise KeyFileError(f"{path}: cannot open: {err.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise KeyFileError(f"{path}: not a regular file")
        if private and info.st_mode & 0o077:
            raise KeyFileError(
                f"{path}: private key is accessible by group or others "
                f"(mode {stat.S_IMODE(info.st_mode):04o}); fix it with: chmod 600 {path}"
            )
        if info.st_size > max_bytes:
            raise KeyFileError(f"{path}: {info.st_size} bytes, more than the {max_bytes} allowed")
        chunks = []
        while chunk := os.read(fd, max_bytes + 1):
            chunks.append(chunk)
        data = b"".join(chunks)
    except OSError as err:
        raise KeyFileError(f"{path}: cannot read: {err.strerror}") from None
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise KeyFileError(f"{path}: more than the {max_bytes} bytes allowed")
    return data


# --------------------------------------------------------------------------- keys


def generate_node_key_pair() -> KeyPair:
    """A fresh libp2p Ed25519 key pair (the node's identity; its peer ID derives from it)."""
    return key_pair_from_private_key(Ed25519PrivateKey.generate())


def key_pair_from_private_key(private_key: Ed25519PrivateKey) -> KeyPair:
    libp2p_key = Libp2pEd25519PrivateKey.from_bytes(private_key.private_bytes_raw())
    return KeyPair(libp2p_key, libp2p_key.get_public_key())


def node_public_key_bytes(key_pair: KeyPair) -> bytes:
    return bytes(key_pair.public_key.to_bytes())


def _private_pem(private_key: Ed25519PrivateKey) -> bytes:
    return private_key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _load_private_pem(path: Path) -> Ed25519PrivateKey:
    data = read_file(path, max_bytes=MAX_KEY_FILE_BYTES, private=True)
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as err:
        raise KeyFileError(f"{path}: not an unencrypted PEM private key ({err})") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise KeyFileError(f"{path}: not an Ed25519 private key")
    return key


def save_node_key(path: Path, key_pair: KeyPair, *, overwrite: bool = False) -> None:
    seed = bytes(key_pair.private_key.to_bytes())[:32]
    pem = _private_pem(Ed25519PrivateKey.from_private_bytes(seed))
    write_file(path, pem, mode=PRIVATE_FILE_MODE, overwrite=overwrite)


def load_node_key(path: Path) -> KeyPair:
    return key_pair_from_private_key(_load_private_pem(path))


def save_ca_key(path: Path, private_key: Ed25519PrivateKey, *, overwrite: bool = False) -> None:
    write_file(path, _private_pem(private_key), mode=PRIVATE_FILE_MODE, overwrite=overwrite)


def load_ca_key(path: Path) -> Ed25519PrivateKey:
    return _load_private_pem(path)


def save_ca_public_key(path: Path, ca_public_key: bytes, *, overwrite: bool = False) -> None:
    pem = Ed25519PublicKey.from_public_bytes(ca_public_key).public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    write_file(path, pem, mode=PUBLIC_FILE_MODE, overwrite=overwrite)


def load_ca_public_key(path: Path) -> bytes:
    """The CA public key as raw 32 bytes."""
    data = read_file(path, max_bytes=MAX_KEY_FILE_BYTES)
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, TypeError) as err:
        raise KeyFileError(f"{path}: not a PEM public key ({err})") from None
    if not isinstance(key, Ed25519PublicKey):
        raise KeyFileError(f"{path}: not an Ed25519 public key")
    return key.public_bytes_raw()


# --------------------------------------------------------------------------- identity


@dataclass(frozen=True)
class NodeIdentity:
    """Everything a node needs to attest itself and check others."""

    key_pair: KeyPair
    peer_id: ID
    certificate: Certificate
    certificate_bytes: bytes
    ca_public_key: bytes

    @property
    def name(self) -> str:
        return self.certificate.name


def make_identity(
    key_pair: KeyPair, certificate_bytes: bytes, ca_public_key: bytes
) -> NodeIdentity:
    """Bundle the parts after checking the certificate is this CA's and is for this key.

    The validity window is not checked here (see ``load_identity``'s ``now``).
    """
    peer_id = ID.from_pubkey(key_pair.public_key)
    certificate = verify_signature(certificate_bytes, ca_public_key=ca_public_key)
    if certificate.peer_id != peer_id.to_base58():
        raise AttestationRejected(
            PEER_ID_MISMATCH,
            f"certificate is for peer {certificate.peer_id}, this key is {peer_id.to_base58()}",
        )
    return NodeIdentity(key_pair, peer_id, certificate, certificate_bytes, ca_public_key)


def save_identity(
    directory: Path,
    key_pair: KeyPair,
    certificate_bytes: bytes,
    ca_public_key: bytes,
    *,
    overwrite: bool = False,
) -> None:
    """Write node.key (0600), node.cert and ca.pub into ``directory`` (created 0700)."""
    make_private_dir(directory)
    save_node_key(directory / NODE_KEY_FILE, key_pair, overwrite=overwrite)
    write_file(
        directory / NODE_CERT_FILE, certificate_bytes, mode=PUBLIC_FILE_MODE, overwrite=overwrite
    )
    save_ca_public_key(directory / CA_PUBLIC_KEY_FILE, ca_public_key, overwrite=overwrite)


def load_identity(
    directory: Path,
    *,
    now: float | None = None,
    key_file: str | Path = NODE_KEY_FILE,
    cert_file: str | Path = NODE_CERT_FILE,
    ca_file: str | Path = CA_PUBLIC_KEY_FILE,
) -> NodeIdentity:
    """Load and cross-check a node's key, certificate and CA public key.

    The file names are relative to ``directory`` (an absolute one is used as is). Raises
    ``KeyFileError`` (naming the file) when a file is missing, unsafe or unreadable, when the
    certificate is not the CA's or not for this key, or (when ``now`` is given) when the
    certificate is outside its validity window.
    """
    key_pair = load_node_key(directory / key_file)
    cert_path = directory / cert_file
    certificate_bytes = read_file(cert_path, max_bytes=MAX_CERTIFICATE_BYTES)
    ca_public_key = load_ca_public_key(directory / ca_file)
    try:
        identity = make_identity(key_pair, certificate_bytes, ca_public_key)
        if now is not None:
            check_certificate(
                identity.certificate, remote_peer_id=identity.peer_id.to_base58(), now=now
            )
    except AttestationRejected as err:
        raise KeyFileError(
            f"{cert_path}: unusable certificate ({err}); issue a new one with `meshd keys issue`"
        ) from None
    return identity


def load_revocation_list(path: Path, *, ca_public_key: bytes) -> tuple[RevocationList, bytes]:
    """Load a revocation list file, check the CA signed it; return it and its raw bytes (which
    the daemon can gossip unchanged). Raises ``KeyFileError`` naming the file."""
    data = read_file(path, max_bytes=MAX_REVOCATION_LIST_BYTES)
    try:
        return verify_revocation_list(data, ca_public_key=ca_public_key), data
    except MeshdError as err:
        raise KeyFileError(f"{path}: unusable revocation list ({err})") from None


def save_revocation_list(path: Path, data: bytes) -> None:
    """Replace the revocation list file with ``data`` (already signed and encoded)."""
    write_file(path, data, mode=PUBLIC_FILE_MODE, overwrite=True)
