"""A request's life after the route decision: one sans-I/O state machine.

``decide()`` says where a request goes first; ``RequestLife`` says what happens next, whatever
happens: a first token, a busy answer (with the server's wait, or without), a dead peer, a
failed pipeline stage, a hedge deadline, a first token that never comes, an answer from the
cache. Events go in with the time; actions come out: send an attempt to a peer (or a plan to its
stages), cancel one, arm a timer, decide again, let out what was held back for the cache, serve
the cached answer, finish, or fail with a code. It reads no clock and does no I/O. The daemon's
execute step (``meshd.node.forward``, a thin trio loop) and the simulator (``meshd.sim.entry``,
its event loop) drive this very class, so what the simulator measures is what the daemon does
(the simulator has no answer cache: it never feeds the cache's events).

The rules, one for both:

- **Attempts.** A request fails after ``max_attempts`` counted failures (``MAX_ATTEMPTS``, 3:
  the first try and two more). A failure counts when it leaves the request with nothing
  running: a busy answer without a usable wait, a dead or silent peer, a failed pipeline stage,
  no first token within ``first_token_timeout_s``. A copy that fails while its hedge sibling
  runs on is dropped without counting; a wait refusal (below) costs a round trip, not an
  attempt. A failure past ``timeout_s`` after the request arrived ends it too.
- **After a failure.** First the copy that lost a hedge race, if any (it did nothing wrong),
  then the next peer of the decision's order that was not tried and is not known dead, then
  (the order spent) the soonest peer that only refused for its wait bound, unbounded; when
  nothing is left, or the failed attempt was a pipeline, decide again (``Redecide``) with
  every peer tried so far (and every stage blamed) excluded: the new decision may be one node
  or a pipeline, whatever the first one was; none fails the request with ``no_route``. A resumed attempt carries the tokens streamed so
  far (the driver's business), so greedy output is identical whoever serves it.
- **Wait refusals** (``meshd.core.admission``): an attempt sent with a wait bound that the
  server cannot meet is answered busy with its wait; the request goes on to the next peer of
  the order, and once the planned bounded attempts are spent, to whichever is predicted sooner
  (``admission.after_refusals``): the next peer, checked against the best refuser's wait, or
  back to that refuser without a bound.
- **Hedging**: at most one hedge per request, armed by the first decision at ``hedge_ms`` after
  the first send: if no first token has come by then, a copy goes to the next untried peer of
  the order, without a wait bound (as every later attempt of a hedged request). The first copy
  with a token (or the answer) wins; the others are cancelled.
- **Pipelines** are never hedged; a failed stage counts one failure, blames its culprits, and
  the request decides again (above).
- **The cache**: a semantic cache lookup that runs for the request (``CacheLookup``, fed before
  the first decision) races the model. Until it answers, what the attempts emit is held back
  from the client (``held``: the driver's buffer) and an end (the answer, a failure, no route)
  waits for it. A hit (``CacheHit``) cancels every attempt and serves the cached answer
  (``ServeCached``, saying whether the model was cancelled or its finished answer dropped); a
  miss (``CacheMiss``) lets out what was held back (``Release``) and the request goes on, or
  ends as it had. A first decision that names the driver's own node first (``CacheLookup.here``),
  or a plan, waits for the lookup before sending: that model would share the node's cores with
  the lookup's embedding. A hit with no lookup pending (none ran, or the answer is out) changes
  nothing.

Peers are whatever the driver names them by (a peer id in the daemon, a node index in the
simulator): anything hashable. Attempts are numbered from 0; ``copy`` says which copy of a
hedged request carries an attempt (0 the original, 1 the hedge): an attempt after a failure
stays on the copy that failed.

``events.py`` holds the vocabulary (``Route``, the events, the actions), ``machine.py`` the
machine; both are re-exported here.
"""


from meshd.core.request_life.events import (
    NO_GONE,
    Action,
    ArmTimer,
    BackToRefuser,
    Busy,
    CacheHit,
    CacheLookup,
    CacheMiss,
    Cancel,
    Decided,
    Drop,
    Expired,
    Fail,
    Failed,
    Finish,
    Finished,
    FirstToken,
    FirstTokenLate,
    GiveUp,
    HedgeDue,
    NoRoute,
    Redecide,
    Release,
    Route,
    Send,
    SendPlan,
    ServeCached,
    StageFailed,
    route_of,
)
from meshd.core.request_life.machine import MAX_ATTEMPTS, RequestLife

__all__ = [
    "Action",
    "ArmTimer",
    "BackToRefuser",
    "Busy",
    "CacheHit",
    "CacheLookup",
    "CacheMiss",
    "Cancel",
    "Decided",
    "Drop",
    "Expired",
    "Fail",
    "Failed",
    "Finish",
    "Finished",
    "FirstToken",
    "FirstTokenLate",
    "GiveUp",
    "HedgeDue",
    "MAX_ATTEMPTS",
    "NO_GONE",
    "NoRoute",
    "Redecide",
    "Release",
    "RequestLife",
    "Route",
    "Send",
    "SendPlan",
    "ServeCached",
    "StageFailed",
    "route_of",
]
