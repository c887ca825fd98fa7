"""The kinds of security event a node keeps in its audit trail (the store's ``audit`` table,
listed by ``meshd audit``). Plain names shared by the code that notices an event (attestation,
the daemon's start-up) and the store, which imports neither. ONLY APPEND: rows on disk keep them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

ATTESTATION_FAILED = "attestation_failed"  # a handshake refused (reason: the attestation reason)
REVOKED = "revoked"  # a connected peer cut off because its serial was revoked
ADVERT_REJECTED = "advert_rejected"  # a gossiped advert refused
REVOCATION_LIST = "revocation_list"  # a newer CA revocation list put in force
CONFIG_LOADED = "config_loaded"  # the daemon read its config file (detail: path, sha256)
KEY_LOADED = "key_loaded"  # the daemon loaded its node key and certificate

KINDS = (ATTESTATION_FAILED, REVOKED, ADVERT_REJECTED, REVOCATION_LIST, CONFIG_LOADED, KEY_LOADED)

# (kind, peer_id, reason, detail): what records one event. It must not block or raise into
# the caller; the daemon's is ``AsyncStore.record_audit``, which only queues the row.
AuditSink = Callable[[str, str, str, Mapping[str, Any]], None]
