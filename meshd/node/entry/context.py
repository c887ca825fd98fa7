"""What the entry chain's steps share: the request's context, and what they need of the node.

Every step is ``async def step(ctx: EntryContext, node: EntryNode) -> None``.
``EntryContext`` is the request on its way through the chain: each step reads what earlier
steps left in it and adds its own part (the model and token ids, the decision, the outcome, the
answer). ``EntryNode`` is the narrow view of the node the steps use; ``meshd.node.node.Node``
conforms, and a test may pass anything else that does. ``EntryState`` is what the entry path
keeps across requests (ids and clients in flight, its counters, the round-robin position, the
observers). ``Reach`` and ``Retrieval`` are what the reach and augment steps need of the cells
and retrieval services.
"""

from __future__ import annotations

import itertools
import random
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from meshd.config import Config
from meshd.core.decide import Decision
from meshd.core.packing import pack_ids, vocab_bound
from meshd.core.request import EntryRequest
from meshd.core.snapshot import Policy, RouteRequest
from meshd.core.tokident import short_id
from meshd.errors import MeshdError, RemoteError
from meshd.node.edge_cache import EdgeCache
from meshd.node.forward import Outcome
from meshd.node.links import Links
from meshd.node.runner import Runner
from meshd.node.stagelinks import StageLinks
from meshd.node.tiering import Tiering
from meshd.node.tokenizers import TokenizerService
from meshd.node.view import MeshView
from meshd.store.protocol import Recorder

Emit = Callable[[str, dict[str, Any]], Awaitable[None]]
"""``await emit(kind, payload)``: "route" ({"served_by", "route"}) and "tokens" ({"ids", "text"})."""

Journal = Callable[[str, dict[str, Any]], None]
"""``journal(kind, payload)``: one event of the request in the node's journal (never raises)."""

Observer = Callable[[dict[str, Any]], None]
"""``observer(event)``: told once of every recorded request's end (the record step)."""


@dataclass(slots=True)
class EntryState:
    """What the entry path keeps across requests at this node."""

    rr_offset: int = 0  # where this node's round-robin starts (``meshd.node.node``)
    in_flight: set[str] = field(default_factory=set)  # ids admitted here and not yet recorded
    client_in_flight: dict[str, int] = field(default_factory=dict)  # executing, per client
    observers: list[Observer] = field(default_factory=list)
    stats: dict[str, int] = field(default_factory=lambda: {
        "submitted": 0, "answered": 0, "failed": 0, "duplicate_ids": 0, "timeouts": 0,
        "cancelled": 0})
    _rr: Iterator[int] = field(init=False)

    def __post_init__(self) -> None:
        self._rr = itertools.count(self.rr_offset)

    def next_rr(self) -> int:
        """The round-robin position of the next decision (route, and execute's new ones)."""
        return next(self._rr)


class Reach(Protocol):
    """What the reach step needs of the cells service (``meshd.node.cells.Cells``)."""

    async def reach(self, model: str, *, need: bool, residency: str | None = None) -> None: ...


class Retrieval(Protocol):
    """What the augment step needs of the retrieval service (``meshd.node.rag.RagService``)."""

    async def retrieve(self, collection: str, question: str, k: int) -> dict[str, Any]: ...


class EntryNode(Protocol):
    """What the entry chain needs of the node."""

    config: Config
    runner: Runner
    policy: Policy
    rng: random.Random
    tokenizers: TokenizerService  # edge tokenization: tokenizers of models served elsewhere
    node_name: str
    peer_id: str
    stats: dict[str, int]  # the entry path's counters

    @property
    def store(self) -> Recorder | None: ...  # None: nothing recorded

    @property
    def membership(self) -> MeshView: ...

    @property
    def links(self) -> Links | None: ...  # once the node runs

    @property
    def stage_links(self) -> StageLinks: ...  # pipelines

    @property
    def cells(self) -> Reach | None: ...  # cells on: probes of other cells (meshd.node.cells)

    @property
    def entry_state(self) -> EntryState: ...

    @property
    def tiering(self) -> Tiering: ...  # model = "auto": the tier classifier (meshd.node.tiering)

    @property
    def edge_cache(self) -> EdgeCache | None: ...  # the answer cache (None: none runs)

    @property
    def rag(self) -> Retrieval | None: ...  # retrieval collections (None: none)


@dataclass(slots=True)
class EntryContext:
    """One request on its way through the entry chain (``meshd.node.entry.chain``)."""

    req: EntryRequest
    emit: Emit
    journal: Journal
    started: float = field(default_factory=time.perf_counter)
    admitted: bool = False  # admit: in this node's requests in flight (else refused, unrecorded)
    cancelled: bool = False  # the client went away before the chain was done (record reads it)
    # prepare
    model: str = ""
    prompt_ids: list[int] = field(default_factory=list)  # empty: the serving node tokenizes
    prompt_tokens: int = 0  # exact when prompt_ids are known, else an estimate
    tokenizer: str = ""  # identity of the tokenizer that made prompt_ids ("" if unknown)
    vocab_size: int = 0  # of that tokenizer or model (0: unknown): picks the packed dtype
    max_tokens: int = 0
    notes: list[str] = field(default_factory=list)  # said to the client (e.g. a clamp)
    # route
    policy: Policy | None = None
    route_req: RouteRequest | None = None
    decision: Decision | None = None
    no_route: RemoteError | None = None  # decide() found no node (execute fails with it)
    # execute
    outcome: Outcome | None = None
    answer: dict[str, Any] | None = None  # the final stats; set when the request is answered
    error: MeshdError | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # what later steps add (cache, rag, tier)

    @property
    def strategy(self) -> str:
        return self.policy.strategy if self.policy is not None else ""

    def wire_fields(self) -> dict[str, Any]:
        """The request as REQ/STAGE_OPEN fields: token ids when this node tokenized it, the text
        otherwise; the generation settings with the budget ``prepare`` settled."""
        out: dict[str, Any] = {"rid": self.req.request_id, "model": self.model,
                               "max_tokens": self.max_tokens, **self.req.sampling.fields()}
        if not self.prompt_ids:
            out["prompt"] = self.req.prompt or ""
            out["chat"] = self.req.chat
        elif self.tokenizer:
            out["tok"] = short_id(self.tokenizer)
        return out

    def packed_prompt(self) -> dict[str, Any]:
        """The prompt's ids as the packed REQ/STAGE_OPEN fields ({} when only text is known)."""
        if not self.prompt_ids:
            return {}
        dtype, data = pack_ids(self.prompt_ids, vocab_bound(self.prompt_ids, self.vocab_size))
        return {"prompt_ids": [], "prompt_packed": data, "prompt_dtype": dtype}
