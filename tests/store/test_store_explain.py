"""explain_text: table tests on explain records, and it never raises on junk."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from store_samples import CANDIDATES

from meshd.store import Store, explain_text
from meshd.store.explain import _event_lines, _Names


def cand(
    name, ttft, *, rtt=10.0, source="measured", queue=20.0, prefill=9.0, score=None, excluded=None
):
    return {
        "name": name,
        "peer_id": "id-" + name,
        "predicted_ttft_ms": ttft,
        "rtt_ms": rtt,
        "rtt_source": source,
        "queue_wait_ms": queue,
        "prefill_ms": prefill,
        "score": ttft if score is None else score,
        "excluded_by": excluded,
    }


def record(
    strategy="meshd",
    candidates=None,
    chosen="id-gw-2",
    order=None,
    constraints=None,
    plan=None,
    outcome=None,
    events=(),
    retries=0,
    hedges=0,
):
    cands = (
        candidates
        if candidates is not None
        else [
            cand("gw-2", 41.0, rtt=12.0),
            cand("gw-1", 45.0),
            cand("gw-3", 80.0),
            cand("gw-5", None, excluded="residency"),
        ]
    )
    return {
        "request_id": "r-7f3a",
        "decision": {
            "ts": 1.0,
            "strategy": strategy,
            "candidates": cands,
            "constraints": constraints if constraints is not None else {},
            "chosen": chosen,
            "order": order if order is not None else ["id-gw-2", "id-gw-1", "id-gw-3"],
            "plan": plan,
        },
        "outcome": outcome,
        "events": list(events),
        "retries": retries,
        "hedges": hedges,
    }


SERVED = {
    "ttft_ms": 52.4,
    "tokens": 64,
    "tokens_per_s": 38.17,
    "served_by": "gw-2",
    "route": ["gw-2"],
    "error": None,
    "retries": 0,
    "hedges": 0,
}


@pytest.mark.parametrize(
    ("rec", "expected"),
    [
        (
            record(constraints={"sample_d": 2}),
            "Routed to gw-2 because its predicted time to first token (41 ms: 12 ms network + "
            "20 ms queue + 9 ms prefill) was among the best 2 of 3 eligible nodes",
        ),
        (record(), "was the best of 3 eligible nodes"),
        (record(chosen="id-gw-1"), "was ranked 2nd of 3 eligible nodes"),
        (record(constraints={"softmax_temperature_ms": 20}), "softmax over predicted times"),
        (
            record(
                strategy="lwsq",
                candidates=[cand("gw-2", 41, score=62.0), cand("gw-1", 45, score=70)],
            ),
            "its LWSQ score (weighted network latency plus queue length) of 62.0 was the lowest of 2 "
            "eligible nodes (predicted time to first token 41 ms: 10 ms network + 20 ms queue + "
            "9 ms prefill).",
        ),
        (record(strategy="round_robin"), "it was next in round-robin order among 3 eligible nodes"),
        (record(strategy="random"), "it was picked at random among 3 eligible nodes"),
        (record(strategy="latency_only"), "it had the lowest network round trip (12 ms)"),
        (record(strategy="least_queue"), "it had the shortest expected queue wait (20 ms)"),
        (
            record(strategy="fancy"),
            "strategy fancy chose it (predicted time to first token 41 ms: "
            "12 ms network + 20 ms queue + 9 ms prefill, score 41.0).",
        ),
        (
            record(candidates=[cand("gw-2", 29.0, rtt=0.0, source="local")], order=["id-gw-2"]),
            "Routed to gw-2 (this node) because it was the only eligible node (predicted time to "
            "first token 29 ms: 20 ms queue + 9 ms prefill on this node).",
        ),
        (
            record(candidates=[cand("gw-2", 41.0, source="vivaldi"), cand("gw-1", 50)]),
            "10 ms network, estimated from coordinates",
        ),
        (record(), "Next in line if it failed: gw-1, gw-3."),
        (
            record(),
            "Excluded gw-5 (residency): its certificate labels do not allow this "
            "request's residency tag.",
        ),
        (
            record(candidates=[cand("gw-2", 41), cand("gw-9", 5, excluded="quota: client cli-3")]),
            "Excluded gw-9 (quota): the client has used its quota of requests in flight (client cli-3).",
        ),
        (
            record(candidates=[cand("gw-2", 41), cand("gw-9", 5, excluded="moon phase")]),
            "Excluded gw-9: moon phase.",
        ),
        (
            record(constraints={"residency": "eu", "model_allow": ["tiny", "small"]}),
            "Hard constraints applied: model_allow=tiny, small; residency=eu.",
        ),
        (
            record(outcome=SERVED),
            "Request r-7f3a was served by gw-2: first token after 52 ms, "
            "64 tokens at 38.2 tokens/s.",
        ),
        (
            record(outcome={**SERVED, "served_by": "gw-3", "route": ["gw-1", "gw-3"]}),
            "served by gw-3 (route: gw-1 -> gw-3)",
        ),
        (record(), "Request r-7f3a has no recorded outcome"),
        (
            record(
                chosen=None,
                order=[],
                candidates=[cand("gw-5", None, excluded="residency")],
                outcome={
                    **SERVED,
                    "error": "no node may serve a request tagged eu",
                    "served_by": None,
                },
            ),
            "Request r-7f3a failed: no node may serve a request tagged eu.\nStrategy: meshd.\n"
            "No node qualified: every candidate was excluded by a hard constraint.",
        ),
        (
            record(
                plan={
                    "hops": [
                        {"name": "gw-1", "layer_start": 0, "layer_end": 12, "predicted_ms": 30.0},
                        {"name": "gw-3", "layer_start": 12, "layer_end": 24, "predicted_ms": 25.5},
                    ]
                },
                chosen=None,
                order=[],
            ),
            "Split into 2 stages: gw-1 runs layers 0-11 (predicted 30 ms), gw-3 runs layers 12-23 "
            "(predicted 26 ms).",
        ),
        (
            {"request_id": "r", "decision": None, "outcome": None, "events": []},
            "No routing decision was recorded for it on this node.",
        ),
    ],
)
def test_phrases(rec, expected):
    assert expected in explain_text(rec)


def test_retry_hedge_and_timeline():
    events = [
        {"ts": 10.0, "kind": "received", "payload": {}},
        {"ts": 10.001, "kind": "routed", "payload": {"to": "id-gw-2"}},
        {
            "ts": 10.12,
            "kind": "hedge",
            "payload": {"to": "id-gw-1", "after_ms": 120, "winner": "id-gw-2"},
        },
        {
            "ts": 10.3,
            "kind": "retry",
            "payload": {"to": "id-gw-1", "from": "id-gw-2", "reason": "peer_gone", "tokens": 12},
        },
        {"ts": 11.7, "kind": "done", "payload": {}},
    ]
    text = explain_text(
        record(
            outcome={**SERVED, "served_by": "gw-1", "retries": 1, "hedges": 1},
            events=events,
            retries=1,
            hedges=1,
        )
    )
    assert (
        "Hedged: no first token after 120 ms, so a second copy went to gw-1; gw-2 answered first."
    ) in text
    assert (
        "Retried on gw-1 after gw-2 failed (peer_gone); it resumed after the 12 tokens "
        "already streamed, so the client saw one uninterrupted stream."
    ) in text
    assert "In all: 1 retry, 1 hedge." in text
    assert (
        "Timeline: received +0 ms, routed +1.0 ms, hedge +120 ms, retry +300 ms, done +1.7 s."
        in text
    )


def test_replan_and_cancel_events():
    events = [
        {"kind": "replan", "payload": {"reason": "gw-3 left the mesh"}},
        {"kind": "cancelled", "payload": {}},
    ]
    text = explain_text(record(events=events, retries=2))
    assert "Replanned the route: gw-3 left the mesh." in text
    assert "Cancelled: the client went away." in text
    assert "In all: 2 retries, 0 hedges." in text


def test_a_cache_hit_says_whether_it_overtook_a_model(tmp_path):
    hit = {"kind": "cache_hit", "payload": {"similarity": 0.93, "threshold": 0.85, "entry": 7}}
    alone = explain_text(record(events=[hit]))
    assert "matched cached entry 7 at cosine similarity 0.930 (threshold 0.850); no model ran." in alone
    for model, what in (("cancelled", "it was cancelled"),
                        ("dropped", "its finished answer was dropped")):
        text = explain_text(record(events=[
            {"kind": "cache_overtook", "payload": {"model": model}}, hit]))
        assert f"The semantic cache answered while the model ran: {what}." in text
        assert "no model ran" not in text
    # the journal takes the event (an unknown kind is refused)
    s = Store(tmp_path / "m.db")
    try:
        s.record_event("r1", "cache_overtook", payload={"model": "cancelled"})
    finally:
        s.close()


def test_whole_story_from_a_real_store(tmp_path):
    s = Store(tmp_path / "m.db")
    try:
        s.record_event("r1", "received", ts=100.0)
        s.record_decision(
            "r1",
            strategy="meshd",
            candidates=CANDIDATES,
            constraints={"residency": "eu", "sample_d": 2},
            chosen="P2",
            order=["P2", "P1"],
            ts=100.0,
        )
        s.record_event("r1", "first_token", ts=100.052)
        s.record_outcome(
            "r1",
            ttft_ms=52.0,
            tokens=64,
            tokens_per_s=38.2,
            served_by="gw-2",
            route=["gw-2"],
            ts=101.0,
        )
        text = explain_text(s.explain("r1"))
    finally:
        s.close()
    assert text.splitlines() == [
        "Request r1 was served by gw-2: first token after 52 ms, 64 tokens at 38.2 tokens/s.",
        "Strategy: meshd.",
        "Routed to gw-2 because its predicted time to first token (41 ms: 12 ms network + "
        "20 ms queue + 9 ms prefill) was among the best 2 of 2 eligible nodes; meshd picks at "
        "random among the best 2 so that nodes with stale load figures do not all pick the "
        "same peer.",
        "Next in line if it failed: gw-1.",
        "Excluded gw-5 (residency): its certificate labels do not allow this request's "
        "residency tag.",
        "Hard constraints applied: residency=eu.",
        "Timeline: received +0 ms, first_token +52 ms.",
    ]


junk = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(
            st.sampled_from(
                [
                    "request_id",
                    "decision",
                    "outcome",
                    "events",
                    "candidates",
                    "chosen",
                    "order",
                    "plan",
                    "hops",
                    "name",
                    "peer_id",
                    "excluded_by",
                    "kind",
                    "payload",
                    "to",
                    "from",
                    "tokens",
                    "ts",
                    "strategy",
                    "constraints",
                    "predicted_ttft_ms",
                    "rtt_source",
                    "layer_end",
                    "retries",
                    "error",
                    "served_by",
                    "route",
                    "sample_d",
                    "after_ms",
                    "score",
                ]
            ),
            inner,
            max_size=6,
        )
    ),
    max_leaves=30,
)


@settings(max_examples=100, deadline=None)
@given(junk)
def test_never_raises(rec):
    assert isinstance(explain_text(rec if isinstance(rec, dict) else {"decision": rec}), str)


def test_the_entry_nodes_attempts_and_a_return_to_a_refuser_read_as_sentences() -> None:
    events = [
        {"ts": 1.0, "kind": "retry", "node": "e",
         "payload": {"target": "gw-1", "reason": "gw-1 is busy: cannot start within 50 ms (wait 420 ms)",
                     "after_tokens": 0}},
        {"ts": 1.1, "kind": "back_to_refuser", "node": "e",
         "payload": {"target": "gw-1", "predicted_ms": 431.0, "instead_of": "gw-7"}},
    ]
    text = "\n".join(_event_lines(events, _Names([])))
    assert "The attempt on gw-1 failed: gw-1 is busy: cannot start within 50 ms" in text
    assert "Went back to gw-1, which had only been too busy" in text
    assert "(first token predicted in 431 ms), instead of gw-7." in text


def test_energy_per_token_is_explained_when_nodes_measure_power():
    cands = [dict(cand("gw-2", 41.0), joules_per_token=0.42), dict(cand("gw-1", 45.0), joules_per_token=None),
             cand("gw-5", None, excluded="not enough free memory (1000 bytes hold 1 tokens < 128)")]
    text = explain_text(record(candidates=cands, order=["id-gw-2", "id-gw-1"],
                               constraints={"energy_weight": 200.0}))
    assert ("Energy per generated token (measured power): gw-2 0.42 J, gw-1 unknown; "
            "energy_weight 200 ms per J/token.") in text
    assert "Excluded gw-5: not enough free memory (1000 bytes hold 1 tokens < 128)." in text
    assert "energy_weight=" not in text  # not listed as a hard constraint
    assert "(not weighed)" in explain_text(record(candidates=cands, order=["id-gw-2"]))
    assert "Energy per generated token" not in explain_text(record())  # nobody measures power
