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

from collections.abc import Sequence

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


class MoveGate:
    """A node moves only when two decisions in a row pick the same target on the same picture.

    One decision can be made on a stale picture: another node's advert announcing its own move
    is still in flight, or a peer looks gone for a moment. Acting on it makes two nodes swap
    ranges back and forth. Asking for the same target, from the same coverage, one decision
    later (a random fraction of an advert interval) lets that picture refresh first.
    """

    def __init__(self) -> None:
        self._pending: dict[str, tuple[tuple[int, int], tuple[float, ...]]] = {}

    def confirm(self, model: str, current: tuple[int, int], target: tuple[int, int],
                heard: Sequence[float]) -> bool:
        """True when this node should move ``model`` to ``target`` now."""
        if target == current:
            self._pending.pop(model, None)
            return False
        seen = (target, tuple(heard))
        if self._pending.get(model) == seen:
            del self._pending[model]
            return True
        self._pending[model] = seen
        return False

    def pending(self, model: str) -> tuple[int, int] | None:
        p = self._pending.get(model)
        return None if p is None else p[0]
