"""Lexical guards: pairs of prompts that embeddings put close together but that need different
answers, refused whatever their cosine similarity.

Pure functions of the two texts (the new prompt and the cached one); nothing is read or
written. Each guard returns the reason it refuses, so the journal and ``meshd explain`` can
say why a close neighbour was not served. A guard may cost a hit (a paraphrase that happens to
trip it), never a wrong answer; that is the trade that lets the similarity threshold sit lower.

1. **numbers differ**: the numbers (digits, and number words up to twenty) are not the same
   ("17 + 25" / "17 + 26", "7 am" / "seven pm" is caught by the words, see 2).
2. **negation differs**: a negation word ("not", "no", "never", "without", "-n't", ...) in an
   odd number in one prompt only; or **opposite words**: a word in one prompt whose negated
   form is in the other ("safe" / "unsafe", "enable" / "disable", "legal" / "illegal"), or one
   of a fixed list of general opposites ("on" / "off", "before" / "after", "open" / "closed",
   "today" / "tomorrow", ...: ``OPPOSITES``).
3. **word order**: the same words, two runs of them trading places around others ("Japan from
   the US" / "the US from Japan"): who does what to whom changed. A phrase moved to the front
   passes ("In a leap year, how many days are there?").
4. **minimal edit**: equal but for one run of at most two words replaced by another, where
   both sides of the run carry content ("today" / "tomorrow", "plus" / "minus", "France" /
   "Germany"). A run whose one side is only question framing (``FRAMING``: "what", "which",
   "tell me", "how much", "please", ...) is a rephrasing and passes ("What is the capital" /
   "Which city is the capital").
5. **question differs**: both prompts ask with a specific question word and not the same one
   ("who" / "when" / "where" / "why"): "Who wrote Hamlet?" / "When was Hamlet published?".
6. **names differ**: each prompt has a name (a capitalised word not opening a sentence) that
   the other lacks ("... in Mexico City" / "... in Copenhagen").

Guards v3 add closed classes of words where one member for another changes the answer; each
refuses only when *both* prompts name a member of the class (so a paraphrase that leaves the
word out passes), except the deictic time words (7):

7. **time differs**: relative time words and named times ("this weekend" / "next weekend",
   "tonight" / "tomorrow", "Friday", "March", "winter"); "this X" is X, "tonight" is "this
   evening", and "today" / "now" are the default. A deictic time in one prompt only
   ("tomorrow", "next week", "tonight") also refuses.
8. **weather differs**: kinds of weather ("rain" / "snow", "sunny" / "cloudy", "storm" /
   "fog").
9. **operation differs**: arithmetic operations ("divided by" / "multiplied by", "plus" /
   "times", "average" / "median", "%", "^"), when both prompts hold a number.
10. **units differ**: the unit written after the same number ("3 kilometers" / "3 miles",
    "25 degrees Celsius" / "25 degrees Fahrenheit"), or the units of one dimension
    ("minutes in a day" / "seconds in a day"; "kilometers to miles" / "miles to kilometers"
    is the same pair).
11. **action differs**: a verb that creates or switches on ("enable", "turn on", "install",
    "set", "book", "start") in one prompt, one that removes or switches off ("disable",
    "turn off", "uninstall", "cancel", "delete", "stop") in the other.

And guards v3 widen three of the first six: question words include "which/what" + a kind of
person ("which writer" = "who"), of date ("what year" = "when") and causes ("what makes" =
"why"), so a minimal edit between two phrasings of one question word passes ("Who wrote" /
"Which writer wrote", "How tall" / "How high", "How long do cats live" / "How many years do
cats live"); numbers include the ordinals "second" to "twentieth" and Roman numerals after a
name ("World War II" = "Second World War" != "World War I"); opposites include "difference" /
"in common".

Guards v4 (``meshd.cache.structure``) add two checks on the structure of the words the prompts
share, naming no topic:

12. **roles swapped**: two words (or numbers) of both prompts trade places around a third that
    stays between them ("Subtract 38 from 100." / "Subtract 100 from 38.", "tablespoons in a
    cup" / "cups in a tablespoon"); "A or B" / "B or A" passes.
13. **qualifier added**: one prompt is the other plus a run of at most three words holding a
    content word, not at the start ("... a cactus in winter?", "an egg white", "the square
    root of" / "the square of").
"""

from __future__ import annotations

import difflib
from collections import Counter
from collections.abc import Callable

from meshd.cache.lexical import CASED_TOKEN, ROMAN, SENTENCE_STOPS, numbers, stem, words
from meshd.cache.structure import roles_swapped
from meshd.cache.wordclasses import (
    OPERATION_OF,
    action_differs,
    operation_differs,
    time_differs,
    units_differ,
    weather_differs,
)

