"""Cell summaries: what one cell tells the whole mesh about itself, signed by the member that
published it. Pure: bytes and the time in, a summary or a rejection out.

A summary travels as a ``SUMMARY`` envelope ``{body, sig, cert}`` on the mesh-wide summary topic
(``meshd.core.cells.SUMMARY_TOPIC``), exactly as an advert does on its cell's topic: ``sig`` is
the author's Ed25519 signature over ``b"meshd-summary-v1\\0" + body``, ``cert`` its CA
certificate. The body (msgpack, at most ``MAX_SUMMARY_BYTES``):

    {"v": 1, "cell": str, "period": int, "ts": float, "members": int,
     "coord": [float, ...],                      # the members' centroid (Vivaldi)
     "models": [{"name", "cap", "best_ms", "q50", "q90", "nodes": [peer id, ...]}, ...],
     "reps": [{"id": peer id, "name": str, "addrs": [multiaddr, ...]}, ...]}

``cap`` is the sum of the members' service rates (requests/s), ``best_ms`` the best wait for a
typical request (``meshd.core.probes.typical_wait_ms``), ``q50``/``q90`` percentiles of the
members' load (queued + running), ``nodes`` the least-loaded members (best first) and ``reps``
how to dial every node named. A summary only steers probes: the nodes it names answer for
themselves with a fresh signed advert.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

from meshd.core.advert_check import AUTHOR_MISMATCH, MALFORMED, AdvertChecker, Rejected
from meshd.core.messages import MessageType
from meshd.core.wire import decode_message, encode_message, pack, unpack
from meshd.errors import ProtocolError

SIGN_CONTEXT = b"meshd-summary-v1\0"
SUMMARY_VERSION = 1
MAX_SUMMARY_BYTES = 4096
MAX_ENVELOPE_BYTES = MAX_SUMMARY_BYTES + 2048
MAX_MODELS = 16
MAX_NODES = 8  # per model
MAX_REPS = 32
MAX_ADDRS = 2  # per named node
MAX_SKEW_S = 120.0
WRONG_CELL = "wrong_cell"
_SUMMARY_ONLY = frozenset({int(MessageType.SUMMARY)})


def signing_payload(body: bytes) -> bytes:
    """What a summary's author signs: the context, then the body."""
    return SIGN_CONTEXT + body


@dataclass(frozen=True, slots=True)
class ModelSummary:
    name: str
    capacity_rps: float  # the members' service rates, summed
    best_ms: float  # the best wait of a typical request in the cell (no RTT)
    queue_p50: float  # members' load (queued + running), percentiles
    queue_p90: float
    nodes: tuple[str, ...]  # the least-loaded members, best first


