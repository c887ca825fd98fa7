"""The words and numbers of a prompt, as the cache's guards read them (``meshd.cache.guards``,
``meshd.cache.wordclasses``): lower-cased words, numbers with number words, ordinals and Roman
numerals after a name counted as digits, and rough singulars. Pure and cached: every guard
reads the same two prompts.
"""

from __future__ import annotations

import functools
import re

_NUMBER = re.compile(r"\d+(?:[.,:]\d+)*")
_WORD = re.compile(r"[a-z']+")
CASED_TOKEN = re.compile(r"[A-Za-z][A-Za-z']*|[.?!:;\"]")
SENTENCE_STOPS = frozenset('.?!:;"')
_SMALL = ("zero one two three four five six seven eight nine ten eleven twelve thirteen "
          "fourteen fifteen sixteen seventeen eighteen nineteen twenty")
_NUMBER_WORDS = {w: str(i) for i, w in enumerate(_SMALL.split())}
_ORDINALS = ("second third fourth fifth sixth seventh eighth ninth tenth eleventh twelfth "
             "thirteenth fourteenth fifteenth sixteenth seventeenth eighteenth nineteenth "
             "twentieth")  # "first" is left out: "the first" / "the original" say the same
_NUMBER_WORDS.update({w: str(i) for i, w in enumerate(_ORDINALS.split(), start=2)})
ROMAN = {"I": "1", "II": "2", "III": "3", "IV": "4", "V": "5", "VI": "6", "VII": "7",
          "VIII": "8", "IX": "9", "X": "10", "XI": "11", "XII": "12"}


def words(text: str) -> list[str]:
    return list(_words(text))


@functools.lru_cache(maxsize=4096)  # every guard reads the words of the same two prompts
def _words(text: str) -> tuple[str, ...]:
    return tuple(_WORD.findall(text.lower()))


@functools.lru_cache(maxsize=4096)
def numbers(text: str) -> tuple[str, ...]:
    """The numbers of a text, in order; number words up to twenty count as digits."""
    low = text.lower()
    found = [(m.start(), m.group().replace(",", "")) for m in _NUMBER.finditer(low)]
    found += [(m.start(), _NUMBER_WORDS[m.group()]) for m in _WORD.finditer(low)
              if m.group() in _NUMBER_WORDS and not _per_second(low, m.start())]
    found += [(pos, ROMAN[tok]) for pos, tok in roman_numerals(text)]
    return tuple(n for _, n in sorted(found))


def _per_second(low: str, start: int) -> bool:
    """"per second", "a second", "one second": the unit, not the ordinal."""
    return low.startswith("second", start) and low[:start].rstrip().endswith(
        (" per", " a", " one", " each", " every"))


def roman_numerals(text: str) -> list[tuple[int, str]]:
    """(position, numeral) of Roman numerals written after a name ("World War II", "Henry
    VIII"): an upper-case numeral whose previous word is capitalised and does not open a
    sentence (so "Can I" is a pronoun)."""
    out: list[tuple[int, str]] = []
    after_name, opening = False, True
    for m in CASED_TOKEN.finditer(text):
        tok = m.group()
        if tok in SENTENCE_STOPS:
            after_name, opening = False, True
            continue
        if tok in ROMAN and after_name:
            out.append((m.start(), tok))
        after_name, opening = tok[0].isupper() and not opening, False
    return out


def stem(word: str) -> str:
    """A plural's singular, roughly ("Sundays" / "Sunday"); possessives lose their "'s"."""
    word = word.removesuffix("'s")
    return word[:-1] if len(word) > 3 and word.endswith("s") and not word.endswith("ss") else word
