"""Hard constraints: which nodes may serve a request at all, and why the others may not.

Two lists a newcomer extends:

- ``REQUEST_CONSTRAINTS``: rules on the request as a whole (allow-list, client quota, ...).
  Each is ``f(req, snap, policy) -> str | None``: the constraint in words when it applies, None
  when not; it raises ``RoutingError`` (or ``QuotaError``) when it rules everything out.
- ``NODE_CONSTRAINTS``: rules on single nodes, in the order they are checked (the first that
  applies is the one reported in ``Candidate.excluded_by``). Each is
  ``f(req, node, policy) -> str | None``: why it rules ``node`` out, or None.

``eligible(req, idx, policy)`` is the fast form of ``NODE_CONSTRAINTS`` over a ``ModelIndex``'s
columns (lists, or numpy past ``NUMPY_MIN_NODES``): a new node constraint adds its filter there
too, and a row in tests/core/test_routing.py checks that the two agree.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from meshd.core.hwsignals import kv_tokens_in_memory
from meshd.core.routing.index import (
    NUMPY_MIN_NODES,
    Ints,
    ModelIndex,
    Positions,
    _Columns,
    kv_bytes_per_token,
)
from meshd.core.snapshot import MeshSnapshot, NodeView, Policy, RouteRequest
from meshd.errors import QuotaError, RoutingError

# Hard constraints on single nodes, in the order they are checked (the first that applies is
# the one reported in ``Candidate.excluded_by``).
EXCLUDED_TRIED = "already tried"
EXCLUDED_RESIDENCY = "residency"
EXCLUDED_HOPS = "hop limit"
EXCLUDED_BUSY = "busy"
EXCLUDED_KV = "kv cache full"
EXCLUDED_MEMORY = "not enough free memory"


def residency_allows(labels: frozenset[str], tag: str) -> bool:
    """Whether a node whose certificate carries ``labels`` may serve a request tagged ``tag``.

    Tags and labels are hierarchical with ``/``: a node labelled ``eu/de`` may serve requests
    tagged ``eu`` or ``eu/de``; a node labelled ``eu`` may not serve one tagged ``eu/de`` (it
    could be anywhere in the EU). A label may also be written ``residency:eu``. The node's
    ``region`` field is not used: it is self-declared, the labels are signed by the mesh's CA.
    """
    for label in labels:
        lab = label.removeprefix("residency:")
        if lab == tag or lab.startswith(tag + "/"):
            return True
    return False


def residency_mask(idx: ModelIndex, tag: str) -> list[bool]:
    """Which nodes of ``idx`` have labels that allow residency ``tag`` (memoised per tag)."""
    m = idx.residency_memo.get(tag)
    if m is None:
        m = idx.residency_memo[tag] = [residency_allows(n.labels, tag) for n in idx.nodes]
    return m


def _residency_array(idx: ModelIndex, cols: _Columns, tag: str) -> npt.NDArray[np.bool_]:
    m = cols.residency_memo.get(tag)
    if m is None:
        m = cols.residency_memo[tag] = np.array(residency_mask(idx, tag), dtype=np.bool_)
    return m


# -- constraints on the request as a whole --------------------------------------------------

RequestConstraint = Callable[[RouteRequest, MeshSnapshot, Policy], str | None]


def model_allowed(req: RouteRequest, snap: MeshSnapshot, policy: Policy) -> str | None:
    """The policy's model allow-list; raises when the model is not on it."""
    if not policy.model_allow:
        return None
    if req.model not in policy.model_allow:
        raise RoutingError(
            f"request {req.request_id}: model {req.model!r} is not in the allow-list "
            f"({', '.join(sorted(policy.model_allow))})"
        )
    return f"model {req.model} is on the allow-list"


def quota_constraint(req: RouteRequest, snap: MeshSnapshot, policy: Policy) -> str | None:
    """The client's quota of requests in flight, in words; raises when it is used up. None when
    the client has no quota. (Pipelines check it too, before planning.)"""
    quota = policy.client_quota.get(req.client)
    if quota is None:
        return None
    used = snap.client_in_flight.get(req.client, 0)
    if used >= quota:
        raise QuotaError(
            f"request {req.request_id}: client {req.client!r} has {used} requests in flight, "
            f"its quota is {quota}"
        )
    return f"client {req.client} within quota ({used + 1}/{quota})"


def residency_note(req: RouteRequest, snap: MeshSnapshot, policy: Policy) -> str | None:
    if req.residency is None:
        return None
    return f"residency {req.residency}: only nodes whose labels allow it"


def exclude_note(req: RouteRequest, snap: MeshSnapshot, policy: Policy) -> str | None:
    if not req.exclude:
        return None
    return f"excluding {len(req.exclude)} peer(s) already tried"


def hop_limit_note(req: RouteRequest, snap: MeshSnapshot, policy: Policy) -> str | None:
    if req.hops < policy.max_hops:
        return None
    return f"hop limit reached ({req.hops}/{policy.max_hops}): local node only"


REQUEST_CONSTRAINTS: tuple[RequestConstraint, ...] = (
    model_allowed, quota_constraint, residency_note, exclude_note, hop_limit_note,
)  # fmt: skip


