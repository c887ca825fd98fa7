"""Adverts: what a node tells the mesh about itself, signed by its author.

An advert travels as an ``ADVERT`` envelope ``{body, sig, cert}``: ``body`` is the msgpack map
below, ``sig`` the author's Ed25519 signature over ``b"meshd-advert-v1\\0" + body`` with its
libp2p identity key, ``cert`` the author's CA certificate (so a node that never connected to
the author can still check the signature). Bodies are size-capped and schema-checked here;
certificate checks live in ``meshd.core.cert``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from meshd.core.prefix_names import SKETCH_MAX_BYTES, valid_sketch
from meshd.core.wire import MAX_ADVERT_BYTES, pack, unpack
from meshd.errors import ProtocolError

SIGN_CONTEXT = b"meshd-advert-v1\0"
ADVERT_VERSION = 1
MAX_MODELS = 32
MAX_ADDRS = 8
MAX_GPUS = 16
MAX_COLLECTIONS = 32  # retrieval collections named in one advert (docs/rag.md)
MAX_COLLECTION_CHARS = 64


@dataclass(frozen=True, slots=True)
class ModelAdvert:
    name: str
    num_layers: int
    layer_start: int
    layer_end: int
    prefill_tps: float = 0.0
    decode_tps: float = 0.0
    free_kv_tokens: int = 0
    hidden_size: int = 0
    # Per-layer speed of this range, measured by the stage server (0: not measured yet).
    prefill_ms_per_layer_token: float = 0.0
    decode_ms_per_layer: float = 0.0
    context_length: int = 0  # tokens of context (prompt + output); 0: not advertised
    # the identity of its tokenizer (meshd.core.tokident; "": not advertised): any node can ask
    # this node for it (TOK_REQ) and tokenize requests for the model at the edge
    tokenizer: str = ""
    # its tier for ``model = "auto"`` (meshd.core.tiers: "micro", "small", "large"; "": none)
    # and relative quality figure; wire keys "tier" and "q", both optional
    tier: str = ""
    quality: float = 0.0
    # bytes of KV cache one token of context takes in this layer range (0: not advertised);
    # with the node's free memory (its hardware map) routers skip a node that cannot hold a
    # request's KV cache (docs/telemetry.md)
    kv_bytes_per_token: int = 0
    # continuous batching (docs/engine.md): how many streams this node decodes in one batch
    # (0: not advertised, one-sequence serving), and the aggregate decode tokens/s it measured
    # at batch sizes 1, 2, 4, ... (index k is batch 2**k; empty: not measured)
    batch_max: int = 0
    batch_tps: tuple[float, ...] = ()
    # how its weights are stored: "fp32", "fp16", "int4", "int8" (meshd.engine.manifest.DTYPES)
    # or an upstream server's ("upstream"); "": not advertised. Wire key "fmt", optional
    weight_format: str = ""
    # what the model really is (meshd.core.modelid: "gguf:<sha256>", "meshd:<sha256>", an
    # upstream server's "llama.cpp:...", "hf:...", "upstream:..."; "": not advertised). Wire
    # key "mid", optional
    model_id: str = ""
    # measured time to first token (ms, from taking a slot; an average; 0: not measured).
    # Wire key "ttft", optional
    ttft_ms: float = 0.0
    # the prompt prefixes whose KV this node's prefix cache holds for this layer range: a Bloom
    # filter of their block names at chunk depths (meshd.core.prefix_names.sketch: 8 to 512
    # bytes; empty: none or not advertised). Wire key "pxs", optional (the list "px" that
    # nodes sent before is still read, and ignored)
    prefix_sketch: bytes = b""


@dataclass(frozen=True, slots=True)
class Advert:
    peer_id: str
    name: str
    seq: int
    ts: float
    region: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    roles: tuple[str, ...] = ()
    addrs: tuple[str, ...] = ()
    hardware: dict[str, Any] = field(default_factory=dict)
    models: tuple[ModelAdvert, ...] = ()
    queue_depth: int = 0
    in_flight: int = 0
    max_concurrency: int = 1
    max_queue: int = 64
    prefill_tps: float = 0.0
    decode_tps: float = 0.0
    cost_per_hour: float = 0.0
    # requests/s the node completes when saturated: its slots over the time a request of its
    # recent traffic holds one (0: not measured yet; routers then derive it from the speeds)
    service_rate_rps: float = 0.0
    coord: tuple[float, ...] = ()
    coord_height: float = 0.0
    coord_error: float = 1.0
    coord_adjustment: float = 0.0
    # the retrieval collections this node holds (docs/rag.md): a request naming one of them
    # that enters a node without it is retrieved here (RAG_REQ); optional, "rag" on the wire
    collections: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "v": ADVERT_VERSION,
            "peer_id": self.peer_id,
            "name": self.name,
            "seq": self.seq,
            "ts": self.ts,
            "region": self.region,
            "labels": dict(self.labels),
            "roles": list(self.roles),
            "addrs": list(self.addrs),
            "hw": self.hardware,
            "models": [
                {
                    "name": m.name,
                    "num_layers": m.num_layers,
                    "layers": [m.layer_start, m.layer_end],
                    "prefill_tps": m.prefill_tps,
                    "decode_tps": m.decode_tps,
                    "free_kv_tokens": m.free_kv_tokens,
                    "hidden_size": m.hidden_size,
                    **({"prefill_ms_layer": m.prefill_ms_per_layer_token,
                        "decode_ms_layer": m.decode_ms_per_layer}
                       if m.prefill_ms_per_layer_token or m.decode_ms_per_layer else {}),
                    **({"ctx": m.context_length} if m.context_length else {}),
                    **({"tok": m.tokenizer} if m.tokenizer else {}),
                    **({"tier": m.tier, "q": m.quality} if m.tier else {}),
                    **({"kvb": m.kv_bytes_per_token} if m.kv_bytes_per_token else {}),
                    **({"batch": m.batch_max} if m.batch_max else {}),
                    **({"batch_tps": list(m.batch_tps)} if m.batch_tps else {}),
                    **({"fmt": m.weight_format} if m.weight_format else {}),
                    **({"mid": m.model_id} if m.model_id else {}),
                    **({"ttft": m.ttft_ms} if m.ttft_ms else {}),
                    **({"pxs": m.prefix_sketch} if m.prefix_sketch else {}),
                }
                for m in self.models
            ],
            "queue": self.queue_depth,
            "inflight": self.in_flight,
            "slots": self.max_concurrency,
            "max_queue": self.max_queue,
            "prefill_tps": self.prefill_tps,
            "decode_tps": self.decode_tps,
            "cost_per_hour": self.cost_per_hour,
            "svc_rps": self.service_rate_rps,
            "coord": {
                "vec": list(self.coord),
                "h": self.coord_height,
                "e": self.coord_error,
                "a": self.coord_adjustment,
            },
            **({"rag": list(self.collections)} if self.collections else {}),
        }

    def encode(self) -> bytes:
        body = pack(self.to_dict())
        if len(body) > MAX_ADVERT_BYTES:
            raise ProtocolError(f"advert of {len(body)} bytes exceeds {MAX_ADVERT_BYTES}")
        return body


def _get(d: dict[str, Any], key: str, kind: type | tuple[type, ...], default: Any = ...) -> Any:
    if key not in d:
        if default is ...:
            raise ProtocolError(f"advert lacks '{key}'")
        return default
    v = d[key]
    if isinstance(v, bool) and kind is not bool:
        raise ProtocolError(f"advert field '{key}' has the wrong type")
    if not isinstance(v, kind):
        raise ProtocolError(f"advert field '{key}' has the wrong type")
    return v


def _num(d: dict[str, Any], key: str, default: float = 0.0, lo: float = 0.0) -> float:
    v = float(_get(d, key, (int, float), default))
    if not math.isfinite(v) or v < lo:
        raise ProtocolError(f"advert field '{key}' is out of range")
    return v


def _count(d: dict[str, Any], key: str, default: int = 0) -> int:
    v = int(_get(d, key, int, default))
    if v < 0 or v > 1 << 62:
        raise ProtocolError(f"advert field '{key}' is out of range")
    return v


def _str(d: dict[str, Any], key: str, default: str | None = None, cap: int = 256) -> str:
    v = _get(d, key, str, ... if default is None else default)
    if len(v) > cap:
        raise ProtocolError(f"advert field '{key}' is too long")
    return str(v)


def _model(d: Any) -> ModelAdvert:
    if not isinstance(d, dict):
        raise ProtocolError("advert model entry must be a map")
    layers = _get(d, "layers", list)
    if len(layers) != 2 or not all(isinstance(x, int) and not isinstance(x, bool) for x in layers):
        raise ProtocolError("advert model 'layers' must be [start, end]")
    n = _count(d, "num_layers")
    start, end = int(layers[0]), int(layers[1])
    if not 0 <= start < end <= n:
        raise ProtocolError("advert model layer range is outside the model")
    return ModelAdvert(
        name=_str(d, "name"),
        num_layers=n,
        layer_start=start,
        layer_end=end,
        prefill_tps=_num(d, "prefill_tps"),
        decode_tps=_num(d, "decode_tps"),
        free_kv_tokens=_count(d, "free_kv_tokens"),
        hidden_size=_count(d, "hidden_size"),
        prefill_ms_per_layer_token=_num(d, "prefill_ms_layer"),
        decode_ms_per_layer=_num(d, "decode_ms_layer"),
        context_length=_count(d, "ctx") if "ctx" in d else 0,
        tokenizer=_str(d, "tok", "", cap=128),
        tier=_str(d, "tier", "", cap=16),  # a tier this node does not know is ignored by it
        quality=_num(d, "q"),
        kv_bytes_per_token=_count(d, "kvb") if "kvb" in d else 0,
        batch_max=_count(d, "batch") if "batch" in d else 0,
        batch_tps=_curve(d),
        weight_format=_str(d, "fmt", "", cap=16),
        model_id=_str(d, "mid", "", cap=256),
        ttft_ms=_num(d, "ttft"),
        prefix_sketch=_prefix_sketch(d),
    )


LEGACY_PX_NAMES = 16  # "px" (before "pxs"): at most 16 names of 8 bytes, read and ignored


def _prefix_sketch(d: dict[str, Any]) -> bytes:
    px = _get(d, "px", list, [])
    if len(px) > LEGACY_PX_NAMES or not all(isinstance(x, bytes) and len(x) == 8 for x in px):
        raise ProtocolError(f"advert model 'px' must be at most {LEGACY_PX_NAMES} names of 8 bytes")
    pxs = _get(d, "pxs", bytes, b"")
    if not valid_sketch(pxs):
        raise ProtocolError(f"advert model 'pxs' must be a sketch of 8 to {SKETCH_MAX_BYTES} "
                            "bytes, a power of two")
    return bytes(pxs)


MAX_BATCH_POINTS = 12


def _curve(d: dict[str, Any]) -> tuple[float, ...]:
    curve = _get(d, "batch_tps", list, [])
    if len(curve) > MAX_BATCH_POINTS or not all(
        isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x) and x >= 0
        for x in curve
    ):
        raise ProtocolError("advert model 'batch_tps' must be a short list of speeds")
    return tuple(float(x) for x in curve)


def decode_advert(body: bytes) -> Advert:
    """Schema-check an advert body. Raises only ``ProtocolError``."""
    d = unpack(body, MAX_ADVERT_BYTES)
    if not isinstance(d, dict):
        raise ProtocolError("advert body must be a map")
    v = _get(d, "v", int)
    if v < 1:
        raise ProtocolError("advert version must be >= 1")
    labels = _get(d, "labels", dict, {})
    if len(labels) > 32 or not all(
        isinstance(k, str) and isinstance(x, str) and len(k) < 64 and len(x) < 256
        for k, x in labels.items()
    ):
        raise ProtocolError("advert labels must be a small map of strings")
    roles = _get(d, "roles", list, [])
    addrs = _get(d, "addrs", list, [])
    if len(addrs) > MAX_ADDRS or not all(isinstance(a, str) and len(a) < 256 for a in addrs):
        raise ProtocolError("advert addrs must be a short list of strings")
    if len(roles) > 16 or not all(isinstance(r, str) and len(r) < 64 for r in roles):
        raise ProtocolError("advert roles must be a short list of strings")
    models = _get(d, "models", list, [])
    if len(models) > MAX_MODELS:
        raise ProtocolError("advert lists too many models")
    hw = _get(d, "hw", dict, {})
    coord = _get(d, "coord", dict, {})
    vec = _get(coord, "vec", list, [])
    if len(vec) > 16 or not all(
        isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x) for x in vec
    ):
        raise ProtocolError("advert coordinate must be a short list of finite numbers")
    rag = _get(d, "rag", list, [])
    if len(rag) > MAX_COLLECTIONS or not all(
        isinstance(c, str) and 0 < len(c) <= MAX_COLLECTION_CHARS for c in rag
    ):
        raise ProtocolError("advert rag must be a short list of collection names")
    seq = _get(d, "seq", int)
    if not 0 <= seq <= 1 << 62:
        raise ProtocolError("advert field 'seq' is out of range")
    ts = _num(d, "ts")
    return Advert(
        peer_id=_str(d, "peer_id", cap=128),
        name=_str(d, "name", cap=128),
        seq=seq,
        ts=ts,
        region=_str(d, "region", "", cap=64),
        labels={str(k): str(x) for k, x in labels.items()},
        roles=tuple(roles),
        addrs=tuple(addrs),
        hardware=hw,
        models=tuple(_model(m) for m in models),
        queue_depth=_count(d, "queue"),
        in_flight=_count(d, "inflight"),
        max_concurrency=max(1, _count(d, "slots", 1)),
        max_queue=_count(d, "max_queue", 64),
        prefill_tps=_num(d, "prefill_tps"),
        decode_tps=_num(d, "decode_tps"),
        cost_per_hour=_num(d, "cost_per_hour"),
        service_rate_rps=_num(d, "svc_rps"),
        coord=tuple(float(x) for x in vec),
        coord_height=_num(coord, "h", 0.0),
        coord_error=_num(coord, "e", 1.0),
        coord_adjustment=_num(coord, "a", 0.0, lo=-1e6),
        collections=tuple(rag),
    )


def signing_payload(body: bytes) -> bytes:
    return SIGN_CONTEXT + body


def significant_load_change(old: tuple[int, int], new: tuple[int, int]) -> bool:
    """Whether a (queue depth, in flight) change is worth an advert before the periodic one:
    any change into or out of idle, or a change of 2+ requests. ``old[0] < 0`` means nothing
    was published yet. The daemon and the simulator both decide with this."""
    if old == new:
        return False
    if old[0] < 0:
        return True
    return abs(new[0] - old[0]) + abs(new[1] - old[1]) >= 2 or (sum(new) == 0) != (sum(old) == 0)
