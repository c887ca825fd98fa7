"""The learned pair verifier in the policy and the store (meshd.cache.policy.pair_refusal), fed
a fake probability here; the real verifier in test_cache_pair_verifier.py."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from meshd.cache import CacheRequest, Lookup, SemanticCache
from meshd.cache.policy import AdaptiveThreshold, FixedThreshold, pair_refusal
from meshd.testing.fake_embedder import FakeEmbedder


class Probe:
    """A pair check returning ``p`` and counting the calls."""

    def __init__(self, p: float) -> None:
        self.p, self.calls = p, 0

    def __call__(self) -> float:
        self.calls += 1
        return self.p


@pytest.mark.parametrize(("p", "min_p", "refused"), [
    (0.10, 0.5, True), (0.49, 0.5, True), (0.50, 0.5, False), (0.99, 0.5, False),
    (0.10, 0.0, False),  # bound 0: the verifier is not asked
])
def test_pair_refusal(p: float, min_p: float, refused: bool) -> None:
    probe = Probe(p)
    why = pair_refusal(probe, min_p)
    assert (why is not None) is refused
    assert probe.calls == (1 if min_p > 0 else 0)
    if refused:
        assert why is not None and why.startswith("pair verifier refused")
    assert pair_refusal(None, min_p) is None


@pytest.mark.parametrize("policy", [FixedThreshold(threshold=0.8, pair_min_p=0.5),
                                    AdaptiveThreshold(delta=0.5, pair_min_p=0.5)])
def test_the_pair_verifier_is_asked_only_where_the_policy_would_serve(
        policy: FixedThreshold | AdaptiveThreshold) -> None:
    q, c = "Who directed the movie Jaws?", "Who starred in Jaws?"  # no guard refuses it
    low, high = Probe(0.1), Probe(0.9)
    assert policy.decide(0.97, q, c, pair=low).kind == "miss"
    assert policy.decide(0.97, q, c, pair=low).reason.startswith("pair verifier refused")
    assert policy.decide(0.97, q, c, pair=high).kind == "hit"
    assert policy.decide(0.97, q, c).kind == "hit"  # no verifier passed: threshold and guards
    n = low.calls
    assert policy.decide(0.3, q, c, pair=low).kind == "miss"  # below the threshold (floor)
    assert low.calls == n
    # a guard that refuses first spares the verifier too ("17 + 25" / "17 + 26": numbers)
    assert policy.decide(0.99, "What is 17 + 26?", "What is 17 + 25?", pair=low).kind == "miss"
    assert low.calls == n


def test_without_a_bound_the_policy_never_asks() -> None:
    probe = Probe(0.0)
    assert FixedThreshold().decide(0.99, "Tell me the capital of France.",
                                   "What is the capital of France?", pair=probe).kind == "hit"
    assert probe.calls == 0


def test_the_store_asks_cached_then_query_and_falls_back_to_the_next_neighbour() -> None:
    asked: list[tuple[str, str]] = []
    refuse = {"how far is the moon from earth today"}

    def verifier(cached: str, query: str) -> float:
        asked.append((cached, query))
        return 0.0 if cached in refuse else 0.9

    cache = SemanticCache(":memory:", FakeEmbedder(),
                          policy=FixedThreshold(threshold=0.5, pair_min_p=0.5),
                          pair_verifier=verifier)
    req = CacheRequest(model="m", tenant="t", client="c", prompt="")

    def ask(prompt: str) -> Lookup:
        return cache.lookup(_req(req, prompt))

    cache.insert(_req(req, "how far is the moon from earth today"), "A")
    got = ask("how far is the moon from earth")
    assert asked and asked[0] == ("how far is the moon from earth today",
                                  "how far is the moon from earth")
    assert got.kind == "miss"
    cache.insert(_req(req, "how far away is the moon from earth"), "B")
    got = ask("how far is the moon from earth")
    assert got.kind == "hit" and got.answer == "B"
    n = len(asked)
    assert ask("bake a chocolate cake").kind == "miss"  # nothing near: not asked
    assert len(asked) == n


def _req(req: CacheRequest, prompt: str) -> CacheRequest:
    return replace(req, prompt=prompt)


@pytest.mark.parametrize(("default", "guards"), [({}, True), ({"guards": False}, False)])
def test_the_verifier_description_says_whether_its_defaults_use_the_guards(
        tmp_path: Path, default: dict[str, bool], guards: bool) -> None:
    """A verifier whose defaults were chosen without the lexical guards in front
    (scripts/train_pair_verifier.py --choose sweeps both) is asked with none; a description
    that does not say (pair-verifier-v1) keeps them."""
    from meshd.embed.pair_verifier import read_info

    meta = {"name": "v", "layers": 2, "max_len": 128, "base": "b",
            "default": {"threshold": 0.6, "min_p": 0.9, **default}}
    (tmp_path / "v.json").write_text(json.dumps(meta))
    info = read_info(tmp_path / "v.npz")
    assert (info.threshold, info.min_p, info.guards) == (0.6, 0.9, guards)
