"""Node configuration: frozen dataclasses with documented defaults, loaded from TOML.

Unknown keys and bad values are errors that name the key and the file. Units are in the names.
``docs/config.md`` documents every key; ``meshd run --print-default-config`` prints them all.
"""

from __future__ import annotations

import dataclasses
import tomllib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from meshd.errors import ConfigError


@dataclass(frozen=True)
class NodeConfig:
    name: str = ""  # defaults to the certificate's node name
    data_dir: str = "/var/lib/meshd"  # state: journal and audit database
    socket: str = ""  # control socket; default: $RUNTIME_DIRECTORY/meshd.sock or data_dir
    listen: tuple[str, ...] = ("/ip4/0.0.0.0/tcp/4001",)
    announce: tuple[str, ...] = ()  # addresses to advertise instead of the listen ones
    bootstrap: tuple[str, ...] = ()  # multiaddrs with /p2p/<peer id> of nodes to join through
    cost_per_hour: float = 0.0  # what an hour of this node costs (for cost-aware routing)
    max_peers: int = 64  # peers this node keeps direct connections to


@dataclass(frozen=True)
class KeysConfig:
    identity: str = "node.key"  # libp2p Ed25519 private key (0600)
    certificate: str = "node.cert"  # the CA-signed certificate of this node
    ca: str = "ca.pub"  # the mesh CA's public key
    revocations: str = ""  # optional CA-signed revocation list to start with


@dataclass(frozen=True)
class GossipConfig:
    advert_interval_s: float = 5.0  # periodic advert; also sent early on a significant change
    min_advert_gap_s: float = 1.0  # never two adverts closer than this
    expiry_intervals: float = 3.0  # a peer expires after this many silent advert intervals
    # a linked peer of our cell whose adverts gossip has not brought for this many intervals is
    # asked for its advert directly over the link (0: never); see docs/routing.md
    pull_after_intervals: float = 2.0
    degree: int = 4  # gossipsub mesh degree D (low = D-1, high = D+2)
    heartbeat_interval_s: float = 1.0
    # heartbeats of recent message ids announced (IHAVE) to peers outside the mesh each heartbeat;
    # 0: none, a message travels over mesh links only (adverts repeat every interval, and a peer
    # gone silent is pulled: the repair IHAVE brings costs more than it saves here)
    ihave_window: int = 0
    # liveness (meshd/node/liveness.py): any frame from a peer proves it alive; pings are only for
    # RTT samples (Vivaldi, routing) and for silent peers that our requests wait on
    ping_interval_s: float = 10.0  # RTT ping of each linked peer, jittered +-25%
    busy_ping_after_s: float = 1.0  # a peer our requests wait on is pinged after this much silence
    stall_timeout_s: float = 3.0  # a ping unanswered this long, the peer silent as long: stalled
    # a request stream from a peer that sends nothing (not even its pings) for this long is closed
    stream_idle_timeout_s: float = 60.0
    # cells (docs/gossip-at-scale.md): "off" gossips every advert mesh-wide; "label" puts a node
    # in the cell its certificate's label cell_label names; "hash" spreads nodes over
    # ceil(mesh_size / cell_size) cells by their peer id. Full adverts then stay in the cell, and
    # each cell publishes a summary mesh-wide every summary_interval_s (slower than the adverts:
    # a summary only picks the cells worth probing; probes bring fresh load)
    cells: str = "off"
    cell_label: str = "region"
    cell_size: int = 32  # "hash": members per cell aimed at
    mesh_size: int = 0  # "hash": the number of nodes the mesh is expected to hold
    summary_interval_s: float = 10.0
    summary_expiry_intervals: float = 3.0  # a cell unheard this many intervals is forgotten
    summary_top_k: int = 4  # least-loaded members a summary names per model
    probes: int = 4  # nodes of other cells an entry node asks for their load
    probe_interval_s: float = 1.0  # at most one round of probes per model this often
    # how long a request for a model no cell member serves waits for the probes' answers (it
    # goes on as soon as they come; a first probe needs a dial, a handshake and a channel)
    probe_wait_s: float = 5.0
    bridges: int = 2  # links kept to nodes of other cells (carry summaries and revocations)


