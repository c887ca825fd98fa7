"""The Attestor tells its audit sink of every refused handshake, revocation list put in force and
peer cut off by one (issue 13, defect 10), without importing the store; a sink that fails never
changes a decision."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import pytest
import trio
from keys_helpers import CA, NOW, new_ca
from test_keys_attest import attested, running, wait_until

from meshd.core import audit as kinds
from meshd.core import cert as C
from meshd.core import crl as R
from meshd.net import attest as A


class Sink:
    def __init__(self) -> None:
        self.events: list[tuple[str, str, str, dict[str, Any]]] = []

    def __call__(self, kind: str, peer_id: str, reason: str, detail: Mapping[str, Any]) -> None:
        self.events.append((kind, peer_id, reason, dict(detail)))


def _crl(ca: CA, version: int, serials: set[int]) -> bytes:
    rl = R.RevocationList(version=version, issued_at=NOW, ca_key_id=C.ca_key_id(ca.public_key),
                          serials=frozenset(serials))
    return R.sign_revocation_list(rl, ca.private_key)


def test_revocation_list_and_revoked_peers_are_audited(ca: CA) -> None:
    sink = Sink()
    attestor = A.Attestor(ca.public_key, audit=sink)
    nodes = [ca.issue(f"n{i}") for i in range(3)]
    for node in nodes:
        attestor.admit(node.peer_id, attestor.check(node.certificate_bytes, node.peer_id, time.time()))
    attestor.offer_revocation_list(_crl(ca, 2, {nodes[1].certificate.serial}))
    attestor.offer_revocation_list(_crl(ca, 1, {nodes[2].certificate.serial}))  # older: nothing
    assert [(k, p, r) for k, p, r, _ in sink.events] == [
        (kinds.REVOCATION_LIST, "", "version 2 in force"),
        (kinds.REVOKED, nodes[1].peer_id.to_base58(), "serial revoked"),
    ]
    assert sink.events[0][3]["serials"] == [nodes[1].certificate.serial]
    assert sink.events[1][3] == {"serial": nodes[1].certificate.serial, "name": "n1"}


def test_a_failing_sink_changes_nothing(ca: CA) -> None:
    def broken(*args: Any) -> None:
        raise RuntimeError("disk full")

    attestor = A.Attestor(ca.public_key, audit=broken)
    attestor.record_rejection(C.WRONG_CA, peer_id="12D3KooWx")
    node = ca.issue("n")
    attestor.admit(node.peer_id, attestor.check(node.certificate_bytes, node.peer_id, time.time()))
    assert attestor.revoke([node.certificate.serial]) == [node.peer_id]
    assert attestor.statistics()["rejected_total"] == 1


@pytest.mark.parametrize("direction", ["inbound", "outbound"])
def test_refused_handshake_is_audited_with_peer_and_address(direction: str, ca: CA) -> None:
    sink = Sink()
    good = attested(ca.issue("good"))
    assert good.attestor is not None
    good.attestor.audit = sink  # settable after construction, as the daemon does
    bad = attested(new_ca().issue("outsider"))

    async def body() -> None:
        with trio.fail_after(10):
            await exchange()

    async def exchange() -> None:
        async with running(good, bad):
            dialer, target = (bad, good) if direction == "inbound" else (good, bad)
            with pytest.raises(Exception), trio.fail_after(3):  # noqa: B017 (libp2p's own types)
                await dialer.host.connect(target.info())
            await wait_until(lambda: len(sink.events) == 1)

    trio.run(body)
    ((kind, peer_id, reason, detail),) = sink.events
    assert (kind, peer_id, reason) == (kinds.ATTESTATION_FAILED, bad.id.to_base58(), C.WRONG_CA)
    assert detail["direction"] == direction and "issued by CA" in detail["detail"]
    if direction == "inbound":
        assert detail["address"].startswith("127.0.0.1:")
