"""One generation's decisions, with no onnxruntime and no trio: logits in, a ``TokenEvent`` out.

``Generation`` samples the next token, tracks the text (incremental decoding, stop strings) and
decides when to finish. The runtime's sync and async drivers feed it logits from the stage
sessions; a mesh pipeline can feed it logits from the last remote stage just the same.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from meshd.engine.sampling import GenerationConfig, sample
from meshd.engine.tokenizer import IncrementalDecoder, StopChecker, Tokenizer

FINISH_EOS, FINISH_STOP, FINISH_LENGTH = "eos", "stop", "length"
DECODER_CONTEXT = 4  # prompt tokens the incremental decoder sees, so leading spaces survive


@dataclass(frozen=True, slots=True)
class TokenEvent:
    """One generated token. ``text`` is the piece of text this token releases (it may be empty
    while bytes of a character or a possible stop string are held back); the concatenation of
    every event's ``text`` is the generated text. The last event has ``finish_reason`` set:
    ``"eos"`` (its token is the end-of-sequence token), ``"stop"`` (a stop string appeared; it and
    anything after it are not in the text) or ``"length"`` (max_tokens or the context is full)."""

    token_id: int
    text: str
    index: int
    finish_reason: str | None = None


class Generation:
    def __init__(self, prompt_ids: Sequence[int], cfg: GenerationConfig, tokenizer: Tokenizer,
                 *, max_new_tokens: int | None = None) -> None:
        self.cfg = cfg
        self.prompt_ids = list(prompt_ids)
        self.history = list(prompt_ids)
        # the distinct ids so far, as an array (what the repetition penalty reads): grown only
        # when a new id appears, instead of converting the whole history at every token
        self._seen = set(self.history)
        self._seen_ids = np.array(sorted(self._seen), dtype=np.int64)
        self.generated: list[int] = []
        self.limit = cfg.max_tokens if max_new_tokens is None else min(cfg.max_tokens,
                                                                          max_new_tokens)
        self._eos = set(tokenizer.eos_token_ids)
        self._decoder = IncrementalDecoder(tokenizer, self.prompt_ids[-DECODER_CONTEXT:])
        self._stops = StopChecker(cfg.stop)
        seed = cfg.seed if cfg.seed is not None else np.random.SeedSequence().entropy
        self._rng = np.random.default_rng(seed)
        self.finish_reason: str | None = None

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    def feed(self, logits_row: np.ndarray) -> TokenEvent:
        """Sample the next token from the logits of the last position."""
        if self.done:
            raise RuntimeError("generation already finished")
        token = sample(logits_row, self._seen_ids, self.cfg, self._rng)
        self.history.append(token)
        if token not in self._seen:
            self._seen.add(token)
            self._seen_ids = np.append(self._seen_ids, token)
        self.generated.append(token)
        index = len(self.generated) - 1
        if token in self._eos:
            self.finish_reason = FINISH_EOS
            return TokenEvent(token, self._drain(), index, FINISH_EOS)
        text = self._stops.push(self._decoder.push(token))
        if self._stops.stopped:
            self.finish_reason = FINISH_STOP
        elif len(self.generated) >= self.limit:
            self.finish_reason = FINISH_LENGTH
            text += self._drain()
        return TokenEvent(token, text, index, self.finish_reason)

    def _drain(self) -> str:
        text = self._stops.push(self._decoder.flush())
        return text if self._stops.stopped else text + self._stops.flush()
