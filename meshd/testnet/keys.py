"""The keys of a testnet folder: a CA in ``DIR/ca`` and one identity per node in ``DIR/NODE``,
reused when a testnet starts again in the same folder.

``prepare_keys`` keeps the folder's CA if it has one (else creates it) and keeps each node's
identity when it is still good for this testnet: signed by that CA, for that node name and those
labels, not revoked, valid for at least another day. Anything else is issued afresh (replacing the
old files), so `meshd testnet up` works after `down`, after a crash, and after someone removed
``ca/`` alone; a node's persisted revocation list from an older CA goes with it (the daemon would
refuse to start on a list its CA did not sign). Keys are made by ``meshd.ca``, the library behind
`meshd keys`, so they are what a user's `meshd keys init-ca` and `issue` would make.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path

from meshd.errors import LocalError, MeshdError

MIN_VALID_S = 86400.0  # an identity that expires sooner than this is reissued
DAYS = 30


def prepare_keys(directory: Path, nodes: Mapping[str, Mapping[str, str]],
                 *, now: float | None = None) -> dict[str, str]:
    """``nodes``: node name -> certificate labels. Returns node name -> peer id."""
    from meshd import ca

    now = time.time() if now is None else now
    ca_dir = directory / "ca"
    if not ca.has_ca(ca_dir):
        try:
            ca.init_ca(ca_dir)
        except MeshdError as err:
            raise LocalError(f"cannot create a CA in {ca_dir}: {err}") from None
    ca_public = ca.load_ca_public_key(ca_dir)
    revoked = ca.revoked_serials(ca_dir, ca_public)
    ids = {}
    for name, labels in nodes.items():
        out = directory / name
        peer_id = _reusable(out, name, labels, ca_public, revoked, now)
        if peer_id is None:
            try:
                peer_id = ca.issue(ca_dir, name, out, days=DAYS, labels=labels, force=True).peer_id
            except MeshdError as err:
                raise LocalError(f"cannot issue keys for {name} in {out}: {err}") from None
            _drop_foreign_revocations(out / "state" / "revocations.bin", ca_public)
        ids[name] = peer_id
    return ids


def _reusable(out: Path, name: str, labels: Mapping[str, str], ca_public: bytes,
              revoked: frozenset[int], now: float) -> str | None:
    """The peer id of the identity in ``out`` if this testnet may keep it, else None."""
    from meshd.net.identity import load_identity

    try:
        identity = load_identity(out, now=now)
    except MeshdError:
        return None  # missing, unsafe, expired or unreadable: issue a new one
    cert = identity.certificate
    if (identity.ca_public_key != ca_public or cert.name != name
            or dict(cert.labels) != dict(labels) or cert.serial in revoked
            or cert.not_after - now < MIN_VALID_S):
        return None
    return identity.peer_id.to_base58()


def _drop_foreign_revocations(path: Path, ca_public: bytes) -> None:
    """Remove a node's persisted revocation list if this CA did not sign it."""
    from meshd.net.identity import load_revocation_list

    if not path.exists():
        return
    try:
        load_revocation_list(path, ca_public_key=ca_public)
    except MeshdError:
        path.unlink()
