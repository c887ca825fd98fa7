"""Per-client quotas on a real daemon: a client at its quota of requests in flight is refused
with a clear error, other clients are not, and the quota frees up when a request ends."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from meshd.testnet.drive import cli as meshd
from meshd.testnet.drive import wait_for
from meshd.testnet.launcher import NodeSpec, down, up

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    d = tmp_path_factory.mktemp("quota")
    # 4 tokens/s per request: a 40-token request stays in flight for about 10 s
    spec = NodeSpec(name="q1", models=[{"path": "default", "max_decode_tokens_per_s": 4.0}],
                    extra={"routing": {"quotas": {"alice": 1}}})
    index = up(d, [spec], advert_interval_s=1.0)
    try:
        yield index["nodes"][0]["socket"]
    finally:
        down(d)


def in_flight(sock: str) -> int:
    data: dict[str, Any] = json.loads(meshd("status", "--socket", sock, "--json").stdout)
    return int(data["in_flight"]) + int(data["queue_depth"])


def test_a_client_at_its_quota_is_refused_and_others_are_not(node: str) -> None:
    long = subprocess.Popen([sys.executable, "-m", "meshd", "submit", "--socket", node,
                             "--client", "alice", "-n", "40", "--json", "Once upon a time"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: in_flight(node) >= 1, 30, "alice's first request to be in flight")
        refused = meshd("submit", "--socket", node, "--client", "alice", "-n", "2", "Hello",
                        check=False)
        assert refused.returncode != 0
        assert "client 'alice' has 1 requests in flight, its quota is 1" in refused.stderr
        assert "Traceback" not in refused.stderr
        other = meshd("submit", "--socket", node, "--client", "bob", "-n", "2", "--json", "Hello")
        assert json.loads(other.stdout)["served_by"] == "q1"
    finally:
        out, err = long.communicate(timeout=60)
    assert long.returncode == 0, err
    assert json.loads(out)["tokens"] == 40
    again = meshd("submit", "--socket", node, "--client", "alice", "-n", "2", "--json", "Hello")
    assert json.loads(again.stdout)["served_by"] == "q1"  # the quota freed up with the request
