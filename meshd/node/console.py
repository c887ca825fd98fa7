"""What the web console (``meshd.api.console``) reads of the node: ``ConsoleFacts``.

It answers ``meshd.api.console.source.ConsoleSource`` from the node's own readers, the ones
`meshd peers`, `meshd status`, `meshd explain` and `meshd audit` use: the peer table
(``meshd.node.status.peers_listing``), this node's advert, the journal and the audit trail of
the store. It adds one thing they lack: a memory of every peer heard since the daemon started,
so that a peer that left the table (its connection lost, its adverts stopped, or cut off by a
revocation) stays on the console's map as silent or revoked instead of vanishing.
"""

from __future__ import annotations

import trio

from meshd.api.console.source import MeshRows
from meshd.config import Config
from meshd.core.advert import Advert
from meshd.node.control import flatten_explain
from meshd.node.node import Node
from meshd.node.status import advert_fields

MAX_REMEMBERED = 1024  # peers kept in the memory of departed ones (the least recently heard go)


class ConsoleFacts:
    """The console's view of ``node``; registers an advert listener on its membership."""

    def __init__(self, node: Node, *, max_remembered: int = MAX_REMEMBERED) -> None:
        self.node = node
        self.max_remembered = max_remembered
        # peer id -> (its latest advert, trio time heard, its certificate serial if attested)
        self.heard: dict[str, tuple[Advert, float, int | None]] = {}
        node.membership.add_listener(self._heard)

    @property
    def config(self) -> Config:
        return self.node.config

    def _heard(self, advert: Advert, new: bool) -> None:
        pid = advert.peer_id
        cert = self.node.attestor.certificate_of(pid)
        old = self.heard.pop(pid, None)
        serial = cert.serial if cert is not None else (old[2] if old is not None else None)
        self.heard[pid] = (advert, trio.current_time(), serial)  # re-inserted: most recent last
        while len(self.heard) > self.max_remembered:
            del self.heard[next(iter(self.heard))]

    def mesh(self) -> MeshRows:
        node, m = self.node, self.node.membership
        now = trio.current_time()
        local = {**advert_fields(m.local_advert()), "cell": m.cell, "known_by": "self",
                 "advert_age_s": 0.0, "stalled": False}
        peers = node.peers_listing()
        listed = {p["peer_id"] for p in peers}
        revoked_serials = node.attestor.revoked
        departed, revoked = [], set()
        for pid, (advert, heard_at, serial) in sorted(self.heard.items()):
            if pid in m.revoked_peer_ids or (serial is not None and serial in revoked_serials):
                revoked.add(pid)
            if pid in listed:
                continue
            departed.append({**advert_fields(advert), "cell": m.cell_of(pid, advert.labels),
                             "known_by": "advert", "silent_s": round(now - heard_at, 3)})
        return MeshRows(local=local, peers=peers, departed=departed, revoked=frozenset(revoked))

    def identity(self) -> dict[str, object]:
        cert = self.node.identity.certificate
        return {"name": self.node.node_name, "peer_id": self.node.peer_id,
                "certificate": {"name": cert.name, "serial": cert.serial, "roles": list(cert.roles),
                                "labels": dict(cert.labels), "not_before": cert.not_before,
                                "not_after": cert.not_after, "ca_key_id": cert.ca_key_id},
                "addrs": list(self.node.addrs)}

    async def explain(self, request_id: str) -> dict[str, object] | None:
        store = self.node.store
        if store is None:
            return None
        return flatten_explain(await store.explain(request_id))

    async def audit(self, n: int) -> list[dict[str, object]]:
        store = self.node.store
        return await store.recent_audit(n) if store is not None else []
