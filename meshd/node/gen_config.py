"""Generation parameters: from wire fields to the engine's ``GenerationConfig``, and back."""

from __future__ import annotations

from typing import Any

from meshd.core.request import DEFAULT_MAX_TOKENS, MAX_MAX_TOKENS

GEN_FIELDS = ("max_tokens", "temperature", "top_k", "top_p", "repetition_penalty", "seed", "stop",
              "presence_penalty", "frequency_penalty", "logit_bias", "logprobs", "n", "grammar")


def gen_fields(msg: dict[str, Any]) -> dict[str, Any]:
    """The generation fields present (and not None) in a message."""
    return {k: msg[k] for k in GEN_FIELDS if msg.get(k) is not None}


def gen_config_from(msg: dict[str, Any], *, already: int = 0, after: list[int] | None = None) -> Any:
    """The engine config for a REQ/SUBMIT, with ``already`` tokens generated elsewhere (their
    ids ``after``, when known: the penalties, the grammar and the seed's draws go on from
    them); None when nothing is left to generate (a failover after the last token)."""
    from meshd.engine import GenerationConfig

    f = gen_fields(msg)
    max_tokens = min(int(f.get("max_tokens", DEFAULT_MAX_TOKENS)), MAX_MAX_TOKENS)
    if max_tokens - already <= 0:
        return None
    kwargs: dict[str, Any] = {"max_tokens": max_tokens - already}
    for k in ("temperature", "top_k", "top_p", "repetition_penalty", "seed", "presence_penalty",
              "frequency_penalty", "logprobs", "n", "grammar"):
        if k in f:
            kwargs[k] = f[k]
    if "stop" in f:
        kwargs["stop"] = tuple(f["stop"])
    if "logit_bias" in f:
        kwargs["logit_bias"] = tuple((int(t), float(b)) for t, b in f["logit_bias"])
    if after:
        kwargs["after"] = tuple(after)
    return GenerationConfig(**kwargs)
