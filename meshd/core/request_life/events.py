"""The request machine's vocabulary: the route it walks, the events it takes, the actions it
gives (``meshd.core.request_life``, whose docstring states the rules). Frozen dataclasses."""

from __future__ import annotations

from collections.abc import Callable, Container, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from meshd.core.decide import Decision
from meshd.errors import ErrorCode

P = TypeVar("P", bound=Hashable)

NO_GONE: frozenset[Any] = frozenset()


@dataclass(frozen=True, slots=True)
class Route(Generic[P]):
    """A one-node decision as the machine needs it: the peers in order, the wait bound of each
    early attempt (``Decision.wait_bounds``), each peer's predicted TTFT with its known part
    (RTT and prefill, for ``after_refusals``; only needed where there are bounds), and the hedge
    deadline."""

    order: tuple[P, ...]
    bounds: Mapping[P, float] = field(default_factory=dict)
    pred: Mapping[P, tuple[float | None, float | None]] = field(default_factory=dict)
    hedge_ms: float | None = None


def route_of(d: Decision, key: Callable[[str], P]) -> Route[P]:
    """``d.route`` as a ``Route``, peers named by ``key(peer_id)``."""
    r = d.route
    assert r is not None
    pred: dict[P, tuple[float | None, float | None]] = {}
    if d.wait_bounds:
        for c in r.candidates:
            if c.predicted_ttft_ms is not None and c.excluded_by is None:
                pred[key(c.peer_id)] = (c.predicted_ttft_ms, c.predicted_ttft_ms - c.queue_wait_ms)
    return Route(tuple(key(p) for p in r.order), {key(p): ms for p, ms in d.wait_bounds.items()},
                 pred, d.hedge_ms)


# ------------------------------------------------------------------------------------ events in


@dataclass(frozen=True, slots=True)
class Decided:
    """A decision (the first, or one ``Redecide`` asked for): ``route`` for one node with
    fallbacks, else ``plan`` (opaque here: the driver runs it)."""

    route: Route[Any] | None = None
    plan: Any = None


@dataclass(frozen=True, slots=True)
class NoRoute:
    """``decide()`` found no node (``reason``: its message; ``code``: its error code, such as
    ``quota`` for a client over its quota)."""

    reason: str
    code: str = ErrorCode.NO_ROUTE


@dataclass(frozen=True, slots=True)
class FirstToken:
    """Attempt ``attempt``'s first token reached the entry node."""

    attempt: int


@dataclass(frozen=True, slots=True)
class Finished:
    """Attempt ``attempt`` delivered the whole answer."""

    attempt: int


@dataclass(frozen=True, slots=True)
class Busy:
    """The attempt's peer answered busy: with ``wait_ms``, the wait it would have needed (a
    refusal, if the attempt carried a bound), else nothing usable."""

    attempt: int
    wait_ms: float | None = None
    reason: str = "busy"
    gone: Container[Any] = NO_GONE  # peers the entry node knows dead now (skipped)


@dataclass(frozen=True, slots=True)
class Failed:
    """The attempt failed: its peer died, stalled, or answered an error (``code``)."""

    attempt: int
    code: str = ErrorCode.PEER_GONE
    reason: str = "peer gone"
    gone: Container[Any] = NO_GONE


@dataclass(frozen=True, slots=True)
class StageFailed:
    """A stage of the pipeline attempt failed; ``culprits`` are the peers to plan around."""

    attempt: int
    culprits: frozenset[Any] = frozenset()
    code: str = ErrorCode.PEER_GONE
    reason: str = "a stage failed"
    gone: Container[Any] = NO_GONE


@dataclass(frozen=True, slots=True)
class Expired:
    """The attempt's server dropped it: not started within the request's deadline."""

    attempt: int
    code: str = "timeout"


@dataclass(frozen=True, slots=True)
class HedgeDue:
    """The hedge timer (``ArmTimer("hedge")``) went off."""

    gone: Container[Any] = NO_GONE


