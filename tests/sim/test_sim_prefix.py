"""Prefix reuse in the simulator (meshd.sim.prefixes): each node models the daemon's prefix cache
with the core's own index (whole 128-token chunks, never the last token, blocks kept when the
prefill ends, LRU under the budget), advertises its bounded sketch as the daemon does, and the
chat workload (``process = "chat"``) drives it; the decision is the daemon's ``decide``."""

from __future__ import annotations

import dataclasses

import pytest

from meshd.core.prefix_cache import PrefixCache
from meshd.core.prefix_names import matched_tokens
from meshd.core.snapshot import Serving
from meshd.errors import ConfigError
from meshd.sim.loop import Simulation
from meshd.sim.prefixes import SPACE, NodePrefixes, model_identity, names_of
from tests.sim.helpers import scenario

PROMPT = tuple(range(1000, 1300))  # 300 tokens: 9 whole blocks before its last token


def test_reuse_is_whole_chunks_of_what_finished_its_prefill_and_never_the_last_token() -> None:
    px = NodePrefixes(10_000)
    names = names_of("m", PROMPT)
    px.keep(names, at=1.0)
    assert px.reuse(names, len(PROMPT), now=0.5) == 0  # its prefill has not ended yet
    assert px.reuse(names, len(PROMPT), now=1.0) == 256  # 9 blocks held: two 128-token chunks
    assert px.reuse(names_of("m", PROMPT[:129]), 129, now=2.0) == 128  # all but its last token
    assert px.reuse(names_of("m", PROMPT[:128]), 128, now=2.0) == 0  # would take the last one
    assert px.reuse(names_of("other", PROMPT), len(PROMPT), now=2.0) == 0  # another model
    assert (px.hits, px.reused_tokens) == (2, 384)


def test_the_budget_evicts_least_recently_used_blocks() -> None:
    px = NodePrefixes(12 * 32)  # 12 blocks
    a, b = names_of("m", PROMPT), names_of("m", tuple(range(5000, 5300)))
    px.keep(a, 0.0)
    px.keep(b, 0.1)  # 9 + 9 blocks: a's tail goes first
    assert px.reuse(b, 300, now=1.0) == 256
    assert px.reuse(a, 300, now=1.0) == 0
    assert px.cache.statistics()["bytes"] <= 12 * 32


def test_the_advert_carries_the_core_sketch_under_the_names_model_identity() -> None:
    px = NodePrefixes(10_000)
    px.keep(names_of("m", PROMPT), 0.0)
    serving = (Serving("m", 8, 0, 8),)
    (s,) = px.serving(serving, now=1.0)
    index = PrefixCache(10_000)
    names = names_of("m", PROMPT)
    index.store(SPACE, names, {i: (None, 32) for i in range(len(names))})
    assert s.prefix_sketch == index.sketch(SPACE) and len(s.prefix_sketch) == 8  # 2 names
    assert matched_tokens(names, s.prefix_sketch) == 256  # depths 4 and 8
    assert s.model_id == model_identity("m") and (s.model, s.layer_end) == ("m", 8)


def test_finished_answers_are_kept_as_the_engine_keeps_them() -> None:
    """``finished`` queues a prompt and its answer (at most ``QUEUE``); ``keep_answers_now``
    prefills them one after another while no prompt waits, beside streams only where a chunk
    fits, and their blocks are reusable when that ends."""
    from meshd.core.answer_keep import QUEUE

    px = NodePrefixes(100_000)
    answer = tuple(range(9000, 9100))
    px.keep(names_of("m", PROMPT), 0.0)
    px.finished("m", PROMPT, answer)
    px.keep_answers_now(1.0, streams=0, step_s=0.02, prefill_tps=1000.0, prompts_waiting=True)
    assert px.answers and px.answers_kept == 0  # a prompt waits: not now
    px.keep_answers_now(1.0, streams=4, step_s=0.02, prefill_tps=1000.0, prompts_waiting=False)
    assert px.answers_kept == 0  # 5 tokens fit a quarter of a 20 ms step: it waits for idle
    px.keep_answers_now(1.0, streams=0, step_s=0.02, prefill_tps=1000.0, prompts_waiting=False)
    # idle: from the prompt's last whole chunk (256) to the answer's end, 144 tokens: 0.144 s
    assert (px.answers, px.answers_kept, px.answers_until) == ([], 1, pytest.approx(1.144))
    nxt = PROMPT + answer + (5, 6, 7)
    assert px.reuse(names_of("m", nxt), len(nxt), now=1.1) == 256  # not yet: the prompt's
    assert px.reuse(names_of("m", nxt), len(nxt), now=1.2) == 384  # 12 of 12 blocks: 3 chunks
    for i in range(QUEUE + 2):
        px.finished("m", PROMPT, (i,) * 40)
    assert len(px.answers) == QUEUE
    off = NodePrefixes(100_000, keep_answers=False)
    off.finished("m", PROMPT, answer)
    assert not off.answers


