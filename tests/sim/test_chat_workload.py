"""The multi-turn chat workload: its stated distributions, the history each turn resends, and
the share of conversations opening with a shared system prompt (seeded, pure)."""

from __future__ import annotations

import statistics

import pytest

from meshd.core.prefix_names import block_hashes
from meshd.sim.chat import ChatSpec, chat_requests


def _by_conversation(reqs):  # type: ignore[no-untyped-def]
    out: dict[int, list] = {}  # type: ignore[type-arg]
    for r in reqs:
        out.setdefault(r.conversation, []).append(r)
    return out


def test_each_turn_resends_the_history_and_arrives_later() -> None:
    reqs = chat_requests(ChatSpec(), 3000, seed=1)
    assert len(reqs) == 3000
    assert [r.at_s for r in reqs] == sorted(r.at_s for r in reqs)
    convs = _by_conversation(reqs)
    multi = [c for c in convs.values() if len(c) > 1]
    assert multi
    for turns in multi:
        for a, b in zip(turns, turns[1:], strict=False):
            assert b.turn == a.turn + 1 and b.at_s > a.at_s
            # the next prompt is this prompt, its answer, then a new user message
            assert b.prompt_ids[:len(a.prompt_ids)] == a.prompt_ids
            assert len(b.prompt_ids) > len(a.prompt_ids) + a.max_tokens
            assert b.prompt_ids[:len(a.prompt_ids) + a.max_tokens] == a.prompt_ids + a.answer_ids
    assert all(len(r.answer_ids) == r.max_tokens for r in reqs)
    assert all(len(r.prompt_ids) + r.max_tokens <= 8192 for r in reqs)


def test_the_stated_means_hold() -> None:
    spec = ChatSpec()
    reqs = chat_requests(spec, 10000, seed=2)
    convs = _by_conversation(reqs)
    whole = [c for c in convs.values() if c[0].turn == 0][: len(convs) // 2]  # early ones: ended
    assert statistics.mean(len(c) for c in whole) == pytest.approx(2.0, rel=0.1)
    assert statistics.mean(r.max_tokens for r in reqs) == pytest.approx(214.5, rel=0.1)
    rate = len(reqs) / (reqs[-1].at_s - reqs[0].at_s)
    assert rate == pytest.approx(spec.rate_per_s, rel=0.15)
    own = [r for r in chat_requests(ChatSpec(shared_share=0.0), 5000, seed=4) if r.turn == 0]
    assert statistics.mean(len(r.prompt_ids) for r in own) == pytest.approx(400 + 69.5, rel=0.1)


@pytest.mark.parametrize("share", [0.0, 0.5, 0.9])
def test_the_share_of_conversations_opening_with_a_shared_system_prompt(share: float) -> None:
    reqs = chat_requests(ChatSpec(shared_share=share), 4000, seed=3)
    firsts = [r for r in reqs if r.turn == 0]
    got = sum(r.system >= 0 for r in firsts) / len(firsts)
    assert got == pytest.approx(share, abs=0.04)
    first_block = [block_hashes(r.prompt_ids, "m")[0] for r in firsts if len(r.prompt_ids) >= 32]
    distinct = len(set(first_block))
    if share == 0.0:
        assert distinct == len(first_block)  # no two conversations share a block
    else:
        assert distinct <= len(first_block) * (1 - share) + 0.05 * len(first_block) + 4


def test_the_same_seed_gives_the_same_requests_and_bad_specs_are_refused() -> None:
    assert chat_requests(ChatSpec(), 50, seed=9) == chat_requests(ChatSpec(), 50, seed=9)
    assert chat_requests(ChatSpec(), 50, seed=9) != chat_requests(ChatSpec(), 50, seed=10)
    with pytest.raises(ValueError, match="shared_share"):
        chat_requests(ChatSpec(shared_share=1.5), 5)
