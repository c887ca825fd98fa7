"""Model tiers on real daemons (docs/tiers.md, issue 16): ``model = "auto"``.

Two daemons, each with a small random-weight Llama imported by the real importer: ``edge``
serves ``micro-m`` (its tier set in ``[[models]] tier``), ``gpu`` serves ``large-m`` (its tier
in the model's manifest). The real tier classifier (shipped ONNX, all-MiniLM-L6-v2 embedding)
scores each prompt at the entry node: a simple prompt goes to the micro model, a complex one
to the large model; ``meshd explain --json`` carries the ``tier`` key. Then ``edge`` is
killed and a simple prompt entering ``gpu`` escalates to the large tier. Every wait is on a
condition with a deadline.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from meshd.engine import import_hf
from meshd.testnet.drive import cli as meshd
from meshd.testnet.drive import peers_of, stream, wait_for
from meshd.testnet.launcher import NodeSpec, down, up

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engine"))

from hf_fixtures import make_checkpoint  # noqa: E402

pytestmark = pytest.mark.slow

SIMPLE = "What is the capital of France?"
COMPLEX = ("Write a Python function that merges overlapping intervals in a list, with tests, "
           "and explain its time complexity.")


def _model(root: Path, name: str, layers: int, seed: int, tier: str | None) -> Path:
    make_checkpoint(root / f"{name}-hf", layers=layers, hidden=32, seed=seed)
    out = root / name
    import_hf(root / f"{name}-hf", out, name=name)
    if tier is not None:  # the manifest's own tier
        m = json.loads((out / "manifest.json").read_text())
        m["tier"] = {"tier": tier, "quality": 1.0}
        (out / "manifest.json").write_text(json.dumps(m, indent=1))
    return out


@pytest.fixture(scope="module")
def mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("tiers")
    micro = _model(root, "micro-m", 2, 3, None)
    large = _model(root, "large-m", 4, 5, "large")
    specs = [NodeSpec(name="edge", models=[{"path": str(micro), "tier": "micro", "quality": 0.3}],
                      extra={"cache": {"enabled": False}}),
             NodeSpec(name="gpu", models=[{"path": str(large)}],
                      extra={"cache": {"enabled": False}})]
    index = up(root / "net", specs, advert_interval_s=1.0)
    try:
        yield index
    finally:
        down(root / "net")


def node(mesh: dict[str, Any], name: str) -> dict[str, Any]:
    return next(n for n in mesh["nodes"] if n["name"] == name)


def submit(mesh: dict[str, Any], at: str, prompt: str) -> dict[str, Any]:
    return trio.run(stream, node(mesh, at)["socket"],
                    {"prompt": prompt, "model": "auto", "max_tokens": 4,
                     "temperature": 0.0})


def explain(mesh: dict[str, Any], at: str, rid: str) -> dict[str, Any]:
    out = meshd("explain", "--json", rid, "--socket", node(mesh, at)["socket"]).stdout
    return dict(json.loads(out))


def hears(mesh: dict[str, Any], at: str, model: str) -> bool:
    return any(model in json.dumps(p) for p in peers_of(node(mesh, at)["socket"]))


def test_auto_sends_simple_to_micro_and_complex_to_large(mesh: dict[str, Any]) -> None:
    wait_for(lambda: hears(mesh, "edge", "large-m"), timeout=30, what="edge hears gpu's advert")
    simple = submit(mesh, "edge", SIMPLE)  # the first auto request loads the classifier
    assert simple["stats"]["model"] == "micro-m", simple["stats"]
    assert simple["served"] == ["edge"]
    assert any(n.startswith("model auto: micro-m (tier micro; score ") for n in simple["stats"]["notes"])
    rec = explain(mesh, "edge", simple["stats"]["request_id"])
    tier = rec["tier"]
    assert (tier["tier"], tier["wanted"], tier["model"]) == ("micro", "micro", "micro-m")
    assert tier["score"] < tier["threshold"] and tier["classifier"] == "ready"
    assert set(tier["features"]) >= {"log_chars", "log_code_markers", "wh_start"}
    assert any("score" in r for r in tier["reasons"])

    hard = submit(mesh, "edge", COMPLEX)
    assert hard["stats"]["model"] == "large-m", hard["stats"]
    assert hard["served"] == ["gpu"]
    tier = explain(mesh, "edge", hard["stats"]["request_id"])["tier"]
    assert (tier["tier"], tier["wanted"]) == ("large", "large") and tier["score"] >= tier["threshold"]

    text = meshd("explain", hard["stats"]["request_id"], "--socket", node(mesh, "edge")["socket"]).stdout
    assert "Model auto: large-m (tier large" in text
    status = json.loads(meshd("status", "--json", "--socket", node(mesh, "edge")["socket"]).stdout)
    tiers = status["services"]["tiers"]
    assert tiers["state"] == "ready" and tiers["scored"] == 2, tiers


def test_a_request_naming_a_model_has_no_tier(mesh: dict[str, Any]) -> None:
    got = trio.run(stream, node(mesh, "edge")["socket"],
                   {"prompt": COMPLEX, "model": "micro-m", "max_tokens": 2})
    assert got["stats"]["model"] == "micro-m"
    assert explain(mesh, "edge", got["stats"]["request_id"])["tier"] is None


def test_escalates_to_large_when_the_micro_tier_is_gone(mesh: dict[str, Any]) -> None:
    os.kill(node(mesh, "edge")["pid"], signal.SIGKILL)
    wait_for(lambda: not hears(mesh, "gpu", "micro-m"), timeout=30, what="gpu forgets edge")
    got = submit(mesh, "gpu", SIMPLE)
    assert got["stats"]["model"] == "large-m" and got["served"] == ["gpu"]
    tier = explain(mesh, "gpu", got["stats"]["request_id"])["tier"]
    assert (tier["wanted"], tier["tier"], tier["escalated"]) == ("micro", "large", True)
    assert "model auto: large-m (tier large, escalated from micro;" in got["stats"]["notes"][0]
    assert any(r.startswith("micro: no model of this tier") or r.startswith("micro: no node")
               for r in tier["reasons"]), tier["reasons"]
