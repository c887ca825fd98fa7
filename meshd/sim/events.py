"""The simulation's events, and what the modules that handle some of them need of it.

Events are plain tuples ``(time, seq, kind, a, b)`` on one heap (``meshd.sim.loop``); ``kind`` is
one of the numbers below. ``Sim`` is the narrow view of the running simulation that
``entry``, ``hedging`` and ``pipeline`` are handed: they read its world, views, metrics and
policy, schedule events with ``push`` and hand requests back with ``send``, ``decide_request``,
``settle_failed``, ``serve_queued``, ``load_changed`` and ``complete``. ``meshd.sim.loop.Simulation`` conforms.
"""

from __future__ import annotations

import random
from typing import Any, Protocol

from meshd.core.snapshot import Policy
from meshd.sim.metrics import Metrics
from meshd.sim.request import SimRequest
from meshd.sim.scenario import Scenario
from meshd.sim.views import Views
from meshd.sim.world import SimNode, World

(
    ARRIVAL,
    AT_SERVER,
    DONE,
    BUSY,
    DEAD,
    ADVERT,
    SUMMARY,
    SCENARIO_EVENT,
    PURGE,
    STAGE,
    EARLY,
    HEDGE,
    FIRST,
    REFUSED,
) = range(14)


class Sim(Protocol):
    """What the event handlers outside the loop need of the running simulation."""

    sc: Scenario
    policy: Policy  # the scenario's, with the strategy under test
    world: World
    views: Views
    m: Metrics
    net_rng: random.Random  # network delays

    def push(self, t: float, kind: int, a: Any = None, b: Any = None) -> None:
        """Schedule an event of ``kind`` at ``t``."""

    def send(self, r: SimRequest, j: int, now: float) -> None:
        """Send copy ``r`` to node ``j``."""

    def decide_request(self, r: SimRequest, now: float, exclude: frozenset[int] = ...) -> None:
        """``decide()`` for ``r`` again, without the nodes in ``exclude``."""

    def settle_failed(self, r: SimRequest, reason: str) -> None:
        """``r``'s request failed for good: count it."""

    def serve_queued(self, t: SimNode, now: float) -> None:
        """Start what node ``t``'s queue holds, while it has free slots."""

    def load_changed(self, t: SimNode, now: float) -> None:
        """Node ``t``'s load changed: an early advert if it changed enough."""

    def complete(self, r: SimRequest, at: float) -> None:
        """``r`` is answered at ``at``: count it."""
