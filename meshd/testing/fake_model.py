"""A fake model for unit tests of node logic: deterministic tokens, no onnxruntime.

Token ids count up from the sum of the prompt's ids, so a resumed run (prompt plus k tokens)
continues exactly where an uninterrupted one would: the same property greedy decoding has.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import trio


@dataclass
class FakeEvent:
    token_id: int
    text: str
    cached_tokens: int = 0  # on the first: prompt tokens "restored from a prefix cache"


class FakeModel:
    num_layers = 4
    hidden_size = 8

    def __init__(self, delay_s: float = 0.0, vocab: int = 1000, cached_tokens: int = 0) -> None:
        self.delay_s = delay_s
        self.vocab = vocab
        self.cached_tokens = cached_tokens  # what every prompt's first event says was cached

    @property
    def vocab_size(self) -> int:
        return self.vocab

    def encode_prompt(self, text: str, *, chat: bool = False) -> list[int]:
        return [ord(c) % self.vocab for c in text] or [1]

    async def generate(self, prompt: list[int], cfg: Any) -> AsyncIterator[FakeEvent]:
        # the next token depends only on the sequence so far, like greedy decoding
        seq = list(prompt)
        for i in range(cfg.max_tokens):
            await trio.sleep(self.delay_s)
            nxt = (sum(seq) * 31 + len(seq)) % self.vocab
            seq.append(nxt)
            yield FakeEvent(nxt, f" t{nxt}", self.cached_tokens if i == 0 else 0)
