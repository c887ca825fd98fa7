"""The learned pair verifier shipped with meshd (meshd/data/verifier, meshd.embed.pair_verifier)
with the real all-MiniLM-L6-v2 word table: its graph loads, refuses near misses and serves
paraphrases written for this test (in no split of the labelled pairs), and a real
``SemanticCache`` wired as the daemon wires it (``cache_policy``) does the same.

The examples were written for this test, then kept where the verifier gets them right: of
five paraphrases tried, two scored below 0.5 ("How many minutes do I boil an egg to keep the
yolk runny?" 0.32, "How long do you boil an egg to get a runny yolk?" 0.18; it refuses some
paraphrases, docs/cache.md), so this checks the wiring and a clear case each way, not its
recall."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from meshd.cache import CacheRequest, SemanticCache
from meshd.config import CacheConfig
from meshd.embed import default_embedding_model, load_embedder
from meshd.embed.pair_verifier import PairVerifier, shipped_verifier
from meshd.node.edge_cache import cache_policy

PAIRS = Path(__file__).resolve().parents[2] / "benchmarks" / "data" / "cache_pairs.jsonl"
# (cached, query): written for this test, not taken from the labelled pairs
NEAR_MISSES = [
    ("Who painted the ceiling of the Sistine Chapel?",
     "Who commissioned the ceiling of the Sistine Chapel?"),
    ("What is the boiling point of water at sea level?",
     "What is the boiling point of water on Mount Everest?"),
]
PARAPHRASES = [
    ("Who painted the ceiling of the Sistine Chapel?",
     "Which artist painted the Sistine Chapel ceiling?"),
    ("What is the boiling point of water at sea level?",
     "At sea level, what temperature does water boil at?"),
]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return default_embedding_model(cache_dir=tmp_path_factory.mktemp("emb"))


@pytest.fixture(scope="module")
def verifier(model: Path) -> PairVerifier:
    return PairVerifier(embed_dir=model)


def test_the_examples_are_not_training_data() -> None:
    seen = set()
    for line in PAIRS.read_text().splitlines():
        r = json.loads(line)
        seen |= {r["a"], r["b"]}
    for a, b in NEAR_MISSES + PARAPHRASES:
        assert a not in seen and b not in seen


def test_the_shipped_file_is_small() -> None:
    assert shipped_verifier().stat().st_size <= 12 * 2**20


def test_refuses_near_misses_and_serves_paraphrases(verifier: PairVerifier) -> None:
    bound = verifier.info.min_p
    for cached, query in NEAR_MISSES:
        assert verifier.probability(cached, query) < bound, (cached, query)
    for cached, query in PARAPHRASES:
        assert verifier.probability(cached, query) >= bound, (cached, query)


def test_the_daemons_cache_refuses_the_near_miss_and_serves_the_paraphrase(model: Path) -> None:
    embedder = load_embedder(model, precision="int8")
    policy, verifiers = cache_policy(CacheConfig(), model)
    assert set(verifiers) == {"pair_verifier"}  # the default: no token-state session
    req = CacheRequest(model="m", tenant="t", client="c", prompt="")
    for (cached, near), (_, para) in zip(NEAR_MISSES, PARAPHRASES, strict=True):
        cache = SemanticCache(":memory:", embedder, policy=policy, **verifiers)
        cache.insert(CacheRequest(**{**_fields(req), "prompt": cached}), "the answer")
        miss = cache.lookup(CacheRequest(**{**_fields(req), "prompt": near}))
        hit = cache.lookup(CacheRequest(**{**_fields(req), "prompt": para}))
        assert miss.kind == "miss", (near, miss)
        assert hit.kind == "hit" and hit.answer == "the answer", (para, hit)
    # "on Mount Everest" passes every guard and reaches the threshold: the verifier refuses it
    assert miss.reason.startswith("pair verifier refused"), miss


def _fields(req: CacheRequest) -> dict[str, object]:
    return {f: getattr(req, f) for f in req.__dataclass_fields__}
