"""`meshd rag add|ls|rm|query`: the node's retrieval collections (docs/rag.md).

These verbs work on the node's store file directly (``[rag] path``, default
``data_dir/rag.db`` of the node's config), so they need no running daemon; a running daemon
sees the changes on its next retrieval and advertises its collections with its next advert.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from meshd.cli.common import print_json, table
from meshd.errors import LocalError
from meshd.exitcodes import Exit

DESCRIPTION = """\
Retrieval collections of this node. `add` indexes text, Markdown and source files (directories
are walked): each is cut into overlapping chunks that keep paragraphs and code blocks whole,
embedded with the edge model (all-MiniLM-L6-v2, the meshd[edge] extra) and stored with a vector
index in the node's SQLite store. Adding a changed file again replaces its chunks; unchanged
files are skipped. A request with `--rag COLLECTION` (API: "rag": "COLLECTION") then gets the
best chunks put into its prompt, with their sources, at the node it enters (or at the nearest
node holding the collection).

  meshd rag add docs ./docs README.md --config /etc/meshd/meshd.toml
  meshd rag add fast ./docs --precision int8     # about half the CPU per question
  meshd rag query docs "How do I rotate the CA key?"
  meshd submit --rag docs "How do I rotate the CA key?"

A collection's embedding precision (fp32, or int8: the quantized graph, about half the CPU per
embedding) is chosen when it is created (--precision, else [rag] embed_precision, else fp32) and
kept: its questions are embedded with it too, and adding with the other one is refused.

