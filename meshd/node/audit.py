"""The daemon's audit trail: what it writes to the store's ``audit`` table, besides what the
``Attestor`` reports through its sink (refused handshakes, revocation lists, revoked peers).

At start the daemon records the config file it read (path and sha256: the daemon has no
in-process reload, so each start is a load) and the node key and certificate it will use, and
the revocation list it starts with. ``meshd audit`` lists them all.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from meshd.core import audit as kinds
from meshd.core.audit import AuditSink
from meshd.store.protocol import Recorder


def store_sink(store: Recorder) -> AuditSink:
    """An ``AuditSink`` that records into ``store`` (``record_audit`` never awaits)."""

    def sink(kind: str, peer_id: str, reason: str, detail: Mapping[str, Any]) -> None:
        store.record_audit(kind, peer_id=peer_id, reason=reason, detail=detail)

    return sink


def record_start(sink: AuditSink, cfg: Any, identity: Any, config_file: str | Path | None,
                 revocation: Any = None) -> None:
    """The start-up events: config loaded, node key loaded, revocation list in force."""
    peer_id = identity.peer_id.to_base58()
    if config_file is not None:
        path = Path(config_file).resolve()
        try:
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
        except OSError:
            digest = ""
        sink(kinds.CONFIG_LOADED, peer_id, "daemon start", {"path": str(path), "sha256": digest})
    cert = identity.certificate
    sink(kinds.KEY_LOADED, peer_id, "node identity in use",
         {"key_file": str(cfg.path(cfg.keys.identity)), "certificate": str(cfg.path(cfg.keys.certificate)),
          "serial": cert.serial, "name": cert.name, "not_after": cert.not_after,
          "ca_key_id": cert.ca_key_id})
    if revocation is not None:
        sink(kinds.REVOCATION_LIST, "", f"version {revocation.version} in force at start",
             {"version": revocation.version, "issued_at": revocation.issued_at,
              "serials": sorted(revocation.serials)})
