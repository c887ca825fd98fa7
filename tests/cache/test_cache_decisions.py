"""The pure parts of the semantic cache: partitions, guards, thresholds, eviction choice."""

from __future__ import annotations

from dataclasses import replace

import pytest

from meshd.cache.eviction import CacheLimits, Candidate, choose_victims, entry_bytes, overflow
from meshd.cache.guards import guard, minimal_edit, numbers
from meshd.cache.keys import CacheRequest, admit
from meshd.cache.policy import AdaptiveThreshold, FixedThreshold, answers_match, posterior

REQ = CacheRequest(model="m@abc", tenant="acme", client="alice", prompt="What is 2 + 2?")


def test_private_partitions_never_cross_clients_or_tenants() -> None:
    a = admit(REQ)
    assert a.cacheable and a.read == (a.write,)
    assert admit(replace(REQ, client="bob")).write != a.write
    assert admit(replace(REQ, tenant="other")).write != a.write
    assert admit(replace(REQ, model="m@def")).write != a.write
    assert admit(replace(REQ, max_tokens=65)).write != a.write


def test_shared_partition_needs_both_sides_to_opt_in() -> None:
    alice = admit(replace(REQ, shared=True))
    bob = admit(replace(REQ, client="bob", shared=True))
    carol = admit(replace(REQ, client="carol"))
    assert alice.write == bob.write and alice.write in bob.read  # both opted in: shared
    assert alice.write not in carol.read  # carol did not opt in: never sees it
    assert carol.write not in alice.read  # nor does anyone see carol's
    assert admit(replace(REQ, shared=True, tenant="other")).write != alice.write


@pytest.mark.parametrize(("change", "cacheable"), [
    ({}, True),
    ({"temperature": 0.7}, False),
    ({"temperature": 0.7, "cache_sampled": True}, True),
    ({"prompt": "   "}, False),
])
def test_admission(change: dict[str, object], cacheable: bool) -> None:
    assert admit(replace(REQ, **change)).cacheable is cacheable  # type: ignore[arg-type]


def test_greedy_settings_ignore_top_k_top_p_seed() -> None:
    a = admit(REQ).write
    assert admit(replace(REQ, top_k=5, top_p=0.5, seed=3)).write == a
    s = replace(REQ, temperature=0.5, cache_sampled=True)
    assert admit(s).write != admit(replace(s, seed=4)).write


@pytest.mark.parametrize(("q", "c", "why"), [
    ("What is 17 plus 25?", "What's 17 + 25?", None),
    ("What is 17 plus 25?", "What is 17 plus 26?", "numbers differ"),
    ("Calculate fifteen percent of 80", "What's 15% of 80?", None),
    ("Is the store open on Sunday?", "Is the store not open on Sunday?", "negation differs"),
    ("Is the store open?", "Isn't the store open?", "negation differs"),
    ("What's the weather in Paris today?", "What's the weather in Paris tomorrow?",
     "opposite words"),
    ("Is it safe to drink tap water?", "Is it unsafe to drink tap water?", "opposite words"),
    ("How do I turn on 2FA on my account?", "Steps to turn off 2FA on my account?",
     "opposite words"),  # "on" twice vs once: counted as multisets
    ("Convert 5 miles to kilometers.", "Convert 5 kilometers to miles.", "word order"),
    ("Visa to visit Japan from the US?", "Visa to visit the US from Japan?", "word order"),
    ("How many days are there in a leap year?", "In a leap year, how many days are there?",
     None),  # a phrase moved to the front
    ("What is the capital of France?", "What is the capital of Germany?", "minimal edit"),
    ("Is 97 a prime number?", "Is 97 an even number?", "minimal edit"),
    ("What is the capital of France?", "Which city is the capital of France?", None),  # framing
    ("What's the weather in Paris today?", "How is the weather in Paris today?", None),
    ("Who wrote Hamlet?", "When was Hamlet first published?", "question differs"),
    ("Who wrote Hamlet?", "Hamlet was written by whom?", None),  # who = whom
    ("Is tap water safe in Mexico City?", "Can I drink the tap water in Copenhagen?",
     "names differ"),
    ("Is the store open on Sunday?", "Are you open Sundays?", None),  # plural of a name
    ("Who wrote Moby-Dick?", "Tell me who wrote Moby-Dick.", None),  # "Tell" opens it
    ("What is the capital of France?", "Tell me the capital city of France.", None),
    ("Same prompt", "same prompt", None),
])
def test_guards(q: str, c: str, why: str | None) -> None:
    assert guard(q, c) == why


def test_numbers_and_minimal_edit() -> None:
    assert numbers("Book 4 seats at 7:30 for twenty") == ("4", "7:30", "20")
    assert minimal_edit("a b c d", "a x c d") and not minimal_edit("a b c d", "x y z d")


@pytest.mark.parametrize(("sim", "kind"), [(0.95, "hit"), (0.9, "hit"), (0.89, "miss")])
def test_fixed_threshold(sim: float, kind: str) -> None:
    assert FixedThreshold(0.9).decide(sim, "a b", "a b c").kind == kind


def test_posterior_moves_with_evidence() -> None:
    mode0, sd0 = posterior((), 0.8, 0.06, 60)
    assert mode0 == pytest.approx(0.8) and sd0 == pytest.approx(0.06)
    up, sd_up = posterior(((0.93, False), (0.95, False)), 0.8, 0.06, 60)
    down, _ = posterior(((0.82, True), (0.85, True), (0.84, True)), 0.8, 0.06, 60)
    assert up > 0.85 and sd_up < sd0 and down < 0.8


Q, C = "how do i reset it", "steps to recover my password please"


def test_adaptive_entry_learns_its_threshold() -> None:
    p = AdaptiveThreshold()
    fresh = p.threshold(())
    assert p.decide(fresh - 0.01, Q, C).kind == "verify"
    assert p.decide(fresh + 0.01, Q, C, u=0.5).kind == "hit"
    assert p.decide(fresh + 0.01, Q, C, u=0.0).kind == "verify"  # explored
    assert p.decide(0.5, Q, C).kind == "miss"
    lenient = ((0.86, True), (0.88, True), (0.87, True), (0.9, True))
    strict = ((0.97, False), (0.96, False))
    assert p.threshold(lenient) < fresh < p.threshold(strict)
    obs: tuple[tuple[float, bool], ...] = ()
    for i in range(40):
        obs = p.observe(obs, 0.9, i % 2 == 0)
    assert len(obs) == p.max_observations


def test_answers_match() -> None:
    assert answers_match("Paris.\n", " Paris. ") and not answers_match("Paris", "Lyon")


def test_eviction_choice_is_lru_and_covers_both_bounds() -> None:
    cands = [Candidate(1, 5.0, 100), Candidate(2, 1.0, 100), Candidate(3, 1.0, 900),
             Candidate(4, 9.0, 100)]
    assert choose_victims(cands, 1, 0) == [2]
    assert choose_victims(cands, 1, 150) == [2, 3]  # ties by id, until 150 bytes are freed
    assert choose_victims(cands, 0, 0) == []
    limits = CacheLimits(max_entries=10, max_bytes=1000, ttl_s=60)
    assert overflow(10, 0, 10, limits) == (1, 0)
    assert overflow(3, 950, 100, limits) == (0, 50)
    assert entry_bytes("ab", "é", 4) == 2 + 2 + 16 + 200
    with pytest.raises(ValueError):
        CacheLimits(max_entries=0)
