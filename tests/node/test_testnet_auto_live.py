"""`meshd submit --model auto` on the default testnet (issue 28): `meshd testnet up` gives its
nodes' model a tier, so the entry node finds one (before, every such request failed with "no
model of the mesh has a tier"). Three real daemons serving the shipped tiny-en, started and
stopped by the CLI; a simple and a complex prompt are both answered by tiny-en at tier large
(the testnet's only tier: the simple one escalates to it). Waits are the CLI's own (`up`
returns when the mesh has formed)."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from typing import Any

import pytest

from meshd.testnet.drive import cli

pytestmark = pytest.mark.slow

SIMPLE = "What is the capital of France?"
COMPLEX = ("Write a Python function that merges overlapping intervals in a list, with tests, "
           "and explain its time complexity.")


@pytest.fixture(scope="module")
def testnet(tmp_path_factory: pytest.TempPathFactory,
            shipped_model: None) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("auto")
    env = {**os.environ, "MESHD_HOME": str(root / "home")}
    d = root / "net"
    up = cli("testnet", "up", "--nodes", "3", "--dir", str(d), env=env, timeout=240)
    try:
        index = json.loads((d / "testnet.json").read_text())
        yield {"env": env, "up": up.stdout, "socket": index["nodes"][0]["socket"]}
    finally:
        cli("testnet", "down", "--dir", str(d), env=env, timeout=60, check=False)


def submit_auto(net: dict[str, Any], prompt: str) -> tuple[str, list[str]]:
    got = cli("submit", "--model", "auto", "--max-tokens", "6", "--temperature", "0", prompt,
              "--socket", net["socket"], env=net["env"], timeout=180)
    notes = [ln.removeprefix("-- note: ") for ln in got.stderr.splitlines()
             if ln.startswith("-- note: ")]
    return got.stdout, notes


def test_up_says_how_to_ask_with_model_auto(testnet: dict[str, Any]) -> None:
    assert 'meshd submit --model auto "Once upon a time"      (tiny-en at tier large)' in testnet["up"]
    assert '"model": "tiny-en"' in testnet["up"]


def test_model_auto_is_answered_on_the_default_testnet(testnet: dict[str, Any]) -> None:
    for prompt in (SIMPLE, COMPLEX):
        text, notes = submit_auto(testnet, prompt)
        assert text.strip(), (prompt, notes)
        auto = [n for n in notes if n.startswith("model auto: ")]
        assert len(auto) == 1 and auto[0].startswith("model auto: tiny-en (tier large"), notes


def test_peers_say_how_each_model_is_stored(testnet: dict[str, Any]) -> None:
    """Adverts carry the weights' format ('fmt'), and `meshd peers` shows it."""
    got = json.loads(cli("peers", "--json", "--socket", testnet["socket"], env=testnet["env"],
                         timeout=60).stdout)
    assert len(got) == 2
    assert all(m.get("fmt") == "fp16" for p in got for m in p["models"]), got  # tiny-en ships fp16
    table = cli("peers", "--socket", testnet["socket"], env=testnet["env"], timeout=60).stdout
    assert re.search(r"tiny-en\[0-6 fp16( \d+ms \d+t/s)?\]", table), table  # with its speed once measured
