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
"""

from __future__ import annotations

import difflib
import re
from collections import Counter
from collections.abc import Callable

_NUMBER = re.compile(r"\d+(?:[.,:]\d+)*")
_WORD = re.compile(r"[a-z']+")
_CASED = re.compile(r"[A-Za-z][A-Za-z']*|[.?!:;\"]")
_STOPS = frozenset('.?!:;"')
_SMALL = ("zero one two three four five six seven eight nine ten eleven twelve thirteen "
          "fourteen fifteen sixteen seventeen eighteen nineteen twenty")
_NUMBER_WORDS = {w: str(i) for i, w in enumerate(_SMALL.split())}
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
    ("boiling", "freezing"),
)
_OPPOSITE = {(a, b) for a, b in OPPOSITES} | {(b, a) for a, b in OPPOSITES}
FRAMING = frozenset({
    "what", "what's", "whats", "which", "how", "tell", "me", "please", "is", "are", "the", "a",
    "an", "give", "show", "name", "much", "can", "could", "would", "you", "i", "do", "does",
    "let", "know", "say", "kindly", "explain", "describe", "quick", "question",
})
QUESTION_WORDS = {"who": "who", "whom": "who", "whose": "who", "when": "when", "where": "where",
                  "why": "why"}  # the question words that say what kind of answer is wanted


def words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def numbers(text: str) -> tuple[str, ...]:
    """The numbers of a text, in order; number words up to twenty count as digits."""
    low = text.lower()
    found = [(m.start(), m.group().replace(",", "")) for m in _NUMBER.finditer(low)]
    found += [(m.start(), _NUMBER_WORDS[m.group()]) for m in _WORD.finditer(low)
              if m.group() in _NUMBER_WORDS]
    return tuple(n for _, n in sorted(found))


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
    return not (set(a[i1:i2]) <= FRAMING or set(b[j1:j2]) <= FRAMING)


def question_differs(query: str, cached: str) -> bool:
    qa = {QUESTION_WORDS[w] for w in words(query) if w in QUESTION_WORDS}
    qb = {QUESTION_WORDS[w] for w in words(cached) if w in QUESTION_WORDS}
    return bool(qa and qb and qa != qb)


def names(text: str) -> set[str]:
    """Capitalised words that do not open a sentence (nor "I"), lower-cased."""
    out: set[str] = set()
    opening = True
    for tok in _CASED.findall(text):
        if tok in _STOPS:
            opening = True
            continue
        if not opening and tok[0].isupper() and tok != "I":
            out.add(_stem(tok.lower()))
        opening = False
    return out


def _stem(word: str) -> str:
    """A plural's singular, roughly ("Sundays" / "Sunday"); possessives lose their "'s"."""
    word = word.removesuffix("'s")
    return word[:-1] if len(word) > 3 and word.endswith("s") and not word.endswith("ss") else word


def names_differ(query: str, cached: str) -> bool:
    """Each prompt names something the other does not mention at all."""
    wa, wb = {_stem(w) for w in words(query)}, {_stem(w) for w in words(cached)}
    return bool(names(query) - wb and names(cached) - wa)


GUARDS: tuple[tuple[str, Callable[[str, str], bool]], ...] = (
    ("numbers differ", lambda q, c: sorted(numbers(q)) != sorted(numbers(c))),
    ("negation differs", lambda q, c: negations(q) % 2 != negations(c) % 2),
    ("opposite words", opposite_words),
    ("word order", reordered),
    ("minimal edit", minimal_edit),
    ("question differs", question_differs),
    ("names differ", names_differ),
)


def guard(query: str, cached: str, skip: frozenset[str] = frozenset()) -> str | None:
    """Why ``cached``'s answer must not answer ``query`` whatever their similarity, or None.
    ``skip``: guards (by reason) to leave out (the benchmark measures each one's share)."""
    for why, refuses in GUARDS:
        if why not in skip and refuses(query, cached):
            return why
    return None
