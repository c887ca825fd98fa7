"""`meshd audit` on a running daemon (issue 13, defect 10): refused handshakes, a revocation
list and the peer it cut off, the config file and node key loaded at start; and the daemon's
pruner removes rows past `[store] max_age_days` on its timer. Two real daemons without models
and an outsider from another CA; every wait has a deadline."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from meshd.core.cert import decode_certificate
from meshd.testnet.children import alive, reap
from meshd.testnet.drive import cli, wait_for
from meshd.testnet.launcher import (
    NodeSpec,
    down,
    free_port,
    issue_keys,
    node_config,
    start_process,
    up,
    write_toml,
)

pytestmark = pytest.mark.slow

STORE = {"prune_interval_s": 1.0, "max_age_days": 1.0}


@pytest.fixture(scope="module")
def mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    d = tmp_path_factory.mktemp("audit-mesh")
    specs = [NodeSpec(name=n, models=[], extra={"store": STORE}) for n in ("n1", "n2")]
    index = up(d, specs, advert_interval_s=1.0)
    try:
        yield index
    finally:
        down(d)


def audit(sock: str, *args: str) -> list[dict[str, Any]]:
    return list(json.loads(cli("audit", "--json", "--socket", sock, *args).stdout)["events"])


def test_start_records_config_and_key(mesh: dict[str, Any]) -> None:
    n1 = mesh["nodes"][0]
    events = {e["kind"]: e for e in audit(n1["socket"])}
    cfg = Path(n1["dir"]) / "meshd.toml"
    assert events["config_loaded"]["detail"] == {
        "path": str(cfg.resolve()), "sha256": hashlib.sha256(cfg.read_bytes()).hexdigest()}
    cert = decode_certificate((Path(n1["dir"]) / "node.cert").read_bytes())
    key = events["key_loaded"]
    assert key["peer_id"] == n1["peer_id"] and key["detail"]["serial"] == cert.serial


def test_outsider_refusals_are_audited(mesh: dict[str, Any], tmp_path: Path) -> None:
    n1 = mesh["nodes"][0]
    spec = NodeSpec(name="outsider", port=free_port(), models=[])
    ids = issue_keys(tmp_path, [spec])  # its own CA
    cfg = node_config(spec, tmp_path / "outsider", [n1["addr"]], advert_interval_s=1.0)
    (tmp_path / "outsider" / "meshd.toml").write_text(write_toml(cfg))
    pid = start_process(tmp_path / "outsider")
    try:
        found = wait_for(lambda: audit(n1["socket"], "--kind", "attestation_failed"), 60,
                         "n1 to audit the outsider's refused handshake", poll_s=0.5)
    finally:
        os.kill(pid, signal.SIGTERM)
        wait_for(lambda: not alive(pid), 15, "the outsider to stop")
        reap(pid)
    e = found[0]
    assert e["peer_id"] == ids["outsider"] and e["reason"] == "wrong_ca"
    assert e["detail"]["direction"] == "inbound" and e["detail"]["address"].startswith("127.0.0.1:")
    text = cli("audit", "--socket", n1["socket"]).stdout
    assert "attestation_failed" in text and "wrong_ca" in text


def test_revocation_is_audited(mesh: dict[str, Any]) -> None:
    n1, n2 = mesh["nodes"]
    ca = Path(mesh["dir"]) / "ca"
    serial = decode_certificate((Path(n2["dir"]) / "node.cert").read_bytes()).serial
    cli("keys", "revoke", str(serial), "--dir", str(ca))
    cli("keys", "push-revocations", "--dir", str(ca), "--socket", n1["socket"])
    revoked = wait_for(lambda: audit(n1["socket"], "--kind", "revoked"), 20,
                       "n1 to audit cutting n2 off")
    assert revoked[0]["peer_id"] == n2["peer_id"] and revoked[0]["detail"]["serial"] == serial
    (in_force,) = audit(n1["socket"], "--kind", "revocation_list")
    assert serial in in_force["detail"]["serials"]


def test_the_daemon_prunes_old_rows_on_its_timer(mesh: dict[str, Any]) -> None:
    n1 = mesh["nodes"][0]
    db = Path(n1["dir"]) / "state" / "meshd.db"
    with sqlite3.connect(db, timeout=10) as conn:  # a row from 10 days ago, past max_age_days
        conn.execute("INSERT INTO audit (ts, kind, peer_id, reason, detail) VALUES (?, ?, ?, ?, ?)",
                     [time.time() - 10 * 86400, "revoked", "P", "ancient", "{}"])
    conn.close()

    def ancient_left() -> int:
        with sqlite3.connect(db, timeout=10) as c:
            n = int(c.execute("SELECT COUNT(*) FROM audit WHERE reason = 'ancient'").fetchone()[0])
        c.close()
        return n

    assert ancient_left() == 1
    wait_for(lambda: ancient_left() == 0, 20, "the pruner to delete the 10-day-old row")
    assert audit(n1["socket"], "--kind", "config_loaded")  # recent rows stay
