"""Which requests the semantic cache may answer, and which cached answers each may see.

Pure functions over a ``CacheRequest``; no I/O, no clock. A cached answer lives in one
*partition*: the hash of everything that must match exactly (model identity, the sampling
settings that change the answer, chat formatting) plus who may read it:

- private: ``tenant`` and ``client``. Only that client ever reads it.
- shared: ``tenant`` and the word ``shared``. Written by clients that opted in to the shared
  cache (``shared=True``), read only by clients of the same tenant that opted in too. A client
  that did not opt in never reads a shared entry, and its own answers stay private.
  Tenants never share.

Answers sampled at temperature > 0 are cached (and served from the cache) only when the
request opts in with ``cache_sampled=True``: two runs would differ anyway, and the client
asked for a sample, not for the answer someone else got.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

SHARED = "*shared*"


@dataclass(frozen=True, slots=True)
class CacheRequest:
    """What the entry chain knows about a request, as far as the cache is concerned."""

    model: str  # the model's identity: name@content hash (Manifest.content_hash)
    tenant: str
    client: str
    prompt: str  # the text that is embedded and compared
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


@dataclass(frozen=True, slots=True)
class Admission:
    """Whether the cache takes part in a request at all, and the partitions it reads and
    the one it writes."""

    cacheable: bool
    reason: str
    read: tuple[str, ...] = ()
    write: str | None = None


def sampling_key(req: CacheRequest) -> str:
    """The settings that change the answer, normalised: at temperature 0 decoding is greedy,
    so top-k, top-p and the seed do not matter and are left out."""
    stop = "\x1f".join(req.stop)
    common = f"max={req.max_tokens};rep={req.repetition_penalty!r};stop={stop};chat={req.chat}"
    if req.temperature <= 0:
        return "greedy;" + common
    return (f"t={req.temperature!r};k={req.top_k};p={req.top_p!r};seed={req.seed};" + common)


def partition(model: str, settings: str, tenant: str, reader: str) -> str:
    """A short stable name for one partition (sha256, 32 hex digits)."""
    text = "\x1e".join((model, settings, tenant, reader))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def prompt_key(prompt: str) -> str:
    """The key of a prompt for the exact-repeat path: its words, whitespace collapsed."""
    return hashlib.sha256(" ".join(prompt.split()).encode()).hexdigest()[:32]


def admit(req: CacheRequest) -> Admission:
    if req.temperature > 0 and not req.cache_sampled:
        return Admission(False, "sampled at temperature > 0 without cache_sampled opt-in")
    if not req.prompt.strip():
        return Admission(False, "empty prompt")
    settings = sampling_key(req)
    own = partition(req.model, settings, req.tenant, "client:" + req.client)
    if req.shared:
        shared = partition(req.model, settings, req.tenant, SHARED)
        return Admission(True, "shared", read=(own, shared), write=shared)
    return Admission(True, "private", read=(own,), write=own)
