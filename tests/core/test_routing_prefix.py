"""Prefix-aware prediction: a node whose advert's sketch holds a prefix of the prompt is credited with
the prefill it skips, in the same prediction as its queue (so a hot node is not piled on), in
the loop and the numpy paths alike, and `meshd explain` states it."""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest

from meshd.core import predict
from meshd.core.prefix_names import BLOCK_TOKENS, block_hashes, sketch
from meshd.core.routing import route
from meshd.core.routing.index import NUMPY_MIN_NODES
from meshd.core.snapshot import MeshSnapshot, NodeView, Policy, RouteRequest, Serving
from meshd.store.explain import explain_text

M, MID = "m", "gguf:0123"
IDS = tuple(range(5, 5 + 20 * BLOCK_TOKENS + 7))  # 647 tokens
NAMES = block_hashes(IDS, MID)


def held(blocks: int) -> bytes:
    """The sketch of a node holding the prompt's first ``blocks`` blocks."""
    return sketch((NAMES[d - 1], d) for d in range(1, blocks + 1))


def node(pid: str, px: bytes = b"", mid: str = MID, **kw: object) -> NodeView:
    base: dict[str, object] = {
        "peer_id": pid, "name": pid.upper(), "serving": (Serving(M, 8, 0, 8, model_id=mid,
                                                                 prefix_sketch=px),),
        "max_concurrency": 4, "prefill_tps": 1000.0, "decode_tps": 50.0, "rtt_ms": 10.0,
        "rtt_source": "measured",
    }  # fmt: skip
    base.update(kw)
    return NodeView(**base)  # type: ignore[arg-type]


def req(ids: tuple[int, ...] = IDS) -> RouteRequest:
    return RouteRequest("r1", M, prompt_tokens=len(IDS), max_tokens=11, prompt_ids=ids)


def candidates(nodes: list[NodeView], r: RouteRequest, strategy: str = "meshd"):  # type: ignore[no-untyped-def]
    d = route(r, MeshSnapshot("a0", tuple(nodes)), Policy(strategy=strategy, explain_limit=200),
              random.Random(1))
    return d, {c.peer_id: c for c in d.candidates}


@pytest.mark.parametrize(("prompt", "cached"), [(647, 0), (647, 512), (647, 640), (100, 512),
                                                (1, 0), (0, 0), (513, 512)])
def test_uncached_tokens_always_leave_the_last_token(prompt: int, cached: int) -> None:
    got = predict.uncached_tokens(prompt, cached)
    want = 0 if prompt <= 0 else prompt - min(cached, prompt - 1)
    assert got == want and (prompt <= 0 or got >= 1)


@pytest.mark.parametrize(("blocks", "credit_tokens"), [(0, 0), (5, 128), (9, 256), (13, 384),
                                                       (20, 640)])
def test_a_node_holding_the_prefix_is_credited_its_prefill(blocks: int, credit_tokens: int) -> None:
    nodes = [node("a0", held(blocks)), node("b1")]
    _, c = candidates(nodes, req())
    ms_per_token = 1.0  # 1,000 tokens/s
    assert c["a0"].prefix_tokens == credit_tokens
    assert c["a0"].prefill_ms == pytest.approx((len(IDS) - credit_tokens) * ms_per_token)
    assert c["a0"].prefix_credit_ms == pytest.approx(credit_tokens * ms_per_token)
    assert c["b1"].prefix_tokens == 0 and c["b1"].prefill_ms == pytest.approx(len(IDS))
    assert c["a0"].predicted_ttft_ms == pytest.approx(
        c["b1"].predicted_ttft_ms - credit_tokens * ms_per_token)


def test_no_credit_without_the_ids_or_for_another_prompt_and_names_per_model_identity() -> None:
    other = block_hashes(IDS, "gguf:other")  # b1 serves m with other weights: its own names
    nodes = [node("a0", held(20)), node("b1", sketch([(other[3], 4)]), mid="gguf:other"),
             node("c2")]
    for r in (req(ids=()), req(ids=tuple(i + 1 for i in IDS))):
        _, c = candidates(nodes, r)
        assert c["a0"].prefix_tokens == 0 and c["a0"].prefill_ms == pytest.approx(len(IDS))
    _, c = candidates(nodes, req())
    assert (c["a0"].prefix_tokens, c["b1"].prefix_tokens, c["c2"].prefix_tokens) == (640, 128, 0)


def test_the_prefix_holder_wins_until_its_queue_costs_more_than_the_prefill_it_saves() -> None:
    """The hot-node problem: the credit is weighed against the queue in one prediction."""
    r = req()
    idle = [node("a0", held(20)), node("b1"), node("c2")]
    d, _ = candidates(idle, r)
    assert d.chosen == "a0"  # 640 ms less prefill, same queue
    busy = [node("a0", held(20), queue_depth=12, in_flight=4, service_rate_rps=8.0),
            node("b1"), node("c2")]
    d, c = candidates(busy, r)
    assert c["a0"].queue_wait_ms > c["a0"].prefix_credit_ms  # ~1.6 s of queue vs 640 ms saved
    assert d.chosen != "a0"


