"""A model's identity: what its weights really are, whatever name it is served under.

Adverts carry it per model (``mid``, optional); the semantic cache keys answers by it, so two
different models that one mesh serves under one name never share an answer. Pure.

- ``gguf:<sha256>``: a model made from a GGUF file, by its digest: a native import (the manifest
  records ``source.gguf_sha256``) and a llama-server loading that very file
  (``meshd.upstream.facts``) are one model;
- ``meshd:<sha256>``: any other meshd model, by its weights file (``Manifest.content_hash``);
- ``llama.cpp:...``, ``hf:...``, ``upstream:...``: models run by upstream servers
  (``meshd.upstream.facts.model_identity``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

_SHA256 = re.compile(r"[0-9a-f]{64}")
MAX_CHARS = 256  # advert cap


def of_manifest(source: Mapping[str, Any], content_hash: str) -> str:
    """The identity of a meshd model directory from its manifest's ``source`` and weights hash
    ("" when neither is known)."""
    sha = source.get("gguf_sha256") if isinstance(source, Mapping) else None
    if isinstance(sha, str) and _SHA256.fullmatch(sha):
        return f"gguf:{sha}"
    return f"meshd:{content_hash}" if content_hash else ""


def short(identity: str) -> str:
    """A shorter form for keys and listings: the kind and 16 characters of what follows."""
    kind, _, rest = identity.partition(":")
    return f"{kind}:{rest[:16]}" if rest else identity