@dataclass(frozen=True)
class ModelConfig:
    path: str = "default"  # a meshd model directory, or "default" for the shipped model
    name: str = ""  # override the manifest's name
    layers: tuple[int, int] | str = "all"  # "all", [start, end) or "auto"
    # requests generating at once: a local model decodes them in one batch (docs/engine.md)
    max_concurrency: int = 8
    max_queue: int = 32  # waiting requests beyond which we answer busy
    # cap this model's decode rate on this node (tokens/s per request; 0 = no cap), e.g. to share
    # a device or keep a fanless box cool; measured speeds, and so adverts, reflect the cap
    max_decode_tokens_per_s: float = 0.0
    # cap this model's prefill rate on this node (prompt tokens computed per second per request,
    # those taken from the prefix cache not counted; 0 = no cap): a testnet's slower device
    max_prefill_tokens_per_s: float = 0.0
    # with layers = "auto": how many layers this node has room for (0: every layer that fits in
    # half of the free memory at start); the range itself follows the mesh's weakest coverage
    max_layers: int = 0
    # serve the model by forwarding to an OpenAI-compatible server (vLLM, llama-server, TGI,
    # Ollama, another meshd) instead of a local ONNX model: its base URL ("http://HOST:PORT/v1"),
    # the model name it knows, a file holding its API key (if it wants one), and the context
    # length to advertise (0: what the server says; else the smaller of the two). `name` is
    # required with upstream. upstream_tokenizer: "auto" (llama-server: the GGUF's tokenizer when
    # its file is readable here, else the server's /tokenize; vLLM: its /tokenize; others:
    # packed text), "server" (never the GGUF file) or "text" (always packed text); docs/upstream.md
    upstream: str = ""
    upstream_model: str = ""
    upstream_key_file: str = ""
    upstream_timeout_s: float = 30.0  # connect and first-token deadline of one upstream call
    upstream_tokenizer: str = "auto"
    context_length: int = 0
    # the model's tier for model = "auto" requests (docs/tiers.md): "micro", "small" or "large";
    # "" takes the manifest's (if any); quality: its relative quality figure (0: the manifest's)
    tier: str = ""
    quality: float = 0.0


@dataclass(frozen=True)
class RoutingConfig:
    strategy: str = "meshd"
    lwsq_alpha: float = 1.0
    lwsq_beta: float = 50.0
    sample_d: int = 2
    hedge: bool = True
    # wait-bounded admission (strategy meshd): this many first attempts may queue only about as
    # long as going to the next candidate would take, never less than wait_bound_min_ms
    wait_bound_attempts: int = 2
    wait_bound_min_ms: float = 50.0
    # strategy meshd: while the eligible nodes hold fewer requests per slot than this, choose the
    # global minimum of predicted TTFT rather than compare sample_d drawn candidates (0: never)
    argmin_below_occupancy: float = 0.5
    max_hops: int = 4
    request_timeout_s: float = 120.0
    first_token_timeout_s: float = 20.0
    model_allow: tuple[str, ...] = ()
    quotas: dict[str, int] = field(default_factory=dict)
    # edge tokenization (docs/edge-tokenization.md): a request for a model this node does not
    # serve is tokenized here with the model's tokenizer, fetched from a peer that advertises it
    # and cached under data_dir/tokenizers; a request waits at most tokenizer_wait_s for a fetch
    # (else its text is forwarded, as with edge_tokenize = false)
    edge_tokenize: bool = True
    tokenizer_wait_s: float = 2.0
    # strategy meshd: ms of predicted time to first token worth one joule per generated token,
    # from peers' measured power draw (docs/telemetry.md); 0 = off
    energy_weight: float = 0.0


