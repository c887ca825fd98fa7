"""What the router reports about one node it considered: ``Candidate``.

Its own module because both ``route`` (which lists them in a ``RouteDecision``) and ``index``
(which keeps the listing of busy nodes per snapshot) hold them, and ``route`` imports ``index``.
"""

from __future__ import annotations

from typing import NamedTuple


class Candidate(NamedTuple):
    """One node that serves the model, as the router saw it.

    ``predicted_ttft_ms`` = ``rtt_ms`` + ``queue_wait_ms`` + ``prefill_ms`` (staleness corrected,
    the same model whatever the strategy, so hedging and ``meshd explain`` can use it). ``score``
    is what the strategy ranked by, lower is better (None for the round-robins and random).
    ``excluded_by`` names the hard constraint that ruled the node out, or is None.
    ``joules_per_token`` is the energy of each generated token of the request there, from the
    node's measured power (None: not measured; ``meshd.core.energy``). (A named
    tuple: a decision lists up to ``explain_limit`` of them, and a tuple is built in a third of
    the time of a frozen dataclass.)
    """

    peer_id: str
    name: str
    predicted_ttft_ms: float | None
    rtt_ms: float
    rtt_source: str
    queue_wait_ms: float
    prefill_ms: float
    score: float | None
    excluded_by: str | None
    joules_per_token: float | None = None
    # prompt tokens whose KV the node's advert says it holds, and the prefill ms that saves
    # (``prefill_ms`` is what is left); 0 when it holds none or the prompt's ids are unknown
    prefix_tokens: int = 0
    prefix_credit_ms: float = 0.0