NEGATIONS = frozenset({"not", "no", "never", "without", "cannot", "nor", "none", "nothing"})
NEGATING_PREFIXES = ("un", "dis", "in", "im", "il", "ir", "non", "de", "anti")
OPPOSITES: tuple[tuple[str, str], ...] = (
    ("on", "off"), ("up", "down"), ("before", "after"), ("above", "below"),
    ("open", "closed"), ("open", "close"), ("start", "stop"), ("begin", "end"),
    ("first", "last"), ("more", "less"), ("most", "least"), ("increase", "decrease"),
    ("add", "remove"), ("buy", "sell"), ("high", "low"), ("hot", "cold"), ("max", "min"),
    ("maximum", "minimum"), ("today", "tomorrow"), ("today", "yesterday"),
    ("yesterday", "tomorrow"), ("am", "pm"), ("import", "export"), ("upload", "download"),
    ("enable", "disable"), ("allow", "deny"), ("accept", "reject"), ("win", "lose"),
    ("true", "false"), ("north", "south"), ("east", "west"),
    ("soft", "hard"), ("best", "worst"), ("better", "worse"), ("fast", "slow"),
    ("faster", "slower"), ("big", "small"), ("bigger", "smaller"), ("largest", "smallest"),
    ("long", "short"), ("longer", "shorter"), ("plus", "minus"), ("encrypt", "decrypt"),
    ("push", "pull"), ("send", "receive"), ("lock", "unlock"), ("freeze", "thaw"),
    ("boiling", "freezing"), ("difference", "common"), ("differences", "common"),
    ("different", "similar"), ("difference", "similarity"), ("differences", "similarities"),
)
_OPPOSITE = {(a, b) for a, b in OPPOSITES} | {(b, a) for a, b in OPPOSITES}
FRAMING = frozenset({
    "what", "what's", "whats", "which", "how", "tell", "me", "please", "is", "are", "the", "a",
    "an", "give", "show", "name", "much", "can", "could", "would", "you", "i", "do", "does",
    "let", "know", "say", "kindly", "explain", "describe", "quick", "question",
})
_PERSON_NOUNS = frozenset({
    "writer", "author", "poet", "novelist", "painter", "artist", "composer", "director",
    "filmmaker", "inventor", "architect", "scientist", "person", "man", "woman", "actor",
    "actress", "singer", "founder", "king", "queen", "president"})
_DATE_NOUNS = frozenset({"year", "date", "day", "month", "century", "decade", "time"})
_TIME_PLURALS = frozenset({"years", "months", "weeks", "days", "hours", "minutes", "seconds"})
SYNONYMS: tuple[tuple[str, str], ...] = (
    ("tall", "high"), ("taller", "higher"), ("tallest", "highest"), ("big", "large"),
    ("bigger", "larger"), ("biggest", "largest"), ("fast", "quick"), ("faster", "quicker"),
    ("fastest", "quickest"), ("begin", "start"), ("end", "finish"), ("buy", "purchase"),
)
_SYNONYM = {(a, b) for a, b in SYNONYMS} | {(b, a) for a, b in SYNONYMS}
QUESTION_WORDS = {"who": "who", "whom": "who", "whose": "who", "when": "when", "where": "where",
                  "why": "why"}  # the question words that say what kind of answer is wanted


def negations(text: str) -> int:
    return sum(w in NEGATIONS or w.endswith("n't") for w in words(text))


def opposite_words(query: str, cached: str) -> bool:
    """A word of one prompt (absent from the other) whose opposite is in the other only."""
    a, b = Counter(words(query)), Counter(words(cached))
    only_a, only_b = a - b, b - a  # as multisets: "turn on ... on my" / "turn off ... on my"
    for x in only_a:
        for y in only_b:
            if (x, y) in _OPPOSITE:
                return True
            short, long_ = (x, y) if len(x) < len(y) else (y, x)
            if len(short) >= 3 and any(long_ == p + short for p in NEGATING_PREFIXES):
                return True
    return False


def reordered(query: str, cached: str) -> bool:
    """The same words, with two runs of them trading places around words that stay put
    ("[Japan] from [the US]" / "[the US] from [Japan]"). Two neighbouring runs trading places
    is a phrase moved to the front and passes ("how many days [in a leap year]" / "[in a leap
    year], how many days")."""
    a, b = words(query), words(cached)
    if a == b or sorted(a) != sorted(b):
        return False
    n = len(a)
    if n > 40:
        return True  # too long to search: the same words in another order is enough
    for i in range(n):
        for j in range(i + 1, n):
            for k in range(j + 1, n):  # a[j:k] is the pivot, at least one word
                for m in range(k + 1, n + 1):
                    if a[:i] + a[k:m] + a[j:k] + a[i:j] + a[m:] == b:
                        return True
    return False


