"""The retrieval store with the real embedding model (all-MiniLM-L6-v2 on onnxruntime) and real
SQLite: a question finds the document about it, a changed file's old chunks are gone, an
unchanged one is skipped, a second store on the same file (the daemon beside `meshd rag add`)
sees every change, through the HNSW graph too."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from meshd.rag.store import NoCollection, RagError, RagStore

DOCS = {
    "bees.md": "# Bees\n\nHoney bees live in hives. A colony has one queen, thousands of workers "
               "and some drones. Workers collect nectar from flowers and make honey.\n",
    "rust.md": "# Rust\n\nIron rusts when it meets water and oxygen: the metal turns into iron "
               "oxide, a flaky red-brown coating. Paint and galvanising keep it away.\n",
    "tides.txt": "The tides rise and fall twice a day because the moon's gravity pulls the "
                 "oceans; the sun adds spring and neap tides.\n",
    "code.py": "def fibonacci(n):\n    \"\"\"The n-th Fibonacci number.\"\"\"\n    a, b = 0, 1\n"
               "    for _ in range(n):\n        a, b = b, a + b\n    return a\n",
}


@pytest.fixture(scope="module")
def embedder() -> Any:
    from meshd.embed import load_embedder

    return load_embedder(threads=1)


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    d = tmp_path / "corpus"
    d.mkdir()
    for name, text in DOCS.items():
        (d / name).write_text(text)
    (d / "image.png").write_bytes(b"\x89PNG\r\n\x1a\n\0\0\0")
    return d


@pytest.fixture
def store(tmp_path: Path, embedder: Any) -> Iterator[RagStore]:
    s = RagStore(tmp_path / "rag.db", embedder)
    yield s
    s.close()


def top(store: RagStore, question: str, k: int = 3) -> list[str]:
    return [Path(h.source).name for h in store.query("kb", question, k).hits]


def test_a_question_retrieves_the_document_about_it(store: RagStore, corpus: Path) -> None:
    rep = store.add("kb", [corpus])
    assert (rep.files_added, rep.chunks) == (4, 4)
    assert any("image.png: binary file" in s for s in rep.files_skipped or [])
    assert top(store, "Who rules a beehive?")[0] == "bees.md"
    assert top(store, "Why does the sea go up and down every day?")[0] == "tides.txt"
    assert top(store, "How do I stop my bike's chain from corroding?")[0] == "rust.md"
    assert top(store, "function that computes fibonacci numbers")[0] == "code.py"
    got = store.query("kb", "Who rules a beehive?", 2)
    assert got.hits[0].score > got.hits[1].score and 0 < got.hits[0].score <= 1.0001
    assert got.hits[0].text.startswith("# Bees") and got.hits[0].start_line == 1
    assert got.embed_ms > 0 and got.search_ms >= 0
    assert [c["name"] for c in store.collections()] == ["kb"]


def test_a_changed_file_replaces_its_chunks_and_an_unchanged_one_is_skipped(
        store: RagStore, corpus: Path, tmp_path: Path, embedder: Any) -> None:
    store.add("kb", [corpus])
    bees = str((corpus / "bees.md").resolve())
    assert "Honey bees live in hives" in store.chunks_of("kb", bees)[0]
    (corpus / "bees.md").write_text("# Volcanoes\n\nMagma rises through the crust and erupts as "
                                    "lava from volcanoes such as Etna and Vesuvius.\n")
    rep = store.add("kb", [corpus])
    assert (rep.files_added, rep.files_replaced, rep.files_unchanged) == (0, 1, 3)
    assert rep.chunks_removed == 1
    chunks = store.chunks_of("kb", bees)
    assert len(chunks) == 1 and "Magma" in chunks[0] and "Honey" not in chunks[0]
    # the old text is gone from the index too: nothing about bees is found any more
    hits = store.query("kb", "Who rules a beehive?", 4).hits
    assert all("Honey" not in h.text for h in hits)
    assert top(store, "Where does lava come from?")[0] == "bees.md"
    # a second store on the same file (the daemon) sees the same
    other = RagStore(tmp_path / "rag.db", embedder)
    try:
        assert all("Honey" not in h.text for h in other.query("kb", "queen bee", 4).hits)
    finally:
        other.close()


def test_remove_files_and_collections(store: RagStore, corpus: Path) -> None:
    store.add("kb", [corpus])
    assert store.remove("kb", [str(corpus / "rust.md")]) == (1, 1)
    assert "rust.md" not in top(store, "iron oxide coating", 4)
    with pytest.raises(RagError, match="holds no file"):
        store.remove("kb", [str(corpus / "rust.md")])
    assert store.remove("kb") == (3, 3)
    with pytest.raises(NoCollection, match="no collection 'kb'"):
        store.query("kb", "anything")
    with pytest.raises(RagError, match="collection name"):
        store.add("bad name!", [corpus])
    with pytest.raises(RagError, match="no such file"):
        store.add("kb", [corpus / "missing.md"])


def test_the_hnsw_graph_is_saved_and_a_second_reader_loads_it(tmp_path: Path, corpus: Path,
                                                              embedder: Any) -> None:
    writer = RagStore(tmp_path / "rag.db", embedder, exact_max=2)  # 4 chunks: a graph
    reader = RagStore(tmp_path / "rag.db", embedder, exact_max=2)
    try:
        writer.add("kb", [corpus])
        assert list((tmp_path / "rag.db.idx").glob("kb.*.usearch"))
        assert [Path(h.source).name for h in reader.query("kb", "queen of the colony", 1).hits] == ["bees.md"]
        (corpus / "tides.txt").write_text("Glaciers are rivers of ice that carve valleys.\n")
        writer.add("kb", [corpus])
        # the reader's graph is a version behind: it loads the new one
        assert [Path(h.source).name for h in reader.query("kb", "rivers of ice", 1).hits] == ["tides.txt"]
        assert len(list((tmp_path / "rag.db.idx").glob("kb.*.usearch"))) == 1
        # a new writer (the next `meshd rag add`) updates the saved graph instead of rebuilding
        again = RagStore(tmp_path / "rag.db", embedder, exact_max=2)
        try:
            (corpus / "rust.md").write_text("Deserts get little rain and hold cacti.\n")
            again.add("kb", [corpus])
        finally:
            again.close()
        assert [Path(h.source).name for h in reader.query("kb", "dry land with cactus", 1).hits] == ["rust.md"]
        assert len(reader.query("kb", "anything", 10).hits) == 4  # no stale keys left behind
    finally:
        writer.close()
        reader.close()
