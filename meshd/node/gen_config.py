"""Generation parameters: from wire fields to the engine's ``GenerationConfig``, and back."""

from __future__ import annotations

from typing import Any

from meshd.core.request import DEFAULT_MAX_TOKENS, MAX_MAX_TOKENS

GEN_FIELDS = ("max_tokens", "temperature", "top_k", "top_p", "repetition_penalty", "seed", "stop")


def gen_fields(msg: dict[str, Any]) -> dict[str, Any]:
    """The generation fields present (and not None) in a message."""
    return {k: msg[k] for k in GEN_FIELDS if msg.get(k) is not None}


def gen_config_from(msg: dict[str, Any], *, already: int = 0) -> Any:
    """The engine config for a REQ/SUBMIT, with ``already`` tokens generated elsewhere; None
    when nothing is left to generate (a failover after the last token)."""
    from meshd.engine import GenerationConfig

    f = gen_fields(msg)
    max_tokens = min(int(f.get("max_tokens", DEFAULT_MAX_TOKENS)), MAX_MAX_TOKENS)
    if max_tokens - already <= 0:
        return None
    kwargs: dict[str, Any] = {"max_tokens": max_tokens - already}
    for k in ("temperature", "top_k", "top_p", "repetition_penalty", "seed"):
        if k in f:
            kwargs[k] = f[k]
    if "stop" in f:
        kwargs["stop"] = tuple(f["stop"])
    return GenerationConfig(**kwargs)
