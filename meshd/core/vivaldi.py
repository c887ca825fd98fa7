"""Vivaldi network coordinates with height, error and adjustment terms (pure functions).

The model is Dabek et al., "Vivaldi: a decentralized network coordinate system" (SIGCOMM 2004)
with the refinements serf's coordinate package made popular: a height term for the access link,
an adaptive timestep driven by each side's error estimate (``ce``/``cc``), an optional gravity
towards the origin that keeps coordinates from drifting, and a per-node adjustment term learned
from residuals. Everything is in milliseconds.

Each node keeps its own ``Coord``, gossips it in its advert, and on every RTT sample it measures
to a peer calls ``update(local, remote, rtt_ms, cfg, rng)`` to get its next coordinate. Any node
can then estimate the RTT between any two coordinates with ``estimate_rtt_ms``. ``choose_rtt``
(or the ``RttBook`` that wraps it) prefers a fresh measured RTT over the estimate.

Nothing here reads a clock or does I/O: sample ages are passed in.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

ZERO_THRESHOLD_MS = 1e-6

# RTT sources, as shown by ``meshd peers`` and recorded with each routing decision.
SOURCE_LOCAL = "local"
SOURCE_MEASURED = "measured"
SOURCE_VIVALDI = "vivaldi"
SOURCE_UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class VivaldiConfig:
    """Tuning of the coordinate system; the defaults follow serf's (converted to ms)."""

    dimensionality: int = 8
    error_max: float = 1.5  # error estimates are clamped to this (it is a relative error)
    ce: float = 0.25  # how fast the error estimate moves
    cc: float = 0.25  # how far one sample moves the coordinate (the adaptive timestep's scale)
    height_min_ms: float = 0.01  # the height never drops below this
    adjustment_window: int = 20  # samples over which the adjustment term averages (0: off)
    gravity_rho_ms: float = 0.0  # > 0 pulls coordinates towards the origin (serf uses 150 s)


@dataclass(frozen=True, slots=True)
class Coord:
    """A point in the Vivaldi space: a Euclidean vector plus a non-negative height (ms).

    ``error`` is the node's confidence in its coordinate (a relative error, 1.5 at start, lower is
    better). ``adjustment`` is added to distances to absorb a systematic residual that the
    Euclidean model cannot express.
    """

    vec: tuple[float, ...]
    height: float = 0.01
    error: float = 1.5
    adjustment: float = 0.0

    @classmethod
    def origin(cls, cfg: VivaldiConfig | None = None) -> Coord:
        """The starting coordinate: the origin with maximal error."""
        c = cfg or VivaldiConfig()
        return cls((0.0,) * c.dimensionality, c.height_min_ms, c.error_max, 0.0)

    def is_valid(self) -> bool:
        """False if any component is NaN or infinite (such a coordinate must be discarded)."""
        parts = (*self.vec, self.height, self.error, self.adjustment)
        return all(math.isfinite(x) for x in parts)


def _raw_distance(a: Coord, b: Coord) -> float:
    return math.dist(a.vec, b.vec) + a.height + b.height


def estimate_rtt_ms(a: Coord, b: Coord) -> float:
    """Estimated RTT between two coordinates: Euclidean distance plus heights plus adjustments.

    The adjustments are only applied when they leave the estimate positive (as serf does).
    Coordinates of different dimensionality cannot be compared and raise ``ValueError``.
    """
    if len(a.vec) != len(b.vec):
        raise ValueError(f"coordinate dimensions differ: {len(a.vec)} != {len(b.vec)}")
    raw = _raw_distance(a, b)
    adjusted = raw + a.adjustment + b.adjustment
    return adjusted if adjusted > 0.0 else raw


def _unit_vector(
    frm: tuple[float, ...], to: tuple[float, ...], rng: random.Random | Sequence[float] | None
) -> tuple[tuple[float, ...], float]:
    """Unit vector pointing from ``to`` towards ``frm`` and the distance between them.

    When the two points coincide a random direction is used (from ``rng``, or ``rng`` itself
    when it is a sequence of jitter components), so nodes starting at the origin separate.
    """
    diff = tuple(x - y for x, y in zip(frm, to, strict=True))
    mag = math.hypot(*diff)
    if mag > ZERO_THRESHOLD_MS:
        return tuple(d / mag for d in diff), mag
    if rng is None:
        direction: tuple[float, ...] = (1.0,) + (0.0,) * (len(frm) - 1)
    elif isinstance(rng, random.Random):
        direction = tuple(rng.gauss(0.0, 1.0) for _ in frm)
    else:
        direction = tuple(float(x) for x in rng)
        if len(direction) != len(frm):
            raise ValueError(f"jitter has {len(direction)} components, expected {len(frm)}")
    dmag = math.hypot(*direction)
    if dmag <= ZERO_THRESHOLD_MS:
        direction, dmag = (1.0,) + (0.0,) * (len(frm) - 1), 1.0
    return tuple(d / dmag for d in direction), 0.0


def _apply_force(
    cfg: VivaldiConfig,
    c: Coord,
    force: float,
    other: Coord,
    rng: random.Random | Sequence[float] | None,
) -> Coord:
    """Move ``c`` by ``force`` ms away from ``other`` (towards it when negative)."""
    unit, mag = _unit_vector(c.vec, other.vec, rng)
    vec = tuple(x + u * force for x, u in zip(c.vec, unit, strict=True))
    height = c.height
    if mag > ZERO_THRESHOLD_MS:
        height = (c.height + other.height) * force / mag + c.height
    return replace(c, vec=vec, height=max(height, cfg.height_min_ms))