@dataclass(frozen=True)
class EngineConfig:
    providers: str = "auto"  # "auto", "cpu", "cuda", "tensorrt"
    threads: int = 0  # onnxruntime intra-op threads; 0 lets it choose
    workers: int = 2  # onnxruntime calls at once
    # decode a whole local model's requests together, one onnxruntime call per step (the batch
    # scheduler, docs/engine.md); false: each request runs its own one-sequence loop, at most
    # `workers` onnxruntime calls at once (how nodes ran before batching; for comparisons)
    batching: bool = True
    # with batching: run each prefill chunk inside the decode step (one onnxruntime call, a second
    # session of the whole model's fused graph: its weights are held twice, e.g. +532 MiB in
    # float32 for a 139.5 M-parameter model); false: chunks run between decode steps, and the
    # running streams stall for a chunk each (docs/engine.md). Turn off where memory is short
    fused_prefill: bool = True
    # KV prefix cache budget per model (docs/engine.md, "Prefix cache"): finished requests' KV
    # blocks of 32 tokens are kept, least recently used evicted past this, and a new request
    # reuses its longest cached block prefix; 0 keeps none
    prefix_cache_mb: int = 256
    # with a prefix cache: keep finished answers' KV too, so a conversation's next turn prefills
    # only its new message. The batch prefills each finished prompt and answer again, while no
    # prompt waits, beside streams only where a chunk adds at most a quarter to their step (only
    # prefilled KV is reused: docs/engine.md); false: prompts' blocks only
    keep_answers: bool = True


@dataclass(frozen=True)
class ApiConfig:
    """The OpenAI-compatible HTTP API (docs/api.md) and Prometheus ``/metrics`` (docs/metrics.md)."""

    listen: str = "127.0.0.1:8080"  # HOST:PORT ([::1]:PORT for IPv6); "" turns the API off
    auth: str = "key"  # "key": bearer API keys from keys_file; "none": no key (loopback only)
    keys_file: str = "api-keys"  # hashes of the API keys, written by `meshd keys api-key create`
    max_body_bytes: int = 2_097_152  # a larger request body is answered 413
    keep_alive_timeout_s: float = 75.0  # an idle keep-alive connection is closed after this


@dataclass(frozen=True)
class StoreConfig:
    # the node's SQLite record (data_dir/meshd.db: request journal, decisions, outcomes, audit) is
    # pruned every prune_interval_s: rows older than max_age_days go, then the oldest rows until
    # the data fills at most three quarters of max_size_mb (the rest is room for what arrives
    # before the next prune)
    max_age_days: float = 30.0
    max_size_mb: float = 256.0  # MiB
    prune_interval_s: float = 300.0


@dataclass(frozen=True)
class CacheConfig:
    """The entry node's answer cache (docs/cache.md): exact repeats always; answers found by
    the question's meaning within ``max_error``, with the ``meshd[edge]`` extra (the embedding
    model; without it only exact repeats are answered)."""

    enabled: bool = True
    path: str = ""  # default: data_dir/semantic-cache.db
    max_entries: int = 100_000
    max_size_mb: float = 512.0  # MiB of prompts, answers and vectors
    ttl_s: float = 7 * 86_400.0  # an answer is served for at most this long after it was made
    # the semantic path's bound on the share of near misses served (a request's cache_max_error
    # overrides it); 0: exact repeats only, and the embedding model is never loaded
    max_error: float = 0.01
    tenant: str = "default"  # clients of one tenant may opt in to sharing answers
    embed_precision: str = "int8"  # the cache's embedding graph: int8 (about 2x less CPU than fp32)