def test_the_numpy_path_credits_the_same_as_the_loop() -> None:
    rng = random.Random(3)
    nodes = [node(f"n{i:03d}", held(rng.choice([0, 0, 5, 9, 20])),
                  queue_depth=rng.randrange(0, 6), rtt_ms=rng.uniform(1, 80))
             for i in range(NUMPY_MIN_NODES + 6)]
    big, cb = candidates(nodes, req())
    assert len(cb) == len(nodes)
    small_nodes = nodes[:10]
    _, cs = candidates(small_nodes, req())
    for pid, c in cs.items():  # the same node's prediction in a loop-sized mesh
        assert c.prefix_tokens == cb[pid].prefix_tokens
        assert c.prefill_ms == pytest.approx(cb[pid].prefill_ms, rel=0, abs=1e-9)
        assert c.prefix_credit_ms == pytest.approx(cb[pid].prefix_credit_ms, rel=0, abs=1e-9)
    assert any(c.prefix_tokens for c in cb.values())
    credited = np.array([c.prefix_tokens for c in cb.values()])
    assert set(credited.tolist()) <= {0, 128, 256, 640}


def test_explain_states_the_cached_prefix_and_the_prefill_it_saves() -> None:
    from meshd.node.entry.route import decision_record

    r = req()
    d, _ = candidates([node("a0", held(20)), node("b1")], r)
    rec = decision_record(d, r)
    a0 = next(c for c in rec["candidates"] if c["peer_id"] == "a0")
    assert a0["prefix_tokens"] == 640 and a0["prefix_credit_ms"] == pytest.approx(640.0)
    b1 = next(c for c in rec["candidates"] if c["peer_id"] == "b1")
    assert "prefix_tokens" not in b1
    text = explain_text({"request_id": "r1", "decision": rec, "outcome": {}, "events": []})
    assert "640 prompt tokens cached there, 640 ms saved" in text


@pytest.mark.parametrize("n", [3, NUMPY_MIN_NODES + 6])
def test_meshd_no_prefix_predicts_as_if_no_advert_listed_a_prefix(n: int) -> None:
    """The comparison without prefix awareness: meshd's own choice, the credit left out."""
    nodes = [node(f"n{i:03d}", held(20) if i == 0 else (), rtt_ms=5.0 + i) for i in range(n)]
    _, c = candidates(nodes, req(), "meshd_no_prefix")
    assert all(x.prefix_tokens == 0 and x.prefix_credit_ms == 0.0 for x in c.values())
    assert c["n000"].prefill_ms == pytest.approx(len(IDS))
    _, plain = candidates([dataclasses.replace(x, serving=(dataclasses.replace(
        x.serving[0], prefix_sketch=b""),)) for x in nodes], req(), "meshd")
    assert {k: v.predicted_ttft_ms for k, v in c.items()} == pytest.approx(
        {k: v.predicted_ttft_ms for k, v in plain.items()})


@pytest.mark.parametrize("n", [4, NUMPY_MIN_NODES + 6])
def test_prefix_only_takes_the_longest_match_whatever_its_queue_and_ties_by_load(n: int) -> None:
    """prefix_only (llm-d's precise prefix scorer alone): the deepest listed prefix wins even
    past a long queue (it herds); among equal matches, and with none, the least loaded."""
    nodes = [node(f"n{i:03d}", queue_depth=3) for i in range(n)]
    nodes[1] = node("n001", held(9), queue_depth=40)  # 256 tokens, a long queue
    nodes[2] = node("n002", held(20), queue_depth=60)  # 640 tokens, a longer one
    nodes[3] = node("n003", held(20), queue_depth=50)
    d, _ = candidates(nodes, req(), "prefix_only")
    assert list(d.order[:3]) == ["n003", "n002", "n001"]
    assert candidates(nodes, req(), "meshd")[0].chosen not in ("n001", "n002", "n003")
    nodes[-1] = node(nodes[-1].peer_id, queue_depth=0)  # no match anywhere: the least loaded
    d, _ = candidates(nodes, req(ids=tuple(i + 1 for i in IDS)), "prefix_only")
    assert d.chosen == nodes[-1].peer_id


@pytest.mark.parametrize("n", [12, NUMPY_MIN_NODES + 6])
def test_a_busy_mesh_compares_the_deepest_holder_but_never_piles_onto_it(n: int) -> None:
    """Past argmin_below_occupancy meshd compares sample_d drawn candidates; one of them is drawn
    among the nodes listing the deepest prefix (sample_prefix), so the holder wins whenever its
    credit beats its queue, and never when its queue costs more than the credit."""
    def chosen(holder_queue: int, sample_prefix: bool) -> float:
        fast = {"in_flight": 4, "service_rate_rps": 8.0, "prefill_tps": 5000.0}
        nodes = [node(f"n{i:03d}", queue_depth=4, **fast) for i in range(n)]  # occupancy 2
        nodes[5] = node("n005", held(9), queue_depth=holder_queue, **fast)  # 256 tokens: 51 ms
        policy = Policy(explain_limit=0, sample_prefix=sample_prefix)
        snap = MeshSnapshot("x", tuple(nodes))
        wins = sum(route(req(), snap, policy, random.Random(s)).chosen == "n005"
                   for s in range(200))
        return wins / 200

    assert chosen(4, True) == 1.0  # the same queue as the others, 51 ms less prefill
    assert chosen(4, False) < 0.5  # drawn only now and then without it
    assert chosen(6, True) == 0.0  # two more queued: 250 ms of wait against 51 ms saved
