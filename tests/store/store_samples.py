"""Sample decision and outcome records shared by the store tests."""

from __future__ import annotations

CANDIDATES = [
    {
        "name": "gw-2",
        "peer_id": "P2",
        "predicted_ttft_ms": 41.0,
        "rtt_ms": 12.0,
        "rtt_source": "measured",
        "queue_wait_ms": 20.0,
        "prefill_ms": 9.0,
        "score": 41.0,
        "excluded_by": None,
    },
    {
        "name": "gw-1",
        "peer_id": "P1",
        "predicted_ttft_ms": 45.0,
        "rtt_ms": 0.0,
        "rtt_source": "local",
        "queue_wait_ms": 36.0,
        "prefill_ms": 9.0,
        "score": 45.0,
        "excluded_by": None,
    },
    {
        "name": "gw-5",
        "peer_id": "P5",
        "predicted_ttft_ms": float("inf"),
        "rtt_ms": 80.0,
        "rtt_source": "vivaldi",
        "queue_wait_ms": 0.0,
        "prefill_ms": 9.0,
        "score": None,
        "excluded_by": "residency",
    },
]


def decision(**over):
    d = dict(
        strategy="meshd",
        candidates=CANDIDATES,
        constraints={"residency": "eu"},
        chosen="P2",
        order=["P2", "P1"],
        plan=None,
    )
    d.update(over)
    return d


def outcome(**over):
    d = dict(ttft_ms=52.0, tokens=64, tokens_per_s=38.2, served_by="gw-2", route=["gw-2"])
    d.update(over)
    return d