def chat(share: float = 0.5, cache: int = 16_384, rate: float = 8.0, **chat_keys: object):  # type: ignore[no-untyped-def]
    hw = [{"name": "gpu", "prefill_tps": 2000.0, "decode_tps": 40.0, "concurrency": 4,
           "max_queue": 16, "cost_per_hour": 0.5, "prefix_cache_tokens": cache}]
    return scenario(
        sim={"duration_s": 60.0, "drain_s": 60.0, "warmup_s": 10.0},
        gossip={"cell_size": 16, "probes": 0},
        hardware=hw,
        region=[{"name": "a", "nodes": [{"hardware": "gpu", "count": 12, "serve": ["m"]}]}],
        latency={"inter_region_ms": {}},
        chat={"shared_share": share, "think_s": 5.0, **chat_keys},
        arrivals=[{"region": "a", "model": "m", "process": "chat", "rate_per_s": rate}],
    )


def test_meshd_routes_turns_to_their_prefix_and_prefix_only_herds() -> None:
    sc = chat(rate=6.0)  # 70% of the mesh's capacity
    got = {s: Simulation(sc, s).run() for s in ("meshd", "meshd_no_prefix", "prefix_only")}
    assert got["meshd"]["failed"] == got["meshd_no_prefix"]["failed"] == 0
    assert got["meshd"]["completed"] == got["meshd_no_prefix"]["completed"] > 250
    # the credit sends more turns where their history is: more of it reused, sooner
    assert got["meshd"]["prefix_reused_tokens"] > 1.1 * got["meshd_no_prefix"]["prefix_reused_tokens"]
    assert got["meshd"]["ttft_p50_ms"] < got["meshd_no_prefix"]["ttft_p50_ms"]
    # routing by the match alone reuses the most, and piles requests onto the holders
    assert got["prefix_only"]["prefix_reused_tokens"] > got["meshd"]["prefix_reused_tokens"]
    assert got["prefix_only"]["ttft_p95_ms"] > 5 * got["meshd"]["ttft_p95_ms"]
    assert Simulation(sc, "meshd").run()["ttft_p50_ms"] == got["meshd"]["ttft_p50_ms"]


def test_kept_answers_let_the_next_turn_skip_the_answer() -> None:
    """With ``keep_answers`` (the default, as the daemon's), finished prompts and answers are
    prefilled again and kept: more of the next turns is reused and their first tokens come
    sooner; without it only prompts are kept. Beside decoding streams an answer goes only where
    its chunk fits a quarter of their step: on a device of slow prefill (against its decode
    step) it waits for an idle node, and fewer are kept."""
    def run(keep: bool, prefill_tps: float) -> dict[str, float]:
        sc = chat(rate=6.0)
        hw = {k: dataclasses.replace(h, keep_answers=keep, prefill_tps=prefill_tps)
              for k, h in sc.hardware.items()}
        return Simulation(dataclasses.replace(sc, hardware=hw), "meshd").run()

    kept, prompts = run(True, 8000.0), run(False, 8000.0)  # 48 tokens fit a 25 ms step
    assert kept["prefix_answers_kept"] > 300 and prompts["prefix_answers_kept"] == 0
    assert kept["completed"] == prompts["completed"] and kept["failed"] == 0
    assert kept["prefix_reused_tokens"] > 1.15 * prompts["prefix_reused_tokens"]
    assert kept["ttft_p50_ms"] < prompts["ttft_p50_ms"]
    slow = run(True, 2000.0)  # 12 tokens fit a step: answers wait for an idle node
    assert slow["prefix_answers_kept"] < 0.8 * kept["prefix_answers_kept"]


def test_without_caches_nothing_is_reused_and_the_figures_say_nothing_of_it() -> None:
    r = Simulation(chat(cache=0), "meshd").run()
    assert r["completed"] > 300 and "prefix_hits" not in r and "prefix_reused_tokens" not in r


@pytest.mark.parametrize(("arrival", "chat_keys", "message"), [
    ({"region": "*"}, {}, "chat needs one region"),
    ({"prompt_tokens": {"dist": "fixed", "mean": 8}}, {}, "drawn by the chat workload"),
    ({}, {"shared_share": 1.5}, "shared_share"),
    ({}, {"turns": 3}, "unknown key 'chat.turns'"),
])
def test_bad_chat_keys_are_refused_by_name(arrival: dict[str, object],
                                           chat_keys: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        scenario(
            region=[{"name": "a", "nodes": [{"hardware": "gpu", "count": 2, "serve": ["m"]}]}],
            latency={"inter_region_ms": {}}, chat=chat_keys,
            arrivals=[{"region": "a", "model": "m", "process": "chat", "rate_per_s": 1.0,
                       **arrival}])
