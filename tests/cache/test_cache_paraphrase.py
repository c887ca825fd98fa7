"""The cache with the real all-MiniLM-L6-v2 embedder and its default policy: paraphrases are
served, near misses are not, and a client never sees another's answers."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from meshd.cache import CacheRequest, SemanticCache
from meshd.embed import Embedder, default_embedding_model, load_embedder

ANSWERS = {
    "What is the capital of France?": "Paris.",
    "Who wrote Pride and Prejudice?": "Jane Austen.",
    "Is it safe to drink tap water in Mexico City?": "Better not; drink bottled water.",
    "What is 17 plus 25?": "42",
    "What's the weather in Paris today?": "Sunny, 21 C.",
}
PARAPHRASES = [  # (lookup, the anchor whose answer it must get); cosine 0.94-0.98
    ("What's the capital city of France?", "What is the capital of France?"),
    ("Who is the author of Pride and Prejudice?", "Who wrote Pride and Prejudice?"),
    ("Can I safely drink the tap water in Mexico City?",
     "Is it safe to drink tap water in Mexico City?"),
]
NEAR_MISSES = [  # a different answer is needed
    "What is the capital of Germany?",  # cosine 0.66
    "What is 17 plus 26?",  # 0.90, and a number differs
    "What's the weather in Paris tomorrow?",  # 0.96: one word swapped
    "Who wrote Sense and Sensibility?",  # 0.57
]


@pytest.fixture(scope="module")
def embedder(tmp_path_factory: pytest.TempPathFactory) -> Embedder:
    return load_embedder(default_embedding_model(cache_dir=tmp_path_factory.mktemp("emb")))


def test_paraphrases_hit_near_misses_do_not(embedder: Embedder, tmp_path: Path) -> None:
    req = CacheRequest(model=embedder.identity, tenant="t", client="alice", prompt="")
    cache = SemanticCache(tmp_path / "cache.db", embedder)
    for prompt, answer in ANSWERS.items():
        got = cache.lookup(replace(req, prompt=prompt))
        assert got.kind == "miss"
        cache.insert(replace(req, prompt=prompt), answer, lookup=got)
    for prompt, anchor in PARAPHRASES:
        got = cache.lookup(replace(req, prompt=prompt))
        assert (got.kind, got.answer) == ("hit", ANSWERS[anchor]), (prompt, got)
    for prompt in NEAR_MISSES:
        got = cache.lookup(replace(req, prompt=prompt))
        assert got.kind == "miss", (prompt, got)
    for prompt, _ in PARAPHRASES:  # another client of the same tenant: private by default
        assert cache.lookup(replace(req, client="bob", prompt=prompt)).kind == "miss"
    cache.close()
    again = SemanticCache(tmp_path / "cache.db", embedder)  # after a restart
    assert again.lookup(replace(req, prompt=PARAPHRASES[0][0])).answer == "Paris."
