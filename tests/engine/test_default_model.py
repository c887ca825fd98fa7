"""The model shipped in the package generates English through `meshd model generate`, offline."""

from __future__ import annotations

import json
import re
import socket

import pytest

from meshd.cli.main import main
from meshd.engine import default_model_path, load_model
from meshd.exitcodes import Exit

SHIPPED = default_model_path()
pytestmark = pytest.mark.skipif(not (SHIPPED / "manifest.json").is_file(),
                                reason=f"no shipped model at {SHIPPED}")
COMMON = {"the", "and", "of", "to", "a", "in", "that", "he", "it", "is", "i", "his", "was",
          "for", "with", "unto", "they", "him", "them", "be", "not", "shall", "all", "her",
          "my", "you", "thou", "thy", "said", "were", "as", "on", "which", "this", "have",
          "from", "their", "by", "lord", "god", "are", "there", "me", "will", "upon"}


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the engine tried to use the network")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


def test_shipped_model_is_small_and_loads() -> None:
    total = sum(p.stat().st_size for p in SHIPPED.iterdir() if p.is_file())
    assert total < 10 * 2**20
    model = load_model(SHIPPED)
    assert model.manifest.dtype == "fp16"
    assert model.manifest.name == "tiny-en"


def test_shipped_model_writes_english(no_network: None,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["model", "generate", "default", "And it came to pass that the king",
               "--max-tokens", "40", "--temperature", "0", "--json"])
    assert rc == Exit.OK
    result = json.loads(capsys.readouterr().out)
    words = re.findall(r"[a-z]+", result["text"].lower())
    assert len(words) >= 10, result["text"]
    assert sum(w in COMMON for w in words) >= 0.25 * len(words), result["text"]
    letters = sum(c.isalpha() or c.isspace() for c in result["text"])
    assert letters >= 0.85 * len(result["text"]), result["text"]


def test_shipped_model_samples_english(no_network: None,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["model", "generate", "default", "In the beginning", "--max-tokens", "40",
               "--seed", "7", "--json"])
    assert rc == Exit.OK
    words = re.findall(r"[a-z]+", json.loads(capsys.readouterr().out)["text"].lower())
    assert sum(w in COMMON for w in words) >= 5