def minimal_edit(query: str, cached: str, max_words: int = 2) -> bool:
    """Whether two different prompts are one content-changing edit apart: the same words but
    for one replaced run of at most ``max_words`` words, each side of it holding a word that
    is not question framing."""
    a, b = words(query), words(cached)
    if a == b:
        return False
    ops = [op for op in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes()
           if op[0] != "equal"]
    if len(ops) != 1 or ops[0][0] != "replace":
        return False
    _, i1, i2, j1, j2 = ops[0]
    if i2 - i1 > max_words or j2 - j1 > max_words:
        return False
    x, y = a[i1:i2], b[j1:j2]
    return not (set(x) <= FRAMING or set(y) <= FRAMING or _same_sense(x, y))


def question_kinds(ws: list[str]) -> set[str]:
    """The kinds of answer asked for: the question words, and "which/what" + a kind of person
    ("which writer": who) or of date ("what year": when), "what makes/causes", "how come" and
    "the reason" (why)."""
    out = {QUESTION_WORDS[w] for w in ws if w in QUESTION_WORDS}
    for w, nxt in zip(ws, ws[1:], strict=False):
        if w in ("which", "what") and nxt in _PERSON_NOUNS:
            out.add("who")
        elif w in ("which", "what") and nxt in _DATE_NOUNS:
            out.add("when")
        elif (w, nxt) in (("what", "makes"), ("what", "causes"), ("how", "come")):
            out.add("why")
    if "reason" in ws:
        out.add("why")
    return out


def question_differs(query: str, cached: str) -> bool:
    qa, qb = question_kinds(words(query)), question_kinds(words(cached))
    return bool(qa and qb and qa != qb)


def _same_sense(x: list[str], y: list[str]) -> bool:
    """Two replaced runs that ask the same: one kind of question ("who" / "which writer",
    "why do" / "what makes"), one arithmetic operation ("x" / "times"), listed synonyms
    ("tall" / "high"), or "long" / "many years"."""
    kx = question_kinds(x)
    if kx and kx == question_kinds(y):
        return True
    ox = {OPERATION_OF[w] for w in x if w in OPERATION_OF}
    if ox and ox == {OPERATION_OF[w] for w in y if w in OPERATION_OF}:
        return True  # "12 x 12" / "12 times 12"
    cx, cy = [w for w in x if w not in FRAMING], [w for w in y if w not in FRAMING]
    if len(cx) == 1 and len(cy) == 1 and (cx[0], cy[0]) in _SYNONYM:
        return True
    dur = (cx == ["long"] and len(cy) == 2 and cy[0] == "many" and cy[1] in _TIME_PLURALS)
    return dur or (cy == ["long"] and len(cx) == 2 and cx[0] == "many"
                   and cx[1] in _TIME_PLURALS)


def names(text: str) -> set[str]:
    """Capitalised words that do not open a sentence (nor "I"), lower-cased."""
    out: set[str] = set()
    opening = True
    for tok in CASED_TOKEN.findall(text):
        if tok in SENTENCE_STOPS:
            opening = True
            continue
        if not opening and tok[0].isupper() and tok not in ROMAN:
            out.add(stem(tok.lower()))
        opening = False
    return out


def names_differ(query: str, cached: str) -> bool:
    """Each prompt names something the other does not mention at all."""
    wa, wb = {stem(w) for w in words(query)}, {stem(w) for w in words(cached)}
    return bool(names(query) - wb and names(cached) - wa)


GUARDS: tuple[tuple[str, Callable[[str, str], bool]], ...] = (
    ("numbers differ", lambda q, c: sorted(numbers(q)) != sorted(numbers(c))),
    ("negation differs", lambda q, c: negations(q) % 2 != negations(c) % 2),
    ("opposite words", opposite_words),
    ("word order", reordered),
    ("minimal edit", minimal_edit),
    ("question differs", question_differs),
    ("names differ", names_differ),
    ("time differs", time_differs),
    ("weather differs", weather_differs),
    ("operation differs", operation_differs),
    ("units differ", units_differ),
    ("action differs", action_differs),
    ("roles swapped", roles_swapped),
)


def guard(query: str, cached: str, skip: frozenset[str] = frozenset()) -> str | None:
    """Why ``cached``'s answer must not answer ``query`` whatever their similarity, or None.
    ``skip``: guards (by reason) to leave out (the benchmark measures each one's share)."""
    for why, refuses in GUARDS:
        if why not in skip and refuses(query, cached):
            return why
    return None
