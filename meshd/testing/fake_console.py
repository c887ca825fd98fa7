"""A fake ``ConsoleSource`` (``meshd.api.console.source``) for the console's tests: a mesh of
rows set by the test, an identity, a journal of explain records and an audit trail."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from meshd.api.console.source import ConsoleSource, MeshRows
from meshd.config import Config


def peer_row(name: str, peer_id: str, *, vec: tuple[float, ...] = (0.0, 0.0), region: str = "local",
             rtt_ms: float | None = 1.0, stalled: bool = False, **more: Any) -> dict[str, Any]:
    """A row shaped like ``meshd peers --json``'s."""
    return {"name": name, "peer_id": peer_id, "region": region, "cell": None, "known_by": "advert",
            "labels": {"region": region}, "hardware": {"kind": "cpu", "cpu_cores": 4, "gpus": []},
            "models": [{"name": "tiny", "layers": [0, 4], "num_layers": 4, "tier": "large",
                        "fmt": "fp32"}],
            "queue_depth": 0, "in_flight": 0, "slots": 8, "prefill_tps": 500.0, "decode_tps": 40.0,
            "seq": 3, "coord": {"vec": list(vec), "height": 0.1}, "advert_age_s": 0.5,
            "rtt_ms": rtt_ms or 100.0, "rtt_source": "measured" if rtt_ms else "unknown",
            "rtt_measured_ms": rtt_ms, "rtt_estimated_ms": None, "stalled": stalled, **more}


@dataclass
class FakeConsole:
    config: Config = field(default_factory=Config)
    rows: MeshRows = field(default_factory=lambda: MeshRows(
        local={**peer_row("fake1", "12D3KooWfake1"), "known_by": "self", "advert_age_s": 0.0},
        peers=[peer_row("fake2", "12D3KooWfake2", vec=(5.0, 0.0)),
               peer_row("fake3", "12D3KooWfake3", vec=(0.0, 5.0), stalled=True)]))
    records: dict[str, dict[str, Any]] = field(default_factory=dict)
    events: list[dict[str, Any]] = field(default_factory=list)
    mesh_calls: int = 0

    def mesh(self) -> MeshRows:
        self.mesh_calls += 1
        return self.rows

    def identity(self) -> dict[str, Any]:
        return {"name": "fake1", "peer_id": "12D3KooWfake1", "addrs": ["/ip4/127.0.0.1/tcp/4001"],
                "certificate": {"name": "fake1", "serial": 7, "roles": ["node"],
                                "labels": {"region": "local"}, "not_before": 1_700_000_000,
                                "not_after": 1_900_000_000, "ca_key_id": "abcd"}}

    async def explain(self, request_id: str) -> dict[str, Any] | None:
        return self.records.get(request_id)

    async def audit(self, n: int) -> list[dict[str, Any]]:
        return self.events[:n]


def _conforms(source: FakeConsole) -> ConsoleSource:
    return source  # mypy checks that the fake satisfies the Protocol
