"""One simulated request (or one copy of a hedged one): entry node, serving node, timings.

What happens to the request after its route is decided (retries, refusals, hedging, new
decisions) is ``meshd.core.request_life.RequestLife``, the daemon's own machine, shared by the
copies of a hedged request (``life``); ``meshd.sim.entry`` drives it."""

from __future__ import annotations

from meshd.core.request_life import RequestLife


class SimRequest:
    """Mutable per-request state. Times are simulated seconds; ``gen`` invalidates stale events.

    ``prompt``/``output`` are what the client asked for; ``done_tokens`` counts output tokens
    already streamed before a failover (the resumed request prefills prompt + done_tokens and
    generates the rest, as the daemon does).
    """

    __slots__ = (
        "rid", "arrival", "entry", "model", "prompt", "output", "residency", "measured",
        "server", "rtt_s", "gen", "ttft_s", "start_s", "first_s", "end_s", "done_tokens",
        "stages", "stage_i", "held", "life", "attempt", "copies", "ids", "names", "answer_ids",
    )  # fmt: skip

    def __init__(
        self, rid: int, arrival: float, entry: int, model: str, prompt: int, output: int,
        residency: str | None, measured: bool, life: RequestLife[int],
    ) -> None:  # fmt: skip
        self.rid = rid
        self.arrival = arrival
        self.entry = entry
        self.model = model
        self.prompt = prompt
        self.output = output
        self.residency = residency
        self.measured = measured
        self.server = -1
        self.rtt_s = 0.0
        self.gen = 0
        self.ttft_s = -1.0
        self.start_s = 0.0
        self.first_s = 0.0
        self.end_s = 0.0
        self.done_tokens = 0
        # Pipelines: the plan's stages as (node idx, layer fraction), the current stage, and
        # the nodes whose slot this request holds.
        self.stages: list[tuple[int, float]] | None = None
        self.stage_i = 0
        self.held: list[tuple[int, float]] = []  # (node idx, since)
        # The request's life after its decision (shared by hedged copies), the attempt this
        # copy carries, and the copies ([original, hedge]) once a hedge was sent.
        self.life = life
        self.attempt = -1
        self.copies: list[SimRequest] | None = None
        # The prompt's token ids (a chat workload's; empty: sizes only) and, once a node with a
        # prefix cache serves it, its block names (meshd.sim.prefixes.names_of)
        self.ids: tuple[int, ...] = ()
        self.names: list[bytes] | None = None
        # the answer's token ids as the conversation's next turn resends them (a chat workload's)
        self.answer_ids: tuple[int, ...] = ()

    @property
    def remaining_output(self) -> int:
        return max(self.output - self.done_tokens, 1)

    @property
    def effective_prompt(self) -> int:
        return self.prompt + self.done_tokens