def global_constraints(req: RouteRequest, snap: MeshSnapshot, policy: Policy) -> list[str]:
    """The ``REQUEST_CONSTRAINTS`` that apply, in words, in order; raises when one of them rules
    everything out."""
    applied: list[str] = []
    for constraint in REQUEST_CONSTRAINTS:
        said = constraint(req, snap, policy)
        if said is not None:
            applied.append(said)
    return applied


# -- constraints on single nodes --------------------------------------------------------------

NodeConstraint = Callable[[RouteRequest, NodeView, Policy], str | None]


def already_tried(req: RouteRequest, n: NodeView, policy: Policy) -> str | None:
    return EXCLUDED_TRIED if n.peer_id in req.exclude else None


def residency(req: RouteRequest, n: NodeView, policy: Policy) -> str | None:
    if req.residency is not None and not residency_allows(n.labels, req.residency):
        return f"{EXCLUDED_RESIDENCY} (labels do not allow {req.residency})"
    return None


def hop_limit(req: RouteRequest, n: NodeView, policy: Policy) -> str | None:
    if req.hops >= policy.max_hops and not n.is_local:
        return f"{EXCLUDED_HOPS} ({req.hops}/{policy.max_hops})"
    return None


def busy(req: RouteRequest, n: NodeView, policy: Policy) -> str | None:
    queued = max(n.queue_depth, 0) + max(n.sent_since_advert, 0)
    if queued >= n.max_queue:
        return f"{EXCLUDED_BUSY} (queue {queued}/{n.max_queue})"
    return None


def kv_cache(req: RouteRequest, n: NodeView, policy: Policy) -> str | None:
    need = req.prompt_tokens + req.max_tokens
    if n.free_kv_tokens < need:
        return f"{EXCLUDED_KV} ({n.free_kv_tokens} free < {need})"
    return None


def memory(req: RouteRequest, n: NodeView, policy: Policy) -> str | None:
    """The node's free memory (a live hardware signal, ``meshd.core.hwsignals``) cannot hold
    the request's KV cache: ``(prompt + max_tokens) x`` the model's KV bytes per token there.
    Unknown memory or an unknown KV size never excludes."""
    if n.free_memory_bytes is None:
        return None
    need = req.prompt_tokens + req.max_tokens
    fits = kv_tokens_in_memory(n.free_memory_bytes, kv_bytes_per_token(n, req.model))
    if fits < need:
        return f"{EXCLUDED_MEMORY} ({n.free_memory_bytes} bytes hold {fits} tokens < {need})"
    return None


NODE_CONSTRAINTS: tuple[NodeConstraint, ...] = (
    already_tried, residency, hop_limit, busy, kv_cache, memory,
)  # fmt: skip


def exclusion_reason(req: RouteRequest, n: NodeView, policy: Policy) -> str | None:
    """Why a hard constraint on single nodes rules ``n`` out for ``req`` (the first of
    ``NODE_CONSTRAINTS`` that does), or None."""
    for constraint in NODE_CONSTRAINTS:
        why = constraint(req, n, policy)
        if why is not None:
            return why
    return None


# -- the same rules over a ModelIndex's columns -----------------------------------------------


def eligible(req: RouteRequest, idx: ModelIndex, policy: Policy) -> Positions:
    """Positions (in ``idx``, ascending) of the nodes that pass every one of
    ``NODE_CONSTRAINTS``. (``memory`` is inside the ``kv`` column: the index keeps there the
    fewer of the free KV tokens and the tokens whose KV cache fits in free memory.)"""
    need = req.prompt_tokens + req.max_tokens
    if len(idx.ids) >= NUMPY_MIN_NODES:
        return _eligible_np(req, idx, policy, need)
    queued, max_queue, kv = idx.queued, idx.max_queue, idx.kv
    out = [i for i in range(len(idx.ids)) if queued[i] < max_queue[i] and kv[i] >= need]
    if req.exclude:
        pos = idx.pos
        gone = {pos[p] for p in req.exclude if p in pos}
        if gone:
            out = [i for i in out if i not in gone]
    if req.residency is not None:
        allowed = residency_mask(idx, req.residency)
        out = [i for i in out if allowed[i]]
    if req.hops >= policy.max_hops:
        local = idx.local
        out = [i for i in out if local[i]]
    return out


def _eligible_np(req: RouteRequest, idx: ModelIndex, policy: Policy, need: int) -> Positions:
    cols = idx.cols()
    ok = cols.not_busy if need <= cols.kv_min else cols.not_busy & (cols.kv >= need)
    if req.exclude:
        gone = [idx.pos[p] for p in req.exclude if p in idx.pos]
        if gone:
            ok = ok.copy() if ok is cols.not_busy else ok
            ok[gone] = False
    if req.residency is not None:
        ok = ok & _residency_array(idx, cols, req.residency)
    if req.hops >= policy.max_hops:
        ok = ok & cols.local
    if ok is cols.not_busy:
        return cols.free  # the usual case: the same positions as last time
    out: Ints = ok.nonzero()[0]
    return out
