"""Live hardware signals on real daemons: n2 reads a fake /proc + /sys tree and a fake NVML
(``MESHD_TEST_TELEMETRY_ROOT``, ``MESHD_TEST_FAKE_NVML``); what the test writes there reaches
n1's peer table within a few advert intervals and changes where n1 routes; a failing NVML
reading is reported once in n2's log, marked stale in its advert, retried and recovered."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from meshd.testing.fakes_telemetry import FakeGpu, build_host_tree, write_nvml_state
from meshd.testnet.drive import cli as meshd
from meshd.testnet.drive import wait_for
from meshd.testnet.launcher import NodeSpec, down, up

pytestmark = pytest.mark.slow

GPU = FakeGpu(name="NVIDIA Fake L4", memory_total_bytes=24 << 30, memory_free_bytes=20 << 30,
              power_mw=72_000)
KV_BYTES_PER_TOKEN = 2 * 2 * 48 * 4 * 6  # tiny-en: 2 KV heads of 48, float32 K and V, 6 layers
# n2's KV prefix cache budget ([engine] prefix_cache_mb's default), holding nothing (the prompts
# here are shorter than a block): the advert leaves it out of the host's free memory
PREFIX_RESERVE = 256 << 20
FREE = (12 << 30) - PREFIX_RESERVE


@pytest.fixture(scope="module")
def net(tmp_path_factory: pytest.TempPathFactory, shipped_model: None) -> Iterator[dict[str, Any]]:
    # shipped_model: n2 must serve tiny-en (KV_BYTES_PER_TOKEN), not the small test model that
    # another module's session fixture leaves in $MESHD_DEFAULT_MODEL (whose KV cache fits in
    # 16 KiB, so the full suite's run routed the request the test expects refused)
    d = tmp_path_factory.mktemp("telemetry")
    tree, nvml = d / "n2-host", d / "n2-nvml.json"
    build_host_tree(tree, mem_available_kb=12 << 20)
    write_nvml_state(nvml, [GPU])
    env = {"MESHD_TEST_TELEMETRY_ROOT": str(tree), "MESHD_TEST_FAKE_NVML": str(nvml)}
    # n1 serves nothing: every request it takes goes to n2, or fails saying why
    specs = [NodeSpec(name="n1", models=[]), NodeSpec(name="n2")]
    index = up(d, specs, advert_interval_s=0.5, env_for={"n2": env})
    try:
        yield {"n1": index["nodes"][0]["socket"], "n2": index["nodes"][1]["socket"],
               "tree": tree, "nvml": nvml,
               "log": Path(index["nodes"][1]["dir"]) / "meshd.log"}
    finally:
        down(d)


def n2_seen_by_n1(net: dict[str, Any]) -> dict[str, Any]:
    peers = json.loads(meshd("peers", "--socket", net["n1"], "--json").stdout)
    return next((p for p in peers if p["name"] == "n2"), {})


def wait_n1_sees(net: dict[str, Any], cond: Any, what: str) -> dict[str, Any]:
    last: dict[str, Any] = {}

    def check() -> dict[str, Any] | None:
        nonlocal last
        last = n2_seen_by_n1(net)
        return last if last and cond(last) else None

    seen = wait_for(check, 30, lambda: f"{what}; n1 sees n2 as {json.dumps(last)[:1500]}")
    assert seen is not None
    return seen


def submit(net: dict[str, Any]) -> Any:
    # --no-cache: the same prompt again must be routed, never answered from n1's semantic cache
    return meshd("submit", "--socket", net["n1"], "-n", "4", "--json", "--no-cache", "Hello",
                 check=False)


def test_a_changing_reading_reaches_peers_and_changes_the_route(net):
    p = wait_n1_sees(net, lambda p: p["hardware"].get("gpus"), "n2's fake GPU in its advert")
    hw = p["hardware"]
    assert hw["kind"] == "nvidia" and hw["kv_memory"] == "host"  # tiny-en runs on the CPU
    assert hw["gpus"][0]["power_draw_w"] == 72.0 and hw["gpus"][0]["memory_free_bytes"] == 20 << 30
    assert hw["memory_available_bytes"] == FREE and hw["cpu_load_1m"] == 0.5
    assert p["signals"] == {"free_memory_bytes": FREE, "power_w": 72.0, "throttle": [],
                            "speed_factor": 1.0}
    first = submit(net)
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout)["served_by"] == "n2"
    # meshd explain reports the energy per token from n2's measured power (72 W)
    rid = json.loads(first.stdout)["request_id"]

    def n2_candidate() -> dict[str, Any] | None:
        out = meshd("explain", rid, "--json", "--socket", net["n1"], check=False)
        if out.returncode != 0:
            return None
        cands = json.loads(out.stdout).get("decision", {}).get("candidates", [])
        return next((c for c in cands if c["name"] == "n2"), None)

    cand = wait_for(n2_candidate, 30, "n1's journal of the first request")
    assert cand["joules_per_token"] > 0
    text = meshd("explain", rid, "--socket", net["n1"]).stdout
    assert "Energy per generated token (measured power): n2 " in text

    # n2 runs hot and out of memory: 16 KiB free (1 byte once the prefix budget is left out)
    # cannot hold a request's KV cache
    build_host_tree(net["tree"], mem_available_kb=16, load_1m=7.5,
                    zones={"x86_pkg_temp": (99_000, 95_000)}, cpu_mhz=(1_200_000, 3_000_000))
    write_nvml_state(net["nvml"], [FakeGpu(**{**GPU.__dict__, "power_mw": 250_000})])
    p = wait_n1_sees(net, lambda p: p["signals"]["free_memory_bytes"] == 1,
                     "n2's new free memory at n1")
    assert p["signals"]["throttle"] == ["thermal:x86_pkg_temp"]
    assert p["signals"]["speed_factor"] == 0.4 and p["signals"]["power_w"] == 250.0
    assert p["hardware"]["cpu_load_1m"] == 7.5
    listing = meshd("peers", "--socket", net["n1"]).stdout
    assert "0.0G" in listing and "250W" in listing and "thermal:x86_pkg_temp x0.40" in listing
    status = meshd("status", "--socket", net["n2"]).stdout
    assert "load 7.50" in status and "250 W" in status and "throttled: thermal:x86_pkg_temp" in status
    refused = submit(net)
    assert refused.returncode != 0 and "Traceback" not in refused.stderr
    assert "not enough free memory" in refused.stderr, refused.stderr

    build_host_tree(net["tree"], mem_available_kb=12 << 20)
    wait_n1_sees(net, lambda p: p["signals"]["free_memory_bytes"] == FREE,
                 "n2's memory back at n1")
    again = submit(net)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["served_by"] == "n2"


def test_a_failing_reading_is_reported_once_and_retried(net):
    write_nvml_state(net["nvml"], [GPU], fail={"nvmlDeviceGetCount": [-1]})
    p = wait_n1_sees(net, lambda p: p["hardware"].get("stale") == ["nvml"], "nvml stale at n1")
    seq = p["seq"]
    wait_n1_sees(net, lambda p: p["seq"] >= seq + 4, "four more adverts from n2")  # still failing
    log = net["log"].read_text()
    assert log.count("hardware reading failed source=nvml") == 1, log[-3000:]
    write_nvml_state(net["nvml"], [FakeGpu(**{**GPU.__dict__, "memory_free_bytes": 5 << 30})])
    p = wait_n1_sees(net, lambda p: not p["hardware"].get("stale"), "nvml recovered at n1")
    assert p["hardware"]["gpus"][0]["memory_free_bytes"] == 5 << 30
    assert net["log"].read_text().count("hardware reading failed source=nvml") == 1
