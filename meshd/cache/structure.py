"""Guards v4 (``meshd.cache.guards``, docstring 12-13): two structural checks on the words the
two prompts share, not on lists of words of a kind.

12. **roles swapped**: two words of both prompts trade places around a third that stays between
    them, within a few words ("Subtract [38] from [100]" / "Subtract [100] from [38]", "Is [221]
    divisible by [13]" / "Is [13] divisible by [221]", "how many [tablespoons] are in a [cup]" /
    "how many [cups] are in a [tablespoon]", "wait to [swim] after [eating]" / "wait to [eat]
    after [swimming]"). Numbers count as words here, and words are compared by a rough root
    ("eating" / "eat"). A coordination ("Serena or Venus", "salt and pepper") is symmetric and
    passes, as does a phrase moved as a whole ("In a leap year, how many days" / "How many
    days in a leap year": no word stays between the two that moved).
13. **qualifier added**: one prompt is the other plus one run of at most three words that holds
    a content word ("How often should I water a cactus [in winter]?", "protein in an egg
    [white]", "in [half] a cup", "the Nobel [Peace] Prize"; or the other way round, "the
    square [root] of 196" / "the square of 196"), everything else equal but for light words
    (``LIGHT``: question framing, articles, pronouns, auxiliaries, prepositions, hedges such as
    "exactly" or "usually"). The qualifier narrows or changes what is asked. A run at the very
    start is framing and passes ("[Convert] 5 feet 10 inches to centimeters" / "5 feet 10
    inches in centimeters?", "[Walk me through] how to ..."), and so is a run that ends with
    "of" (a head noun put in front: "reverse [the order of] a list") or that names only an
    symbol replaced by words ("144 divided by 12" / "144 / 12" is a replacement, not an addition).

Both were written after reading the near misses of the ``fresh2`` split that guards v3 served
(docs/cache.md); unlike v3's classes they name no topic, so they are meant to carry over to
prompts about anything. Pure functions of the two texts.
"""

from __future__ import annotations

import difflib
import functools
import re
from dataclasses import dataclass

_TOKEN = re.compile(r"[a-z]+(?:'[a-z]+)?|\d+(?:[.,]\d+)*|[-+*/^%=×÷]")
SYMMETRIC = frozenset({"or", "and", "vs", "versus", "nor"})
MAX_SPAN = 5  # words from the first of the swapped pair to the second, in each prompt
MAX_RUN = 3
_LIGHT_WORDS = """
a an the this that these those some any my your our their his her its it it's there
i me we you us they them he she one
is are was were be been being am do does did doing can could would should will shall may might
must have has had
what what's whats which who whom whose how how's when where why
of to in on at for by with from into onto about as than then so if
tell give show name let know say explain describe please kindly quick question
exactly actually usually really just quickly roughly approximately typically generally
normally basically currently even also still ever
much many and or
"""
LIGHT = frozenset(_LIGHT_WORDS.split())
_STOP_ROLE = LIGHT - {"from", "to", "in", "on", "at", "for", "by", "with", "into", "onto",
                      "about", "than"}  # a swapped pair must be content words or numbers


@dataclass(frozen=True, slots=True)
class Added:
    """A run of words one prompt has and the other lacks (``qualifier_added``): ``side`` is
    the prompt that has it (``"query"`` or ``"cached"``), ``spans`` the character spans there
    of its content words."""

    side: str
    spans: tuple[tuple[int, int], ...]


@functools.lru_cache(maxsize=4096)
def _scan(text: str) -> tuple[tuple[str, int, int], ...]:
    """(root, start, end) of each word and number of ``text``, in order."""
    return tuple((root(m.group().replace(",", "")), m.start(), m.end())
                 for m in _TOKEN.finditer(text.lower()))


def roots(text: str) -> tuple[str, ...]:
    return tuple(r for r, _, _ in _scan(text))


def root(word: str) -> str:
    """A rough root: plural and verb endings dropped ("cups" / "cup", "swimming" / "swim",
    "eating" / "eat", "flashing" / "flash"); possessives lose their "'s"."""
    word = word.removesuffix("'s")
    for suffix in ("ing", "ed", "es", "s"):
        if len(word) > len(suffix) + 2 and word.endswith(suffix) and not word.endswith("ss"):
            word = word[: -len(suffix)]
            if suffix in ("ing", "ed") and len(word) > 2 and word[-1] == word[-2]:
                word = word[:-1]  # "swimming" -> "swimm" -> "swim"
            return word
    return word


def roles_swapped(query: str, cached: str) -> bool:
    """Two words of both prompts trade places around the same words ("[38] from [100]" /
    "[100] from [38]"; see the module docstring, 12)."""
    a, b = roots(query), roots(cached)
    once = {w for w in set(a) & set(b) if a.count(w) == 1 and b.count(w) == 1}
    if len(once) < 2 or len(once) > 40:
        return False
    pa = {w: i for i, w in enumerate(a) if w in once}
    pb = {w: i for i, w in enumerate(b) if w in once}
    movers = sorted(w for w in once if w not in _STOP_ROLE)
    for x in movers:
        for y in movers:
            if not (pa[x] + 1 < pa[y] <= pa[x] + MAX_SPAN and pb[y] + 1 < pb[x] <= pb[y] + MAX_SPAN):
                continue
            between = a[pa[x] + 1:pa[y]]
            if between == b[pb[y] + 1:pb[x]] and not set(between) <= SYMMETRIC:
                return True
    return False


def added_run(query: str, cached: str) -> Added | None:
    """The run of words one prompt adds to the other, everything else equal but for light
    words, when it is a qualifier by its shape (see the module docstring, 13), else None."""
    sa, sb = _scan(query), _scan(cached)
    a, b = tuple(r for r, _, _ in sa), tuple(r for r, _, _ in sb)
    if a == b:
        return None
    ops = difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes()
    added: list[tuple[str, int, int]] = []
    for tag, i1, i2, j1, j2 in ops:
        x, y = a[i1:i2], b[j1:j2]
        if tag == "equal" or (set(x) <= LIGHT and set(y) <= LIGHT):
            continue
        if set(x) <= LIGHT:  # words the cached prompt adds (x may hold light words)
            added.append(("cached", j1, j2))
        elif set(y) <= LIGHT:
            added.append(("query", i1, i2))
        else:
            return None  # a content word replaced: not an addition
    if len(added) != 1:
        return None
    side, start, end = added[0]
    scan = sa if side == "query" else sb
    run = [r for r, _, _ in scan[start:end]]
    content = [(s, e) for r, s, e in scan[start:end] if r not in LIGHT]
    if len(run) > MAX_RUN or not content:
        return None
    if all(r in LIGHT for r, _, _ in scan[:start]):
        return None  # at the start: framing ("Convert ...", "Steps to ...")
    if run[-1] == "of":
        return None  # a head noun put in front ("the order of a list")
    return Added(side, tuple(content))


def qualifier_added(query: str, cached: str) -> bool:
    """Whether one prompt adds a qualifier to the other by its shape alone (the policy asks
    the encoder whether the added words have a partner before it refuses: docs/cache.md)."""
    return added_run(query, cached) is not None