The store is [rag] path of the node's config (default: data_dir/rag.db). Without --config:
$MESHD_CONFIG, else /etc/meshd/meshd.toml, else the first node of the last `meshd testnet up`.
"""


def register(sub: Any) -> None:
    p = sub.add_parser("rag", help="retrieval collections: add, ls, rm, query", description=DESCRIPTION,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    verbs = p.add_subparsers(dest="rag_command", metavar="ACTION")
    p.set_defaults(func=lambda a: (p.print_help(), int(Exit.USAGE))[1])

    def where(q: argparse.ArgumentParser) -> None:
        g = q.add_mutually_exclusive_group()
        g.add_argument("--config", "-c", type=Path, help="the node's config file (its store)")
        g.add_argument("--db", type=Path, help="a store file to use instead of a node's")
        q.add_argument("--json", action="store_true", help="print JSON")

    q = verbs.add_parser("add", help="index files into a collection (created if new)",
                         description="Index the text files under PATH... into COLLECTION: new "
                         "files are added, changed ones replace their old chunks, unchanged ones "
                         "(same sha256) are skipped, binary and non-UTF-8 files are skipped and "
                         "listed.")
    q.add_argument("collection", metavar="COLLECTION")
    q.add_argument("paths", nargs="+", metavar="PATH")
    q.add_argument("--chunk-chars", type=int, default=None,
                   help="a chunk's size at most, in characters (default 1000; set when the "
                   "collection is created)")
    q.add_argument("--overlap-chars", type=int, default=None,
                   help="what a chunk repeats of the one before (default 200)")
    q.add_argument("--precision", choices=("fp32", "int8"), default=None,
                   help="the embedding graph of a new collection: fp32 (the float one) or int8 "
                   "(about half the CPU per chunk and per question; cosine >= ~0.97 to fp32). Kept "
                   "with the collection and used for its questions; an existing collection's is "
                   "the only one accepted. Default: [rag] embed_precision of the config, else fp32")
    where(q)
    q.set_defaults(func=run_add)
    q = verbs.add_parser("ls", help="list collections, or the files of one",
                         description="List the collections (files, chunks, bytes), or with "
                         "COLLECTION the files it holds.")
    q.add_argument("collection", nargs="?", metavar="COLLECTION")
    where(q)
    q.set_defaults(func=run_ls)
    q = verbs.add_parser("rm", help="remove a collection, or some files of it",
                         description="Remove COLLECTION, or only the files PATH... from it.")
    q.add_argument("collection", metavar="COLLECTION")
    q.add_argument("paths", nargs="*", metavar="PATH")
    where(q)
    q.set_defaults(func=run_rm)
    q = verbs.add_parser("query", help="show the chunks a question retrieves",
                         description="Show the K chunks of COLLECTION nearest in meaning to "
                         "QUESTION, best first, with their scores (cosine similarity) and "
                         "sources. --json prints a list of {source, score, text, lines, heading, "
                         "chunk}.")
    q.add_argument("collection", metavar="COLLECTION")
    q.add_argument("question", metavar="QUESTION")
    q.add_argument("-k", type=int, default=None, help="chunks to show (default: [rag] top_k, 4)")
    where(q)
    q.set_defaults(func=run_query)


def _config(args: argparse.Namespace) -> Any:
    from meshd.config import load_config

    if args.config is not None:
        return load_config(args.config)
    env = os.environ.get("MESHD_CONFIG")
    if env:
        return load_config(env)
    system = Path("/etc/meshd/meshd.toml")
    if system.exists():
        return load_config(system)
    from meshd.paths import last_testnet_dir, testnet_sockets

    last = last_testnet_dir()
    if last is not None:
        socks = testnet_sockets(last)
        if socks and (socks[0].parent / "meshd.toml").exists():
            return load_config(socks[0].parent / "meshd.toml")
    raise LocalError("name the node's config with --config FILE (or the store with --db FILE)")


def _store(args: argparse.Namespace, *, embedder: bool) -> Any:
    from meshd.rag.store import RagStore

    if args.db is not None:
        path, top_k, precision = Path(args.db), 4, "fp32"
    else:
        cfg = _config(args)
        path, top_k, precision = cfg.rag_path(), cfg.rag.top_k, cfg.rag.embed_precision
    args.top_k_default = top_k
    if not embedder and not path.exists():
        raise LocalError(f"{path}: no retrieval store yet (create one with `meshd rag add`)")
    return RagStore(path, _load_embedder if embedder else None, precision=precision)


def _load_embedder(precision: str) -> Any:
    from meshd.embed import load_embedder

    return load_embedder(verify=False, precision=precision)


def _shown(source: str) -> str:
    try:
        return os.path.relpath(source) if source.startswith(os.getcwd() + os.sep) else source
    except ValueError:
        return source


def run_add(args: argparse.Namespace) -> int:
    from meshd.rag.chunking import MAX_CHARS, OVERLAP_CHARS

    store = _store(args, embedder=True)
    say = None if args.json else (lambda line: print(f"  {_shown(line)}", file=sys.stderr))
    try:
        rep = store.add(args.collection, args.paths,
                        max_chars=args.chunk_chars or MAX_CHARS,
                        overlap_chars=OVERLAP_CHARS if args.overlap_chars is None else args.overlap_chars,
                        precision=args.precision, progress=say)
    except ValueError as e:  # chunking settings
        raise LocalError(str(e)) from None
    finally:
        store.close()
    if args.json:
        print_json({"collection": args.collection, "store": str(store.path), **rep.to_dict()})
        return int(Exit.OK)
    print(f"{args.collection}: {rep.files_added} files added, {rep.files_replaced} replaced, "
          f"{rep.files_unchanged} unchanged; {rep.chunks} chunks indexed"
          + (f" ({rep.chunks_removed} old chunks removed)" if rep.chunks_removed else "")
          + f" in {rep.seconds:.1f} s; store {store.path}")
    for line in rep.files_skipped or ():
        print(f"  skipped {line}", file=sys.stderr)
    return int(Exit.OK)


def run_ls(args: argparse.Namespace) -> int:
    store = _store(args, embedder=False)
    try:
        if args.collection:
            files = store.files(args.collection)
            if args.json:
                print_json(files)
            else:
                print(table([[_shown(f["source"]), str(f["chunks"]), str(f["bytes"]), f["sha256"][:12]]
                             for f in files], ["source", "chunks", "bytes", "sha256"]))
            return int(Exit.OK)
        cols = store.collections()
    finally:
        store.close()
    if args.json:
        print_json(cols)
    elif not cols:
        print(f"no collections in {store.path}")
    else:
        print(table([[c["name"], str(c["files"]), str(c["chunks"]), str(c["bytes"]), c["precision"],
                      c["embedder"]] for c in cols],
                    ["collection", "files", "chunks", "bytes", "precision", "embedder"]))
    return int(Exit.OK)


def run_rm(args: argparse.Namespace) -> int:
    store = _store(args, embedder=False)
    try:
        files, chunks = store.remove(args.collection, list(args.paths))
    finally:
        store.close()
    what = "files of " if args.paths else ""
    if args.json:
        print(json.dumps({"collection": args.collection, "files": files, "chunks": chunks}))
    else:
        print(f"removed {what}{args.collection}: {files} files, {chunks} chunks")
    return int(Exit.OK)


def run_query(args: argparse.Namespace) -> int:
    store = _store(args, embedder=True)
    try:
        got = store.query(args.collection, args.question, args.k or args.top_k_default)
    finally:
        store.close()
    if args.json:
        print_json([h.to_dict() for h in got.hits])
        return int(Exit.OK)
    for n, h in enumerate(got.hits, 1):
        where = f"{_shown(h.source)}:{h.start_line}-{h.end_line}"
        print(f"[{n}] score {h.score:.3f}  {where}" + (f"  ({h.heading})" if h.heading else ""))
        for line in h.text.splitlines():
            print(f"    {line}")
        print()
    print(f"-- {len(got.hits)} chunks; embedding {got.embed_ms:.1f} ms, search {got.search_ms:.1f} ms",
          file=sys.stderr)
    return int(Exit.OK)
