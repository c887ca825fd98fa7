"""Guards v4's verifier with the real encoder (all-MiniLM-L6-v2, int8): the token states it reads
are the ones the embedding pools, an added qualifier has no partner in the other prompt and an
added rewording has one, and the cache refuses the first and serves the second."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from meshd.cache import CacheRequest, SemanticCache
from meshd.cache.align import added_alignment
from meshd.cache.structure import added_run
from meshd.embed import Embedder, default_embedding_model, load_embedder
from meshd.embed.token_states import TokenStates


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return default_embedding_model(cache_dir=tmp_path_factory.mktemp("emb"))


@pytest.fixture(scope="module")
def embedder(model: Path) -> Embedder:
    return load_embedder(model, precision="int8")


@pytest.fixture(scope="module")
def states(model: Path) -> TokenStates:
    return TokenStates(model, precision="int8")


def test_token_states_are_what_the_embedding_pools(embedder: Embedder, model: Path) -> None:
    import onnx
    import onnxruntime as ort

    from meshd.embed.token_states import expose_token_states

    text = "How often should I water a cactus in winter?"
    m = onnx.load(str(model / embedder.manifest.int8_file))
    out = expose_token_states(m)
    sess = ort.InferenceSession(m.SerializeToString())
    ids = np.asarray(embedder.token_ids([text])[0], np.int64)[None]
    emb, h = sess.run(["embedding", out], {"input_ids": ids, "attention_mask": np.ones_like(ids)})
    pooled = h[0].mean(0)
    assert np.allclose(pooled / np.linalg.norm(pooled), emb[0], atol=1e-5)
    assert np.allclose(emb[0], embedder.embed([text])[0], atol=1e-5)


def test_words_spans_and_unit_vectors(states: TokenStates) -> None:
    text = "What's the check-engine light?"
    spans, vecs = states.words(text)
    assert [text[s:e] for s, e in spans] == ["What", "'", "s", "the", "check", "-", "engine",
                                             "light", "?"]
    assert np.allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-5)
    assert states.words(text)[1] is vecs  # memoised


@pytest.mark.parametrize(("q", "c", "low"), [
    ("How often should I water a cactus in winter?", "How often should I water a cactus?", True),
    ("How many grams of protein are in an egg white?",
     "How many grams of protein are in an egg?", True),
    ("Has a storm warning been issued for Miami tonight?",
     "Is there a storm warning for Miami tonight?", False),
    ("What's the capital city of Norway?", "What is the capital of Norway?", False),
])
def test_alignment_of_added_words(states: TokenStates, q: str, c: str, low: bool) -> None:
    added = added_run(q, c)
    assert added is not None
    assert (added_alignment(states.words, q, c, added) < 0.5) is low


def test_cache_refuses_a_qualifier_and_serves_a_rewording(embedder: Embedder,
                                                          states: TokenStates) -> None:
    req = CacheRequest(model="m", tenant="t", client="c", prompt="How often should I water a "
                       "cactus?")
    winter = CacheRequest(model="m", tenant="t", client="c",
                          prompt="How often should I water a cactus in winter?")
    without = SemanticCache(":memory:", embedder)  # no verifier: the threshold serves it
    without.insert(req, "Every two to three weeks.")
    assert without.lookup(winter).kind == "hit"
    cache = SemanticCache(":memory:", embedder, word_states=states.words)
    cache.insert(req, "Every two to three weeks.")
    got = cache.lookup(winter)
    assert got.kind == "miss" and got.reason == "qualifier added"
    cache.insert(CacheRequest(model="m", tenant="t", client="c",
                              prompt="Is there a storm warning for Miami tonight?"), "No.")
    issued = cache.lookup(CacheRequest(model="m", tenant="t", client="c",
                                       prompt="Has a storm warning been issued for Miami "
                                       "tonight?"))
    assert issued.kind == "hit" and issued.answer == "No."
