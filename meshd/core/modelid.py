"""A model's identity: what its weights really are, whatever name it is served under.

Adverts carry it per model (``mid``, optional); the semantic cache keys answers by it, so two
different models that one mesh serves under one name never share an answer. Pure.

- ``gguf:<digest>``: a model made from a GGUF file, by the file's sha256: a native import (the
  manifest records ``source.gguf_sha256``) and a llama-server loading that very file
  (``meshd.upstream.facts``) are one model;
- ``meshd:<digest>``: any other meshd model, by its weights file's sha256
  (``Manifest.content_hash``);

A digest here is the first ``DIGEST_CHARS`` hex digits (128 bits) of the sha256: as unique as the
whole for telling models apart, and 32 bytes fewer in every advert for every model.
- ``llama.cpp:...``, ``hf:...``, ``upstream:...``: models run by upstream servers
  (``meshd.upstream.facts.model_identity``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

_SHA256 = re.compile(r"[0-9a-f]{64}")
MAX_CHARS = 256  # advert cap
DIGEST_CHARS = 32


def gguf(sha256: str) -> str:
    """The identity of a model made from the GGUF file whose sha256 is ``sha256``."""
    return f"gguf:{sha256[:DIGEST_CHARS]}"


def of_manifest(source: Mapping[str, Any], content_hash: str) -> str:
    """The identity of a meshd model directory from its manifest's ``source`` and weights hash
    ("" when neither is known)."""
    sha = source.get("gguf_sha256") if isinstance(source, Mapping) else None
    if isinstance(sha, str) and _SHA256.fullmatch(sha):
        return gguf(sha)
    return f"meshd:{content_hash[:DIGEST_CHARS]}" if content_hash else ""


def short(identity: str) -> str:
    """A shorter form for keys and listings: the kind and 16 characters of what follows."""
    kind, _, rest = identity.partition(":")
    return f"{kind}:{rest[:16]}" if rest else identity
