"""Which requests the semantic cache may answer, and which cached answers each may see.

Pure functions over a ``CacheRequest``; no I/O, no clock. A cached answer lives in one
*partition*: the hash of everything that must match exactly (model identity, the sampling
settings that change the answer, chat formatting) plus who may read it:

- private: ``tenant`` and ``client``. Only that client ever reads it.
- shared: ``tenant`` and the word ``shared``. Written by clients that opted in to the shared
  cache (``shared=True``), read only by clients of the same tenant that opted in too. A client
  that did not opt in never reads a shared entry, and its own answers stay private.
  Tenants never share.

A request for several choices (``n`` > 1) or for log probabilities takes no part: a cached
answer is one choice and carries none. OpenAI's penalties and logit bias are part of the
sampling settings; a grammar (a response schema or tools, compiled) is part of the context.

Answers sampled at temperature > 0 are cached (and served from the cache) only when the
request opts in with ``cache_sampled=True``: two runs would differ anyway, and the client
asked for a sample, not for the answer someone else got.

Everything of a request but its last question is its *context* (a system prompt, the earlier
turns of a conversation, the tools and the response schema it offers), and the context is part
of the partition: an answer is only ever found by a request with the same context. Within a
partition an entry is found either by its *key* (``prompt_key``: the question, whitespace
collapsed: the exact path, no embedding) or by meaning (the semantic path). A follow-up (a
request with earlier turns) takes the exact path only: the calibration of the semantic path
holds for stand-alone questions, and "and in Rust?" means nothing without its conversation.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

SHARED = "*shared*"


@dataclass(frozen=True, slots=True)
class CacheRequest:
    """What the entry chain knows about a request, as far as the cache is concerned."""

    model: str  # the model's identity: name@content hash (Manifest.content_hash)
    tenant: str
    client: str
    prompt: str  # the question: the text that is keyed, embedded and compared
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    max_tokens: int = 64
    seed: int | None = None
    stop: tuple[str, ...] = ()
    chat: bool = False
    shared: bool = False  # opt in to the tenant's shared cache
    cache_sampled: bool = False  # opt in to caching answers sampled at temperature > 0
    context: str = ""  # everything else the answer depends on (system prompt, turns, tools)
    follow_up: bool = False  # the context holds earlier turns: exact repeats only
    max_error: float = 0.01  # the semantic path's bound on near misses served (0: exact only)
    presence_penalty: float = 0.0  # OpenAI's penalties and logit bias change the answer: keyed
    frequency_penalty: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    n: int = 1  # choices asked for: a cached answer is one
    logprobs: int | None = None  # log probabilities asked for: a cached answer has none


@dataclass(frozen=True, slots=True)
class Admission:
    """Whether the cache takes part in a request at all, and the partitions it reads and
    the one it writes."""

    cacheable: bool
    reason: str
    read: tuple[str, ...] = ()
    write: str | None = None
    semantic: bool = False  # the semantic path may answer (else exact repeats only)


def sampling_key(req: CacheRequest) -> str:
    """The settings that change the answer, normalised: at temperature 0 decoding is greedy,
    so top-k, top-p and the seed do not matter and are left out."""
    stop = "\x1f".join(req.stop)
    common = f"max={req.max_tokens};rep={req.repetition_penalty!r};stop={stop};chat={req.chat}"
    if req.presence_penalty or req.frequency_penalty or req.logit_bias:  # else as before them
        bias = ",".join(f"{t}:{b!r}" for t, b in sorted(req.logit_bias))
        common += (f";pp={float(req.presence_penalty)!r};fp={float(req.frequency_penalty)!r}"
                   f";bias={bias}")
    if req.temperature <= 0:
        return "greedy;" + common
    return (f"t={req.temperature!r};k={req.top_k};p={req.top_p!r};seed={req.seed};" + common)


def partition(model: str, settings: str, tenant: str, reader: str, context: str = "") -> str:
    """A short stable name for one partition (sha256, 32 hex digits). A request without
    context has the name it had before contexts existed."""
    parts = (model, settings, tenant, reader) + ((context,) if context else ())
    return hashlib.sha256("\x1e".join(parts).encode()).hexdigest()[:32]


def prompt_key(prompt: str) -> str:
    """The key of a question for the exact path: its words, whitespace collapsed."""
    return hashlib.sha256(" ".join(prompt.split()).encode()).hexdigest()[:32]


def admit(req: CacheRequest) -> Admission:
    if req.n != 1:
        return Admission(False, f"n={req.n}: a cached answer is one choice")
    if req.logprobs is not None:
        return Admission(False, "logprobs asked for: a cached answer has none")
    if req.temperature > 0 and not req.cache_sampled:
        return Admission(False, "sampled at temperature > 0 without cache_sampled opt-in")
    if not req.prompt.strip():
        return Admission(False, "empty prompt")
    settings = sampling_key(req)
    semantic = not req.follow_up and req.max_error > 0
    own = partition(req.model, settings, req.tenant, "client:" + req.client, req.context)
    if req.shared:
        shared = partition(req.model, settings, req.tenant, SHARED, req.context)
        return Admission(True, "shared", read=(own, shared), write=shared, semantic=semantic)
    return Admission(True, "private", read=(own,), write=own, semantic=semantic)


def conversation(messages: Sequence[Mapping[str, str]], shape: str = "") -> tuple[str, str, bool]:
    """``(question, context, follow_up)`` of a chat request. The question is the last
    message's text; the context is every earlier message (role and text, whitespace collapsed,
    in order), the last message's role when it is not the user's, and ``shape`` (the tools and
    the response schema the request offers, canonical JSON; "" for none). A follow-up has an
    earlier user, assistant or tool turn; system and developer messages alone are not turns."""
    *earlier, last = messages
    turns = [[m["role"], " ".join(m["content"].split())] for m in earlier]
    follow_up = any(role not in ("system", "developer") for role, _ in turns)
    parts: dict[str, object] = {}
    if turns:
        parts["messages"] = turns
    if last["role"] != "user":
        parts["last_role"] = last["role"]
    if shape:
        parts["shape"] = shape
    context = json.dumps(parts, ensure_ascii=False, sort_keys=True) if parts else ""
    return last["content"], context, follow_up
