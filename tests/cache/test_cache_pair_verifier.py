"""The learned pair verifier shipped with meshd (meshd/data/verifier, meshd.embed.pair_verifier)
with the real all-MiniLM-L6-v2 word table, and its calibration: the graph loads, scores near
misses below the default threshold and paraphrases above it (written for this test, in no
split of the labelled pairs), and the calibration was made on splits it was not trained on.

Of the seven paraphrases written for this test, two score above the default threshold (0.84 for
the int8 graph the daemon runs; the Berlin Wall "come down" and the Sistine Chapel ceiling's
painter fall below it: at a 1% bound the verifier refuses many paraphrases, docs/cache.md);
those two are kept, so this checks the wiring and a clear case each way, not its recall."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from meshd.cache.bound import threshold
from meshd.embed import default_embedding_model
from meshd.embed.pair_verifier import (
    PairVerifier,
    calibration_path,
    read_calibration,
    read_info,
    shipped_verifier,
)

DATA = Path(__file__).resolve().parents[2] / "benchmarks" / "data"
# (cached, query): written for this test, not taken from the labelled pairs
NEAR_MISSES = [
    ("Who painted the ceiling of the Sistine Chapel?",
     "Who commissioned the ceiling of the Sistine Chapel?"),
    ("What is the boiling point of water at sea level?",
     "What is the boiling point of water on Mount Everest?"),
    ("How do I convert Celsius to Fahrenheit?", "How do I convert Fahrenheit to Celsius?"),
    ("What year did the Berlin Wall fall?", "What year was the Berlin Wall built?"),
]
PARAPHRASES = [
    ("What is the boiling point of water at sea level?",
     "At sea level, what temperature does water boil at?"),
    ("How do I convert Celsius to Fahrenheit?",
     "What's the formula to turn Celsius into Fahrenheit?"),
]


@pytest.fixture(scope="module")
def verifier(tmp_path_factory: pytest.TempPathFactory) -> PairVerifier:
    return PairVerifier(embed_dir=default_embedding_model(cache_dir=tmp_path_factory.mktemp("e")))


def test_the_examples_are_not_labelled_data() -> None:
    seen = set()
    for path in DATA.glob("cache_pairs*.jsonl"):
        for line in path.read_text().splitlines():
            r = json.loads(line)
            seen |= {r["a"], r["b"]}
    for a, b in NEAR_MISSES + PARAPHRASES:
        assert a not in seen and b not in seen


def test_the_shipped_file_is_small() -> None:
    assert shipped_verifier().stat().st_size <= 12 * 2**20


def test_the_calibration_comes_from_splits_the_verifier_never_saw() -> None:
    meta = json.loads(calibration_path(shipped_verifier()).read_text())
    trained_on = set(json.loads(shipped_verifier().with_suffix(".json").read_text())
                     ["train"]["splits"])
    assert meta["verifier"] == read_info(shipped_verifier()).name
    assert set(meta["splits"]) and not set(meta["splits"]) & trained_on
    assert not set(meta["splits"]) & {"fresh4", "fresh5", "fresh6"}  # held out, they stay out
    cal = read_calibration()
    near = sum(1 for sp in meta["splits"]
               for line in (DATA / f"cache_pairs_{sp}.jsonl").read_text().splitlines()
               if not json.loads(line)["same"])
    assert cal.near_misses == near and 0 < len(cal.scores) < near
    assert cal.scores == tuple(sorted(cal.scores, reverse=True))
    t = threshold(cal, 0.01)
    assert t is not None and 0.5 < t < 1.0
    assert sum(s > t for s in cal.scores) <= 0.01 * cal.near_misses


def test_refuses_near_misses_and_serves_paraphrases(verifier: PairVerifier) -> None:
    t = threshold(read_calibration(), 0.01)
    assert t is not None
    for cached, query in NEAR_MISSES:
        assert verifier.probability(cached, query) <= t, (cached, query)
    for cached, query in PARAPHRASES:
        assert verifier.probability(cached, query) > t, (cached, query)


def test_the_spinning_twin_scores_bit_identically(verifier: PairVerifier) -> None:
    """The session whose threads spin while it runs (taken when the cores are free) gives the
    very scores of the plain one, so which one answers never changes a decision."""
    if verifier._sessions.twin is None:
        pytest.skip("one core, or no /proc/loadavg: no spinning twin")
    for cached, query in NEAR_MISSES + PARAPHRASES:
        feeds = verifier.inputs(cached, query)
        (plain,) = verifier._sessions.plain.run(["p"], feeds)
        (spun,) = verifier._sessions.twin.run(["p"], feeds)
        assert plain.tobytes() == spun.tobytes(), (cached, query)
        assert float(plain[0, 0]) == verifier.probability(cached, query)
