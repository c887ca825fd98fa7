"""The message registry: every message meshd sends, by type id. ONLY APPEND.

Type ids and field names are the wire contract written down in ``proto/registry.toml``
(generated from this module by ``scripts/gen_proto.py``; ``tests/core/test_proto_registry.py``
checks that the two agree) and summarised in ``proto/README.md``. A new field is added as optional
with a ``since`` version; an id is never reused and a field never changes its type. Unknown
fields are ignored by decoders (so a newer peer can add optional fields); missing required
fields and wrong types are a ``ProtocolError``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from meshd.errors import ProtocolError

PROTOCOL_VERSION = 6  # 2: tokenizer identities, packed prompt ids, TOK_REQ/TOK_PART; 3: cells;
# 4: the sampling surface (OpenAI penalties, logit_bias, logprobs, n, grammar); 5: the answer
# cache's error bound (SUBMIT cache_max_error) and feedback (CACHE_REQ op feedback, rid, verdict);
# 6: prefix reuse in pipeline stages (STAGE_OPEN px, STAGE_READY reused)

# libp2p protocol ids and the gossip topics.
REQUEST_PROTOCOL = "/meshd/req/1.0.0"
STAGE_PROTOCOL = "/meshd/stage/1.0.0"
ADVERT_TOPIC = "meshd/adverts/1"
REVOCATION_TOPIC = "meshd/revocations/1"
CONTROL_VERSION = 1


class MessageType(enum.IntEnum):
    # Control socket (meshd CLI <-> local daemon)
    HELLO = 1
    HELLO_OK = 2
    SUBMIT = 3
    TOKENS = 4
    DONE = 5
    ERROR = 6
    STATUS_REQ = 7
    STATUS = 8
    PEERS_REQ = 9
    PEERS = 10
    EXPLAIN_REQ = 11
    EXPLAIN = 12
    CANCEL = 13
    ROUTE = 14
    PUSH_REVOCATION = 15
    OK = 16
    AUDIT_REQ = 17
    CACHE_REQ = 18
    # Peer request protocol (entry node <-> serving node), multiplexed by request id
    REQ = 20
    PING = 22
    PONG = 23
    SYNC_REQ = 24
    SYNC = 25
    TOK_REQ = 26
    TOK_PART = 27
    RAG_REQ = 28
    RAG_PART = 29
    # Stage protocol (layer-wise pipelines)
    STAGE_OPEN = 30
    STAGE_STEP = 31
    STAGE_FREE = 32
    STAGE_OUT = 33
    STAGE_READY = 34
    # Gossip payloads
    ADVERT = 40
    REVOCATION = 41
    SUMMARY = 42


class F(enum.Enum):
    """Field kinds."""

    INT = "int"
    NUM = "num"  # int or float
    STR = "str"
    BIN = "bin"
    BOOL = "bool"
    LIST = "list"
    MAP = "map"
    INTS = "ints"  # list of ints
    STRS = "strs"  # list of strs


@dataclass(frozen=True, slots=True)
class Field:
    name: str
    kind: F
    required: bool = True
    nullable: bool = False
    since: int = 1


@dataclass(frozen=True, slots=True)
class MessageSpec:
    type_id: int
    name: str
    fields: tuple[Field, ...]
    doc: str


def _ok(kind: F, v: Any) -> bool:
    if kind is F.INT:
        return isinstance(v, int) and not isinstance(v, bool)
    if kind is F.NUM:
        return isinstance(v, int | float) and not isinstance(v, bool)
    if kind is F.STR:
        return isinstance(v, str)
    if kind is F.BIN:
        return isinstance(v, bytes)
    if kind is F.BOOL:
        return isinstance(v, bool)
    if kind is F.LIST:
        return isinstance(v, list)
    if kind is F.MAP:
        return isinstance(v, dict)
    if kind is F.INTS:
        return isinstance(v, list) and all(
            isinstance(x, int) and not isinstance(x, bool) for x in v
        )
    if kind is F.STRS:
        return isinstance(v, list) and all(isinstance(x, str) for x in v)
    return False  # pragma: no cover


def check_fields(spec: MessageSpec, msg: dict[str, Any]) -> None:
    for f in spec.fields:
        if f.name not in msg:
            if f.required:
                raise ProtocolError(f"{spec.name} lacks required field '{f.name}'")
            continue
        v = msg[f.name]
        if v is None and f.nullable:
            continue
        if not _ok(f.kind, v):
            raise ProtocolError(f"{spec.name}.{f.name} must be {f.kind.value}")


def _m(t: MessageType, doc: str, *fields: Field) -> MessageSpec:
    return MessageSpec(int(t), t.name, fields, doc)


def _opt(name: str, kind: F, nullable: bool = True) -> Field:
    return Field(name, kind, required=False, nullable=nullable)


# Since version 2 (docs/edge-tokenization.md): the prompt as packed token ids
# (meshd.core.packing) and the identity of the tokenizer that made them (meshd.core.tokident).
_PACKED = (
    Field("prompt_packed", F.BIN, required=False, since=2),
    Field("prompt_dtype", F.STR, required=False, since=2),
    Field("tok", F.STR, required=False, since=2),
)


_GEN = (
    _opt("max_tokens", F.INT),
    _opt("temperature", F.NUM),
    _opt("top_k", F.INT),
    _opt("top_p", F.NUM),
    _opt("repetition_penalty", F.NUM),
    _opt("seed", F.INT),
    _opt("stop", F.STRS),
    # Since version 4 (docs/api.md): OpenAI's sampling settings and constrained decoding; the
    # serving node (or a pipeline's last stage) applies them, so failover and hedging keep them.
    Field("presence_penalty", F.NUM, required=False, nullable=True, since=4),
    Field("frequency_penalty", F.NUM, required=False, nullable=True, since=4),
    Field("logit_bias", F.LIST, required=False, nullable=True, since=4),  # [[token id, bias]]
    Field("logprobs", F.INT, required=False, nullable=True, since=4),  # top alternatives, 0-20
    Field("n", F.INT, required=False, nullable=True, since=4),  # choices, one batch
    Field("grammar", F.STR, required=False, nullable=True, since=4),  # llguidance grammar
)

SPECS: tuple[MessageSpec, ...] = (
    _m(MessageType.HELLO, "client greets the daemon", Field("v", F.INT), _opt("client", F.STR)),
    _m(
        MessageType.HELLO_OK,
        "daemon accepts the control version",
        Field("v", F.INT),
        Field("node", F.STR),
        Field("peer_id", F.STR),
    ),
    _m(
        MessageType.SUBMIT,
        "submit a prompt through the local daemon",
        Field("rid", F.STR),
        Field("prompt", F.STR),
        _opt("model", F.STR),
        _opt("residency", F.STR),
        _opt("strategy", F.STR),
        _opt("client", F.STR),
        _opt("chat", F.BOOL, nullable=False),
        _opt("pipeline", F.STR),
        *_GEN,
        _opt("cache", F.BOOL),  # false keeps the request out of the semantic cache
        # a retrieval collection to put context from into the prompt (docs/rag.md)
        Field("rag", F.STR, required=False, nullable=True, since=2),
        # model "auto": a lower tier than the prompt needs may serve it (docs/tiers.md)
        Field("allow_lower_tier", F.BOOL, required=False, since=2),
        # the semantic cache's bound on near misses served for this request (docs/cache.md)
        Field("cache_max_error", F.NUM, required=False, since=5),
    ),
    _m(
        MessageType.TOKENS,
        "tokens of a request, coalesced",
        Field("rid", F.STR),
        Field("ids", F.INTS),
        _opt("text", F.STR),
        # since version 4: the choice these tokens belong to (n > 1; absent: 0), and per token
        # [text, log probability, [[text, log probability], ...]] when logprobs were asked for
        Field("idx", F.INT, required=False, since=4),
        Field("lp", F.LIST, required=False, since=4),
    ),
    _m(MessageType.DONE, "a request ended well", Field("rid", F.STR), _opt("stats", F.MAP)),
    _m(
        MessageType.ERROR,
        "a request or a frame failed; code from proto/errors.md",
        _opt("rid", F.STR),
        Field("code", F.STR),
        Field("message", F.STR),
        _opt("peer", F.STR),
        _opt("wait_ms", F.INT),
    ),
    _m(MessageType.STATUS_REQ, "ask the node's status"),
    _m(MessageType.STATUS, "the node's status", Field("data", F.MAP)),
    _m(MessageType.PEERS_REQ, "ask the peer table"),
    _m(MessageType.PEERS, "the peer table", Field("peers", F.LIST)),
    _m(MessageType.EXPLAIN_REQ, "ask why a request went where it did", Field("rid", F.STR)),
    _m(MessageType.EXPLAIN, "the routing record of a request", Field("record", F.MAP, nullable=True)),
    _m(MessageType.CANCEL, "cancel a request", Field("rid", F.STR)),
    _m(
        MessageType.ROUTE,
        "where a request is being served (sent before its first tokens, again on failover)",
        Field("rid", F.STR),
        Field("served_by", F.STR),
        Field("route", F.STRS),
    ),
    _m(
        MessageType.PUSH_REVOCATION,
        "hand a CA-signed revocation list to the daemon, which applies and gossips it",
        Field("crl", F.BIN),
    ),
    _m(MessageType.OK, "a control request succeeded", _opt("data", F.MAP)),
    _m(
        MessageType.REQ,
        "an entry node asks a peer to serve a request",
        Field("rid", F.STR),
        Field("model", F.STR),
        Field("prompt_ids", F.INTS),
        _opt("prompt", F.STR),
        _opt("chat", F.BOOL, nullable=False),
        _opt("resume_ids", F.INTS),
        Field("deadline_ms", F.INT),
        Field("hops", F.INT),
        _opt("origin", F.STR),
        *_GEN,
        _opt("max_wait_ms", F.INT),
        *_PACKED,
    ),
    _m(MessageType.PING, "heartbeat and RTT probe", Field("n", F.INT)),
    _m(MessageType.PONG, "answer to PING", Field("n", F.INT), _opt("queue", F.INT)),
    _m(
        MessageType.SYNC_REQ,
        "a new link asks the peer for the signed adverts it holds (join without waiting a period)",
        Field("n", F.INT),
        _opt("adverts", F.LIST, nullable=False),
        # a probe (docs/gossip-at-scale.md): answer with a fresh signed advert of your own only
        Field("fresh", F.BOOL, required=False, since=3),
        # cells: answer with the summaries held only, no adverts (a node missing cells asks)
        Field("summaries_only", F.BOOL, required=False, since=3),
    ),
    _m(
        MessageType.SYNC,
        "answer to SYNC_REQ: signed ADVERT messages as gossiped, each checked like gossip",
        Field("n", F.INT),
        Field("adverts", F.LIST),
        # the signed cell summaries the node holds (cells on), so a joining node knows every cell
        Field("summaries", F.LIST, required=False, since=3),
    ),
    _m(
        MessageType.STAGE_OPEN,
        "open a stage session for a request's layer range",
        Field("rid", F.STR),
        Field("model", F.STR),
        Field("layer_start", F.INT),
        Field("layer_end", F.INT),
        Field("deadline_ms", F.INT),
        _opt("next", F.LIST),
        _opt("gen", F.MAP),
        _opt("prompt_ids", F.INTS),
        _opt("prompt", F.STR),
        _opt("chat", F.BOOL, nullable=False),
        _opt("max_tokens", F.INT),
        _opt("wire_dtype", F.STR),
        _opt("idle_ms", F.INT),
        *_PACKED,
        # the prompt's block names (meshd.core.prefix_names.block_hashes of all but its last
        # token), 16 bytes each, concatenated: the stage restores its longest cached prefix
        Field("px", F.BIN, required=False, since=6),
    ),
    _m(
        MessageType.STAGE_STEP,
        "run a stage on activations (or token ids) for some positions",
        Field("rid", F.STR),
        Field("step", F.INT),
        Field("pos", F.INTS),
        Field("dtype", F.STR),
        Field("shape", F.INTS),
        Field("data", F.BIN),
    ),
    _m(MessageType.STAGE_FREE, "free a stage session", Field("rid", F.STR)),
    _m(
        MessageType.STAGE_OUT,
        "the last stage's output for one step: the next token",
        Field("rid", F.STR),
        Field("step", F.INT),
        Field("ids", F.INTS),
        _opt("stats", F.MAP),
        _opt("text", F.STR),
        _opt("finish", F.STR),
        Field("lp", F.LIST, required=False, since=4),  # as TOKENS' lp
    ),
    _m(
        MessageType.STAGE_READY,
        "a stage session is open (the prompt's token ids when the stage encoded them)",
        Field("rid", F.STR),
        _opt("prompt_ids", F.INTS),
        _opt("free_kv_tokens", F.INT),
        # prompt tokens restored from the prefix cache (px): the entry node starts the first
        # step at the least of its stages', and a stage that restored more cuts back to it
        Field("reused", F.INT, required=False, since=6),
    ),
    _m(
        MessageType.ADVERT,
        "a node's signed advert (gossip)",
        Field("body", F.BIN),
        Field("sig", F.BIN),
        Field("cert", F.BIN),
    ),
    _m(MessageType.REVOCATION, "a CA-signed revocation list (gossip)", Field("crl", F.BIN)),
    _m(
        MessageType.AUDIT_REQ,
        "ask the node's audit trail, newest first; answered by OK {events: [...]}",
        _opt("n", F.INT),
        _opt("kind", F.STR),
    ),
    _m(
        MessageType.CACHE_REQ,
        "the semantic cache: op 'stats', 'clear' or 'feedback' (rid, verdict 'right' or "
        "'wrong'); answered by OK {data: statistics}",
        Field("op", F.STR),
        Field("rid", F.STR, required=False, since=5),
        Field("verdict", F.STR, required=False, since=5),
    ),
    _m(
        MessageType.TOK_REQ,
        "ask a peer for a tokenizer bundle by identity; answered by TOK_PART frames or ERROR",
        Field("rid", F.STR, since=2),
        Field("tok", F.STR, since=2),
    ),
    _m(
        MessageType.TOK_PART,
        "one chunk of a tokenizer bundle (the last when offset + len(data) == total)",
        Field("rid", F.STR, since=2),
        Field("offset", F.INT, since=2),
        Field("total", F.INT, since=2),
        Field("data", F.BIN, since=2),
    ),
    _m(
        MessageType.RAG_REQ,
        "ask a peer holding a retrieval collection for the chunks nearest a question; "
        "answered by one RAG_PART or ERROR",
        Field("rid", F.STR, since=2),
        Field("collection", F.STR, since=2),
        Field("query", F.STR, since=2),
        Field("k", F.INT, since=2),
        Field("deadline_ms", F.INT, since=2),
    ),
    _m(
        MessageType.RAG_PART,
        "the chunks a RAG_REQ retrieved, best first: maps of source, score, text",
        Field("rid", F.STR, since=2),
        Field("chunks", F.LIST, since=2),
        Field("embed_ms", F.NUM, required=False, since=2),
        Field("search_ms", F.NUM, required=False, since=2),
    ),
    _m(
        MessageType.SUMMARY,
        "a cell's signed summary (gossip, topic meshd/summaries/1; meshd/core/summary.py)",
        Field("body", F.BIN, since=3),
        Field("sig", F.BIN, since=3),
        Field("cert", F.BIN, since=3),
    ),
)

REGISTRY: dict[int, MessageSpec] = {s.type_id: s for s in SPECS}

CONTROL_TYPES = frozenset(
    int(t)
    for t in (
        MessageType.HELLO,
        MessageType.SUBMIT,
        MessageType.STATUS_REQ,
        MessageType.PEERS_REQ,
        MessageType.EXPLAIN_REQ,
        MessageType.CANCEL,
        MessageType.PUSH_REVOCATION,
        MessageType.AUDIT_REQ,
        MessageType.CACHE_REQ,
    )
)
CONTROL_REPLY_TYPES = frozenset(
    int(t)
    for t in (
        MessageType.HELLO_OK,
        MessageType.TOKENS,
        MessageType.DONE,
        MessageType.ERROR,
        MessageType.STATUS,
        MessageType.PEERS,
        MessageType.EXPLAIN,
        MessageType.ROUTE,
        MessageType.OK,
    )
)
REQUEST_TYPES = frozenset(
    int(t)
    for t in (
        MessageType.REQ,
        MessageType.TOKENS,
        MessageType.DONE,
        MessageType.ERROR,
        MessageType.CANCEL,
        MessageType.PING,
        MessageType.PONG,
        MessageType.ROUTE,
        MessageType.SYNC_REQ,
        MessageType.SYNC,
        MessageType.TOK_REQ,
        MessageType.TOK_PART,
        MessageType.RAG_REQ,
        MessageType.RAG_PART,
    )
)
STAGE_TYPES = frozenset(
    int(t)
    for t in (
        MessageType.STAGE_OPEN,
        MessageType.STAGE_STEP,
        MessageType.STAGE_FREE,
        MessageType.STAGE_OUT,
        MessageType.STAGE_READY,
        MessageType.ERROR,
        MessageType.PING,
        MessageType.PONG,
    )
)

# Error codes (proto/errors.md). ONLY APPEND.
ERROR_CODES = {
    "malformed": "the frame could not be decoded or broke the schema",
    "too_large": "a frame or payload exceeded its size limit",
    "unsupported": "the protocol version or message type is not supported",
    "unattested": "the peer failed attestation",
    "busy": "the node's queue is full; try another",
    "no_model": "the node does not serve the requested model or layers",
    "no_route": "no node may serve the request under its constraints",
    "deadline": "the request's deadline passed",
    "hops": "the request exceeded its hop limit",
    "cancelled": "the request was cancelled",
    "peer_gone": "the serving peer died or stalled",
    "bad_tensor": "an activation tensor was malformed or not finite",
    "quota": "the client's quota is exhausted",
    "internal": "a bug in meshd; the node logged it",
    "no_session": "no open stage session has this id (never opened, freed or expired)",
    "context_length_exceeded": "the prompt plus max_tokens do not fit the model's context",
    "duplicate_request": "a request with this id is already in flight at the entry node",
    "unauthorized": "no API key, or one this node does not know",
    "no_collection": "no node of the mesh holds the retrieval collection the request names",
}
