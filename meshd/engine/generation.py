"""One generation's decisions, with no onnxruntime and no trio: logits in, a ``TokenEvent`` out.

``Generation`` samples the next token (penalties, logit bias and the grammar's mask applied:
``meshd.engine.sampling``), tracks the text (incremental decoding, stop strings), reports log
probabilities when asked and decides when to finish. The runtime's sync and async drivers and
the batch scheduler feed it logits from the stage sessions; a mesh pipeline can feed it logits
from the last remote stage just the same.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from meshd.engine.sampling import GenerationConfig, choose, log_probs, process, top_choices
from meshd.engine.tokenizer import IncrementalDecoder, StopChecker, Tokenizer

FINISH_EOS, FINISH_STOP, FINISH_LENGTH = "eos", "stop", "length"
DECODER_CONTEXT = 4  # prompt tokens the incremental decoder sees, so leading spaces survive


@dataclass(frozen=True, slots=True)
class TokenEvent:
    """One generated token. ``text`` is the piece of text this token releases (it may be empty
    while bytes of a character or a possible stop string are held back); the concatenation of
    every event's ``text`` is the generated text. The last event has ``finish_reason`` set:
    ``"eos"`` (its token is the end-of-sequence token, or the grammar is complete), ``"stop"``
    (a stop string appeared; it and anything after it are not in the text) or ``"length"``
    (max_tokens or the context is full). ``logprob`` (when asked for) is ``[token text, log
    probability, [[text, log probability], ...the likeliest alternatives]]``; ``choice`` is the
    index of the choice (``n`` > 1) the token belongs to. A choice's first event carries
    ``cached_tokens``: the prompt tokens its prefill took from the prefix cache, not computed."""

    token_id: int
    text: str
    index: int
    finish_reason: str | None = None
    logprob: list[Any] | None = None
    choice: int = 0
    cached_tokens: int = 0


class Generation:
    def __init__(self, prompt_ids: Sequence[int], cfg: GenerationConfig, tokenizer: Tokenizer,
                 *, max_new_tokens: int | None = None, choice: int = 0) -> None:
        self.cfg = cfg
        self.choice = choice
        self.prompt_ids = list(prompt_ids)
        self.history = list(prompt_ids)
        # the distinct ids so far, as an array (what the repetition penalty reads): grown only
        # when a new id appears, instead of converting the whole history at every token
        self._seen = set(self.history)
        self._seen_ids = np.array(sorted(self._seen), dtype=np.int64)
        # generated ids and how often each came (OpenAI's penalties), the resumed ones included
        self._gen_index: dict[int, int] = {}
        self._gen_ids = np.zeros(0, np.int64)
        self._gen_counts = np.zeros(0, np.float64)
        after = list(cfg.after)
        for t in after:
            self._count(t)
        self.generated: list[int] = []
        self.limit = cfg.max_tokens if max_new_tokens is None else min(cfg.max_tokens,
                                                                          max_new_tokens)
        self._tok = tokenizer
        self._eos = set(tokenizer.eos_token_ids)
        self._decoder = IncrementalDecoder(tokenizer, self.prompt_ids[-DECODER_CONTEXT:])
        self._stops = StopChecker(cfg.stop)
        if cfg.seed is None:
            seed: Any = np.random.SeedSequence().entropy
        else:
            seed = cfg.seed if choice == 0 else [cfg.seed, choice]
        self._rng = np.random.default_rng(seed)
        if cfg.temperature > 0 and after:
            self._rng.random(len(after))  # the draws the resumed tokens took elsewhere
        self._after = after
        self._matcher: Any = None
        self.finish_reason: str | None = None

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    @property
    def constrained(self) -> bool:
        return self.cfg.grammar is not None

    def matcher(self) -> Any:
        """The grammar's matcher (made on first use, in the caller's thread: compiling takes a
        few ms), advanced past the resumed tokens; None without a grammar."""
        if self.cfg.grammar is None:
            return None
        if self._matcher is None:
            from meshd.engine.constrain import Matcher

            m = Matcher(self._tok, self.cfg.grammar)
            for t in self._after:
                m.consume(t)
            self._matcher = m
        return self._matcher

    def _count(self, token: int) -> None:
        i = self._gen_index.get(token)
        if i is None:
            self._gen_index[token] = len(self._gen_ids)
            self._gen_ids = np.append(self._gen_ids, token)
            self._gen_counts = np.append(self._gen_counts, 1.0)
        else:
            self._gen_counts[i] += 1.0

    def feed(self, logits_row: np.ndarray, allowed: np.ndarray | None = None) -> TokenEvent:
        """Sample the next token from the logits of the last position. ``allowed`` is the
        grammar's mask when the caller computed it (the batch does, for all rows at once)."""
        if self.done:
            raise RuntimeError("generation already finished")
        cfg = self.cfg
        matcher = self.matcher()
        if matcher is not None and allowed is None:
            allowed = matcher.allowed()
        logprob: list[Any] | None = None
        if allowed is None and cfg.logprobs is None and cfg.plain_greedy:
            token = int(np.argmax(logits_row))  # the common greedy case, without a float64 copy
        else:
            z = process(logits_row, cfg, self._seen_ids, self._gen_ids, self._gen_counts, allowed)
            if allowed is not None and not np.isfinite(z).any():
                token = min(self._eos) if self._eos else int(np.argmax(logits_row))
            else:
                token = choose(z, cfg, self._rng)
            if cfg.logprobs is not None:
                lp = log_probs(z, cfg.temperature)
                logprob = [self._tok.token_text(token), float(lp[token]),
                           [[self._tok.token_text(t), v] for t, v in top_choices(lp, cfg.logprobs)]]
        if matcher is not None:
            matcher.consume(token)
        self.history.append(token)
        if token not in self._seen:
            self._seen.add(token)
            self._seen_ids = np.append(self._seen_ids, token)
        self._count(token)
        self.generated.append(token)
        index = len(self.generated) - 1
        if token in self._eos:
            self.finish_reason = FINISH_EOS
            return TokenEvent(token, self._drain(), index, FINISH_EOS, logprob, self.choice)
        text = self._stops.push(self._decoder.push(token))
        if self._stops.stopped:
            self.finish_reason = FINISH_STOP
        elif matcher is not None and matcher.done:  # the grammar is complete: nothing may follow
            self.finish_reason = FINISH_EOS
            text += self._drain()
        elif len(self.generated) >= self.limit:
            self.finish_reason = FINISH_LENGTH
            text += self._drain()
        return TokenEvent(token, text, index, self.finish_reason, logprob, self.choice)

    def _drain(self) -> str:
        text = self._stops.push(self._decoder.flush())
        return text if self._stops.stopped else text + self._stops.flush()