@dataclass(frozen=True)
class RagConfig:
    """Retrieval-augmented generation at the entry node (docs/rag.md): collections that
    `meshd rag add` indexes and requests with ``rag = "COLLECTION"`` retrieve from. Needs the
    ``meshd[edge]`` extra (the embedding model)."""

    path: str = ""  # the store; default: data_dir/rag.db (vector graphs in data_dir/rag.db.idx/)
    top_k: int = 4  # chunks retrieved per request (the lowest-scoring go first if they do not fit)
    remote_timeout_s: float = 10.0  # a retrieval forwarded to the nearest node holding the collection
    embed_precision: str = "fp32"  # of collections `meshd rag add` creates without --precision: fp32 or int8


@dataclass(frozen=True)
class TiersConfig:
    """Model tiers and the complexity classifier (docs/tiers.md): how the entry node picks a
    model for a request whose model is "auto"."""

    default_auto: bool = False  # a request that names no model is treated as model = "auto"
    classifier: str = ""  # an ONNX tier classifier file; "" = the one shipped with meshd
    threshold: float = 0.0  # P(complex) from which micro is not enough; 0 = the classifier's own
    small_below: float = 0.0  # P(complex) below which the small tier is enough (0: no small band)
    max_ttft_ms: float = 5000.0  # a tier predicted slower than this to first token is skipped
    pin_clients: dict[str, str] = field(default_factory=dict)  # client -> tier, always
    pin_classes: dict[str, str] = field(default_factory=dict)  # "code"/"math"/"text" -> tier


