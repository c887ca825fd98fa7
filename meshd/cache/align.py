"""The verifier of guards v4's "qualifier added" (meshd.cache.structure, 13): do the words one
prompt adds to the other have a partner in it, by the encoder's contextual word vectors?

A run added at the end or inside a prompt is sometimes a qualifier that changes the question
("How often should I water a cactus [in winter]?", "an egg [white]") and sometimes a rewording
whose words the other prompt says in its own way ("Has a storm warning been [issued]" / "Is
there a storm warning", "Weather [forecast] for Paris" / "What's the weather in Paris"). The
shape cannot tell them apart; the encoder can: each added content word's vector (its
word-pieces' last hidden states, averaged) is compared with every word of the other prompt, and
the best cosine is its alignment. On the development splits the added words of near misses
aligned at 0.16-0.45 and those of paraphrases at 0.52 and above (int8, docs/cache.md); the
policy refuses below ``added_word_bound`` (0.5).

``word_states`` is any ``text -> (word char spans, [words, dim] unit vectors)``:
``meshd.embed.token_states.TokenStates.words`` in the daemon, a table in the benchmark.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from meshd.cache.structure import Added

WordStates = tuple[tuple[tuple[int, int], ...], np.ndarray]


def added_alignment(word_states: Callable[[str], WordStates], query: str, cached: str,
                    added: Added) -> float:
    """The lowest alignment of the added run's content words (1.0 when none can be found)."""
    longer, other = (query, cached) if added.side == "query" else (cached, query)
    spans, vecs = word_states(longer)
    _, others = word_states(other)
    if not len(vecs) or not len(others):
        return 0.0
    best = (vecs @ others.T).max(axis=1)
    out = 1.0
    for start, end in added.spans:
        rows = [i for i, (s, e) in enumerate(spans) if s < end and start < e]
        if rows:
            out = min(out, float(best[rows].max()))
    return out
