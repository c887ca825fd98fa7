"""Cheap features of a prompt, for the tier classifier (docs/tiers.md): length, code markers,
numbers, question structure and language, plus the prompt's class for policy pins.

Pure and fast (a few tens of microseconds for a short prompt): the entry node computes them
beside the sentence embedding, and the training script (scripts/train_tier_classifier.py)
computes the very same ones, so the classifier sees at run time what it was trained on.
Long prompts are read up to ``MAX_CHARS`` (the length features still count the whole text).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

MAX_CHARS = 8192  # the part of a prompt the pattern features read

FEATURE_NAMES = (
    "log_chars", "log_words", "log_lines", "log_code_markers", "code_block", "digit_share",
    "log_numbers", "math_ops", "questions", "wh_start", "log_sentences", "asks",
    "non_ascii_share", "english_share",
)  # fmt: skip

PROMPT_CLASSES = ("code", "math", "text")

_CODE = re.compile(
    r"```|\bdef |\bclass |\breturn\b|\bimport |\bfn |\bfunc |=>|->|;\s*$|\{\s*$|^\s*[}\]]|"
    r"\b(?:if|for|while)\s*\(|\(\)|\w+\(\w*[,)]|^ {4}\S",
    re.MULTILINE,
)
_NUMBER = re.compile(r"\d+(?:[.,]\d+)?")
_MATH = re.compile(r"\d\s*[-+*/^=%]\s*\d|[=<>]=|\bsquared\b|\^")
_SENTENCE = re.compile(r"[.!?]+(?:\s|$)")
_WORD = re.compile(r"[^\W\d_]+", re.UNICODE)
_WH = re.compile(
    r"^\s*(?:what|who|whom|which|where|when|why|how|is|are|was|were|do|does|did|can|could|"
    r"should|would|will|name|give|tell|define)\b",
    re.IGNORECASE,
)
# separate asks inside one prompt: "then", "and explain", "with", lists
_ASK = re.compile(r"\bthen\b|\band (?:explain|say|give|write|compare|justify|list)\b|"
                  r"\bstep by step\b|\bincluding\b|\bwith (?:a|an|the)?\s*\w+|^\s*(?:\d+[.)]|[-*])\s",
                  re.IGNORECASE | re.MULTILINE)
_STOP = frozenset(
    ["the", "a", "an", "of", "to", "in", "and", "or", "is", "are", "was", "be", "for", "on", "with", "as", "by", "at", "it", "this", "that", "what", "how", "why", "which", "who", "do", "does", "you", "i", "me", "my", "your", "from", "not", "can"]
)


@dataclass(frozen=True, slots=True)
class PromptFeatures:
    """The features of one prompt (see ``FEATURE_NAMES``) and its class."""

    values: tuple[float, ...]
    prompt_class: str  # "code", "math" or "text"

    def named(self) -> dict[str, float]:
        return {k: round(v, 4) for k, v in zip(FEATURE_NAMES, self.values, strict=True)}


def prompt_features(text: str) -> PromptFeatures:
    """The cheap features of ``text`` (any language, any length)."""
    head = text[:MAX_CHARS]
    chars = len(text)
    words = _WORD.findall(head)
    n_words = len(words) if chars <= MAX_CHARS else int(len(words) * chars / max(len(head), 1))
    code = len(_CODE.findall(head))
    numbers = _NUMBER.findall(head)
    digits = sum(c.isdigit() for c in head)
    non_ascii = sum(ord(c) > 127 for c in head)
    latin_words = [w.lower() for w in words if w.isascii()]
    english = sum(w in _STOP for w in latin_words) / max(len(words), 1)
    math_ops = len(_MATH.findall(head))
    values = (
        math.log1p(chars),
        math.log1p(n_words),
        math.log1p(text.count("\n")),
        math.log1p(code),
        1.0 if "```" in head else 0.0,
        digits / max(len(head), 1),
        math.log1p(len(numbers)),
        min(math_ops, 5) / 5.0,
        min(head.count("?"), 3) / 3.0,
        1.0 if _WH.match(head) else 0.0,
        math.log1p(len(_SENTENCE.findall(head))),
        min(len(_ASK.findall(head)), 5) / 5.0,
        non_ascii / max(len(head), 1),
        english,
    )
    if code >= 2 or "```" in head:
        cls = "code"
    elif len(numbers) >= 2 and math_ops >= 1:
        cls = "math"
    else:
        cls = "text"
    return PromptFeatures(values, cls)
