"""Guards v3 (meshd/cache/guards.py): for each rule, a near miss it must refuse (with its reason)
and a paraphrase it must pass."""

from __future__ import annotations

import pytest

from meshd.cache.guards import guard, question_kinds
from meshd.cache.lexical import numbers, words
from meshd.cache.wordclasses import operations, polarity, times, units


@pytest.mark.parametrize(("q", "c", "why"), [
    # time differs
    ("Is it going to rain in Seattle next weekend?",
     "Is it going to snow in Seattle this weekend?", "time differs"),
    ("Will it rain in Oslo next month?", "Is rain expected in Oslo this month?",
     "time differs"),
    ("What's the weather in Oslo?", "What's the weather in Oslo tonight?", "time differs"),
    ("Is it going to rain in Seattle this weekend?", "Will it rain in Seattle on the weekend?",
     None),  # "this weekend" is the weekend
    ("Book a table for 4 at 8 pm.", "Reserve a table for four people at 8 in the evening.",
     None),  # a part of the day in one prompt only is not a deictic time
    # weather differs
    ("Will it hail in Leeds this afternoon?", "Will there be fog in Leeds this afternoon?",
     "weather differs"),
    ("Is it rainy in Leeds?", "Are showers expected in Leeds?", None),  # one kind: rain
    # operation differs
    ("What is 45 divided by 3?", "What's 45 multiplied by 3?", "operation differs"),
    ("What is 7 ^ 3?", "What is 7 x 3?", "operation differs"),
    ("What is 12 x 12?", "What is 12 times 12?", None),  # one operation, two spellings
    ("What is the difference between a cat and a dog?", "How do a cat and a dog differ?",
     None),  # no numbers: not arithmetic
    # units differ
    ("Please convert 3 miles into kilometres.", "Convert 3 kilometers to miles.", "units differ"),
    ("Express 25 degrees Celsius in Fahrenheit.", "Convert 25 degrees Fahrenheit to Celsius.",
     "units differ"),
    ("How many grams are in a pint?", "A pint holds how many ounces?", "units differ"),
    ("How many kilometers is 3 miles?", "Convert 3 miles to kilometers.", None),
    # action differs
    ("What are the steps to disable two-factor authentication on my account?",
     "How do I turn on two-factor authentication on my account?", "action differs"),
    ("Cancel the alarm for 7 am.", "Please set an alarm for 7 am.", "action differs"),
    ("How do I remove my profile picture?", "How can I delete my profile picture?", None),
    # widened: question kinds, numbers, opposites
    ("Which writer wrote Moby-Dick?", "When was Moby-Dick first published?", "question differs"),
    ("Which writer wrote Hamlet?", "Who wrote Hamlet?", None),
    ("What makes cats purr?", "Why do cats purr?", None),
    ("How high is K2?", "How tall is K2?", None),
    ("How many years do cats live?", "How long do cats live?", None),
    ("What year did World War I end?", "What year did World War II end?", "numbers differ"),
    ("When did the Second World War end?", "What year did World War II end?", None),
    ("What's the second largest city in Peru?", "What's the largest city in Peru?",
     "numbers differ"),
    ("What do a virus and a bacterium have in common?",
     "What is the difference between a virus and a bacterium?", "opposite words"),
])
def test_guards_v3(q: str, c: str, why: str | None) -> None:
    assert guard(q, c) == why


def test_class_extractors() -> None:
    assert times("Rain next weekend or tonight in May?") == {"next weekend", "evening", "may"}
    assert times("May I book it on Sundays?") == {"sunday"}  # "May" opening: the verb
    assert operations("What is 9 - 4, or 3 / 2?") == {"subtract", "divide"}
    assert operations("The well-known x factor") == set()
    after, named = units("$1,000 at 25 °C over 5 feet 10 inches")
    assert after == {"1000": {"usd"}, "25": {"C"}, "5": {"ft"}, "10": {"inch"}}
    assert named["length"] == {"ft", "inch"}
    assert polarity("Turn the lights off") == {"off"} and polarity("set up 2FA") == {"on"}
    assert question_kinds(words("Which author wrote it, and in what year?")) == {"who", "when"}
    assert numbers("Henry VIII said: Can I go?") == ()  # "Henry" opens; "Can I" is a pronoun
    assert numbers("Frames per second, the second act") == ("2",)
