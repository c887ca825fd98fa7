"""Revocations: the CA's revocation list in force on this node, and how it spreads.

A list comes from a file at start, from ``meshd revoke`` over the control socket (``apply``
with ``gossip=True``) or from the revocation topic. A newer list than the one in force is put in
force by the attestor, the peers it revokes are disconnected and expelled from membership, it is
written to ``<data_dir>/revocations.bin`` (so a restart keeps it) and, when it came from this
node's operator, published. A peer that joins later hears the list again: every new peer
schedules one re-publication (batched over ``REGOSSIP_DELAY_S``), so a node that was away when
the list spread still gets it.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Protocol

import trio

from meshd.core.advert import Advert
from meshd.core.crl import verify_revocation_list
from meshd.core.messages import REVOCATION_TOPIC, MessageType
from meshd.core.wire import decode_message, encode_message
from meshd.errors import MeshdError
from meshd.net.attest import Attestor, apply_revocation
from meshd.node.membership import GossipPort

log = logging.getLogger(__name__)

MAX_REVOCATION_BYTES = 300_000
REGOSSIP_DELAY_S = 1.0  # batch joins; also lets the new peer's mesh form
_REVOCATION_ONLY = frozenset({int(MessageType.REVOCATION)})


class Expeller(Protocol):
    """What a list in force does to membership (``meshd.node.membership.Membership``)."""

    def expel(self, gone: list[str]) -> None: ...

    def reject(self, reason: str) -> bool: ...


class Revocations:
    def __init__(self, attestor: Attestor, membership: Expeller, *, data_dir: Path,
                 crl: bytes | None = None) -> None:
        self.attestor = attestor
        self.membership = membership
        self.data_dir = data_dir
        self.crl = crl  # the encoded list in force (as the CA signed it), or None
        if crl is not None:
            attestor.offer_revocation_list(crl)
        self._host: Any = None
        self._gossip: GossipPort | None = None
        self._nursery: trio.Nursery | None = None
        self._regossip_pending = False

    async def run(self, host: Any, gossip: GossipPort, *,
                  task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Take lists from the revocation topic (``host``: the libp2p host to disconnect from)."""
        self._host = host
        self._gossip = gossip
        gossip.set_validator(REVOCATION_TOPIC, self.validate)
        sub = await gossip.subscribe(REVOCATION_TOPIC)
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            while True:
                msg = await sub.get()
                try:
                    m = decode_message(bytes(msg.data), MAX_REVOCATION_BYTES, _REVOCATION_ONLY)
                    await self.apply(m["crl"], gossip=False)
                except MeshdError as e:
                    log.info("revocation ignored error=%s", e)

    def validate(self, author: str, data: bytes) -> bool:
        """Gossip validator: any author may relay a list; the CA's signature is what counts."""
        try:
            msg = decode_message(data, MAX_REVOCATION_BYTES, _REVOCATION_ONLY)
            verify_revocation_list(msg["crl"], ca_public_key=self.attestor.ca_public_key)
        except MeshdError:
            return self.membership.reject("bad_revocation")
        return True

    async def apply(self, crl: bytes, *, gossip: bool) -> list[str]:
        """Put ``crl`` in force if it is newer; returns the peers disconnected. Raises
        ``MeshdError`` for a list that is malformed or not this CA's."""
        assert self._host is not None
        before = self.attestor.revocation_list
        doomed = await apply_revocation(self._host, self.attestor, crl)
        changed = self.attestor.revocation_list is not before
        if changed:
            self.crl = crl
            self._persist(crl)
            log.warning("revocation list applied version=%s disconnected=%d",
                        self.attestor.revocation_list.version if self.attestor.revocation_list else 0,
                        len(doomed))
        gone = [p.to_base58() for p in doomed]
        self.membership.expel(gone)
        if changed and gossip and self._gossip is not None:
            await self._gossip.publish(REVOCATION_TOPIC, encode_message(MessageType.REVOCATION, {"crl": crl}))
        return gone

    def _persist(self, crl: bytes) -> None:
        try:
            d = self.data_dir
            d.mkdir(parents=True, exist_ok=True)
            tmp = d / "revocations.bin.tmp"
            tmp.write_bytes(crl)
            tmp.replace(d / "revocations.bin")
        except OSError as e:
            log.warning("cannot persist revocation list error=%s", e)

    # ------------------------------------------------------------------ spreading to newcomers

    def on_advert(self, adv: Advert, new: bool) -> None:
        """A membership listener: a new peer hears the list in force (once per batch of joins)."""
        if not new or self.crl is None or self._nursery is None or self._regossip_pending:
            return
        self._regossip_pending = True
        self._nursery.start_soon(self._regossip)

    async def _regossip(self) -> None:
        await trio.sleep(REGOSSIP_DELAY_S)
        self._regossip_pending = False
        crl = self.crl
        if crl is None or self._gossip is None:
            return
        try:
            await self._gossip.publish(
                REVOCATION_TOPIC, encode_message(MessageType.REVOCATION, {"crl": crl})
            )
        except Exception as e:
            log.info("revocation gossip failed error=%r", e)
