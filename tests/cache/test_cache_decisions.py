"""The pure parts of the cache: partitions, conversations, the semantic decision, eviction."""

from __future__ import annotations

from dataclasses import replace

import pytest

from meshd.cache.eviction import CacheLimits, Candidate, choose_victims, entry_bytes, overflow
from meshd.cache.keys import CacheRequest, admit, conversation
from meshd.cache.policy import decide

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
    ({"n": 2}, False),  # a cached answer is one choice
    ({"logprobs": 0}, False),  # and carries no log probabilities
    ({"presence_penalty": 0.5, "logit_bias": ((7, -100.0),)}, True),  # keyed (below)
])
def test_admission(change: dict[str, object], cacheable: bool) -> None:
    assert admit(replace(REQ, **change)).cacheable is cacheable  # type: ignore[arg-type]


def test_greedy_settings_ignore_top_k_top_p_seed() -> None:
    a = admit(REQ).write
    assert admit(replace(REQ, top_k=5, top_p=0.5, seed=3)).write == a
    s = replace(REQ, temperature=0.5, cache_sampled=True)
    assert admit(s).write != admit(replace(s, seed=4)).write


def test_penalties_and_logit_bias_are_part_of_the_settings() -> None:
    a = admit(REQ).write
    assert admit(replace(REQ, presence_penalty=0.0, frequency_penalty=0.0)).write == a
    pp = admit(replace(REQ, presence_penalty=0.5)).write
    fp = admit(replace(REQ, frequency_penalty=0.5)).write
    bias = admit(replace(REQ, logit_bias=((7, -100.0),))).write
    assert len({a, pp, fp, bias}) == 4
    assert admit(replace(REQ, logit_bias=((9, 1.0), (7, -1.0)))).write == admit(
        replace(REQ, logit_bias=((7, -1.0), (9, 1.0)))).write  # order aside


def test_the_context_is_part_of_the_partition() -> None:
    base = admit(REQ)
    assert admit(replace(REQ, context="")).write == base.write  # as before contexts existed
    assert admit(replace(REQ, context="a system prompt")).write != base.write
    assert admit(replace(REQ, context="x")).write != admit(replace(REQ, context="y")).write


def test_follow_ups_and_max_error_zero_take_the_exact_path_only() -> None:
    assert admit(REQ).semantic
    assert not admit(replace(REQ, follow_up=True)).semantic
    assert not admit(replace(REQ, max_error=0.0)).semantic
    assert admit(replace(REQ, follow_up=True)).cacheable  # exact repeats still


def msgs(*pairs: tuple[str, str]) -> tuple[dict[str, str], ...]:
    return tuple({"role": r, "content": c} for r, c in pairs)


def test_a_conversation_keys_on_its_earlier_turns() -> None:
    q, ctx, follow = conversation(msgs(("user", "What is the capital of France?")))
    assert (q, ctx, follow) == ("What is the capital of France?", "", False)
    # a system prompt is context, not a turn: the semantic path may still answer
    q, ctx, follow = conversation(msgs(("system", "Be brief."), ("user", "Capital of France?")))
    assert q == "Capital of France?" and ctx and not follow
    one = msgs(("user", "Tell me about Python."), ("assistant", "Python is a language..."),
               ("user", "How do I install it?"))
    other = msgs(("user", "Tell me about Rust."), ("assistant", "Rust is a language..."),
                 ("user", "How do I install it?"))
    q1, c1, f1 = conversation(one)
    q2, c2, f2 = conversation(other)
    assert q1 == q2 == "How do I install it?" and f1 and f2
    assert c1 != c2  # the same follow-up in another conversation: another partition
    assert conversation(msgs(*[(m["role"], "  " + m["content"] + " ") for m in one]))[1] == c1
    # the tools and the schema offered are context too
    assert conversation(msgs(("user", "Weather?")), '{"tools":[1]}')[1] != \
        conversation(msgs(("user", "Weather?")), '{"tools":[2]}')[1]
    assert conversation(msgs(("user", "Hi"), ("assistant", "Hello")))[1] != \
        conversation(msgs(("user", "Hi"), ("user", "Hello")))[1]  # the last role counts


class Score:
    def __init__(self, p: float) -> None:
        self.p, self.calls = p, 0

    def __call__(self) -> float:
        self.calls += 1
        return self.p


@pytest.mark.parametrize(("sim", "limit", "p", "kind", "asked"), [
    (None, 0.8, 0.99, "miss", False),  # nothing cached
    (0.70, 0.8, 0.99, "miss", False),  # below the gate: the verifier is spared
    (0.95, None, 0.99, "refused", False),  # the bound cannot hold: not asked either
    (0.95, 0.8, 0.80, "refused", True),  # strictly above the threshold, or refused
    (0.95, 0.8, 0.81, "hit", True),
    (0.79, 0.8, 0.99, "hit", True),  # at the gate
])
def test_decide(sim: float | None, limit: float | None, p: float, kind: str,
                asked: bool) -> None:
    score = Score(p)
    d = decide(sim, 0.79, limit, score)
    assert d.kind == kind and score.calls == int(asked)
    if kind == "hit":
        assert (d.similarity, d.score, d.threshold) == (sim, p, limit)


def test_eviction_choice_is_lru_and_covers_both_bounds() -> None:
    cands = [Candidate(1, 5.0, 100), Candidate(2, 1.0, 100), Candidate(3, 1.0, 900),
             Candidate(4, 9.0, 100)]
    assert choose_victims(cands, 1, 0) == [2]
    assert choose_victims(cands, 1, 150) == [2, 3]  # ties by id, until 150 bytes are freed
    assert choose_victims(cands, 0, 0) == []
    limits = CacheLimits(max_entries=10, max_bytes=1000, ttl_s=60)
    assert overflow(10, 0, 10, limits) == (1, 0)
    assert overflow(9, 0, 10, limits) == (0, 0)
    big = CacheLimits(max_entries=1000, max_bytes=10**9)
    assert overflow(1000, 0, 10, big) == (11, 0)  # a full cache frees a hundredth more
    assert overflow(999, 0, 10, big) == (0, 0)
    assert overflow(3, 950, 100, limits) == (0, 50)
    assert entry_bytes("ab", "é", 4) == 2 + 2 + 16 + 200
    with pytest.raises(ValueError):
        CacheLimits(max_entries=0)
