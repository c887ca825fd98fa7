"""The router: where one request runs, a pure decision over a ``MeshSnapshot`` (docs/routing.md).

One concept per module, in the order a decision visits them:

- ``index``: the column cache, every per-node figure of one model gathered once per snapshot
  (``model_index``, ``ModelIndex``, its numpy form ``_Columns``/``_Part``/``_Fixed``).
- ``constraints``: hard constraints, ``REQUEST_CONSTRAINTS`` and ``NODE_CONSTRAINTS`` (lists of
  small functions), the exclusion reasons and the eligible set.
- ``prediction``: the predicted TTFT, queue wait and price of the request at each eligible
  node (the batched form of ``meshd.core.predict``'s formulas).
- ``strategies`` (and ``roundrobin``): how the eligible nodes are ranked, meshd's weighted
  choice and the baselines.
- ``route``: ``route()`` itself, the ``RouteDecision`` with its ``Candidate`` list, and
  ``hedge_deadline_ms``.
- ``candidate``: ``Candidate``, one node as the router saw it (below ``index``, which keeps
  the busy nodes' listing, and ``route``).

The names the rest of meshd uses are re-exported here: ``from meshd.core.routing import route``.
"""

from meshd.core.routing.candidate import Candidate
from meshd.core.routing.constraints import (
    EXCLUDED_BUSY,
    EXCLUDED_HOPS,
    EXCLUDED_KV,
    EXCLUDED_MEMORY,
    EXCLUDED_RESIDENCY,
    EXCLUDED_TRIED,
    NODE_CONSTRAINTS,
    REQUEST_CONSTRAINTS,
    exclusion_reason,
    quota_constraint,
    residency_allows,
)
from meshd.core.routing.index import NUMPY_MIN_NODES, ModelIndex, model_index
from meshd.core.routing.prediction import NO_PREFIX
from meshd.core.routing.roundrobin import LOCKSTEP, round_robin_offset, round_robin_rank
from meshd.core.routing.route import RouteDecision, hedge_deadline_ms, route
from meshd.core.routing.strategies import (
    BASELINE_STRATEGIES,
    PREFIX_ONLY,
    STRATEGIES,
    known_temperature_ms,
)

__all__ = [
    "BASELINE_STRATEGIES",
    "EXCLUDED_BUSY",
    "EXCLUDED_HOPS",
    "EXCLUDED_KV",
    "EXCLUDED_MEMORY",
    "EXCLUDED_RESIDENCY",
    "EXCLUDED_TRIED",
    "LOCKSTEP",
    "NODE_CONSTRAINTS",
    "NO_PREFIX",
    "NUMPY_MIN_NODES",
    "PREFIX_ONLY",
    "REQUEST_CONSTRAINTS",
    "STRATEGIES",
    "Candidate",
    "ModelIndex",
    "RouteDecision",
    "exclusion_reason",
    "hedge_deadline_ms",
    "known_temperature_ms",
    "model_index",
    "quota_constraint",
    "residency_allows",
    "round_robin_offset",
    "round_robin_rank",
    "route",
]
