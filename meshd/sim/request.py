"""One simulated request and its life: entry node, tries, serving node, timings."""

from __future__ import annotations

from typing import Any


class SimRequest:
    """Mutable per-request state. Times are simulated seconds; ``gen`` invalidates stale events.

    ``prompt``/``output`` are what the client asked for; ``done_tokens`` counts output tokens
    already streamed before a failover (the resumed request prefills prompt + done_tokens and
    generates the rest, as the daemon does).
    """

    __slots__ = (
        "rid", "arrival", "entry", "model", "prompt", "output", "residency", "measured",
        "tried", "order", "pos", "attempts", "server", "rtt_s", "gen", "ttft_s", "start_s",
        "first_s", "end_s", "done_tokens", "hops", "stages", "stage_i", "held", "family",
        "bounds", "pred", "refused",
    )  # fmt: skip

    def __init__(
        self, rid: int, arrival: float, entry: int, model: str, prompt: int, output: int,
        residency: str | None, measured: bool,
    ) -> None:  # fmt: skip
        self.rid = rid
        self.arrival = arrival
        self.entry = entry
        self.model = model
        self.prompt = prompt
        self.output = output
        self.residency = residency
        self.measured = measured
        self.tried: set[int] = set()
        self.order: list[int] = []
        self.pos = 0
        self.attempts = 0
        self.server = -1
        self.rtt_s = 0.0
        self.gen = 0
        self.ttft_s = -1.0
        self.start_s = 0.0
        self.first_s = 0.0
        self.end_s = 0.0
        self.done_tokens = 0
        self.hops = 0
        # Pipelines: the plan's stages as (node idx, layer fraction), the current stage, and
        # the nodes whose slot this request holds.
        self.stages: list[tuple[int, float]] | None = None
        self.stage_i = 0
        self.held: list[tuple[int, float]] = []  # (node idx, since)
        self.family: Any = None  # a hedging.Family once a hedge copy is sent
        # Wait-bounded admission (sim.admission): node idx -> max_wait_ms of the attempts that
        # carry one; node idx -> (predicted TTFT, its RTT + prefill part) in ms; and the
        # refusals so far as (predicted TTFT back there in ms, node idx).
        self.bounds: dict[int, float] | None = None
        self.pred: dict[int, tuple[float, float]] | None = None
        self.refused: list[tuple[float, int]] | None = None

    @property
    def remaining_output(self) -> int:
        return max(self.output - self.done_tokens, 1)

    @property
    def effective_prompt(self) -> int:
        return self.prompt + self.done_tokens