@dataclass(frozen=True, slots=True)
class FirstTokenLate:
    """The first-token timer (``ArmTimer("first_token")``) went off."""

    gone: Container[Any] = NO_GONE


@dataclass(frozen=True, slots=True)
class CacheLookup:
    """A semantic cache lookup runs for this request (fed before the first decision, or before
    its ``NoRoute``). Until it answers (``CacheHit`` or ``CacheMiss``) what the attempts emit is
    held back from the client (``RequestLife.held``), and an end (the answer, a failure) waits
    for it. ``here``: the driver's own node: a first decision that names it first, or a plan,
    waits for the lookup before sending (the model would share the node's cores with the
    lookup's embedding)."""

    here: Any = None


@dataclass(frozen=True, slots=True)
class CacheHit:
    """The pending semantic lookup found the answer (ignored when none is pending: an answer
    already let out to the client stays the answer)."""


@dataclass(frozen=True, slots=True)
class CacheMiss:
    """The pending semantic lookup missed, refused or failed: the request goes on."""


@dataclass(frozen=True, slots=True)
class GiveUp:
    """The request is abandoned (the driver's run ended, the client went away)."""

    code: str
    reason: str = ""


# ---------------------------------------------------------------------------------- actions out


@dataclass(frozen=True, slots=True)
class Send:
    """Start attempt ``attempt`` on ``peer`` (with the tokens streamed so far), bounded by
    ``max_wait_ms`` (None: no bound); ``hedge``: a second copy, the first still running."""

    attempt: int
    peer: Any
    max_wait_ms: float | None
    copy: int
    hedge: bool = False


@dataclass(frozen=True, slots=True)
class SendPlan:
    """Start attempt ``attempt`` along ``plan``'s stages (with the tokens streamed so far)."""

    attempt: int
    plan: Any
    copy: int


@dataclass(frozen=True, slots=True)
class Cancel:
    """Stop attempt ``attempt`` (``why``: "lost", another copy answered first; "done"; "late",
    no first token in time; "cached"; or how the request ended: "attempts", "no route",
    "expired", "gave up")."""

    attempt: int
    peer: Any
    why: str


@dataclass(frozen=True, slots=True)
class Drop:
    """Attempt ``attempt`` failed while a sibling runs on: nothing follows from it."""

    attempt: int


@dataclass(frozen=True, slots=True)
class ArmTimer:
    """Feed ``HedgeDue`` (kind "hedge") or ``FirstTokenLate`` ("first_token") at ``at``."""

    kind: str
    at: float


@dataclass(frozen=True, slots=True)
class Redecide:
    """Call ``decide()`` again, on a fresh snapshot, with ``exclude`` left out; feed back
    ``Decided`` or ``NoRoute``. ``after``: the failure that led here."""

    exclude: frozenset[Any]
    after: str


@dataclass(frozen=True, slots=True)
class BackToRefuser:
    """(A note for the journal) the request goes back to ``peer``, which refused it earlier and
    is predicted sooner (``predicted_ms``) than ``instead_of``."""

    peer: Any
    predicted_ms: float
    instead_of: Any


@dataclass(frozen=True, slots=True)
class Finish:
    """The request is answered by attempt ``attempt``."""

    attempt: int


@dataclass(frozen=True, slots=True)
class Release:
    """The cache missed: let out what was held back from the client, in order."""


@dataclass(frozen=True, slots=True)
class ServeCached:
    """Answer the request from the cache (every attempt is cancelled before). ``model``: what
    became of the model's side: "cancelled" (attempts had been sent), "dropped" (its answer was
    complete, held back), None (nothing had been sent)."""

    model: str | None = None


@dataclass(frozen=True, slots=True)
class Fail:
    """The request failed for good: tell the client ``code`` and ``reason``."""

    code: str
    reason: str


Action = (Send | SendPlan | Cancel | Drop | ArmTimer | Redecide | BackToRefuser | Finish | Release
          | ServeCached | Fail)
