"""The mesh CA's files: create a CA, issue node identities, revoke serials, read what a CA
issued and what a key file holds. Plain functions over a CA folder, for ``meshd keys`` and the
testnet alike; the encoding and checks themselves are ``meshd.core.cert`` and ``meshd.core.crl``,
the files ``meshd.net.identity``. See ``keys/README.md``.

Importing this package imports libp2p (through ``meshd.net.identity``, about a second): the CLI
imports it only when an action runs.
"""

from meshd.ca.authority import IssuedCert, NewCA, Revocation, init_ca, issue, revoke
from meshd.ca.folder import (
    IssuedEntry,
    has_ca,
    issued,
    load_ca_public_key,
    revocation_file,
    revocation_list,
    revoked_serials,
)
from meshd.ca.keyfile import describe, read_revocation_list, utc_text

__all__ = [
    "IssuedCert",
    "IssuedEntry",
    "NewCA",
    "Revocation",
    "describe",
    "has_ca",
    "init_ca",
    "issue",
    "issued",
    "load_ca_public_key",
    "read_revocation_list",
    "revocation_file",
    "revocation_list",
    "revoke",
    "revoked_serials",
    "utc_text",
]