@dataclass(frozen=True)
class Config:
    node: NodeConfig = field(default_factory=NodeConfig)
    keys: KeysConfig = field(default_factory=KeysConfig)
    gossip: GossipConfig = field(default_factory=GossipConfig)
    models: tuple[ModelConfig, ...] = (ModelConfig(),)
    routing: RoutingConfig = field(default_factory=RoutingConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    api: ApiConfig = field(default_factory=ApiConfig)
    store: StoreConfig = field(default_factory=StoreConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    rag: RagConfig = field(default_factory=RagConfig)
    tiers: TiersConfig = field(default_factory=TiersConfig)
    base_dir: str = ""  # where relative paths resolve (the config file's folder)

    def path(self, p: str) -> Path:
        q = Path(p).expanduser()
        return q if q.is_absolute() or not self.base_dir else Path(self.base_dir) / q

    def rag_path(self) -> Path:
        """The node's retrieval store (``[rag] path``, else ``data_dir/rag.db``)."""
        return self.path(self.rag.path) if self.rag.path else self.path(self.node.data_dir) / "rag.db"


_SECTIONS: dict[str, type] = {
    "node": NodeConfig,
    "keys": KeysConfig,
    "gossip": GossipConfig,
    "routing": RoutingConfig,
    "engine": EngineConfig,
    "api": ApiConfig,
    "store": StoreConfig,
    "cache": CacheConfig,
    "rag": RagConfig,
    "tiers": TiersConfig,
}


def _convert(value: Any, tp: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    if tp is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        raise ConfigError(f"{where} must be a number, not {value!r}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(f"{where} must be an integer, not {value!r}")
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{where} must be true or false, not {value!r}")
    if tp is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{where} must be a string, not {value!r}")
    if origin is tuple:
        args = typing.get_args(tp)
        if not isinstance(value, list):
            raise ConfigError(f"{where} must be a list, not {value!r}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_convert(v, args[0], f"{where}[{i}]") for i, v in enumerate(value))
        if len(value) != len(args):
            raise ConfigError(f"{where} must be a list of {len(args)} values")
        return tuple(_convert(v, a, f"{where}[{i}]") for i, (v, a) in enumerate(zip(value, args, strict=True)))
    if origin is dict:
        kt, vt = typing.get_args(tp)
        if not isinstance(value, dict):
            raise ConfigError(f"{where} must be a table, not {value!r}")
        return {_convert(k, kt, where): _convert(v, vt, f"{where}.{k}") for k, v in value.items()}
    if origin in (typing.Union, types.UnionType):
        errors = []
        for a in typing.get_args(tp):
            try:
                return _convert(value, a, where)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(f"{where} has a bad value {value!r}")
    raise ConfigError(f"{where}: unsupported type")  # pragma: no cover


def _section(cls: type, data: Any, where: str) -> Any:
    if not isinstance(data, dict):
        raise ConfigError(f"{where} must be a table")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in data.items():
        if key not in names:
            known = ", ".join(sorted(names))
            raise ConfigError(f"unknown key '{key}' in {where} (known keys: {known})")
        kwargs[key] = _convert(value, hints[key], f"{where}.{key}")
    return cls(**kwargs)


def _validate(cfg: Config, src: str) -> None:
    def bad(key: str, why: str) -> ConfigError:
        return ConfigError(f"{src}: {key} {why}")

    g = cfg.gossip
    if g.advert_interval_s <= 0:
        raise bad("[gossip] advert_interval_s", "must be > 0")
    if g.expiry_intervals < 1:
        raise bad("[gossip] expiry_intervals", "must be >= 1")
    if g.pull_after_intervals < 0:
        raise bad("[gossip] pull_after_intervals", "must be >= 0 (0 turns pulls off)")
    if g.degree < 2:
        raise bad("[gossip] degree", "must be >= 2")
    if not 0 <= g.ihave_window <= 5:
        raise bad("[gossip] ihave_window", "must be 0 to 5 (heartbeats of message ids announced)")
    for key in ("ping_interval_s", "busy_ping_after_s", "stall_timeout_s"):
        if getattr(g, key) <= 0:
            raise bad(f"[gossip] {key}", "must be > 0")
    if g.cells not in ("off", "label", "hash"):
        raise bad("[gossip] cells", 'must be "off", "label" or "hash"')
    if g.cells == "hash" and (g.mesh_size < 1 or g.cell_size < 1):
        raise bad("[gossip] mesh_size", 'must be >= 1 with cells = "hash" (with cell_size >= 1)')
    if g.cells == "label" and not g.cell_label:
        raise bad("[gossip] cell_label", 'must name a certificate label with cells = "label"')
    for key in ("summary_interval_s", "probe_interval_s"):
        if getattr(g, key) <= 0:
            raise bad(f"[gossip] {key}", "must be > 0")
    if g.summary_expiry_intervals < 1:
        raise bad("[gossip] summary_expiry_intervals", "must be >= 1")
    for key in ("summary_top_k", "probes", "bridges"):
        if getattr(g, key) < 0 or getattr(g, key) > 64:
            raise bad(f"[gossip] {key}", "must be between 0 and 64")
    if g.probe_wait_s < 0:
        raise bad("[gossip] probe_wait_s", "must be >= 0")
    if g.stream_idle_timeout_s < 3 * g.ping_interval_s:
        raise bad("[gossip] stream_idle_timeout_s", "must be at least 3 x ping_interval_s "
                  "(a live peer pings every ping_interval_s)")
    if not cfg.routing.energy_weight >= 0:
        raise bad("[routing] energy_weight", "must be >= 0 (0 = off)")
    for i, m in enumerate(cfg.models):
        if isinstance(m.layers, str) and m.layers not in ("all", "auto"):
            raise bad(f"[[models]][{i}].layers", "must be \"all\", \"auto\" or [start, end]")
        if isinstance(m.layers, tuple) and not 0 <= m.layers[0] < m.layers[1]:
            raise bad(f"[[models]][{i}].layers", "must be [start, end] with 0 <= start < end")
        if m.max_concurrency < 1 or m.max_queue < 0:
            raise bad(f"[[models]][{i}]", "max_concurrency must be >= 1 and max_queue >= 0")
        if m.max_layers < 0:
            raise bad(f"[[models]][{i}].max_layers", "must be >= 0 (0 = as many as fit)")
        if m.max_decode_tokens_per_s < 0:
            raise bad(f"[[models]][{i}].max_decode_tokens_per_s", "must be >= 0 (0 = no cap)")
        if m.max_prefill_tokens_per_s < 0:
            raise bad(f"[[models]][{i}].max_prefill_tokens_per_s", "must be >= 0 (0 = no cap)")
        if m.context_length < 0:
            raise bad(f"[[models]][{i}].context_length", "must be >= 0 (0 = unknown)")
        if m.upstream or m.upstream_model:
            _validate_upstream(m, f"[[models]][{i}]", bad)
        if m.tier and m.tier not in _tiers():
            raise bad(f"[[models]][{i}].tier", f"must be one of {', '.join(_tiers())} (or left out)")
        if m.quality < 0:
            raise bad(f"[[models]][{i}].quality", "must be >= 0")
    if cfg.routing.sample_d < 1:
        raise bad("[routing] sample_d", "must be >= 1")
    if cfg.routing.wait_bound_attempts < 0:
        raise bad("[routing] wait_bound_attempts", "must be >= 0")
    if not cfg.routing.argmin_below_occupancy >= 0:
        raise bad("[routing] argmin_below_occupancy", "must be >= 0 (0 = always sample)")
    if cfg.routing.wait_bound_min_ms < 0:
        raise bad("[routing] wait_bound_min_ms", "must be >= 0")
    if cfg.routing.max_hops < 1:
        raise bad("[routing] max_hops", "must be >= 1")
    if cfg.routing.tokenizer_wait_s < 0:
        raise bad("[routing] tokenizer_wait_s", "must be >= 0")
    if cfg.engine.providers not in ("auto", "cpu", "cuda", "tensorrt"):
        raise bad("[engine] providers", "must be auto, cpu, cuda or tensorrt")
    if cfg.engine.workers < 1:
        raise bad("[engine] workers", "must be >= 1")
    if cfg.engine.threads < 0:
        raise bad("[engine] threads", "must be >= 0 (0 = onnxruntime chooses)")
    if cfg.engine.prefix_cache_mb < 0:
        raise bad("[engine] prefix_cache_mb", "must be >= 0 (0 = no prefix cache)")
    c = cfg.cache
    if c.max_entries < 1 or c.max_size_mb <= 0 or c.ttl_s <= 0:
        raise bad("[cache]", "max_entries must be >= 1, max_size_mb and ttl_s > 0")
    if not 0 <= c.max_error < 1:
        raise bad("[cache] max_error", "must be in [0, 1) (0 = exact repeats only)")
    if not 1 <= cfg.rag.top_k <= 64:
        raise bad("[rag] top_k", "must be in [1, 64]")
    if cfg.rag.remote_timeout_s <= 0:
        raise bad("[rag] remote_timeout_s", "must be > 0")
    if cfg.rag.embed_precision not in ("int8", "fp32"):
        raise bad("[rag] embed_precision", "must be int8 or fp32")
    if c.embed_precision not in ("int8", "fp32"):
        raise bad("[cache] embed_precision", "must be int8 or fp32")
    for key in ("max_age_days", "max_size_mb", "prune_interval_s"):
        if getattr(cfg.store, key) <= 0:
            raise bad(f"[store] {key}", "must be > 0")
    _validate_api(cfg.api, bad)
    _validate_tiers(cfg.tiers, bad)


def _tiers() -> tuple[str, ...]:
    from meshd.core.tiers import TIERS

    return TIERS


def _validate_tiers(t: TiersConfig, bad: Any) -> None:
    from meshd.core.prompt_features import PROMPT_CLASSES

    TIERS = _tiers()

    if not 0 <= t.threshold < 1 or not 0 <= t.small_below < 1:
        raise bad("[tiers]", "threshold and small_below must be in [0, 1) (0 = default)")
    if t.max_ttft_ms <= 0:
        raise bad("[tiers] max_ttft_ms", "must be > 0")
    for key, pins in (("pin_clients", t.pin_clients), ("pin_classes", t.pin_classes)):
        for k, tier in pins.items():
            if tier not in TIERS:
                raise bad(f"[tiers] {key}.{k}", f"must be one of {', '.join(TIERS)}, not {tier!r}")
            if key == "pin_classes" and k not in PROMPT_CLASSES:
                raise bad(f"[tiers] pin_classes.{k}", f"is not a prompt class ({', '.join(PROMPT_CLASSES)})")


def _validate_upstream(m: ModelConfig, where: str, bad: Any) -> None:
    if not m.upstream.startswith(("http://", "https://")):
        raise bad(f"{where}.upstream", 'must be the base URL of an OpenAI-compatible API, '
                  'e.g. "http://127.0.0.1:8000/v1"')
    if not m.upstream_model:
        raise bad(f"{where}.upstream_model", "must name the model as the upstream server knows it")
    if not m.name:
        raise bad(f"{where}.name", "is required with upstream (the name the mesh serves it as)")
    if m.path != "default" or m.layers != "all":
        raise bad(where, "upstream serves the whole model: leave path and layers out")
    if m.upstream_timeout_s <= 0:
        raise bad(f"{where}.upstream_timeout_s", "must be > 0")
    if m.upstream_tokenizer not in ("auto", "server", "text"):
        raise bad(f"{where}.upstream_tokenizer", 'must be "auto", "server" or "text"')


def parse_listen(listen: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[V6]:PORT`` for IPv6) as (host, port); raises ValueError saying why."""
    host, sep, port = listen.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError("must be HOST:PORT, e.g. 127.0.0.1:8080 or [::1]:8080")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ValueError("an IPv6 host goes in brackets, e.g. [::1]:8080")
    return host, int(port)


def is_loopback(host: str) -> bool:
    """Whether ``host`` names only this machine (127.0.0.0/8, ::1 or localhost)."""
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _validate_api(api: ApiConfig, bad: Any) -> None:
    if api.auth not in ("key", "none"):
        raise bad("[api] auth", 'must be "key" or "none"')
    if not api.listen:
        return  # the API is off
    try:
        host, _ = parse_listen(api.listen)
    except ValueError as e:
        raise bad("[api] listen", str(e)) from None
    if api.auth == "none" and not is_loopback(host):
        raise bad("[api] auth", f'= "none" is allowed only on a loopback listener, not on '
                  f'{api.listen}: anyone who can reach it could use the mesh. Use auth = "key" '
                  "(keys from `meshd keys api-key create`) or listen on 127.0.0.1")
    if api.max_body_bytes < 1024:
        raise bad("[api] max_body_bytes", "must be >= 1024")
    if api.keep_alive_timeout_s <= 0:
        raise bad("[api] keep_alive_timeout_s", "must be > 0")


def parse_config(data: dict[str, Any], src: str = "<config>", base_dir: str = "") -> Config:
    kwargs: dict[str, Any] = {"base_dir": base_dir}
    for key, value in data.items():
        if key in _SECTIONS:
            kwargs[key] = _section(_SECTIONS[key], value, f"{src} [{key}]")
        elif key == "models":
            if not isinstance(value, list):
                raise ConfigError(f"{src}: models must be an array of tables ([[models]])")
            kwargs["models"] = tuple(
                _section(ModelConfig, m, f"{src} [[models]][{i}]") for i, m in enumerate(value)
            )
        else:
            known = ", ".join(sorted([*_SECTIONS, "models"]))
            raise ConfigError(f"unknown section '{key}' in {src} (known: {known})")
    cfg = Config(**kwargs)
    _validate(cfg, src)
    return cfg


def load_config(path: str | Path) -> Config:
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise ConfigError(f"cannot read config file {p}: {e.strerror}") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{p}: not valid TOML: {e}") from None
    return parse_config(data, str(p), str(p.resolve().parent))
