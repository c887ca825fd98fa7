"""Revoked while connected, across real daemons (separate processes) on loopback.

A 3-daemon testnet; the CA revokes n3's serial with `meshd keys revoke`; the list is handed to
ONE daemon (n2) with `meshd keys push-revocations` and spreads by gossip. Every other daemon
must drop n3 from its peer table and close its connection to n3 within a deadline, n3 must
not get a request served any more, and a restarted n3 must not get back in: its dials are
refused, also by a daemon restarted since, which holds the list only from the
``data_dir/revocations.bin`` it persisted. Every wait polls a condition with a deadline.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from meshd.core.cert import decode_certificate
from meshd.core.messages import MessageType
from meshd.testnet.children import alive, reap
from meshd.testnet.drive import ask, wait_for
from meshd.testnet.drive import cli as meshd
from meshd.testnet.launcher import NodeSpec, down, start_process, up

pytestmark = pytest.mark.slow

ADVERT_INTERVAL_S = 1.0
CUT_OFF_DEADLINE_S = 10.0  # push -> every daemon has dropped n3 and closed its connections
SOLO_MODEL = "tiny-solo"  # served by n1 only, so n3 needs the mesh to get it served




def peer_names(sock: str) -> set[str] | None:
    r = ask(sock, MessageType.PEERS_REQ)
    return None if r is None else {p["name"] for p in r["peers"]}


def attestation(sock: str) -> dict[str, Any] | None:
    r = ask(sock, MessageType.STATUS_REQ)
    return None if r is None else dict(r["data"]["services"]["attestation"])


@pytest.fixture(scope="module")
def mesh(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> Iterator[dict[str, Any]]:
    d = tmp_path_factory.mktemp("revocation-mesh")
    specs = [NodeSpec(name="n1"), NodeSpec(name="n2"), NodeSpec(name="n3")]
    specs[0].models = [{"path": "default"}, {"path": "default", "name": SOLO_MODEL}]
    index = up(d, specs, advert_interval_s=ADVERT_INTERVAL_S)
    try:
        yield index
    finally:
        down(d)


def node(mesh: dict[str, Any], name: str) -> dict[str, Any]:
    return next(n for n in mesh["nodes"] if n["name"] == name)


def sock(mesh: dict[str, Any], name: str) -> str:
    return str(node(mesh, name)["socket"])


def submit_solo(mesh: dict[str, Any], name: str) -> subprocess.CompletedProcess[str]:
    return meshd("submit", "--json", "-n", "4", "--model", SOLO_MODEL, "--socket", sock(mesh, name),
                 "Once upon a time", check=False)


def restart(mesh: dict[str, Any], name: str) -> None:
    n = node(mesh, name)
    os.kill(n["pid"], signal.SIGTERM)
    wait_for(lambda: not alive(n["pid"]), 20, f"{name} to stop")
    reap(n["pid"])
    n["pid"] = start_process(Path(n["dir"]))
    (Path(mesh["dir"]) / "testnet.json").write_text(json.dumps(mesh, indent=2))
    wait_for(lambda: ask(sock(mesh, name), MessageType.STATUS_REQ) is not None, 60,
             f"{name} to answer on its control socket again")


@pytest.fixture(scope="module")
def revoked(mesh: dict[str, Any]) -> dict[str, Any]:
    """Check that n3 is a full member, then revoke it and push the list into n2 only."""
    ca = Path(mesh["dir"]) / "ca"
    serial = decode_certificate((Path(node(mesh, "n3")["dir"]) / "node.cert").read_bytes()).serial
    # Before: n3 is in every table and the mesh serves it n1's model (so the test can fail).
    for name in ("n1", "n2"):
        assert "n3" in (peer_names(sock(mesh, name)) or set())
    before = submit_solo(mesh, "n3")
    assert before.returncode == 0, before.stderr
    assert json.loads(before.stdout)["served_by"] == "n1"
    assert attestation(sock(mesh, "n3"))["attested_peers"] == 2  # type: ignore[index]

    listed = json.loads(meshd("keys", "list", "--dir", str(ca), "--json").stdout)
    assert {r["name"]: r["serial"] for r in listed}["n3"] == serial
    out = meshd("keys", "revoke", str(serial), "--dir", str(ca)).stdout
    assert f"revoked serial={serial} (n3)" in out and "push-revocations" in out
    t0 = time.monotonic()
    pushed = json.loads(meshd("keys", "push-revocations", "--dir", str(ca), "--socket",
                              sock(mesh, "n2"), "--json").stdout)
    return {"serial": serial, "t0": t0, "pushed": pushed, "crl": (ca / "revoked.crl").read_bytes()}


def test_push_revocations_help_explains_itself() -> None:
    out = meshd("keys", "push-revocations", "--help").stdout
    for words in ("revoked.crl", "control socket", "gossip", "revocations.bin", "--socket",
                  "newer"):
        assert words in out, words
    assert "push-revocations" in meshd("keys", "--help").stdout


def test_push_refuses_what_is_not_a_revocation_list(mesh: dict[str, Any], tmp_path: Path) -> None:
    bogus = tmp_path / "bogus.crl"
    bogus.write_bytes(b"not a list")
    proc = meshd("keys", "push-revocations", str(bogus), "--socket", sock(mesh, "n1"), check=False)
    assert proc.returncode == 1 and "not a revocation list" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    proc = meshd("keys", "push-revocations", str(tmp_path / "missing.crl"), "--socket",
                 sock(mesh, "n1"), check=False)
    assert proc.returncode == 1 and "meshd keys revoke" in proc.stderr, proc.stderr


def test_push_refuses_a_list_signed_by_another_ca(mesh: dict[str, Any], tmp_path: Path) -> None:
    other = tmp_path / "other-ca"
    meshd("keys", "init-ca", "--dir", str(other))
    meshd("keys", "revoke", "1", "--dir", str(other))
    proc = meshd("keys", "push-revocations", "--dir", str(other), "--socket", sock(mesh, "n1"),
                 check=False)
    assert proc.returncode == 1 and "refused" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    assert attestation(sock(mesh, "n1"))["revocation_version"] == 0  # type: ignore[index]


def test_revoked_node_is_cut_off_by_every_daemon_while_connected(
    mesh: dict[str, Any], revoked: dict[str, Any]
) -> None:
    assert revoked["pushed"]["applied"] and revoked["pushed"]["version_in_force"] == 1
    assert revoked["pushed"]["disconnected"] == [node(mesh, "n3")["peer_id"]]
    s1, s2, s3 = (sock(mesh, n) for n in ("n1", "n2", "n3"))

    def cut_off() -> bool:
        t1, t2, t3 = peer_names(s1), peer_names(s2), peer_names(s3)
        a3 = attestation(s3)
        # n3's side: no connection left at all, and no peer in its table. The table drops a
        # peer on py-libp2p's disconnect notification, which can come a moment after the
        # attestation count falls (a clean-clone CI run read n2 still listed just after)
        return (t1 is not None and t2 is not None and t3 is not None and a3 is not None
                and "n3" not in t1 and "n3" not in t2
                and a3["attested_peers"] == 0 and t3 == set())

    remaining = CUT_OFF_DEADLINE_S - (time.monotonic() - revoked["t0"])
    wait_for(cut_off, max(remaining, 0.0), "n1 and n2 to drop n3 and close its connections")
    # n1 got the list only by gossip, and cut its own live connection to n3 itself
    for name in ("n1", "n2"):
        a = attestation(sock(mesh, name))
        assert a is not None
        assert a["revocation_version"] == 1, (name, a)
        assert a["disconnected_revoked"] == 1, (name, a)
    assert peer_names(s1) == {"n2"} and peer_names(s2) == {"n1"}
    assert peer_names(s3) == set()


def test_revoked_node_cannot_get_a_request_served(
    mesh: dict[str, Any], revoked: dict[str, Any]
) -> None:
    wait_for(lambda: peer_names(sock(mesh, "n3")) == set(), CUT_OFF_DEADLINE_S, "n3 to be alone")
    proc = submit_solo(mesh, "n3")
    assert proc.returncode == 69, (proc.returncode, proc.stdout, proc.stderr)
    assert SOLO_MODEL in proc.stderr and "Traceback" not in proc.stderr
    # and the others still serve each other
    ok = submit_solo(mesh, "n2")
    assert ok.returncode == 0 and json.loads(ok.stdout)["served_by"] == "n1", ok.stderr


def test_daemons_persist_the_list(mesh: dict[str, Any], revoked: dict[str, Any]) -> None:
    for name in ("n1", "n2"):
        path = Path(node(mesh, name)["dir"]) / "state" / "revocations.bin"
        wait_for(path.exists, CUT_OFF_DEADLINE_S, f"{path}")
        assert path.read_bytes() == revoked["crl"]


def test_restarted_revoked_node_cannot_rejoin(
    mesh: dict[str, Any], revoked: dict[str, Any]
) -> None:
    s1, s2, s3 = (sock(mesh, n) for n in ("n1", "n2", "n3"))
    wait_for(lambda: peer_names(s3) == set(), CUT_OFF_DEADLINE_S, "n3 to be cut off")
    refused_before = attestation(s1)["rejected_by_reason"]["revoked"]  # type: ignore[index]

    # n3 comes back and dials its bootstrap peer n1, which refuses it: revoked
    restart(mesh, "n3")
    wait_for(lambda: (attestation(s1) or {}).get("rejected_by_reason", {}).get("revoked", 0)
             > refused_before, 30, "n1 to refuse the restarted n3's dial")
    a3 = attestation(s3)
    assert a3 is not None and a3["attested_peers"] == 0
    assert a3["rejected_by_reason"]["rejected_by_peer"] >= 1, a3

    # n1 restarts too: now it knows the list only from data_dir/revocations.bin, and n3 (which
    # keeps redialling its bootstrap peer) is refused again by the new n1
    restart(mesh, "n1")
    wait_for(lambda: (attestation(s1) or {}).get("rejected_by_reason", {}).get("revoked", 0) >= 1,
             30, "the restarted n1 to refuse n3 from its persisted list")
    assert attestation(s1)["revocation_version"] == 1  # type: ignore[index]
    for s in (s1, s2):
        assert "n3" not in (peer_names(s) or set())
    assert peer_names(s3) == set()
    proc = submit_solo(mesh, "n3")
    assert proc.returncode == 69 and "Traceback" not in proc.stderr, proc.stderr
