"""The KV prefix cache in a real daemon: ``[engine] prefix_cache_mb`` sets its budget, a request
whose prompt repeats an earlier one's prefix reuses it with the same tokens, and `meshd status`
(text and --json) states the cache."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import trio

from meshd.testnet.drive import cli as meshd
from meshd.testnet.drive import peers_of, stream, wait_for
from meshd.testnet.launcher import NodeSpec, down, up

# the shipped tiny-en (whose tokenizer SYSTEM is sized for), not a session fixture's model
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("shipped_model")]

# about 190 tokens of the shipped model's tokenizer: several blocks, under its 256 context
SYSTEM = ("You are the keeper of the mesh. Answer in the words of the King James Bible, "
          "briefly, and never name a node that is not in the mesh. ") * 3


def _serve(sock: str, prompt: str, rid: str = "") -> list[int]:
    fields = {"prompt": prompt, "max_tokens": 12, "temperature": 0.0, "cache": False,
              "rid": rid or os.urandom(6).hex()}
    got: dict[str, Any] = trio.run(stream, sock, fields)
    assert got["served"] and got["ids"]
    return list(got["ids"])


def _model(sock: str) -> dict[str, Any]:
    data = json.loads(meshd("status", "--json", "--socket", sock).stdout)
    return dict(next(m for m in data["models"] if m["model"] == "tiny-en"))


@pytest.mark.parametrize("budget_mb", [16, 0])
def test_a_repeated_prefix_is_reused_with_the_same_tokens_and_status_states_it(
        tmp_path: Path, budget_mb: int) -> None:
    index = up(tmp_path / "net", [NodeSpec(name="solo", extra={"engine": {
        "prefix_cache_mb": budget_mb}})], advert_interval_s=1.0)
    try:
        sock = index["nodes"][0]["socket"]
        first = _serve(sock, SYSTEM + "Who built the first node?")
        again = _serve(sock, SYSTEM + "Who built the first node?")
        assert again == first
        model = _model(sock)
        text = meshd("status", "--socket", sock).stdout
    finally:
        down(tmp_path / "net")
    if not budget_mb:  # 0 keeps none: no cache, and status says nothing of one
        assert "prefix_cache" not in model and "prefix cache" not in text
        return
    px = model["prefix_cache"]
    assert px["budget_bytes"] == budget_mb << 20 and px["block_tokens"] == 32
    assert 0 < px["bytes"] <= px["budget_bytes"] and px["blocks"] >= 4
    assert px["hits"] == 1 and px["reused_tokens"] >= 64  # the second request's prefix
    assert px["lookups"] == 2 and px["evicted_blocks"] == 0
    assert f"prefix cache {px['bytes'] / 2**20:.1f} of {budget_mb} MiB" in text
    assert "1 of 2 lookups hit" in text
    b = model["batch"]  # the 12-token answers add no block to the prompt's: none to keep
    assert (b["answers_kept"], b["answers_waiting"]) == (0, 0)
    assert "answers kept 0 (0 tokens prefilled again), 0 waiting, 0 dropped" in text


def test_the_advert_lists_the_prefix_and_the_entry_credits_it_in_explain(tmp_path: Path) -> None:
    """n1 serves tiny-en with a prefix cache, e serves nothing: after a request, n1's advert
    carries its prompt's prefix in its sketch; the same prompt entering at e (tokenized there with n1's
    tokenizer) is predicted with n1's prefill credit, and `meshd explain` states it."""
    index = up(tmp_path / "net", [NodeSpec(name="n1", extra={"engine": {"prefix_cache_mb": 16}}),
                                  NodeSpec(name="e", models=[])], advert_interval_s=1.0)
    try:
        n1, e = index["nodes"]
        prompt = SYSTEM + "Who built the first node?"
        wait_for(lambda: any(m["name"] == "tiny-en" for p in peers_of(e["socket"])
                             for m in p["models"]), 60, "e to hear n1's advert")
        first = _serve(e["socket"], prompt)

        def listed() -> int:
            return max((m.get("prefix_sketch_bytes", 0) for p in peers_of(e["socket"])
                        for m in p["models"] if m["name"] == "tiny-en"), default=0)

        wait_for(listed, 30, "n1's advert to carry the prompt's prefix")
        rid = os.urandom(6).hex()
        assert _serve(e["socket"], prompt, rid) == first
        record = json.loads(meshd("explain", rid, "--json", "--socket", e["socket"]).stdout)
        text = meshd("explain", rid, "--socket", e["socket"]).stdout
    finally:
        down(tmp_path / "net")
    cands = record["decision"]["candidates"]
    c = next(c for c in cands if c["name"] == "n1")
    assert c["prefix_tokens"] == 128 and c["prefix_credit_ms"] > 0
    assert "128 prompt tokens cached there" in text
