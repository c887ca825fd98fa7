"""The node's SQLite record: request journal, routing decisions, outcomes, security audit.

``Store`` is the synchronous store (one connection, thread-safe); ``AsyncStore`` wraps it for
trio with a single writer task that loses no write to cancellation; ``Recorder`` is the narrow
write side both inherit, ``Reader`` the reads the control socket needs; ``explain_text`` turns
``explain()`` records into words.
"""

from meshd.store.async_store import AsyncStore, StoreStatistics
from meshd.store.explain import explain_text
from meshd.store.protocol import Reader, Recorder
from meshd.store.rows import (
    AUDIT_ADVERT_REJECTED,
    AUDIT_ATTESTATION_FAILED,
    AUDIT_REVOKED,
    EVENT_KINDS,
    StoreError,
)
from meshd.store.schema import MIGRATIONS, SCHEMA_VERSION, Migration
from meshd.store.store import Store

__all__ = [
    "AUDIT_ADVERT_REJECTED",
    "AUDIT_ATTESTATION_FAILED",
    "AUDIT_REVOKED",
    "EVENT_KINDS",
    "MIGRATIONS",
    "SCHEMA_VERSION",
    "AsyncStore",
    "Migration",
    "Reader",
    "Recorder",
    "Store",
    "StoreError",
    "StoreStatistics",
    "explain_text",
]
