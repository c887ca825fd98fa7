"""A multi-turn chat workload: conversations whose every turn resends the history (issue 32).

Real chat traffic repeats itself at the front: turn ``k + 1`` of a conversation is the system
prompt, every earlier user message and answer, and the new user message. ``chat_requests``
draws such conversations as token ids (seeded, synthetic ids: only equality of prefixes
matters to a prefix cache and to prefix-aware routing), so the simulator and the testnet
benchmark can replay the same requests to every strategy.

The distributions, and where they come from (``ChatSpec`` defaults):

- **Turns per conversation**: geometric (1 + failures before a success), mean 2.0: the mean of
  LMSYS-Chat-1M (Zheng et al., 2023, Table 1: 2.0 turns per conversation; ShareGPT 3.5). The
  geometric shape is an assumption (most conversations are one turn, a long tail).
- **User message tokens**: lognormal, mean 69.5, sigma 1.0 (LMSYS-Chat-1M: 69.5 tokens per
  prompt; ShareGPT 94.5). **Answer tokens**: lognormal, mean 214.5, sigma 0.8 (LMSYS-Chat-1M:
  214.5 per response; ShareGPT 348.5). The sigmas are assumptions (long-tailed lengths).
- **System prompts**: ``shared_prompts`` (4) prompts of lognormal length, mean 400 tokens,
  sigma 0.5 (an assumption: tool definitions and RAG preambles of a few hundred tokens); a
  conversation starts with one of them (chosen uniformly) with probability ``shared_share``
  (swept 0, 0.5, 0.9), else with a system prompt of its own of the same length distribution.
- **Arrivals**: conversations start as a Poisson process of rate ``rate_per_s / mean turns``,
  so requests arrive at about ``rate_per_s``; the next turn comes ``answer time + think time``
  after a turn, the answer time ``answer tokens / answer_tps`` and the think time exponential,
  mean 20 s (assumptions).
- A conversation ends early when its next prompt would leave fewer than its answer's tokens of
  the ``context_tokens`` context.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from meshd.sim.scenario import LengthDist
from meshd.sim.workload import sample_length


@dataclass(frozen=True)
class ChatSpec:
    rate_per_s: float = 10.0  # requests per second, every turn counted
    mean_turns: float = 2.0
    user_tokens: LengthDist = field(default_factory=lambda: LengthDist(
        "lognormal", mean=69.5, sigma=1.0, low=1, high=4096))
    answer_tokens: LengthDist = field(default_factory=lambda: LengthDist(
        "lognormal", mean=214.5, sigma=0.8, low=1, high=2048))
    system_tokens: LengthDist = field(default_factory=lambda: LengthDist(
        "lognormal", mean=400.0, sigma=0.5, low=16, high=4096))
    shared_prompts: int = 4
    shared_share: float = 0.5  # conversations that start with a shared system prompt
    think_s: float = 20.0
    answer_tps: float = 30.0
    context_tokens: int = 8192
    vocab: int = 32000


@dataclass(frozen=True)
class ChatTurn:
    """One request of the workload: ``prompt_ids`` (the whole history and the new message)
    arrives at ``at_s``, asking for ``max_tokens`` (the answer's length)."""

    at_s: float
    conversation: int
    turn: int  # 0: the first
    system: int  # the shared system prompt it starts with (-1: its own)
    prompt_ids: tuple[int, ...]
    max_tokens: int


def _ids(rng: random.Random, n: int, vocab: int) -> list[int]:
    return [rng.randrange(3, vocab) for _ in range(n)]


def chat_requests(spec: ChatSpec, requests: int, seed: int = 0) -> list[ChatTurn]:
    """The first ``requests`` requests (by arrival) of conversations drawn with ``spec``."""
    if not (spec.rate_per_s > 0 and spec.mean_turns >= 1 and 0 <= spec.shared_share <= 1):
        raise ValueError("a chat workload needs rate_per_s > 0, mean_turns >= 1 and "
                         "shared_share in [0, 1]")
    rng = random.Random(seed)
    shared = [_ids(rng, sample_length(spec.system_tokens, rng), spec.vocab)
              for _ in range(spec.shared_prompts)]
    stop = 1.0 / spec.mean_turns  # geometric: each turn is the last with this probability
    out: list[ChatTurn] = []
    t = 0.0
    conv = 0
    # conversations start until their first turns alone exceed the count asked for: every
    # request that can arrive before the last one kept is drawn
    while conv < requests:
        t += rng.expovariate(spec.rate_per_s / spec.mean_turns)
        which = rng.randrange(len(shared)) if shared and rng.random() < spec.shared_share else -1
        history = list(shared[which]) if which >= 0 else _ids(
            rng, sample_length(spec.system_tokens, rng), spec.vocab)
        at, turn = t, 0
        while True:
            history += _ids(rng, sample_length(spec.user_tokens, rng), spec.vocab)
            answer = sample_length(spec.answer_tokens, rng)
            if len(history) + answer > spec.context_tokens:
                break
            out.append(ChatTurn(at, conv, turn, which, tuple(history), answer))
            if rng.random() < stop:
                break
            history += _ids(rng, answer, spec.vocab)
            at += answer / spec.answer_tps + rng.expovariate(1.0 / spec.think_s)
            turn += 1
        conv += 1
    out.sort(key=lambda r: (r.at_s, r.conversation, r.turn))
    return out[:requests]
