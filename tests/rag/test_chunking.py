"""The chunker's rules, table by table: paragraphs and code blocks stay whole when they fit,
overlap carries the previous chunk's tail, overlong blocks split at line/sentence ends, line
ranges and headings are kept."""

from __future__ import annotations

import pytest

from meshd.rag.chunking import Chunk, blocks, chunk_text, kind_of

PARA = "word " * 30  # 150 characters


def para(n: int) -> str:
    return f"Paragraph {n} says something. " + "x" * 60 + f" End of {n}."


@pytest.mark.parametrize(("name", "kind"), [
    ("README.md", "markdown"), ("notes.markdown", "markdown"), ("a/b/c.py", "code"),
    ("main.rs", "code"), ("config.toml", "code"), ("book.txt", "text"), ("LICENSE", "text"),
    ("x.MD", "markdown"),
])
def test_kind_of(name: str, kind: str) -> None:
    assert kind_of(name) == kind


@pytest.mark.parametrize(("text", "kind", "want"), [
    ("", "text", []),
    ("one\n\ntwo", "text", [(1, 1, "para"), (3, 3, "para")]),
    ("a\nb\n\n\n\nc", "text", [(1, 2, "para"), (6, 6, "para")]),
    ("# T\ntext\n\n## U\nmore", "markdown", [(1, 1, "heading"), (2, 2, "para"),
                                              (4, 4, "heading"), (5, 5, "para")]),
    # a fence keeps its blank lines and its '#' lines inside one block
    ("intro\n```py\n# not a heading\n\nx = 1\n```\nafter", "markdown",
     [(1, 1, "para"), (2, 6, "code"), (7, 7, "para")]),
    ("~~~\nunclosed\n\nfence", "markdown", [(1, 4, "code")]),
    ("def f():\n    return 1\n\n\nclass C:\n    pass\n", "code", [(1, 2, "code"), (5, 6, "code")]),
    ("# a comment in code\nx = 1", "code", [(1, 2, "code")]),
])
def test_blocks(text: str, kind: str, want: list[tuple[int, int, str]]) -> None:
    assert [(b.start, b.end, b.kind) for b in blocks(text, kind)] == want


def test_paragraphs_that_fit_are_never_split() -> None:
    text = "\n\n".join(para(i) for i in range(12))
    chunks = chunk_text(text, "text", max_chars=300, overlap_chars=0)
    assert len(chunks) > 1
    for c in chunks:
        assert len(c.text) <= 300
        for piece in c.text.split("\n\n"):
            assert piece in {para(i) for i in range(12)}  # whole paragraphs only
    joined = "\n\n".join(c.text for c in chunks)
    assert joined == text  # nothing lost, nothing repeated without overlap


def test_overlap_repeats_the_previous_chunks_tail() -> None:
    text = "\n\n".join(para(i) for i in range(12))
    chunks = chunk_text(text, "text", max_chars=300, overlap_chars=120)
    for a, b in zip(chunks, chunks[1:], strict=False):
        first = b.text.split("\n\n")[0]
        assert a.text.endswith(first)  # the next chunk starts with the tail of this one
        assert len(first) <= 120
        assert b.start_line <= a.end_line


def test_overlap_falls_back_to_the_last_sentences_of_a_long_paragraph() -> None:
    long = " ".join(f"Sentence number {i} is here." for i in range(30))  # ~800 chars, one line
    text = f"{long}\n\n{para(1)}"
    chunks = chunk_text(text, "text", max_chars=500, overlap_chars=100)
    assert len(chunks) >= 2
    second = chunks[1].text
    assert second.startswith("Sentence number")  # sentences, not a cut word
    assert len(second.split("\n\n")[0]) <= 100 or chunks[1].start_line == 1


def test_a_code_block_that_fits_stays_whole_and_is_not_carried_in_part() -> None:
    code = "```python\n" + "\n".join(f"x{i} = {i}  # a line of code" for i in range(12)) + "\n```"
    text = "\n\n".join([para(1), para(2), code, para(3), para(4)])
    chunks = chunk_text(text, "markdown", max_chars=400, overlap_chars=150)
    holding = [c for c in chunks if "x0 = 0" in c.text]
    for c in holding:
        assert code in c.text  # the fence is always whole
    assert all(c.text.count("```") % 2 == 0 for c in chunks)


def test_an_overlong_code_block_splits_at_line_ends() -> None:
    lines = [f"value_{i} = compute({i})" for i in range(100)]
    chunks = chunk_text("\n".join(lines), "code", max_chars=300, overlap_chars=60)
    assert len(chunks) > 5
    for c in chunks:
        assert len(c.text) <= 300
        for line in c.text.split("\n"):
            assert line in lines  # no line is cut
    assert chunks[0].start_line == 1 and chunks[-1].end_line == 100


def test_a_single_overlong_line_splits_at_spaces() -> None:
    text = " ".join(["token"] * 400)  # 2,399 characters, no sentence ends
    chunks = chunk_text(text, "text", max_chars=250, overlap_chars=0)
    assert all(len(c.text) <= 250 for c in chunks)
    assert " ".join(c.text for c in chunks).split() == text.split()


def test_headings_name_their_section_and_are_not_left_alone_at_a_chunk_end() -> None:
    text = "# Guide\n\n" + para(1) + "\n\n## Install\n\n" + para(2) + "\n\n" + para(3) \
        + "\n\n## Use\n\n" + para(4)
    for max_chars in (150, 260, 400):
        chunks = chunk_text(text, "markdown", max_chars=max_chars, overlap_chars=0)
        for c in chunks:
            assert not c.text.rstrip().endswith(("# Guide", "## Install", "## Use"))
            if c.text.startswith("## "):  # a chunk that opens a section is named for it
                assert c.heading == c.text.split("\n")[0][3:]
        # a chunk is named for the section it starts in
        assert chunks[0].heading == "Guide"
        assert [c.heading for c in chunks if c.text.startswith(para(3))] in ([], ["Install"])
    small = chunk_text(text, "markdown", max_chars=150, overlap_chars=0)
    assert [c.heading for c in small] == ["Guide", "Install", "Install", "Use"]


@pytest.mark.parametrize(("max_chars", "overlap"), [(8, 0), (100, 50), (100, -1)])
def test_bad_settings_are_refused(max_chars: int, overlap: int) -> None:
    with pytest.raises(ValueError):
        chunk_text("text", max_chars=max_chars, overlap_chars=overlap)


def test_line_ranges_point_at_the_text() -> None:
    text = "\n".join(["alpha", "", "beta", "gamma", "", "", "delta"])
    chunks = chunk_text(text, "text", max_chars=16, overlap_chars=0)
    lines = text.split("\n")
    for c in chunks:
        assert isinstance(c, Chunk)
        span = "\n".join(lines[c.start_line - 1:c.end_line])
        for word in c.text.split():
            assert word in span
