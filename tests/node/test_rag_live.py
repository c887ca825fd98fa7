"""Retrieval-augmented generation on real daemons (issue 16), with the real embedding model and
real SQLite: `meshd rag add` indexes files into a node's store, a question about a document
retrieves it, a request with `rag` gets the chunks put into its prompt and lists its sources,
an over-long retrieval is trimmed to the model's context (not failed), a request entering a
node without the collection is retrieved on the node that has it (RAG_REQ/RAG_PART), a
changed file's old chunks are gone, and a collection nobody holds is `no_collection`."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from meshd.errors import RemoteError
from meshd.testing.wait import wait_for
from meshd.testnet.drive import cli as meshd
from meshd.testnet.drive import peers_of, stream
from meshd.testnet.launcher import NodeSpec, down, up

pytestmark = pytest.mark.slow

CONTEXT = 256  # the shipped tiny-en's context length, in tokens

BEES = ("# Bees\n\nHoney bees live in hives. A colony has one queen, thousands of workers and "
        "some drones. Workers collect nectar from flowers and make honey.\n")
TIDES = ("The tides rise and fall twice a day because the moon's gravity pulls the oceans; the "
         "sun adds spring and neap tides.\n")
# a long document: many chunks about one subject, so the top 4 do not fit 256 tokens
LIGHTHOUSE = "# Lighthouses\n\n" + "\n\n".join(
    f"Lighthouse keeper log, night {i}: the lighthouse lamp burned oil and its lens threw the "
    f"beam across the rocks; the keeper trimmed the wick, wound the clockwork that turned the "
    f"lens, and wrote the weather, the ships that passed and the fog signals in the log book. "
    + "The keeper watched the lamp. " * 8 for i in range(8))


@pytest.fixture(scope="module")
def mesh(tmp_path_factory: pytest.TempPathFactory, shipped_model: None) -> Iterator[dict[str, Any]]:
    d = tmp_path_factory.mktemp("rag")
    corpus = d / "corpus"
    corpus.mkdir()
    (corpus / "bees.md").write_text(BEES)
    (corpus / "tides.txt").write_text(TIDES)
    (corpus / "lighthouse.md").write_text(LIGHTHOUSE)
    index = up(d, [NodeSpec(name="r1"), NodeSpec(name="r2")], advert_interval_s=1.0)
    try:
        cfg = str(Path(sock(index, "r1")).parent / "meshd.toml")
        added = json.loads(meshd("rag", "add", "kb", str(corpus), "--config", cfg, "--json",
                                 timeout=180).stdout)
        assert added["files_added"] == 3 and added["chunks"] >= 8
        # r2 holds no collection, and learns from r1's advert that r1 holds kb
        wait_for(lambda: any(p["name"] == "r1" and "kb" in p["collections"]
                             for p in peers_of(sock(index, "r2"))), 60, "r1 to advertise kb")
        yield {"dir": d, "index": index, "corpus": corpus, "cfg": cfg}
    finally:
        down(d)


def sock(index: dict[str, Any], name: str) -> str:
    return str(next(n["socket"] for n in index["nodes"] if n["name"] == name))


def ask(mesh: dict[str, Any], node: str, prompt: str, **extra: Any) -> dict[str, Any]:
    fields = {"prompt": prompt, "max_tokens": 8, "temperature": 0.0, "rag": "kb",
              **extra}
    out: dict[str, Any] = trio.run(stream, sock(mesh["index"], node), fields)["stats"]
    return out


def names(sources: list[dict[str, Any]]) -> list[str]:
    return [Path(s["source"].rsplit(":", 1)[0]).name for s in sources]


def test_a_question_about_an_indexed_document_retrieves_it(mesh: dict[str, Any]) -> None:
    got = json.loads(meshd("rag", "query", "kb", "Who rules a beehive?", "--json",
                           "--config", mesh["cfg"], timeout=120).stdout)
    assert Path(got[0]["source"]).name == "bees.md"
    assert {"source", "score", "text"} <= set(got[0]) and "queen" in got[0]["text"]
    assert got[0]["score"] >= got[-1]["score"]
    listing = json.loads(meshd("rag", "ls", "--config", mesh["cfg"], "--json").stdout)
    assert [c["name"] for c in listing] == ["kb"] and listing[0]["files"] == 3
    # through the daemon: the answer names its sources, best first, retrieved here
    stats = ask(mesh, "r1", "Who rules a beehive?", max_tokens=4)
    assert names(stats["sources"])[0] == "bees.md"
    assert stats["rag"]["retrieved_by"] == "r1" and stats["rag"]["collection"] == "kb"
    assert stats["prompt_tokens"] + stats["max_tokens"] <= CONTEXT


def test_an_over_long_retrieval_is_trimmed_not_failed(mesh: dict[str, Any]) -> None:
    stats = ask(mesh, "r1", "What did the lighthouse keeper write in the log book?",
                max_tokens=48)
    rag = stats["rag"]
    assert rag["chunks_retrieved"] == 4 and rag["trimmed"] >= 1
    assert rag["chunks_used"] == rag["chunks_retrieved"] - rag["trimmed"]
    assert len(stats["sources"]) == rag["chunks_used"]
    assert any("retrieval trimmed" in n for n in stats.get("notes", []))
    assert stats["prompt_tokens"] + 48 <= CONTEXT and stats["completion_tokens"] >= 1
    if stats["sources"]:  # what is kept is the best: scores never rise down the list
        scores = [s["score"] for s in stats["sources"]]
        assert scores == sorted(scores, reverse=True)


def test_a_request_entering_a_node_without_the_collection_is_served_via_one_that_has_it(
        mesh: dict[str, Any]) -> None:
    stats = ask(mesh, "r2", "Why does the sea rise and fall twice a day?")
    assert names(stats["sources"])[0] == "tides.txt"
    assert stats["rag"]["retrieved_by"] == "r1"  # retrieved on r1, over RAG_REQ
    assert not Path(sock(mesh["index"], "r2")).parent.joinpath("state", "rag.db").exists()
    # the HTTP API's extension field, entering r2 too
    n2 = next(n for n in mesh["index"]["nodes"] if n["name"] == "r2")
    key = (Path(mesh["dir"]) / "api-key").read_text().strip()
    r = httpx.post(f"{n2['api_url']}/completions", timeout=60,
                   headers={"authorization": f"Bearer {key}"},
                   json={"model": "tiny-en", "prompt": "Who rules a beehive?", "max_tokens": 4,
                         "temperature": 0, "rag": "kb"})
    assert r.status_code == 200, r.text
    assert names(r.json()["sources"])[0] == "bees.md"
    # a collection nobody holds: a clear error, on the CLI and the API
    with pytest.raises(RemoteError, match="no node of the mesh holds collection 'nothing'") as e:
        ask(mesh, "r2", "anything", rag="nothing")
    assert e.value.code == "no_collection"
    r = httpx.post(f"{n2['api_url']}/completions", timeout=60,
                   headers={"authorization": f"Bearer {key}"},
                   json={"model": "tiny-en", "prompt": "x", "rag": "nothing"})
    assert r.status_code == 404 and r.json()["error"]["code"] == "collection_not_found"
    out = meshd("submit", "--rag", "nothing", "--socket", sock(mesh["index"], "r2"), "hello",
                check=False)
    assert out.returncode == 69 and "no_collection" in out.stderr
    assert "Traceback" not in out.stderr


def test_a_changed_file_is_reindexed_and_its_old_chunks_are_gone(mesh: dict[str, Any]) -> None:
    bees = mesh["corpus"] / "bees.md"
    bees.write_text("# Volcanoes\n\nMagma rises through the crust and erupts as lava from "
                    "volcanoes such as Etna and Vesuvius.\n")
    added = json.loads(meshd("rag", "add", "kb", str(mesh["corpus"]), "--config", mesh["cfg"],
                             "--json", timeout=180).stdout)
    assert (added["files_replaced"], added["files_unchanged"], added["chunks_removed"]) == (1, 2, 1)
    got = json.loads(meshd("rag", "query", "kb", "queen bee and honey", "-k", "8", "--json",
                           "--config", mesh["cfg"], timeout=120).stdout)
    assert all("Honey" not in c["text"] for c in got)
    # the running daemons see the new chunks at once: lava is now found in bees.md
    for node in ("r1", "r2"):
        stats = ask(mesh, node, "Where does lava come from?", max_tokens=4)
        assert names(stats["sources"])[0] == "bees.md"


def test_an_int8_collection_is_retrieved_with_the_int8_graph(mesh: dict[str, Any]) -> None:
    # `meshd rag add --precision int8`: the daemon embeds the collection's questions with the
    # int8 graph (with the float one, the store refuses: the embedder identities differ)
    added = json.loads(meshd("rag", "add", "kb8", str(mesh["corpus"]), "--precision", "int8",
                             "--config", mesh["cfg"], "--json", timeout=180).stdout)
    assert added["files_added"] == 3
    listing = json.loads(meshd("rag", "ls", "--config", mesh["cfg"], "--json").stdout)
    assert {c["name"]: c["precision"] for c in listing} == {"kb": "fp32", "kb8": "int8"}
    refused = meshd("rag", "add", "kb8", str(mesh["corpus"]), "--precision", "fp32",
                    "--config", mesh["cfg"], check=False)
    assert refused.returncode != 0 and "indexed with int8 embeddings, not fp32" in refused.stderr
    wait_for(lambda: any(p["name"] == "r1" and "kb8" in p["collections"]
                         for p in peers_of(sock(mesh["index"], "r2"))), 60, "r1 to advertise kb8")
    for node in ("r1", "r2"):  # r2 retrieves on r1, over RAG_REQ
        stats = ask(mesh, node, "Why does the sea go up and down every day?", rag="kb8",
                    max_tokens=4)
        assert stats["rag"]["collection"] == "kb8" and stats["rag"]["retrieved_by"] == "r1"
        assert names(stats["sources"])[0] == "tides.txt"
