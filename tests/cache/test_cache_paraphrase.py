"""The cache with the real all-MiniLM-L6-v2 embedder, the shipped pair verifier and its
calibration, wired as the daemon wires them (``semantic_parts``): at the default bound a
paraphrase is served, near misses are not (one at cosine 0.99), a client never sees another's
answers, and the entries survive a restart."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from meshd.cache import CacheRequest, SemanticCache
from meshd.config import CacheConfig
from meshd.embed import default_embedding_model
from meshd.node.edge_cache import semantic_parts

ANSWERS = {
    "How many days are there in a leap year?": "366.",
    "How do I convert Celsius to Fahrenheit?": "Multiply by 9/5 and add 32.",
    "What is 17 plus 25?": "42",
    "What's the weather in Paris today?": "Sunny, 21 C.",
}
PARAPHRASES = [  # (lookup, the anchor whose answer it must get)
    ("In a leap year, how many days are there?", "How many days are there in a leap year?"),
    ("What's the formula to turn Celsius into Fahrenheit?",
     "How do I convert Celsius to Fahrenheit?"),
]
NEAR_MISSES = [  # a different answer is needed
    "How do I convert Fahrenheit to Celsius?",  # cosine 0.99
    "What is 17 plus 26?",
    "What's the weather in Paris tomorrow?",
    "How many days are there in February in a leap year?",
]


@pytest.fixture(scope="module")
def parts(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any, Any]:
    model = default_embedding_model(cache_dir=tmp_path_factory.mktemp("emb"))
    return semantic_parts(CacheConfig(), model)


def test_paraphrases_hit_near_misses_do_not(parts: tuple[Any, Any, Any], tmp_path: Path) -> None:
    embedder, verifier, calibration = parts
    req = CacheRequest(model="m", tenant="t", client="alice", prompt="")
    cache = SemanticCache(tmp_path / "cache.db", embedder, verifier=verifier,
                          calibration=calibration)
    for prompt, answer in ANSWERS.items():
        got = cache.lookup(replace(req, prompt=prompt))
        assert got.kind == "miss"
        cache.insert(replace(req, prompt=prompt), answer, vector=got.vector)
    for prompt, anchor in PARAPHRASES:
        got = cache.lookup(replace(req, prompt=prompt))
        assert (got.kind, got.answer) == ("semantic", ANSWERS[anchor]), (prompt, got)
    for prompt in NEAR_MISSES:
        got = cache.lookup(replace(req, prompt=prompt))
        assert not got.hit, (prompt, got)
    for prompt, _ in PARAPHRASES:  # another client of the same tenant: private by default
        assert not cache.lookup(replace(req, client="bob", prompt=prompt)).hit
    cache.close()
    again = SemanticCache(tmp_path / "cache.db", embedder, verifier=verifier,
                          calibration=calibration)  # after a restart
    assert again.lookup(replace(req, prompt=PARAPHRASES[0][0])).answer == "366."
