"""A daemon of another mesh that keeps redialling us does not flood its log with bare libp2p
lines (issue 13, defect 12): every line is in meshd's format, and the repeated refusals are
rate limited. Two real daemons without models; waits have deadlines."""

from __future__ import annotations

import json
import os
import re
import signal
from pathlib import Path

import pytest

from meshd.testnet.children import alive, reap
from meshd.testnet.drive import cli, wait_for
from meshd.testnet.launcher import (
    NodeSpec,
    free_port,
    issue_keys,
    node_config,
    start_process,
    write_toml,
)

pytestmark = pytest.mark.slow

STAMPED = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} \S+ [A-Z]+ ")


def _daemon(d: Path, bootstrap: list[str]) -> tuple[int, dict[str, str]]:
    spec = NodeSpec(name="n", port=free_port(), models=[])
    ids = issue_keys(d, [spec])
    cfg = node_config(spec, d / "n", bootstrap, advert_interval_s=1.0)
    (d / "n" / "meshd.toml").write_text(write_toml(cfg))
    pid = start_process(d / "n")
    return pid, {"sock": str(d / "n" / "meshd.sock"), "log": str(d / "n" / "meshd.log"),
                 "addr": f"/ip4/127.0.0.1/tcp/{spec.port}/p2p/{ids['n']}"}


def _stop(pid: int) -> None:
    if alive(pid):
        os.kill(pid, signal.SIGTERM)
    wait_for(lambda: not alive(pid), 15, "a daemon to stop")
    reap(pid)


def test_outsider_redials_leave_few_timestamped_lines(tmp_path: Path) -> None:
    pid_a, a = _daemon(tmp_path / "mesh", [])
    pid_b = None
    try:
        wait_for(lambda: Path(a["sock"]).exists(), 60, "the mesh node's socket")
        pid_b, b = _daemon(tmp_path / "outsider", [a["addr"]])  # its own CA

        def refusals() -> int:
            st = json.loads(cli("status", "--json", "--socket", a["sock"]).stdout)
            return int(st["services"]["attestation"]["rejected_total"])

        wait_for(lambda: refusals() >= 4, 60, "four refused redials of the outsider", poll_s=0.5)
        _stop(pid_b)
        pid_b = None
        lines = [ln for ln in Path(b["log"]).read_text().splitlines()
                 if ln and not ln.startswith("meshd: ")]  # the daemon's own start-up banner
        bare = [ln for ln in lines if not STAMPED.match(ln)]
        assert not bare, bare
        upgrade = [ln for ln in lines if "failed to upgrade security" in ln]
        assert 1 <= len(upgrade) <= 2, upgrade
        rejected = [ln for ln in Path(a["log"]).read_text().splitlines() if "peer rejected" in ln]
        assert 1 <= len(rejected) <= 2, rejected
    finally:
        if pid_b is not None:
            _stop(pid_b)
        _stop(pid_a)
