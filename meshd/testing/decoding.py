"""Timing the engine's decoding in benchmarks: a tokenizer that never ends a stream, so every
stream makes exactly the tokens asked for (llama-server's ``ignore_eos``), and a stream's decode
tokens/s from its tokens' arrival times."""

from __future__ import annotations

from typing import Any


class IgnoreEos:
    """The model's tokenizer without end-of-sequence ids (every other attribute its own)."""

    eos_token_ids: tuple[int, ...] = ()

    def __init__(self, tok: Any) -> None:
        self._tok = tok

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tok, name)


def decode_tps(times: list[float]) -> float:
    """Decode tokens/s of one stream from its tokens' arrival times (the first token's is the
    start: prefill excluded)."""
    return (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 else 0.0
