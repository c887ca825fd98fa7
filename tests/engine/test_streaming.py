"""Streaming text: incremental decoding, stop strings, and the Generation state machine."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from meshd.engine import GenerationConfig, Model, TokenEvent
from meshd.engine.generation import Generation
from meshd.engine.tokenizer import IncrementalDecoder, StopChecker


@pytest.mark.parametrize(
    ("stops", "pieces", "emitted", "stopped"),
    [
        ((), ["ab", "c"], ["ab", "c"], False),
        (("END",), ["hello E", "N", "D more"], ["hello ", "", ""], True),
        (("END",), ["hello E", "x"], ["hello ", "Ex"], False),
        (("\n\n", "###"), ["a\n", "b#", "#", "#c"], ["a", "\nb", "", ""], True),
        (("ab",), ["xa", "ab"], ["x", "a"], True),
    ],
)
def test_stop_checker(stops: tuple[str, ...], pieces: list[str], emitted: list[str],
                      stopped: bool) -> None:
    checker = StopChecker(stops)
    assert [checker.push(p) for p in pieces] == emitted
    assert checker.stopped is stopped


def test_stop_checker_flush_releases_held_text() -> None:
    checker = StopChecker(["END"])
    assert checker.push("the EN") == "the "
    assert checker.flush() == "EN"


def test_incremental_decoder_matches_full_decode(models: dict[str, Model]) -> None:
    tok = models["llama"].tokenizer
    text = "Hello wörld, the 🦊 jumps — naïvely! "
    ids = tok.encode(text, add_special_tokens=False)
    prompt = tok.encode("Say:")
    dec = IncrementalDecoder(tok, prompt[-4:])
    pieces = [dec.push(i) for i in ids] + [dec.flush()]
    assert "".join(pieces) == tok.decode(ids)
    assert "" in pieces  # the fox emoji spans several byte tokens and is held back


def scripted(tokens: list[int], vocab: int) -> list[np.ndarray]:
    """Logits rows that make greedy sampling pick ``tokens`` in turn."""
    rows = []
    for t in tokens:
        row = np.zeros(vocab, np.float32)
        row[t] = 10.0
        rows.append(row)
    return rows


def run(model: Model, tokens: list[int], **cfg: object) -> list[TokenEvent]:
    config = GenerationConfig(temperature=0.0, repetition_penalty=1.0, **cfg)  # type: ignore
    gen = Generation(model.tokenizer.encode("Hi"), config, model.tokenizer)
    events = []
    for row in scripted(tokens, model.vocab_size):
        events.append(gen.feed(row))
        if gen.done:
            break
    return events


def test_generation_finishes_on_eos_length_and_stop(models: dict[str, Model]) -> None:
    model = models["llama"]
    tok = model.tokenizer
    words = tok.encode(" hello world again", add_special_tokens=False)
    eos = tok.eos_token_ids[0]

    ev = run(model, [*words, eos, *words], max_tokens=20)
    assert [e.token_id for e in ev] == [*words, eos]
    assert ev[-1].finish_reason == "eos" and ev[-1].text == ""
    assert "".join(e.text for e in ev) == " hello world again"
    assert [e.index for e in ev] == list(range(len(ev)))

    ev = run(model, words * 3, max_tokens=2)
    assert len(ev) == 2 and ev[-1].finish_reason == "length"

    ev = run(model, words * 3, max_tokens=20, stop=("world",))
    assert ev[-1].finish_reason == "stop"
    assert "".join(e.text for e in ev) == " hello "


def test_finished_generation_refuses_more(models: dict[str, Model]) -> None:
    model = models["llama"]
    gen = Generation([0], GenerationConfig(max_tokens=1, temperature=0.0), model.tokenizer)
    row = scripted([5], model.vocab_size)[0]
    assert gen.feed(row).finish_reason == "length"
    with pytest.raises(RuntimeError):
        gen.feed(row)


def test_seeded_sampling_is_reproducible(models: dict[str, Model]) -> None:
    model = models["qwen2"]
    cfg = GenerationConfig(max_tokens=12, temperature=1.0, top_k=20, top_p=0.9, seed=3)
    a = [e.token_id for e in model.generate_sync("Hello", cfg)]
    b = [e.token_id for e in model.generate_sync("Hello", cfg)]
    assert a == b and len(a) >= 1


def test_chat_template(models: dict[str, Model], model_dirs: dict[str, Path]) -> None:
    tok = models["llama"].tokenizer
    assert tok.has_chat_template
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}])
    assert text == "<s><|user|>hi\n<|assistant|>"
    assert tok.encode_chat([{"role": "user", "content": "hi"}])[0] == tok.bos_token_id
    assert not models["qwen2"].tokenizer.has_chat_template
    ids = models["llama"].encode_prompt("hi", chat=True)
    assert ids == tok.encode(text, add_special_tokens=False)


def test_chat_template_errors_are_model_errors(models: dict[str, Model]) -> None:
    from dataclasses import replace

    from meshd.engine.tokenizer import Tokenizer
    from meshd.errors import ModelError

    model = models["llama"]
    path = model.path / model.manifest.tokenizer.file
    raising = replace(model.manifest.tokenizer,
                      chat_template="{{ raise_exception('no system role') }}")
    with pytest.raises(ModelError, match="chat template failed: no system role"):
        Tokenizer(path, raising).apply_chat_template([{"role": "system", "content": "x"}])
    broken = replace(model.manifest.tokenizer, chat_template="{% for %}")
    with pytest.raises(ModelError, match="does not compile"):
        Tokenizer(path, broken).apply_chat_template([])
    dated = replace(model.manifest.tokenizer, chat_template="{{ strftime_now('%Y') }}")
    assert Tokenizer(path, dated).apply_chat_template([]).isdigit()
