"""Guards v4 (meshd/cache/structure.py): roles swapped, and the shape of an added qualifier with
the policy's verifier over it (fed a fake alignment here; the real encoder's in
test_cache_verifier.py)."""

from __future__ import annotations

import pytest

from meshd.cache.guards import guard
from meshd.cache.policy import AdaptiveThreshold, FixedThreshold, qualifier
from meshd.cache.structure import Added, added_run, roles_swapped, root


@pytest.mark.parametrize(("q", "c", "swapped"), [
    ("Subtract 100 from 38.", "Subtract 38 from 100.", True),
    ("Is 13 divisible by 221?", "Is 221 divisible by 13?", True),
    ("What is 10 to the power of 2?", "What is 2 to the power of 10?", True),
    ("How many cups are in a tablespoon?", "How many tablespoons are in a cup?", True),
    ("How long should I wait to eat after swimming?",
     "How long should I wait to swim after eating?", True),
    ("How much is a flight from Paris to Rome?", "How much is a flight from Rome to Paris?",
     True),
    # coordination is symmetric; phrases moved with other words between them pass
    ("Which is older, Venus or Serena?", "Which is older, Serena or Venus?", False),
    ("Is it going to be sunny in Lisbon on Saturday?", "Saturday weather in Lisbon: sunny?",
     False),
    ("In a leap year, how many days are there?", "How many days are there in a leap year?",
     False),
    ("Turn the living room lights off.", "Switch off the lights in the living room.", False),
    ("What is 38 plus 100?", "What is 38 plus 100?", False),
])
def test_roles_swapped(q: str, c: str, swapped: bool) -> None:
    assert roles_swapped(q, c) is swapped
    if swapped:
        assert guard(q, c) is not None  # ("word order" may refuse first)


def _added_words(q: str, c: str) -> list[str] | None:
    got = added_run(q, c)
    if got is None:
        return None
    text = q if got.side == "query" else c
    return [text[s:e] for s, e in got.spans]


@pytest.mark.parametrize(("q", "c", "added"), [
    ("How often should I water a cactus in winter?", "How often should I water a cactus?",
     ["winter"]),
    ("How many grams of protein are in an egg white?",
     "How many grams of protein are in an egg?", ["white"]),
    ("How many tablespoons are in half a cup?", "How many tablespoons are in a cup?", ["half"]),
    ("What is the square of 196?", "What is the square root of 196?", ["root"]),  # cached adds
    ("Who won the Nobel Peace Prize?", "Who won a Nobel Prize?", ["Peace"]),
    ("What's the capital city of France?", "What is the capital of France?", ["city"]),
    # framing at the start, a head noun in front, replacements, light words: no added run
    ("Convert 5 feet 10 inches to centimeters.", "5 feet 10 inches in centimeters?", None),
    ("How can I reverse the order of a list in Java?", "How do I reverse a list in Java?", None),
    ("What's 17 + 25?", "What is 17 plus 25?", None),
    ("What is the speed limit here?", "What is the minimum speed here?", None),
    ("Can you tell me exactly how tall K2 is?", "How tall is K2?", None),
    ("How often should I water a cactus in winter and in summer?",
     "How often should I water a cactus?", None),  # longer than three words
])
def test_added_run(q: str, c: str, added: list[str] | None) -> None:
    assert _added_words(q, c) == added


def test_root() -> None:
    assert [root(w) for w in ("swimming", "eating", "cups", "flashing", "glass", "bus")] == [
        "swim", "eat", "cup", "flash", "glass", "bus"]


@pytest.mark.parametrize("policy", [FixedThreshold(), AdaptiveThreshold(delta=0.5)])
def test_the_verifier_refuses_an_unaligned_qualifier_above_the_threshold(
        policy: FixedThreshold | AdaptiveThreshold) -> None:
    q, c = "How often should I water a cactus in winter?", "How often should I water a cactus?"
    seen: list[Added] = []

    def align(score: float) -> object:
        def f(added: Added) -> float:
            seen.append(added)
            return score
        return f

    assert policy.decide(0.97, q, c, align=align(0.2)).reason == "qualifier added"  # type: ignore[arg-type]
    assert policy.decide(0.97, q, c, align=align(0.8)).kind == "hit"  # type: ignore[arg-type]
    assert policy.decide(0.97, q, c).kind == "hit"  # no verifier: the shape alone never refuses
    n = len(seen)
    assert policy.decide(0.5, q, c, align=align(0.2)).kind == "miss"  # type: ignore[arg-type]
    assert len(seen) == n  # below the threshold: the verifier is not asked
    assert qualifier("What is the capital of France?", "Capital of France?", align(0.0), 0.5) \
        is None  # type: ignore[arg-type]
