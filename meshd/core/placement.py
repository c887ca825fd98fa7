"""Which layer range a node on ``auto`` should serve (docs/routing.md, "Placement").

A pipeline is as strong as its weakest layer: the mesh's capacity for a model is the minimum,
over its layers, of the capacity serving that layer. ``choose_range`` picks the window of
``my_capacity_layers`` consecutive layers that, added to what the node hears from other nodes'
adverts, makes that minimum as high as possible (then leaves as few layers as possible at it,
then compares the next weakest layers, and so on: a leximin order). It moves away from the
range the node serves now only when the move clearly helps, so small changes in what it hears
(speeds measured a little differently, a peer's advert missed) never make it flap.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from meshd.errors import ConfigError


def _coverage(heard: Sequence[float], start: int, size: int, speed: float) -> list[float]:
    cov = list(heard)
    for layer in range(start, start + size):
        cov[layer] += speed
    return cov


def _weak(cov: Sequence[float], level: float) -> int:
    """How many layers are at or below ``level``."""
    return sum(1 for c in cov if c <= level)


def choose_range(
    model: str,
    num_layers: int,
    my_capacity_layers: int,
    heard: Sequence[float],
    current: tuple[int, int] | None,
    hysteresis: float = 0.5,
    *,
    my_speed: float = 1.0,
) -> tuple[int, int]:
    """The layer range ``(start, end)`` (half open) this node should serve for ``model``.

    ``heard[l]`` is the capacity serving layer ``l`` according to the other nodes' adverts (not
    counting this node), in the same unit as ``my_speed``: 1.0 per replica to count replicas,
    or tokens per second to weigh speed. ``my_capacity_layers`` is how many layers fit in this
    node's memory. ``current`` is the range served now (None at start).

    The node stays on ``current`` unless the best range raises the weakest layer's coverage by
    more than ``hysteresis``, or, without lowering it, leaves fewer layers within ``hysteresis``
    of the weakest level than ``current`` leaves at that level. Ties go to ``current``, then to the lowest start. The caller should
    re-hear adverts after a move before deciding again, and decide at a randomised moment of the
    advert interval, so that two nodes never move in lock-step.
    """
    if num_layers <= 0:
        raise ConfigError(f"model {model}: num_layers must be positive, got {num_layers}")
    if len(heard) != num_layers:
        raise ConfigError(
            f"model {model}: heard coverage has {len(heard)} layers, expected {num_layers}"
        )
    size = min(my_capacity_layers, num_layers)
    if size <= 0:
        raise ConfigError(
            f"model {model}: this node has room for no layer (capacity {my_capacity_layers})"
        )
    cur: tuple[int, int] | None = None
    if (
        current is not None
        and current[1] - current[0] == size
        and current[0] >= 0
        and current[1] <= num_layers
    ):
        cur = current

    def rank(start: int) -> tuple[tuple[float, ...], bool, int]:
        cov = _coverage(heard, start, size, my_speed)
        return (tuple(sorted(cov)), cur is not None and start == cur[0], -start)

    best = max(range(num_layers - size + 1), key=rank)
    if cur is None or best == cur[0]:
        return (best, best + size)
    now = _coverage(heard, cur[0], size, my_speed)
    then = _coverage(heard, best, size, my_speed)
    now_min, then_min = min(now), min(then)
    if then_min > now_min + hysteresis:
        return (best, best + size)
    # Fewer weak layers: counted against a bar raised by the hysteresis for the new range and
    # not for the current one, so that no two ranges can each look better than the other.
    if then_min >= now_min and _weak(then, now_min + hysteresis) < _weak(now, now_min):
        return (best, best + size)
    return cur


def outranked(my_id: str, current: tuple[int, int],
              peers: Iterable[tuple[str, tuple[int, int]]]) -> bool:
    """True when a peer with a lower peer ID serves exactly ``current`` (pure).

    Nodes that share a range hear the same coverage apart from each other, so they all want
    the same move. If each acted, they would land on the same target together and move again;
    if one acts on a picture in which the other has not moved yet, the two swap. The node with
    the lowest peer ID of those sharing the range goes first; the others wait to hear it.
    ``peers`` is ``(peer_id, (layer_start, layer_end))`` for each other node serving the model.
    """
    return any(pid < my_id and rng == current for pid, rng in peers)


class MoveGate:
    """A node moves only when two decisions in a row pick the same target on the same picture,
    and, when it shares its range with a node of lower peer ID, only after it has waited
    ``patience`` decisions on one picture for that node to move first.

    One decision can be made on a stale picture: another node's advert announcing its own move
    is still in flight, or a peer looks gone for a moment. Acting on it makes two nodes swap
    ranges back and forth. Asking for the same target, from the same coverage, one decision
    later (a random fraction of an advert interval) lets that picture refresh first. The wait
    behind a senior node (``outranked``) covers a picture that stays stale for longer, on a
    loaded host: the senior's move, once heard, changes what this node wants. A senior that
    never moves (its layers are fixed) delays this node by ``patience`` decisions only.
    """

    def __init__(self, patience: int = 6) -> None:
        self.patience = patience
        self._pending: dict[str, tuple[tuple[int, int], tuple[float, ...]]] = {}
        self._waited: dict[str, tuple[tuple[float, ...], int]] = {}

    def confirm(self, model: str, current: tuple[int, int], target: tuple[int, int],
                heard: Sequence[float], outranked: bool = False) -> bool:
        """True when this node should move ``model`` to ``target`` now."""
        if target == current:
            self._pending.pop(model, None)
            self._waited.pop(model, None)
            return False
        if not outranked:
            self._waited.pop(model, None)
        else:
            picture, waited = self._waited.get(model, (tuple(heard), 0))
            if picture != tuple(heard):  # something moved: the wait starts over
                waited = 0
            if waited < self.patience:
                self._waited[model] = (tuple(heard), waited + 1)
                self._pending.pop(model, None)
                return False
        seen = (target, tuple(heard))
        if self._pending.get(model) == seen:
            del self._pending[model]
            self._waited.pop(model, None)
            return True
        self._pending[model] = seen
        return False

    def pending(self, model: str) -> tuple[int, int] | None:
        p = self._pending.get(model)
        return None if p is None else p[0]
