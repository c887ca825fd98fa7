"""Whether the semantic path serves a cached answer: one pure decision.

A semantic lookup embeds the question and finds the nearest cached one of the partitions the
request may read (cosine ``similarity``). That entry is a *candidate* when the similarity
reaches the calibration's ``gate``; the pair verifier (meshd.embed.pair_verifier: both
questions read at once) then scores it, P(the cached answer is right for this question), and
it is served when the score is above ``limit``, the threshold the error bound gives for the
request's ``max_error`` (meshd.cache.bound). Only the nearest entry is asked about: the bound
is calibrated on one candidate per lookup. No limit (the bound cannot hold at that
``max_error``) refuses without asking.

Pure: the similarity, the limit and a callable for the score come in, a ``Decision`` comes out.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

Kind = Literal["hit", "refused", "miss"]


@dataclass(frozen=True, slots=True)
class Decision:
    kind: Kind  # hit: serve; refused: a candidate the bound did not let through; miss: none
    reason: str
    similarity: float | None = None
    score: float | None = None  # the verifier's score, when it was asked
    threshold: float | None = None  # the score a hit had to beat


def decide(similarity: float | None, gate: float, limit: float | None,
           score: Callable[[], float]) -> Decision:
    """``similarity``: of the nearest cached question (None: nothing cached); ``limit``: the
    bound's threshold (None: nothing may be served); ``score``: the verifier, called at most
    once and only for a candidate."""
    if similarity is None:
        return Decision("miss", "nothing cached to compare with")
    if similarity < gate:
        return Decision("miss", "nearest question below the gate", similarity)
    if limit is None:
        return Decision("refused", "the error bound cannot hold at this max_error", similarity)
    p = score()
    if p > limit:
        return Decision("hit", "verifier score above the bound's threshold", similarity, p, limit)
    return Decision("refused", "verifier score not above the bound's threshold", similarity, p,
                    limit)
