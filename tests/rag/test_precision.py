"""A collection's embedding precision (docs/rag.md), with the real embedding model (both graphs
of all-MiniLM-L6-v2 on onnxruntime) and real SQLite: an int8 collection is indexed and asked
with the int8 graph only, adding with the other precision is refused with one line and changes
nothing, a store written before collections had a precision reads as fp32 (or int8 when its
embedder identity says so), and `meshd rag add --precision` / `[rag] embed_precision` / `rag ls`
on the command line."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from meshd.rag.store import RagError, RagStore
from meshd.testnet.drive import cli as meshd

DOCS = {
    "bees.md": "# Bees\n\nHoney bees live in hives. A colony has one queen, thousands of workers "
               "and some drones. Workers collect nectar from flowers and make honey.\n",
    "tides.txt": "The tides rise and fall twice a day because the moon's gravity pulls the "
                 "oceans; the sun adds spring and neap tides.\n",
}


@pytest.fixture(scope="module")
def embedders() -> dict[str, Any]:
    from meshd.embed import load_embedder

    return {p: load_embedder(threads=1, precision=p) for p in ("fp32", "int8")}


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    d = tmp_path / "corpus"
    d.mkdir()
    for name, text in DOCS.items():
        (d / name).write_text(text)
    return d


@pytest.fixture
def loads(embedders: dict[str, Any]) -> list[str]:
    return []  # the precisions the store asked its loader for


@pytest.fixture
def store(tmp_path: Path, embedders: dict[str, Any], loads: list[str]) -> Iterator[RagStore]:
    def load(precision: str) -> Any:
        loads.append(precision)
        return embedders[precision]

    s = RagStore(tmp_path / "rag.db", load)
    yield s
    s.close()


def test_an_int8_collection_is_indexed_and_asked_with_the_int8_graph(
        store: RagStore, corpus: Path, embedders: dict[str, Any], loads: list[str]) -> None:
    store.add("kb8", [corpus], precision="int8")
    (col,) = store.collections()
    assert col["precision"] == "int8" and col["embedder"] == embedders["int8"].identity
    assert col["embedder"].endswith("+int8")
    got = store.query("kb8", "Who rules a beehive?", 2)
    assert Path(got.hits[0].source).name == "bees.md"
    # the stored vectors are the int8 graph's, and the question was embedded with it too:
    # the score is the int8 cosine, not the float one
    q8 = embedders["int8"].embed(["Who rules a beehive?"])[0]
    d8 = embedders["int8"].embed([DOCS["bees.md"]])[0]
    assert got.hits[0].score == pytest.approx(float(q8 @ d8), abs=1e-4)
    assert loads == ["int8"]  # the float graph was never loaded
    assert store.precisions() == ["int8"]


def test_adding_with_the_other_precision_is_refused_and_changes_nothing(
        store: RagStore, corpus: Path, loads: list[str]) -> None:
    store.add("kb", [corpus])  # the store's default: fp32
    assert store.collections()[0]["precision"] == "fp32"
    (corpus / "new.md").write_text("# Glaciers\n\nGlaciers are rivers of ice.\n")
    with pytest.raises(RagError, match=r"'kb' is indexed with fp32 embeddings, not int8: one "
                                        r"collection never mixes the two"):
        store.add("kb", [corpus], precision="int8")
    assert loads == ["fp32"]  # refused before the int8 graph was loaded or a file was read
    assert store.collections()[0]["files"] == 2
    # without --precision an existing collection keeps its own
    assert store.add("kb", [corpus]).files_added == 1
    # a store given one embedder cannot serve a collection of the other precision
    with pytest.raises(RagError, match="given the fp32 embedder only, not the int8 one"):
        RagStore(store.path, store.embedder_for("fp32")).add("other", [corpus], precision="int8")


def test_the_store_default_precision_and_a_store_from_before_precisions(
        tmp_path: Path, corpus: Path, embedders: dict[str, Any]) -> None:
    s = RagStore(tmp_path / "d.db", embedders["int8"], precision="int8")
    s.add("kb", [corpus])
    assert s.collections()[0]["precision"] == "int8"
    s.close()
    with pytest.raises(RagError, match="embedding precision 'fp16'"):
        RagStore(tmp_path / "d.db", precision="fp16")
    # a store written before collections had a precision column
    old = tmp_path / "old.db"
    db = sqlite3.connect(old)
    db.executescript(
        "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT); INSERT INTO meta VALUES ('schema', '1');"
        "CREATE TABLE collections (name TEXT PRIMARY KEY, embedder TEXT, dim INTEGER, "
        "max_chars INTEGER, overlap_chars INTEGER, version INTEGER, created FLOAT, updated FLOAT);"
        f"INSERT INTO collections VALUES ('a', '{embedders['fp32'].identity}', 384, 1000, 200, 0, 0, 0);"
        f"INSERT INTO collections VALUES ('b', '{embedders['int8'].identity}', 384, 1000, 200, 0, 0, 0);")
    db.commit()
    db.close()
    s = RagStore(old)
    assert {c["name"]: c["precision"] for c in s.collections()} == {"a": "fp32", "b": "int8"}
    s.close()


def test_the_cli_precision_option_config_default_and_listing(tmp_path: Path, corpus: Path) -> None:
    db = str(tmp_path / "rag.db")
    added = json.loads(meshd("rag", "add", "kb8", str(corpus), "--db", db, "--precision", "int8",
                             "--json", timeout=180).stdout)
    assert added["files_added"] == 2
    out = meshd("rag", "add", "kb8", str(corpus), "--db", db, "--precision", "fp32", check=False)
    assert out.returncode != 0 and "Traceback" not in out.stderr
    assert out.stderr.strip().count("\n") == 0  # one line
    assert "'kb8' is indexed with int8 embeddings, not fp32" in out.stderr
    listing = json.loads(meshd("rag", "ls", "--db", db, "--json").stdout)
    assert [(c["name"], c["precision"], c["files"]) for c in listing] == [("kb8", "int8", 2)]
    assert "int8" in meshd("rag", "ls", "--db", db).stdout
    hits = json.loads(meshd("rag", "query", "kb8", "Why does the sea rise and fall?", "--db", db,
                            "--json", timeout=120).stdout)
    assert Path(hits[0]["source"]).name == "tides.txt"
    bad = meshd("rag", "add", "kb8", str(corpus), "--db", db, "--precision", "fp16", check=False)
    assert bad.returncode == 2 and "invalid choice: 'fp16'" in bad.stderr


def test_rag_embed_precision_in_the_config_is_the_default_of_new_collections(
        tmp_path: Path, corpus: Path) -> None:
    from meshd.config import load_config
    from meshd.errors import ConfigError

    cfg = tmp_path / "meshd.toml"
    cfg.write_text(f'[node]\ndata_dir = "{tmp_path / "state"}"\n\n[rag]\nembed_precision = "fp16"\n')
    with pytest.raises(ConfigError, match=r"\[rag\] embed_precision must be int8 or fp32"):
        load_config(cfg)
    cfg.write_text(cfg.read_text().replace('"fp16"', '"int8"'))
    assert load_config(cfg).rag.embed_precision == "int8"
    meshd("rag", "add", "kb", str(corpus), "--config", str(cfg), timeout=180)
    listing = json.loads(meshd("rag", "ls", "--config", str(cfg), "--json").stdout)
    assert [(c["name"], c["precision"]) for c in listing] == [("kb", "int8")]
    assert (tmp_path / "state" / "rag.db").exists()