def _apply_gravity(cfg: VivaldiConfig, c: Coord) -> Coord:
    if cfg.gravity_rho_ms <= 0.0:
        return c
    mag = math.hypot(*c.vec)
    if mag <= ZERO_THRESHOLD_MS:
        return c
    pull = (mag / cfg.gravity_rho_ms) ** 2
    vec = tuple(x - x / mag * pull for x in c.vec)
    return replace(c, vec=vec)


def update(
    local: Coord,
    remote: Coord,
    rtt_ms: float,
    cfg: VivaldiConfig | None = None,
    rng: random.Random | Sequence[float] | None = None,
) -> Coord:
    """The local coordinate after one RTT sample to a node at ``remote``.

    The step is weighted by ``local.error / (local.error + remote.error)``: a confident node
    barely moves for an unsure peer and an unsure node moves a lot towards a confident one.
    ``rng`` (a ``random.Random``, or a sequence of jitter components) only picks a direction when
    the two coordinates coincide, as they do at the start. Invalid samples (not finite, negative)
    and invalid remote coordinates leave ``local`` unchanged.
    """
    c = cfg or VivaldiConfig()
    if len(local.vec) != len(remote.vec):
        raise ValueError(f"coordinate dimensions differ: {len(local.vec)} != {len(remote.vec)}")
    if not (math.isfinite(rtt_ms) and rtt_ms >= 0.0) or not remote.is_valid():
        return local
    rtt = max(rtt_ms, ZERO_THRESHOLD_MS)
    dist = _raw_distance(local, remote)
    wrongness = abs(dist - rtt) / rtt
    total_error = max(local.error + remote.error, ZERO_THRESHOLD_MS)
    weight = local.error / total_error
    error = c.ce * weight * wrongness + local.error * (1.0 - c.ce * weight)
    error = min(error, c.error_max)
    force = c.cc * weight * (rtt - dist)
    moved = _apply_force(c, replace(local, error=error), force, remote, rng)
    moved = _apply_gravity(c, moved)
    if c.adjustment_window > 0:
        # An exponential average of half the residual: the pure stand-in for serf's window.
        residual = rtt - _raw_distance(moved, remote)
        adj = moved.adjustment + (residual / 2.0 - moved.adjustment) / c.adjustment_window
        moved = replace(moved, adjustment=adj)
    return moved if moved.is_valid() else local


def median_filter(samples: Sequence[float]) -> float:
    """The median of the last few raw RTT samples to one peer (serf keeps 3): drops outliers."""
    if not samples:
        raise ValueError("median of no samples")
    s = sorted(samples)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2.0


def choose_rtt(
    measured_ms: float | None,
    measured_age_s: float | None,
    local: Coord | None,
    remote: Coord | None,
    *,
    max_age_s: float = 30.0,
    unknown_ms: float = 100.0,
) -> tuple[float, str]:
    """The best RTT we have to one peer, and where it came from.

    A measured RTT younger than ``max_age_s`` wins ("measured"); otherwise the Vivaldi estimate
    between the two coordinates ("vivaldi"); otherwise a stale measurement is still better than
    nothing ("measured"); failing all of that ``unknown_ms`` ("unknown").
    """
    fresh = measured_ms is not None and measured_age_s is not None and measured_age_s <= max_age_s
    if fresh and measured_ms is not None:
        return measured_ms, SOURCE_MEASURED
    if (
        local is not None
        and remote is not None
        and len(local.vec) == len(remote.vec)
        and local.is_valid()
        and remote.is_valid()
    ):
        return estimate_rtt_ms(local, remote), SOURCE_VIVALDI
    if measured_ms is not None:
        return measured_ms, SOURCE_MEASURED
    return unknown_ms, SOURCE_UNKNOWN


@dataclass(frozen=True, slots=True)
class RttBook:
    """An immutable book of measured RTTs (peer id -> (rtt_ms, measured_at_s)) and coordinates.

    ``with_sample`` and ``with_coord`` return new books; ``lookup`` answers ``choose_rtt`` for one
    peer at the time ``now_s`` that the caller passes in.
    """

    local: Coord | None = None
    measured: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    coords: Mapping[str, Coord] = field(default_factory=dict)
    max_age_s: float = 30.0
    unknown_ms: float = 100.0

    def with_sample(self, peer_id: str, rtt_ms: float, at_s: float) -> RttBook:
        measured = dict(self.measured)
        measured[peer_id] = (rtt_ms, at_s)
        return replace(self, measured=measured)

    def with_coord(self, peer_id: str, coord: Coord) -> RttBook:
        coords = dict(self.coords)
        coords[peer_id] = coord
        return replace(self, coords=coords)

    def with_local(self, coord: Coord) -> RttBook:
        return replace(self, local=coord)

    def lookup(self, peer_id: str, now_s: float) -> tuple[float, str]:
        """(rtt_ms, source) to ``peer_id``: fresh measurement, else Vivaldi, else stale, else unknown."""
        m = self.measured.get(peer_id)
        return choose_rtt(
            m[0] if m else None,
            (now_s - m[1]) if m else None,
            self.local,
            self.coords.get(peer_id),
            max_age_s=self.max_age_s,
            unknown_ms=self.unknown_ms,
        )
