"""A multi-turn chat workload: conversations whose every turn resends the history (issue 32).

Real chat traffic repeats itself at the front: turn ``k + 1`` of a conversation is the system
prompt, every earlier user message and answer, and the new user message. ``chat_requests``
draws such conversations as token ids (seeded; synthetic ids, fresh for every message: only
equality of prefixes matters to a prefix cache and to prefix-aware routing), so the simulator
(``[[arrivals]] process = "chat"``, ``ChatStream``) and the testnet benchmark can replay the same
requests to every strategy.

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

import collections
import dataclasses
import functools
import math
import random
from dataclasses import dataclass

from meshd.sim.scenario import ArrivalSpec, ChatSpec
from meshd.sim.workload import sample_length

__all__ = ["ChatSpec", "ChatStream", "ChatTurn", "chat_requests", "mean_sizes"]


@dataclass(frozen=True)
class ChatTurn:
    """One request of the workload: ``prompt_ids`` (the whole history and the new message)
    arrives at ``at_s``, asking for ``max_tokens`` (the answer's length); ``answer_ids`` are
    the answer's tokens as the next turn resends them (the generated tokens, assumed to encode
    back to themselves: tests/engine/test_prefix.py holds it for a real SmolLM2 chat)."""

    at_s: float
    conversation: int
    turn: int  # 0: the first
    system: int  # the shared system prompt it starts with (-1: its own)
    prompt_ids: tuple[int, ...]
    max_tokens: int
    answer_ids: tuple[int, ...] = ()


class _Ids:
    """Fresh token ids for each message: a counter, so no two messages share a token and a
    shared system prompt is the same ids wherever it opens a conversation (only equality of
    prefixes matters to a prefix cache; ranges are cheap to draw and to extend a history by)."""

    def __init__(self) -> None:
        self.next = 3

    def __call__(self, n: int) -> range:
        out = range(self.next, self.next + n)
        self.next += n
        return out


def chat_requests(spec: ChatSpec, requests: int, seed: int = 0, *,
                  until_s: float | None = None) -> list[ChatTurn]:
    """The first ``requests`` requests (by arrival) of conversations drawn with ``spec``;
    with ``until_s``, only those arriving by then (no conversation starts later)."""
    if not (spec.rate_per_s > 0 and spec.mean_turns >= 1 and 0 <= spec.shared_share <= 1):
        raise ValueError("a chat workload needs rate_per_s > 0, mean_turns >= 1 and "
                         "shared_share in [0, 1]")
    rng = random.Random(seed)
    ids = _Ids()
    shared = [list(ids(sample_length(spec.system_tokens, rng))) for _ in range(spec.shared_prompts)]
    stop = 1.0 / spec.mean_turns  # geometric: each turn is the last with this probability
    out: list[ChatTurn] = []
    t = 0.0
    conv = 0
    # conversations start until their first turns alone exceed the count asked for: every
    # request that can arrive before the last one kept is drawn
    while conv < requests:
        t += rng.expovariate(spec.rate_per_s / spec.mean_turns)
        if until_s is not None and t > until_s:
            break
        which = rng.randrange(len(shared)) if shared and rng.random() < spec.shared_share else -1
        history = list(shared[which]) if which >= 0 else list(
            ids(sample_length(spec.system_tokens, rng)))
        at, turn = t, 0
        while until_s is None or at <= until_s:
            history += ids(sample_length(spec.user_tokens, rng))
            answer = sample_length(spec.answer_tokens, rng)
            if len(history) + answer > spec.context_tokens:
                break
            answer_ids = tuple(ids(answer))
            out.append(ChatTurn(at, conv, turn, which, tuple(history), answer, answer_ids))
            if rng.random() < stop:
                break
            history += answer_ids
            at += answer / spec.answer_tps + rng.expovariate(1.0 / spec.think_s)
            turn += 1
        conv += 1
    out.sort(key=lambda r: (r.at_s, r.conversation, r.turn))
    return out[:requests]


@functools.lru_cache(maxsize=16)
def mean_sizes(spec: ChatSpec, samples: int = 4000, seed: int = 7) -> tuple[float, float]:
    """The mean prompt (whole history) and answer tokens of the workload's requests (drawn
    once per spec: every stream of a scenario shares it)."""
    reqs = chat_requests(spec, samples, seed)
    n = max(len(reqs), 1)
    return sum(len(r.prompt_ids) for r in reqs) / n, sum(r.max_tokens for r in reqs) / n


LEAD_TURNS = 5  # turn gaps drawn before the run: a conversation of more turns is rare (1/32)


class ChatStream:
    """One ``[[arrivals]]`` stream of process ``"chat"``, with ``ArrivalStream``'s interface
    (``next_time``, ``rng``, ``spec``): its requests are drawn up front (``chat_requests``,
    seeded by the scenario seed and the stream's index), and each turn enters at the node its
    conversation entered at first (a client keeps talking to its node; another when that one
    is gone).

    The conversations start ``LEAD_TURNS`` mean turn gaps (answer and think time) before the
    run, and only the turns arriving from 0 on are kept: requests come at the stream's
    ``rate_per_s`` from the start, later turns among them, instead of first turns alone until
    the first think times pass (a mesh that has been serving chats for a while)."""

    def __init__(self, spec: ArrivalSpec, index: int, seed: int, until_s: float) -> None:
        assert spec.chat is not None
        self.spec = spec
        self.index = index
        self.rng = random.Random((seed * 1_000_003) ^ (index * 7919 + 17))
        chat = dataclasses.replace(spec.chat, rate_per_s=spec.rate_per_s)
        lead = LEAD_TURNS * (chat.think_s + chat.answer_tokens.mean / chat.answer_tps)
        drawn = (chat_requests(chat, 1 << 62, seed * 7_919 + index, until_s=until_s + lead)
                 if spec.rate_per_s > 0 else [])
        self.turns = [dataclasses.replace(t, at_s=t.at_s - lead) for t in drawn
                      if t.at_s >= lead]
        self._next = 0
        self._scheduled: collections.deque[ChatTurn] = collections.deque()
        self._entry: dict[int, int] = {}  # conversation -> its entry node

    def next_time(self) -> float:
        """The next request's arrival instant (``inf`` when there is none)."""
        if self._next >= len(self.turns):
            return math.inf
        turn = self.turns[self._next]
        self._next += 1
        self._scheduled.append(turn)
        return turn.at_s

    def take(self, alive: list[int]) -> tuple[ChatTurn, int]:
        """The request arriving now (the oldest scheduled) and its entry node (-1: none)."""
        turn = self._scheduled.popleft()
        entry = self._entry.get(turn.conversation, -1)
        if entry not in alive:  # a list of a region's live nodes: short, once per request
            entry = alive[self.rng.randrange(len(alive))] if alive else -1
            self._entry[turn.conversation] = entry
        return turn, entry