@dataclass(frozen=True, slots=True)
class Rep:
    peer_id: str
    name: str
    addrs: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class CellSummary:
    cell: str
    author: str  # the member that published it (peer id)
    period: int
    ts: float  # wall clock when published
    members: int
    models: tuple[ModelSummary, ...] = ()
    reps: tuple[Rep, ...] = ()
    coord: tuple[float, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    def model(self, name: str) -> ModelSummary | None:
        return next((m for m in self.models if m.name == name), None)

    def to_dict(self) -> dict[str, Any]:
        return {
            "v": SUMMARY_VERSION, "cell": self.cell, "author": self.author, "period": self.period,
            "ts": self.ts, "members": self.members, "coord": list(self.coord),
            "models": [{"name": m.name, "cap": round(m.capacity_rps, 3), "best_ms": round(m.best_ms, 1),
                        "q50": m.queue_p50, "q90": m.queue_p90, "nodes": list(m.nodes)}
                       for m in self.models],
            "reps": [{"id": r.peer_id, "name": r.name, "addrs": list(r.addrs)} for r in self.reps],
        }

    def encode(self) -> bytes:
        """The body; models past the size cap are left out (the least-served last)."""
        s = self
        while True:
            body = pack(s.to_dict())
            if len(body) <= MAX_SUMMARY_BYTES or not s.models:
                break
            s = trimmed(s)
        if len(body) > MAX_SUMMARY_BYTES:
            raise ProtocolError(f"summary of {len(body)} bytes exceeds {MAX_SUMMARY_BYTES}")
        return body


def trimmed(s: CellSummary) -> CellSummary:
    """``s`` without its last model, and without the nodes only that model named."""
    models = s.models[:-1]
    named = {p for m in models for p in m.nodes}
    return CellSummary(s.cell, s.author, s.period, s.ts, s.members, models,
                       tuple(r for r in s.reps if r.peer_id in named), s.coord)


def percentile(xs: list[float], q: float) -> float:
    """The ``q`` quantile (nearest rank) of ``xs``; 0 for none."""
    if not xs:
        return 0.0
    ys = sorted(xs)
    return float(ys[min(len(ys) - 1, int(q * len(ys)))])


# ---------------------------------------------------------------------------------- decoding


def _get(d: dict[str, Any], key: str, kind: type | tuple[type, ...]) -> Any:
    v = d.get(key)
    if v is None or isinstance(v, bool) or not isinstance(v, kind):
        raise ProtocolError(f"summary field '{key}' is missing or has the wrong type")
    return v


def _num(d: dict[str, Any], key: str) -> float:
    v = float(_get(d, key, (int, float)))
    if not math.isfinite(v) or v < 0:
        raise ProtocolError(f"summary field '{key}' is out of range")
    return v


def _strs(v: Any, cap: int, what: str) -> tuple[str, ...]:
    if not isinstance(v, list) or len(v) > cap or not all(isinstance(x, str) and len(x) < 256 for x in v):
        raise ProtocolError(f"summary {what} must be a short list of strings")
    return tuple(v)


def decode_summary(body: bytes) -> CellSummary:
    """Schema-check a summary body. Raises only ``ProtocolError``."""
    d = unpack(body, MAX_SUMMARY_BYTES)
    if not isinstance(d, dict) or _get(d, "v", int) < 1:
        raise ProtocolError("summary body must be a map of version >= 1")
    models, reps = _get(d, "models", list), _get(d, "reps", list)
    if len(models) > MAX_MODELS or len(reps) > MAX_REPS:
        raise ProtocolError("summary lists too many models or nodes")
    out_models = []
    for m in models:
        if not isinstance(m, dict):
            raise ProtocolError("summary model entry must be a map")
        name = _get(m, "name", str)
        out_models.append(ModelSummary(name[:128], _num(m, "cap"), _num(m, "best_ms"), _num(m, "q50"),
                                       _num(m, "q90"), _strs(m.get("nodes"), MAX_NODES, "nodes")))
    out_reps = []
    for r in reps:
        if not isinstance(r, dict):
            raise ProtocolError("summary node entry must be a map")
        out_reps.append(Rep(_get(r, "id", str)[:128], _get(r, "name", str)[:128],
                            _strs(r.get("addrs"), MAX_ADDRS, "addrs")))
    vec = _get(d, "coord", list)
    if len(vec) > 16 or not all(isinstance(x, int | float) and not isinstance(x, bool)
                                and math.isfinite(x) for x in vec):
        raise ProtocolError("summary coordinate must be a short list of finite numbers")
    cell = _get(d, "cell", str)
    period, members = _get(d, "period", int), _get(d, "members", int)
    if not cell or len(cell) > 64 or period < 0 or not 0 <= members <= 1 << 30:
        raise ProtocolError("summary cell, period or members out of range")
    return CellSummary(cell, _get(d, "author", str)[:128], period, _num(d, "ts"), members,
                       tuple(out_models), tuple(out_reps), tuple(float(x) for x in vec))


# --------------------------------------------------------------------------- sign and check


def seal_summary(summary: CellSummary, sign: Callable[[bytes], bytes], cert_bytes: bytes) -> bytes:
    body = summary.encode()
    return encode_message(MessageType.SUMMARY,
                          {"body": body, "sig": sign(signing_payload(body)), "cert": cert_bytes})


def claimed_author(data: object) -> str | None:
    """The author a SUMMARY envelope's body names, checking nothing else (a synced summary
    names its author only inside: ``check_summary`` then verifies it)."""
    if not isinstance(data, bytes) or len(data) > MAX_ENVELOPE_BYTES:
        return None
    try:
        return decode_summary(decode_message(data, MAX_ENVELOPE_BYTES, _SUMMARY_ONLY)["body"]).author
    except ProtocolError:
        return None


def check_summary(data: bytes, author: str, now: float, checker: AdvertChecker,
                  cell_of_cert: Callable[[str, dict[str, str]], str | None], *,
                  revoked: Collection[int] = frozenset()) -> CellSummary | Rejected:
    """A gossiped ``SUMMARY`` envelope from ``author`` at wall-clock ``now``: the certificate is
    this CA's, the author's, not revoked; the signature holds; the body decodes; it names its
    author; and the author belongs to the cell it summarises (``cell_of_cert(peer id, labels)``)."""
    opened = checker.open_envelope(data, author, now, _SUMMARY_ONLY, MAX_ENVELOPE_BYTES,
                                   signing_payload, revoked)
    if isinstance(opened, Rejected):
        return opened
    msg, cert = opened
    try:
        s = decode_summary(msg["body"])
    except ProtocolError as e:
        return Rejected(MALFORMED, str(e))
    if s.author != author:
        return Rejected(AUTHOR_MISMATCH)
    if cell_of_cert(author, dict(cert.labels)) != s.cell:
        return Rejected(WRONG_CELL, f"the author is not a member of cell {s.cell}")
    if abs(s.ts - now) > MAX_SKEW_S:
        return Rejected("stale", f"published {now - s.ts:.0f} s from now")
    return s
