"""``layers = "auto"``: serve the layer range that most helps the mesh, and move rarely.

At start a node on ``auto`` loads ``[0, capacity)`` (or the whole model when it fits: then
there is nothing to choose). Once it has heard adverts it decides, at a random moment of each
advert interval, with the pure ``meshd.core.placement.choose_range`` over the coverage it hears
(replicas per layer of the same model, this node not counted): it moves only when the move
clearly helps (hysteresis), only when the next decision picks the same target on the same
picture (``MoveGate``: a picture can be stale while another node's move is still being gossiped),
only after a node of lower peer ID that shares its range has had a few decisions to move
first (``outranked``: nodes sharing a range all want the same move), never while it serves a
request on that model, and after a move it waits two advert intervals, so that the others
hear it, before deciding again. Coverage counts every peer in the table,
stalled ones too: a peer that is slow for a moment has not left its layers. A move re-loads
the model for the new range and publishes an advert at once.
"""

from __future__ import annotations

import logging
import os
import random
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import trio

from meshd.config import Config
from meshd.core.advert import Advert
from meshd.core.peertable import PeerTable
from meshd.core.placement import MoveGate, choose_range, outranked
from meshd.node.engine_model import EngineModel, default_model_dir, load_engine_model
from meshd.node.runner import Runner, Served
from meshd.node.stages import StageServer

log = logging.getLogger(__name__)

HYSTERESIS = 0.5  # replicas
SETTLE_INTERVALS = 2.0


def heard_coverage(adverts: Iterable[Advert], model: str, num_layers: int) -> list[float]:
    """Replicas serving each layer of ``model`` according to ``adverts`` (pure)."""
    cov = [0.0] * num_layers
    for a in adverts:
        for m in a.models:
            if m.name == model and m.num_layers == num_layers:
                for layer in range(max(m.layer_start, 0), min(m.layer_end, num_layers)):
                    cov[layer] += 1.0
    return cov


def capacity_layers(path: Path, max_layers: int, free_bytes: int | None = None) -> int:
    """How many layers of the model at ``path`` this node takes on ``auto``: ``max_layers`` when
    set, else as many as fit in half of the free memory (a first or last stage, the larger)."""
    from meshd.engine import read_manifest
    from meshd.engine.planning import stage_memory

    man = read_manifest(path)
    n = man.arch.num_layers
    if max_layers > 0:
        return min(max_layers, n)
    if free_bytes is None:
        try:
            free_bytes = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError):
            return n
    budget = free_bytes // 2
    ctx = man.arch.max_position_embeddings
    fits = 1
    for k in range(1, n + 1):
        need = max(stage_memory(man.arch, s, s + k, man.dtype).total(ctx) for s in (0, n - k))
        if need <= budget:
            fits = k
    return fits


def initial_range(path: Path, max_layers: int) -> tuple[int, int] | None:
    """The range a node on ``auto`` loads at start: None (every layer) when they all fit."""
    from meshd.engine import read_manifest

    n = read_manifest(path).arch.num_layers
    cap = capacity_layers(path, max_layers)
    return None if cap >= n else (0, cap)


@dataclass
class _Auto:
    name: str
    path: Path
    capacity: int
    cfg: Any  # the ModelConfig


class Heard(Protocol):
    """What placement needs of membership (``meshd.node.membership.Membership``): the adverts it
    holds, and a way to tell the mesh at once that this node moved."""

    table: PeerTable

    async def publish_advert(self) -> None: ...


class AutoPlacer:
    def __init__(self, config: Config, runner: Runner, membership: Heard, stages: StageServer) -> None:
        self.config = config
        self.runner = runner
        self.membership = membership
        self.stages = stages
        self.rng = random.Random()
        self.stats = {"decisions": 0, "moves": 0, "deferred": 0, "unconfirmed": 0,
                      "reload_failures": 0}
        self.gate = MoveGate()
        self.autos: list[_Auto] = []

    def _find(self) -> list[_Auto]:
        cfg = self.config
        out = []
        for m in cfg.models:
            if m.layers != "auto":
                continue
            from meshd.engine import read_manifest  # only here: a node without models skips it

            path = default_model_dir() if m.path == "default" else cfg.path(m.path)
            name = m.name or read_manifest(path).name
            out.append(_Auto(name, Path(path), capacity_layers(Path(path), m.max_layers), m))
        return out

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        self.autos = [a for a in self._find() if self.runner.get(a.name) is not None]
        task_status.started()
        if not self.autos:
            return
        interval = self.config.gossip.advert_interval_s
        quiet_until = trio.current_time() + SETTLE_INTERVALS * interval
        while True:
            await trio.sleep(interval * self.rng.uniform(0.5, 1.5))
            if trio.current_time() < quiet_until or len(self.membership.table) == 0:
                continue
            for a in self.autos:
                if await self._decide(a):
                    quiet_until = trio.current_time() + SETTLE_INTERVALS * interval

    async def _decide(self, a: _Auto) -> bool:
        s = self.runner.get(a.name)
        if s is None:
            return False
        n = s.num_layers
        if a.capacity >= n:
            return False
        adverts = [e.advert for e in self.membership.table.known()]
        heard = heard_coverage(adverts, a.name, n)
        current = (s.layer_start, s.layer_end)
        self.stats["decisions"] += 1
        target = choose_range(a.name, n, a.capacity, heard, current, HYSTERESIS)
        junior = outranked(self.membership.table.local_peer_id, current, (
            (ad.peer_id, (m.layer_start, m.layer_end))
            for ad in adverts for m in ad.models if m.name == a.name and m.num_layers == n))
        if not self.gate.confirm(a.name, current, target, heard, junior):
            if target != current:
                self.stats["unconfirmed"] += 1
            return False
        busy = s.running or s.waiting or any(
            x.model == a.name for x in self.stages.sessions.values())
        if busy:
            self.stats["deferred"] += 1
            return False
        try:
            await self._reload(a, target)
        except Exception as e:  # the old range keeps serving
            self.stats["reload_failures"] += 1
            log.warning("layer range move failed model=%s target=%s error=%r", a.name, target, e)
            return False
        self.stats["moves"] += 1
        log.info("layer range moved model=%s from=%d-%d to=%d-%d heard=%s", a.name, current[0],
                 current[1], target[0], target[1], ",".join(f"{c:g}" for c in heard))
        await self.membership.publish_advert()
        return True

    async def _reload(self, a: _Auto, target: tuple[int, int]) -> None:
        def load() -> Any:
            return load_engine_model(self.config, a.path, target)

        model = await trio.to_thread.run_sync(load)
        old = self.runner.models[a.name]
        self.runner.models[a.name] = Served(
            name=a.name, model=EngineModel(model), layer_start=target[0], layer_end=target[1],
            num_layers=old.num_layers, max_concurrency=old.max_concurrency,
            max_queue=old.max_queue, max_decode_tps=getattr(old, "max_decode_tps", 0.0),
            max_prefill_tps=getattr(old, "max_prefill_tps", 0.0))

    def statistics(self) -> dict[str, Any]:
        return {**self.stats, "auto_models": {
            a.name: {"capacity_layers": a.capacity,
                     "layers": [s.layer_start, s.layer_end] if (s := self.runner.get(a.name)) else None}
            for a in self.autos}}
